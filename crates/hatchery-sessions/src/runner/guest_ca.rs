//! The egress interception CA inside a session's sandbox: appended to the
//! system bundle, and named by the variables clients read instead of it.

use super::R;
use crate::guest_trust::{GUEST_BUNDLE, GUEST_CA_FILE};
use crate::sandbox::SandboxError;
use crate::session_core::SessionCore;
use std::sync::Arc;

pub(super) use crate::guest_trust::add_trust_env;

/// Writes the CA and the system bundle with it appended. Through the
/// file API rather than a shell script: three round trips to the agent
/// cost a few milliseconds, where a script's processes cost about 100 ms
/// of gVisor process starts on every session's start path.
pub(super) async fn install(svc: &Arc<SessionCore>, sbx: &str, pem: String) -> R<()> {
    let sb = &svc.sandboxes;
    let mut bundle = match sb.read_file(sbx, GUEST_BUNDLE).await {
        Ok(b) => b,
        // A template without a system bundle gets one of the CA alone.
        Err(SandboxError::NotFound(_)) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    bundle = with_ca(bundle, &pem);
    tokio::try_join!(
        sb.write_file(sbx, GUEST_CA_FILE, pem.into_bytes()),
        sb.write_file(sbx, GUEST_BUNDLE, bundle),
    )?;
    Ok(())
}

/// `bundle` with `pem` appended on a line of its own.
fn with_ca(mut bundle: Vec<u8>, pem: &str) -> Vec<u8> {
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(pem.as_bytes());
    bundle
}

#[cfg(test)]
mod tests {
    use super::with_ca;

    #[test]
    fn the_ca_goes_after_the_bundle_on_a_line_of_its_own() {
        assert_eq!(with_ca(b"A\n".to_vec(), "CA\n"), b"A\nCA\n");
        assert_eq!(with_ca(b"A".to_vec(), "CA\n"), b"A\nCA\n");
        assert_eq!(with_ca(Vec::new(), "CA\n"), b"CA\n");
    }
}
