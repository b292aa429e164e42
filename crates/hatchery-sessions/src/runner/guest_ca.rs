//! The egress interception CA inside a session's sandbox: appended to the
//! system bundle, and named by the variables clients read instead of it.

use super::{fail, AGENT_DIR, R};
use crate::session_core::SessionCore;
use std::sync::Arc;

use crate::guest_trust::install_script;

pub(super) use crate::guest_trust::add_trust_env;

/// Appends the CA to the sandbox's system bundle.
pub(super) async fn install(svc: &Arc<SessionCore>, sbx: &str, pem: String) -> R<()> {
    let staged = format!("{AGENT_DIR}/egress-ca.pem");
    svc.sandboxes
        .write_file(sbx, &staged, pem.into_bytes())
        .await?;
    let script = install_script(&staged);
    let x = svc
        .sandboxes
        .exec(sbx, vec!["/bin/sh".into(), "-c".into(), script], "/", 60)
        .await?;
    if x.exit_code != 0 {
        return Err(fail(
            "services_unavailable",
            format!("installing the egress CA in the sandbox: {}", x.stderr),
        ));
    }
    Ok(())
}
