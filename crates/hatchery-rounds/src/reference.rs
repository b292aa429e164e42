//! The reference solution check at prepare time: CPU time under systrap on
//! a shared host varies by up to 3× for the same program
//! (docs/interviews.md#fairness), so a limit set on a knife edge would fail
//! good candidates at random. The round's author gives a known-good
//! solution; it runs a few times in the preparing sandbox (after the
//! snapshot, so no candidate sees it) and the limit must leave 50 %
//! headroom over the most CPU it took.

use crate::limits::{REFERENCE_HEADROOM_HALVES, REFERENCE_RUNS, WORKDIR};
use crate::models::{RoundSpec, Verdict};
use crate::verdict::{tail, verdict};
use crate::{Rounds, RoundsError};
use std::collections::BTreeMap;

/// The smallest limit the rule accepts for a reference that took `cpu_ms`.
pub(crate) fn min_limit_ms(cpu_ms: u64) -> u64 {
    (cpu_ms * REFERENCE_HEADROOM_HALVES).div_ceil(2)
}

/// Judges the reference's runs (CPU of each) against the round's limit.
pub(crate) fn judge(limit_ms: u64, runs: &[u64]) -> Result<u64, RoundsError> {
    let most = runs.iter().copied().max().unwrap_or(0);
    let need = min_limit_ms(most);
    if limit_ms < need {
        return Err(RoundsError::state(
            "limit_too_tight",
            format!(
                "cpu_time_limit_ms {limit_ms} leaves less than 50% headroom over the reference \
                 solution, which took up to {most} ms of CPU in {} runs {runs:?}; use at least {need}",
                runs.len()
            ),
        ));
    }
    Ok(most)
}

impl Rounds {
    /// Runs the reference [`REFERENCE_RUNS`] times in `sbx` with the round's
    /// own command and limits; returns the most CPU one run took.
    pub(crate) async fn run_reference(
        &self,
        sbx: &str,
        spec: &RoundSpec,
        files: &BTreeMap<String, String>,
    ) -> Result<u64, RoundsError> {
        for (path, text) in files {
            self.sandboxes
                .write_file(sbx, &format!("{WORKDIR}/{path}"), text.as_bytes().to_vec())
                .await?;
        }
        let mut runs = Vec::with_capacity(REFERENCE_RUNS);
        for i in 0..REFERENCE_RUNS {
            let o = self.sandboxes.exec(sbx, self.exec_spec(spec)).await?;
            match verdict(&o, spec.memory_limit_mb << 20) {
                Verdict::Ok => runs.push(o.cpu_ms),
                // Over the limit is the same finding as too little headroom.
                Verdict::TimeLimit => {
                    runs.push(o.cpu_ms.max(spec.cpu_time_limit_ms + 1));
                    break;
                }
                v => {
                    return Err(RoundsError::state(
                        "reference_failed",
                        format!(
                        "reference_solution run {} of {REFERENCE_RUNS}: {v:?} (exit {}, {}): {}",
                        i + 1,
                        o.exit_code,
                        o.reason,
                        tail(&o.stderr, 2000)
                    ),
                    ))
                }
            }
        }
        tracing::info!(runs = ?runs, limit_ms = spec.cpu_time_limit_ms, "rounds: reference solution measured");
        judge(spec.cpu_time_limit_ms, &runs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_needs_half_again_the_worst_run() {
        assert_eq!(min_limit_ms(1000), 1500);
        assert_eq!(min_limit_ms(1001), 1502, "rounds up, never down");
        assert_eq!(judge(1500, &[800, 1000, 900]).unwrap(), 1000);
        let e = judge(1499, &[800, 1000, 900]).unwrap_err();
        assert_eq!(e.status_code().1, "limit_too_tight");
        assert!(e.to_string().contains("at least 1500"), "{e}");
        assert!(
            judge(100, &[101]).is_err(),
            "a run over the limit is refused"
        );
    }
}
