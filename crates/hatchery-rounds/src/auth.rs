//! Who is calling: the daemon's API key (the hiring team's server), a
//! tenant's key (the same, for the rounds that tenant made), a candidate
//! token (one session) or a reviewer token (one round's sessions, reports
//! and replays). Each route says what it accepts.

use crate::store::{Scope, TokenRecord};
use crate::{Rounds, RoundsError};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use std::sync::Arc;

#[derive(Debug, Clone)]
pub enum Caller {
    Key,
    /// A tenant's key (hatchery-tenants): the API key's rights over the
    /// tenant's own rounds. Another tenant's round answers 404 as a
    /// missing one does (checked when the caller is extracted).
    Tenant(String),
    Candidate(TokenRecord),
    Reviewer(TokenRecord),
    Interviewer(TokenRecord),
}

impl FromRequestParts<Arc<Rounds>> for Caller {
    type Rejection = RoundsError;
    async fn from_request_parts(parts: &mut Parts, st: &Arc<Rounds>) -> Result<Self, RoundsError> {
        let given = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        Caller::from_token(st, given, parts.uri.path()).await
    }
}

impl Caller {
    /// Who `given` (a bearer token, or the API key) is, asking for `path`
    /// (a tenant's key reaches only its own rounds' paths).
    pub(crate) async fn from_token(
        st: &Rounds,
        given: &str,
        path: &str,
    ) -> Result<Self, RoundsError> {
        if given.is_empty() {
            return Err(RoundsError::Unauthorized);
        }
        if hatchery_serve::headers::constant_time_eq(given.as_bytes(), st.api_key.as_bytes()) {
            return Ok(Caller::Key);
        }
        if let Some(tenants) = st.tenants.get() {
            if let Some(p) = tenants.resolve(given).await.map_err(RoundsError::Tenants)? {
                let tenant = p.tenant().unwrap_or_default().to_string();
                if let Some(id) = round_in_path(path) {
                    owned_by(st, id, &tenant).await?;
                }
                return Ok(Caller::Tenant(tenant));
            }
        }
        let rec = crate::tokens::check(st.store.as_ref(), given, crate::ids::now_ms()).await?;
        Ok(match rec.scope {
            Scope::Candidate => Caller::Candidate(rec),
            Scope::Reviewer => Caller::Reviewer(rec),
            Scope::Interviewer => Caller::Interviewer(rec),
        })
    }
}

/// The round a `/v1/rounds/{id}…` path names; `None` for the collection.
fn round_in_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/rounds/")?;
    let id = rest.split('/').next().unwrap_or("");
    (!id.is_empty()).then_some(id)
}

/// `Ok` when round `id` is `tenant`'s; 404 `round_not_found` for another
/// tenant's or a missing one alike.
async fn owned_by(st: &Rounds, id: &str, tenant: &str) -> Result<(), RoundsError> {
    let r = st.round(id).await?;
    if r.tenant.as_deref() == Some(tenant) {
        Ok(())
    } else {
        Err(RoundsError::NotFound(format!("round {id}")))
    }
}

impl Caller {
    /// The caller's tenant (`None`: the API key, or a round's token).
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Caller::Tenant(t) => Some(t),
            _ => None,
        }
    }

    pub fn require_key(&self) -> Result<(), RoundsError> {
        match self {
            Caller::Key | Caller::Tenant(_) => Ok(()),
            _ => Err(RoundsError::Forbidden(
                "this route needs the API key".into(),
            )),
        }
    }

    /// The API key, or a reviewer token of this round.
    pub fn require_reviewer(&self, round_id: &str) -> Result<(), RoundsError> {
        match self {
            Caller::Key | Caller::Tenant(_) => Ok(()),
            Caller::Reviewer(t) if t.round_id == round_id => Ok(()),
            Caller::Reviewer(_) => Err(RoundsError::Forbidden(
                "this reviewer token is for another round".into(),
            )),
            Caller::Candidate(_) => Err(RoundsError::Forbidden(
                "a candidate token cannot read reviews".into(),
            )),
            Caller::Interviewer(_) => Err(RoundsError::Forbidden(
                "an interviewer token cannot read reviews".into(),
            )),
        }
    }

    /// The API key, or an interviewer token of this round.
    pub fn require_interviewer(&self, round_id: &str) -> Result<(), RoundsError> {
        match self {
            Caller::Key => Ok(()),
            Caller::Interviewer(t) if t.round_id == round_id => Ok(()),
            Caller::Interviewer(_) => Err(RoundsError::Forbidden(
                "this interviewer token is for another round".into(),
            )),
            _ => Err(RoundsError::Forbidden(
                "this route needs an interviewer token of the round".into(),
            )),
        }
    }

    /// The API key, or the candidate token of this very session.
    pub fn require_candidate(&self, round_id: &str, session_id: &str) -> Result<(), RoundsError> {
        match self {
            Caller::Key | Caller::Tenant(_) => Ok(()),
            Caller::Candidate(t)
                if t.round_id == round_id && t.session_id.as_deref() == Some(session_id) =>
            {
                Ok(())
            }
            Caller::Candidate(_) => Err(RoundsError::Forbidden(
                "this candidate token is for another session".into(),
            )),
            Caller::Reviewer(_) => Err(RoundsError::Forbidden(
                "a reviewer token cannot act for the candidate".into(),
            )),
            Caller::Interviewer(_) => Err(RoundsError::Forbidden(
                "an interviewer token cannot act for the candidate".into(),
            )),
        }
    }

    /// What a fork records as its owner: only the same caller may use it.
    pub fn owner(&self) -> String {
        match self {
            Caller::Key => "api_key".into(),
            Caller::Tenant(t) => format!("tenant:{t}"),
            Caller::Candidate(t) | Caller::Reviewer(t) | Caller::Interviewer(t) => t.hash.clone(),
        }
    }

    pub fn is_candidate(&self) -> bool {
        matches!(self, Caller::Candidate(_))
    }
}

#[cfg(test)]
mod tests {
    use super::round_in_path;

    #[test]
    fn the_round_of_a_path_is_found() {
        assert_eq!(round_in_path("/v1/rounds"), None);
        assert_eq!(round_in_path("/v1/rounds/"), None);
        assert_eq!(round_in_path("/v1/rounds/rnd_a"), Some("rnd_a"));
        assert_eq!(
            round_in_path("/v1/rounds/rnd_a/sessions/rse_b/run"),
            Some("rnd_a")
        );
        assert_eq!(round_in_path("/rounds/room/"), None);
    }
}
