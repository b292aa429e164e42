//! E2B's sandbox lifecycle: `autoPause` (pause instead of kill when the
//! timeout is reached) and `autoResume` (a request to a paused sandbox
//! resumes it).
//!
//! Hatchery ends a sandbox at its TTL on its own (the shim, even with the
//! daemon down), so an auto-pausing sandbox gets [`GRACE_S`] more TTL than
//! its E2B timeout: the E2B end time is the Hatchery expiry minus the
//! grace, and the sweep ([`crate::auto_pause`]) pauses the sandbox when
//! that end comes. If the daemon is not running then, the TTL still ends
//! the sandbox a little later: it is lost rather than left running without
//! a limit.
//!
//! This module is only the settings, and depends on nothing else here:
//! every sandbox view carries them (`backend::SandboxView`).
//!
//! The settings are kept in the sandbox's metadata (keys clients never
//! see), so they survive restarts and a pause carries them to the resumed
//! sandbox, as E2B keeps a sandbox's lifecycle across pauses.

use std::collections::BTreeMap;

/// Metadata: the sandbox pauses at its timeout.
pub const AUTO_PAUSE_KEY: &str = "e2b_auto_pause";
/// Metadata: a request to the paused sandbox resumes it.
pub const AUTO_RESUME_KEY: &str = "e2b_auto_resume";
/// Metadata: the timeout (seconds) an auto-resume gives the sandbox, the
/// one it was created or last connected with.
pub const TIMEOUT_KEY: &str = "e2b_timeout_s";
/// Metadata: the auto-pause keeps files only (`autoPauseMemory: false`).
pub const AUTO_PAUSE_FILES_KEY: &str = "e2b_auto_pause_files";
/// The keys above, hidden from clients and kept across pauses.
pub const KEYS: [&str; 4] = [
    AUTO_PAUSE_KEY,
    AUTO_RESUME_KEY,
    TIMEOUT_KEY,
    AUTO_PAUSE_FILES_KEY,
];
/// TTL beyond the E2B timeout of an auto-pausing sandbox: time for the
/// sweep to notice and the checkpoint to finish before Hatchery's own
/// TTL would end it.
pub const GRACE_S: u64 = 60;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lifecycle {
    pub auto_pause: bool,
    pub auto_resume: bool,
    /// The timeout an auto-resume gives, in seconds (0: not known).
    pub timeout_s: u64,
    /// The auto-pause is filesystem-only (E2B's `autoPauseMemory: false`):
    /// files kept, memory and processes dropped.
    pub files_only: bool,
}

impl Lifecycle {
    /// Read back from a sandbox's or a pause record's metadata.
    pub fn of(m: &BTreeMap<String, String>) -> Self {
        Lifecycle {
            auto_pause: m.get(AUTO_PAUSE_KEY).is_some_and(|v| v == "1"),
            auto_resume: m.get(AUTO_RESUME_KEY).is_some_and(|v| v == "1"),
            timeout_s: m.get(TIMEOUT_KEY).and_then(|v| v.parse().ok()).unwrap_or(0),
            files_only: m.get(AUTO_PAUSE_KEY).is_some_and(|v| v == "1")
                && m.get(AUTO_PAUSE_FILES_KEY).is_some_and(|v| v == "1"),
        }
    }

    /// The metadata that records it (nothing for E2B's default: kill).
    pub fn keys(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        if self.auto_pause {
            m.insert(AUTO_PAUSE_KEY.into(), "1".into());
            m.insert(TIMEOUT_KEY.into(), self.timeout_s.to_string());
            if self.auto_resume {
                m.insert(AUTO_RESUME_KEY.into(), "1".into());
            }
            if self.files_only {
                m.insert(AUTO_PAUSE_FILES_KEY.into(), "1".into());
            }
        }
        m
    }

    /// The Hatchery TTL for an E2B timeout of `ttl` seconds.
    pub fn hatchery_ttl(&self, ttl: u64) -> u64 {
        if self.auto_pause {
            ttl + GRACE_S
        } else {
            ttl
        }
    }

    /// The E2B end time of a sandbox whose Hatchery expiry is `expires_ms`.
    pub fn e2b_end_ms(&self, expires_ms: u64) -> u64 {
        if self.auto_pause {
            expires_ms.saturating_sub(GRACE_S * 1000)
        } else {
            expires_ms
        }
    }

    /// `lifecycle` of E2B's `SandboxDetail`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "onTimeout": if self.auto_pause { "pause" } else { "kill" },
            "autoResume": self.auto_resume,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_metadata() {
        let l = Lifecycle {
            auto_pause: true,
            auto_resume: true,
            timeout_s: 30,
            files_only: false,
        };
        assert_eq!(Lifecycle::of(&l.keys()), l);
        let f = Lifecycle {
            auto_pause: true,
            timeout_s: 30,
            files_only: true,
            ..Default::default()
        };
        assert_eq!(Lifecycle::of(&f.keys()), f);
        // A files-only pause means nothing without auto-pause.
        let k = Lifecycle {
            files_only: true,
            ..Default::default()
        };
        assert_eq!(Lifecycle::of(&k.keys()), Lifecycle::default());
        assert!(Lifecycle::default().keys().is_empty());
        // Auto-resume means nothing without auto-pause.
        let r = Lifecycle {
            auto_resume: true,
            ..Default::default()
        };
        assert_eq!(Lifecycle::of(&r.keys()), Lifecycle::default());
    }

    #[test]
    fn the_grace_is_added_to_the_ttl_and_hidden_from_the_end_time() {
        let l = Lifecycle {
            auto_pause: true,
            ..Default::default()
        };
        assert_eq!(l.hatchery_ttl(10), 10 + GRACE_S);
        assert_eq!(l.e2b_end_ms(100_000), 100_000 - GRACE_S * 1000);
        let k = Lifecycle::default();
        assert_eq!((k.hatchery_ttl(10), k.e2b_end_ms(5)), (10, 5));
        assert_eq!(l.json()["onTimeout"], "pause");
        assert_eq!(k.json()["onTimeout"], "kill");
    }
}
