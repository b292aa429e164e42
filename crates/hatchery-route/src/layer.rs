//! The middleware in front of a host's API (roles `all` and `host` on a
//! shared store): a request for a sandbox or snapshot another host owns
//! goes there, or is answered 503 with Retry-After if that host is lost
//! or unreachable.

use crate::{
    forward, scope_of_request, Directory, Location, RouteError, RouteMetrics, Scope, TenantKeys,
    FORWARDED_BY,
};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

#[derive(Clone)]
pub struct HostRouting {
    pub directory: Arc<dyn Directory>,
    /// This host's id.
    pub me: String,
    pub api_key: Arc<str>,
    pub metrics: RouteMetrics,
    /// The deployment's daemon key, on the layer of a preview listener:
    /// added to what it forwards, because an owner serves guest content
    /// on its API listener only to another daemon ([`with_daemon_key`]).
    /// `None` on an API listener.
    pub forward_key: Option<Arc<str>>,
    /// Tenant keys are forwarded too once recognised (`None`: only the
    /// API key is).
    pub tenant_keys: Option<Arc<dyn TenantKeys>>,
}

/// Marks a request forwarded from a preview listener with the daemon key
/// (replacing whatever the client sent under that name): the owner's API
/// listener serves a preview only with it, and removes it before the
/// request reaches the guest.
pub fn with_daemon_key(mut req: Request, key: Option<&str>) -> Request {
    if let Some(v) = key.and_then(|k| axum::http::HeaderValue::from_str(k).ok()) {
        req.headers_mut()
            .insert(hatchery_serve::headers::DAEMON_KEY_HEADER, v);
    }
    req
}

/// Who a forwarded request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Caller {
    /// The API key, or a credential the owner checks itself.
    Unscoped,
    /// A tenant key: it reaches only its tenant's things.
    Tenant(String),
}

/// Forwarding is for callers with the API key (Bearer, or E2B's
/// `X-API-Key`) or a tenant key that `tenants` recognises (the owner
/// scopes what it reaches). The exceptions carry a credential only the
/// owner, whose secret signed it, can check: the pty WebSocket (a
/// terminal token), E2B's sandbox traffic (`X-Access-Token`) and preview
/// URLs (the token is the path). A string that merely looks like a
/// tenant key is not forwarded (`None`): an unknown caller learns nothing
/// about where things are.
///
/// What it needs of the request is taken before the returned future runs:
/// the request itself is not Sync, so it is not held across an await.
pub(crate) fn may_forward(
    req: &Request,
    api_key: &str,
    tenants: Option<&Arc<dyn TenantKeys>>,
) -> impl std::future::Future<Output = Result<Option<Caller>, RouteError>> + Send + 'static {
    let path = req.uri().path();
    let open = hatchery_serve::headers::api_key_ok(req.headers(), api_key)
        || path.ends_with("/pty")
        || path.starts_with("/e2b/sandbox/")
        || path == "/e2b/sandbox"
        || path.starts_with("/preview/");
    let ask = match (open, tenants, bearer(req)) {
        (false, Some(t), Some(b)) => Some((t.clone(), b.to_string())),
        _ => None,
    };
    async move {
        match ask {
            _ if open => Ok(Some(Caller::Unscoped)),
            Some((t, b)) => Ok(t.tenant(&b).await?.map(Caller::Tenant)),
            None => Ok(None),
        }
    }
}

/// The request's `Authorization: Bearer` value, or E2B's `X-API-Key`.
fn bearer(req: &Request) -> Option<&str> {
    let h = req.headers();
    h.get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| h.get("x-api-key").and_then(|v| v.to_str().ok()))
        .filter(|k| !k.is_empty())
}

/// What the directory says about the request's sandbox or snapshot;
/// `None` for requests without one.
///
/// A host that cannot answer for it (lost, starting, or a sandbox lost
/// with its host) is answered here, naming the host. To a tenant key that
/// does not own the thing it is [`Location::Unknown`] instead, answered
/// like anything missing (404), so another tenant learns neither that it
/// exists nor where: a live owner checks the key itself.
pub(crate) async fn locate(
    dir: &dyn Directory,
    scope: Scope,
    caller: &Caller,
) -> Option<Result<(Location, String), RouteError>> {
    let (loc, what) = match &scope {
        Scope::Sandbox(id) => (dir.sandbox(id).await, format!("sandbox {id}")),
        Scope::Snapshot(id) => (dir.snapshot(id).await, format!("snapshot {id}")),
        Scope::Session(id) => (dir.session(id).await, format!("session {id}")),
        Scope::Other => return None,
    };
    let answered_here = matches!(
        loc,
        Ok(Location::Lost { .. } | Location::Starting { .. } | Location::Gone { .. })
    );
    let loc = match caller {
        Caller::Tenant(t) if answered_here => match dir.tenant_of(&scope).await {
            Ok(owner) if owner.as_deref() == Some(t.as_str()) => loc,
            Ok(_) => Ok(Location::Unknown),
            Err(e) => Err(e),
        },
        _ => loc,
    };
    Some(loc.map(|l| (l, what)))
}

