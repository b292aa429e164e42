//! Tenants and keys as the API shows them, and the requests that make and
//! change them, validated at the edge into typed values. Caps: a name of
//! 1 to [`MAX_NAME_CHARS`] characters, no control characters; each limit
//! 0 to its maximum in [`Limits::MAX`] (0 refuses everything it limits);
//! at most [`MAX_ACTIVE_KEYS`] unrevoked keys per tenant and
//! [`MAX_TENANTS`] tenants.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Longest tenant name, in characters.
pub const MAX_NAME_CHARS: usize = 128;
/// Most unrevoked keys one tenant holds at once.
pub const MAX_ACTIVE_KEYS: u64 = 20;
/// Most tenants one deployment keeps.
pub const MAX_TENANTS: u64 = 10_000;

/// A tenant's limits; each absent one is unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Model tokens (input + output) over the tenant's sessions.
    #[serde(default)]
    pub tokens: Option<u64>,
    /// Model spend in US cents.
    #[serde(default)]
    pub usd_cents: Option<u64>,
    /// Sessions running at once.
    #[serde(default)]
    pub concurrent_sessions: Option<u64>,
    /// Sandboxes alive at once; enforced at create and fork.
    #[serde(default)]
    pub live_sandboxes: Option<u64>,
    /// Wall-clock seconds over the tenant's sessions.
    #[serde(default)]
    pub wall_clock_seconds: Option<u64>,
}

impl Limits {
    /// The largest value each limit takes, in field order.
    pub const MAX: [(&'static str, u64); 5] = [
        ("tokens", 1_000_000_000_000),
        ("usd_cents", 10_000_000_000),
        ("concurrent_sessions", 100_000),
        ("live_sandboxes", 100_000),
        ("wall_clock_seconds", 1_000_000_000),
    ];

    fn values(&self) -> [Option<u64>; 5] {
        [
            self.tokens,
            self.usd_cents,
            self.concurrent_sessions,
            self.live_sandboxes,
            self.wall_clock_seconds,
        ]
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        for ((name, max), v) in Self::MAX.iter().zip(self.values()) {
            if let Some(v) = v {
                if v > *max {
                    return Err(ValidationError::LimitRange {
                        name,
                        value: v,
                        max: *max,
                    });
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("name must be 1 to {MAX_NAME_CHARS} characters without control characters")]
    Name,
    #[error("limits.{name} is {value}; it must be 0 to {max}")]
    LimitRange {
        name: &'static str,
        value: u64,
        max: u64,
    },
}

fn validate_name(name: &str) -> Result<(), ValidationError> {
    let n = name.chars().count();
    if n == 0 || n > MAX_NAME_CHARS || name.chars().any(char::is_control) || name.trim().is_empty()
    {
        return Err(ValidationError::Name);
    }
    Ok(())
}

/// `POST /v1/tenants`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTenant {
    pub name: String,
    #[serde(default)]
    pub limits: Limits,
}

impl NewTenant {
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate_name(&self.name)?;
        self.limits.validate()
    }
}

/// `PATCH /v1/tenants/{id}`: a field given replaces the stored one;
/// `limits`, when given, replaces all five (an absent one becomes
/// unlimited).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantPatch {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub limits: Option<Limits>,
}

impl TenantPatch {
    pub fn validate(&self) -> Result<(), ValidationError> {
        if let Some(n) = &self.name {
            validate_name(n)?;
        }
        if let Some(l) = &self.limits {
            l.validate()?;
        }
        Ok(())
    }
}

/// A tenant as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Tenant {
    /// `ten_` and 16 hex digits.
    pub id: String,
    pub name: String,
    pub limits: Limits,
    /// RFC 3339, UTC.
    pub created_at: String,
}

/// A key as listed: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct TenantKey {
    /// `key_` and 16 hex digits.
    pub id: String,
    pub tenant: String,
    /// The key's first characters (`htk_` and 8 more), to tell keys apart.
    pub prefix: String,
    pub created_at: String,
    /// Set once revoked; a revoked key is refused at once.
    pub revoked_at: Option<String>,
}

/// `POST /v1/tenants/{id}/keys`' answer: the only time the key is shown.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CreatedKey {
    #[serde(flatten)]
    pub info: TenantKey,
    /// The bearer key. Not stored; it cannot be shown again.
    pub key: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_limits_are_bounded() {
        let ok = |name: &str| NewTenant {
            name: name.into(),
            limits: Limits::default(),
        };
        assert!(ok("acme").validate().is_ok());
        assert!(ok(&"é".repeat(MAX_NAME_CHARS)).validate().is_ok());
        for bad in ["", "  ", "a\nb", &"x".repeat(MAX_NAME_CHARS + 1)] {
            assert_eq!(ok(bad).validate(), Err(ValidationError::Name), "{bad:?}");
        }
        for (i, (name, max)) in Limits::MAX.iter().enumerate() {
            let mut v = [None; 5];
            v[i] = Some(*max);
            let at = Limits {
                tokens: v[0],
                usd_cents: v[1],
                concurrent_sessions: v[2],
                live_sandboxes: v[3],
                wall_clock_seconds: v[4],
            };
            assert!(at.validate().is_ok(), "{name} at its max");
            v[i] = Some(max + 1);
            let over = Limits {
                tokens: v[0],
                usd_cents: v[1],
                concurrent_sessions: v[2],
                live_sandboxes: v[3],
                wall_clock_seconds: v[4],
            };
            let e = over.validate().unwrap_err();
            assert!(matches!(e, ValidationError::LimitRange { name: n, .. } if n == *name));
        }
    }

    #[test]
    fn unknown_fields_are_refused() {
        let r: Result<NewTenant, _> = serde_json::from_str(r#"{"name":"a","limit":{}}"#);
        assert!(r.is_err());
        let r: Result<Limits, _> = serde_json::from_str(r#"{"sandboxes":1}"#);
        assert!(r.is_err());
        let r: Result<Limits, _> = serde_json::from_str(r#"{"tokens":-1}"#);
        assert!(r.is_err(), "negative limits do not parse");
    }
}