pub async fn route(State(r): State<HostRouting>, req: Request, next: Next) -> Response {
    // Forwarded once already: this host answers, whatever it knows. A
    // tenant store that cannot tell: answered here too, where the API's
    // own check says 503.
    if req.headers().contains_key(FORWARDED_BY) {
        return next.run(req).await;
    }
    let Ok(Some(caller)) = may_forward(&req, &r.api_key, r.tenant_keys.as_ref()).await else {
        return next.run(req).await;
    };
    // Taken before any await: the request itself is not Sync.
    let scope = scope_of_request(req.uri().path(), req.headers());
    match locate(r.directory.as_ref(), scope, &caller).await {
        None | Some(Ok((Location::Here | Location::Unknown | Location::Anywhere, _))) => {
            next.run(req).await
        }
        Some(Ok((Location::At { host, url }, what))) => {
            let req = with_daemon_key(req, r.forward_key.as_deref());
            match forward::forward_watched(r.directory.as_ref(), &host, &url, &r.me, &what, req)
                .await
            {
                Ok(resp) => {
                    r.metrics.count("forwarded");
                    resp
                }
                Err(e) => {
                    r.metrics.count("unreachable");
                    e.into_response()
                }
            }
        }
        Some(Ok((Location::Lost { host }, what))) => {
            r.metrics.count("host_lost");
            RouteError::HostLost { host, what }.into_response()
        }
        Some(Ok((Location::Starting { host }, what))) => {
            r.metrics.count("host_starting");
            RouteError::HostStarting { host, what }.into_response()
        }
        Some(Ok((
            Location::Gone {
                host,
                at_ms,
                reason,
            },
            what,
        ))) => {
            r.metrics.count("sandbox_lost");
            let e = RouteError::SandboxLost {
                host,
                what,
                at_ms,
                reason,
            };
            match crate::error::is_e2b(req.uri().path()) {
                true => e.into_e2b_response(),
                false => e.into_response(),
            }
        }
        Some(Err(e)) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    /// Knows one tenant key.
    struct OneKey;

    #[async_trait::async_trait]
    impl TenantKeys for OneKey {
        async fn tenant(&self, bearer: &str) -> Result<Option<String>, RouteError> {
            Ok((bearer == "htk_good").then(|| "ten_a".to_string()))
        }
    }

    fn req(path: &str, auth: Option<&str>) -> Request {
        let mut b = Request::builder().uri(path);
        if let Some(a) = auth {
            b = b.header("authorization", format!("Bearer {a}"));
        }
        b.body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn tenant_keys_are_forwarded_once_recognised_and_only_then() {
        let keys: Arc<dyn TenantKeys> = Arc::new(OneKey);
        let t = Some(&keys);
        let ask = |path: &str, auth: Option<&str>, t| may_forward(&req(path, auth), "op", t);
        let un = Some(Caller::Unscoped);
        assert_eq!(
            ask("/v1/sessions/ses_a", Some("op"), None).await.unwrap(),
            un
        );
        assert_eq!(
            ask("/v1/sessions/ses_a", Some("htk_good"), t)
                .await
                .unwrap(),
            Some(Caller::Tenant("ten_a".into()))
        );
        assert_eq!(
            ask("/v1/sessions/ses_a", Some("htk_bad"), t).await.unwrap(),
            None
        );
        assert_eq!(
            ask("/v1/sessions/ses_a", Some("htk_good"), None)
                .await
                .unwrap(),
            None,
            "without a resolver only the API key is forwarded"
        );
        assert_eq!(ask("/v1/sessions/ses_a", None, t).await.unwrap(), None);
        assert_eq!(ask("/preview/tok/x", None, t).await.unwrap(), un);
    }

    /// Sandbox `sbx_a` of tenant `ten_a` on lost host `h1`.
    struct LostHost;

    #[async_trait::async_trait]
    impl Directory for LostHost {
        async fn sandbox(&self, _: &str) -> Result<Location, RouteError> {
            Ok(Location::Lost { host: "h1".into() })
        }
        async fn snapshot(&self, _: &str) -> Result<Location, RouteError> {
            Ok(Location::Starting { host: "h1".into() })
        }
        async fn session(&self, _: &str) -> Result<Location, RouteError> {
            Ok(Location::Here)
        }
        async fn hosts(&self) -> Result<Vec<crate::HostSlot>, RouteError> {
            Ok(vec![])
        }
        async fn tenant_live(
            &self,
            _: &str,
        ) -> Result<std::collections::BTreeMap<String, u32>, RouteError> {
            Ok(Default::default())
        }
        async fn tenant_of(&self, _: &Scope) -> Result<Option<String>, RouteError> {
            Ok(Some("ten_a".into()))
        }
    }

    #[tokio::test]
    async fn a_lost_host_is_named_only_to_the_owner_and_the_operator() {
        let at = |s: &'static str, c: Caller| async move {
            let scope = if s == "sandbox" {
                Scope::Sandbox("sbx_a".into())
            } else {
                Scope::Snapshot("snap_a".into())
            };
            locate(&LostHost, scope, &c).await.unwrap().unwrap().0
        };
        let lost = Location::Lost { host: "h1".into() };
        assert_eq!(at("sandbox", Caller::Unscoped).await, lost);
        assert_eq!(at("sandbox", Caller::Tenant("ten_a".into())).await, lost);
        assert_eq!(
            at("sandbox", Caller::Tenant("ten_b".into())).await,
            Location::Unknown
        );
        assert_eq!(
            at("snapshot", Caller::Tenant("ten_b".into())).await,
            Location::Unknown
        );
        // A live owner checks the key itself: nothing asked here.
        assert_eq!(
            locate(
                &LostHost,
                Scope::Session("ses_a".into()),
                &Caller::Tenant("ten_b".into())
            )
            .await
            .unwrap()
            .unwrap()
            .0,
            Location::Here
        );
    }
}
