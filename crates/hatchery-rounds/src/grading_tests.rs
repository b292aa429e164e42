//! Submit and grading against the in-memory sandboxes
//! ([`crate::sandbox::fake`]) and the real SQLite store in a tempdir: what
//! is captured, where it is graded, what the candidate is told, and what
//! happens when the grader fails, vanishes or is cut off by a restart.

use crate::limits::{GRADER_DIR, WORKDIR};
use crate::models::*;
use crate::sandbox::fake::{Effect, FakeSandboxes, Fault, FaultExt, Files, Op};
use crate::sandbox::{ExecOutcome, ExecSpec};
use crate::state::SessionState;
use crate::store::{DbStore, RoundRecord, RoundStore, SessionRecord};
use crate::{files_sha256, Rounds, RoundsConfig, RoundsError};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const GOOD: &str = "def add(a, b):\n    return a + b\n";
const STARTER: &str = "def add(a, b):\n    pass\n";

pub(crate) struct Env {
    pub(crate) rounds: Arc<Rounds>,
    pub(crate) fake: Arc<FakeSandboxes>,
    pub(crate) store: Arc<dyn RoundStore>,
    _dir: tempfile::TempDir,
}

impl Env {
    pub(crate) async fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let db = hatchery_db::Db::sqlite(&dir.path().join("hatchery.db"))
            .await
            .unwrap();
        let store: Arc<dyn RoundStore> = Arc::new(DbStore::open(db).await.unwrap());
        let fake = Arc::new(FakeSandboxes::new());
        fake.add_template("code-interpreter", "v1", 512);
        script_grader(&fake);
        let rounds = service(&store, &fake);
        Env {
            rounds,
            fake,
            store,
            _dir: dir,
        }
    }

    /// A round and one candidate's session on it.
    pub(crate) async fn session(&self) -> (RoundRecord, SessionRecord) {
        let (r, s, _) = self.session_with_token().await;
        (r, s)
    }

    /// The same, with the candidate's token.
    pub(crate) async fn session_with_token(&self) -> (RoundRecord, SessionRecord, String) {
        self.session_of(None).await
    }

    /// The same, on a round made by `tenant`'s key (`None`: the API key).
    pub(crate) async fn session_of(
        &self,
        tenant: Option<&str>,
    ) -> (RoundRecord, SessionRecord, String) {
        let body: CreateRound = serde_json::from_value(serde_json::json!({
            "name": "add",
            "starter_files": {"solution.py": STARTER, "notes.md": "scratch"},
            "tests": {"files": {
                "test_add.py": "# SECRET-TEST-SOURCE\nexpect:return a + b",
                "test_doc.py": "# SECRET-TEST-SOURCE\nexpect:\"\"\"",
            }},
            "cpu_time_limit_ms": 2000
        }))
        .unwrap();
        let round = self.rounds.create_round(body, tenant).await.unwrap();
        let created = self
            .rounds
            .create_session(
                &round.id,
                CreateSession {
                    candidate: "ada".into(),
                },
                None,
            )
            .await
            .unwrap();
        let (r, s) = self
            .rounds
            .session(&round.id, &created.session.id)
            .await
            .unwrap();
        (r, s, created.token)
    }

    pub(crate) async fn submit(&self, s: &SessionRecord) -> Result<SubmitAccepted, RoundsError> {
        self.rounds
            .submit(&s.round_id, &s.id, SubmitBody { files: None })
            .await
    }

    /// Waits (in milliseconds, on the fake) until the session is graded.
    pub(crate) async fn graded(&self, s: &SessionRecord) -> SessionRecord {
        for _ in 0..5000 {
            let cur = self.store.get_session(&s.id).await.unwrap().unwrap();
            if cur.state == SessionState::Graded {
                return cur;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("session {} was never graded", s.id);
    }

    fn live_graders(&self) -> Vec<String> {
        self.fake
            .made("round-grader")
            .into_iter()
            .filter(|g| g.alive)
            .map(|g| g.id)
            .collect()
    }
}

fn service(store: &Arc<dyn RoundStore>, fake: &Arc<FakeSandboxes>) -> Arc<Rounds> {
    Rounds::new(
        store.clone(),
        fake.clone(),
        "key".into(),
        RoundsConfig::default(),
        &prometheus::Registry::new(),
    )
}

fn text(files: &Files, path: &str) -> Option<String> {
    files
        .get(path)
        .map(|b| String::from_utf8_lossy(b).into_owned())
}

/// What the grader's commands do: the clean-up empties `/work`; the
/// built-in runner passes a test file's case when `/work/solution.py`
/// holds the text after its `expect:`, and writes the report where
/// `HATCHERY_REPORT` says (with details and output only a reviewer may
/// see).
fn script_grader(fake: &FakeSandboxes) {
    fake.on_exec(
        |s| s.argv.get(2).is_some_and(|c| c.starts_with("rm -rf /work")),
        |_, files| {
            files.retain(|p, _| !p.starts_with(&format!("{WORKDIR}/")));
            ExecOutcome {
                reason: "exited".into(),
                ..ExecOutcome::default()
            }
        },
    );
    fake.on_exec(
        |s| s.argv.get(1).is_some_and(|a| a.ends_with("run_tests.py")),
        |spec, files| {
            let solution = text(files, &format!("{WORKDIR}/solution.py")).unwrap_or_default();
            let tests = format!("{GRADER_DIR}/tests/");
            let cases: Vec<serde_json::Value> = files
                .iter()
                .filter_map(|(p, c)| Some((p.strip_prefix(&tests)?, String::from_utf8_lossy(c))))
                .map(|(name, c)| {
                    let want = c.split_once("expect:").map(|x| x.1).unwrap_or_default();
                    serde_json::json!({
                        "name": name,
                        "ok": solution.contains(want),
                        "detail": format!("SECRET-DETAIL: wanted {want:?}"),
                    })
                })
                .collect();
            let report = serde_json::json!({ "cases": cases }).to_string();
            files.insert(spec.env["HATCHERY_REPORT"].clone(), report.into_bytes());
            ExecOutcome {
                stdout: "SECRET-STDOUT".into(),
                reason: "exited".into(),
                ..ExecOutcome::default()
            }
        },
    );
}

#[tokio::test]
async fn submit_grades_the_captured_files_in_a_fresh_grader() {
    let e = Env::new().await;
    let (r, s) = e.session().await;
    let cand = s.sandbox_id.clone().unwrap();
    // The candidate's work: an edit, a deleted starter file, and a file
    // sent with the submit itself.
    e.fake
        .put_file(&cand, &format!("{WORKDIR}/solution.py"), GOOD.as_bytes());
    e.fake.remove_file(&cand, &format!("{WORKDIR}/notes.md"));
    let acc = e
        .rounds
        .submit(
            &s.round_id,
            &s.id,
            SubmitBody {
                files: Some(BTreeMap::from([("lib/util.py".into(), "X = 1\n".into())])),
            },
        )
        .await
        .unwrap();
    assert_eq!(acc.state, SessionState::Submitted);
    // Edited after the capture: changes the session, not what is graded.
    e.fake
        .put_file(&cand, &format!("{WORKDIR}/solution.py"), b"broken");
    e.graded(&s).await;

    let want = BTreeMap::from([
        ("lib/util.py".to_string(), "X = 1\n".to_string()),
        ("solution.py".to_string(), GOOD.to_string()),
    ]);
    let captured = e
        .rounds
        .submission_files(&s.round_id, &s.id, &acc.submission_id)
        .await
        .unwrap();
    assert_eq!(captured.files, want);
    assert_eq!(captured.sha256, files_sha256(&want));
    assert_eq!(acc.sha256, captured.sha256);

    let graders = e.fake.made("round-grader");
    assert_eq!(graders.len(), 1, "one fresh grader per grading");
    let g = &graders[0];
    assert!(!g.alive, "the grader is deleted after grading");
    assert_eq!(
        Some(&g.origin),
        r.prepared_snapshot.as_ref(),
        "forked from the prepared snapshot, not the candidate's sandbox"
    );
    assert_eq!(g.network, None, "deny-all egress");
    assert_eq!(
        g.metadata.get("hatchery.submission"),
        Some(&acc.submission_id)
    );
    // Exactly the captured files in /work: not the later edit, not the
    // starter file the candidate deleted.
    let work: BTreeMap<String, String> = g
        .files
        .iter()
        .filter_map(|(p, c)| {
            Some((
                p.strip_prefix(&format!("{WORKDIR}/"))?.to_string(),
                String::from_utf8_lossy(c).into_owned(),
            ))
        })
        .collect();
    assert_eq!(work, want);
    assert!(g
        .files
        .contains_key(&format!("{GRADER_DIR}/tests/test_add.py")));
    // The hidden tests never reach the candidate's sandbox.
    let c = e.fake.sandbox(&cand).unwrap();
    assert!(c.alive);
    assert!(!c.files.keys().any(|p| p.starts_with(GRADER_DIR)));
    assert!(!c
        .files
        .values()
        .any(|v| String::from_utf8_lossy(v).contains("SECRET-TEST-SOURCE")));

    let report = e.rounds.report(&s.round_id, &s.id).await.unwrap();
    let gr = &report.submissions[0].gradings;
    assert_eq!(gr.len(), 1);
    assert_eq!(
        (gr[0].status.as_str(), gr[0].passed, gr[0].total),
        ("graded", 1, 2)
    );
}

#[tokio::test]
async fn the_candidate_sees_counts_and_failed_case_names_only() {
    let e = Env::new().await;
    let (r, s) = e.session().await;
    let cand = s.sandbox_id.clone().unwrap();
    e.fake
        .put_file(&cand, &format!("{WORKDIR}/solution.py"), GOOD.as_bytes());
    e.submit(&s).await.unwrap();
    let s = e.graded(&s).await;

    let view = e.rounds.session_view(&s, &r).await.unwrap();
    let res = view.result.clone().unwrap();
    assert_eq!((res.passed, res.total), (1, 2));
    assert_eq!(res.failed_cases, ["test_doc.py"]);
    assert_eq!(res.status, "graded");
    let json = serde_json::to_string(&view).unwrap();
    for secret in ["SECRET-DETAIL", "SECRET-STDOUT", "SECRET-TEST-SOURCE"] {
        assert!(
            !json.contains(secret),
            "{secret} leaked to the candidate: {json}"
        );
    }
    // The reviewer's report has them.
    let report =
        serde_json::to_string(&e.rounds.report(&s.round_id, &s.id).await.unwrap()).unwrap();
    assert!(report.contains("SECRET-DETAIL") && report.contains("SECRET-STDOUT"));
}

/// Each way a grading can go wrong after the capture: a grading with
/// status `error` is stored, the session can submit again, no grader is
/// left behind and the candidate's sandbox is untouched.
#[tokio::test]
async fn the_grader_is_deleted_whatever_fails() {
    let cases: Vec<(&str, Fault, usize)> = vec![
        (
            "fork refused",
            Fault::fail(Op::Fork, 404, "snapshot_not_found").kind("round-grader"),
            0,
        ),
        (
            "clean-up lost its connection",
            Fault::on(Op::Exec, Effect::Transport).kind("round-grader"),
            1,
        ),
        (
            "writing a file failed",
            Fault::fail(Op::WriteFile, 500, "internal").kind("round-grader"),
            1,
        ),
        (
            "the grader vanished under the runner",
            Fault::on(Op::Exec, Effect::Vanish)
                .kind("round-grader")
                .skip(1),
            1,
        ),
        (
            "the runner wrote no report",
            Fault::fail(Op::ReadFile, 404, "file_not_found").kind("round-grader"),
            1,
        ),
    ];
    for (what, fault, graders) in cases {
        let e = Env::new().await;
        let (_, s) = e.session().await;
        e.fake.inject(fault);
        e.submit(&s).await.unwrap();
        e.graded(&s).await;
        let report = e.rounds.report(&s.round_id, &s.id).await.unwrap();
        let g = &report.submissions[0].gradings[0];
        assert_eq!(g.status, "error", "{what}");
        assert!(g.error.is_some(), "{what}: the reviewer is told why");
        assert_eq!(e.fake.made("round-grader").len(), graders, "{what}");
        assert!(e.live_graders().is_empty(), "{what}: a grader was left");
        let cand = e.fake.sandbox(s.sandbox_id.as_deref().unwrap()).unwrap();
        assert!(cand.alive, "{what}");
        let cur = e.store.get_session(&s.id).await.unwrap().unwrap();
        assert!(
            cur.state.can_submit(),
            "{what}: the candidate may submit again"
        );
    }
}

#[tokio::test]
async fn a_second_submit_waits_for_the_grading() {
    let e = Env::new().await;
    let (_, s) = e.session().await;
    e.fake.inject(
        Fault::on(Op::Exec, Effect::Hang)
            .kind("round-grader")
            .skip(1),
    );
    e.submit(&s).await.unwrap();
    let err = e.submit(&s).await.unwrap_err();
    assert!(
        matches!(
            err,
            RoundsError::State {
                code: "grading_in_progress",
                ..
            }
        ),
        "{err:?}"
    );
    e.fake.release();
    e.graded(&s).await;
    e.submit(&s).await.unwrap();
}

/// The process died while its grader ran: the next one deletes that
/// orphan (but not another process's graders), grades the captured
/// submission once, and a late result of the old grading is dropped.
#[tokio::test]
async fn a_grading_cut_off_by_a_restart_is_done_again_once() {
    let e = Env::new().await;
    let (_, s) = e.session().await;
    e.fake.inject(
        Fault::on(Op::Exec, Effect::Hang)
            .kind("round-grader")
            .skip(1),
    );
    let acc = e.submit(&s).await.unwrap();
    while e.fake.hung() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let orphan = e.live_graders();
    assert_eq!(orphan.len(), 1);
    let theirs = {
        use crate::sandbox::{NewSandbox, Sandboxes};
        let meta = BTreeMap::from([
            ("hatchery.kind".to_string(), "round-grader".to_string()),
            ("hatchery.rounds_by".to_string(), "another-host".to_string()),
        ]);
        e.fake
            .create(NewSandbox {
                template: "code-interpreter".into(),
                ttl_seconds: 60,
                metadata: meta,
                network: None,
            })
            .await
            .unwrap()
    };

    let restarted = service(&e.store, &e.fake);
    assert_eq!(restarted.resume_gradings().await.unwrap(), 1);
    e.graded(&s).await;
    assert!(!e.fake.sandbox(&orphan[0]).unwrap().alive, "orphan deleted");
    assert!(e.fake.sandbox(&theirs).unwrap().alive, "not ours to delete");
    assert_eq!(restarted.resume_gradings().await.unwrap(), 0, "done once");
    let gradings = e.store.list_gradings(&acc.submission_id).await.unwrap();
    assert_eq!(gradings.len(), 1);
    assert_eq!(gradings[0].status, "graded");

    // The old grading wakes up on a deleted grader and ends in an error,
    // which must not replace or join the stored one.
    e.fake.release();
    let errors = e.rounds.metrics.gradings.with_label_values(&["error"]);
    for _ in 0..5000 {
        if errors.get() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(errors.get(), 1, "the old grading finished");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let after = e.store.list_gradings(&acc.submission_id).await.unwrap();
    assert_eq!(after, gradings, "the late grading was dropped");
    assert_eq!(e.live_graders(), [theirs]);
}

#[tokio::test]
async fn a_regrade_uses_a_new_grader_and_the_candidate_keeps_the_first_result() {
    let e = Env::new().await;
    let (r, s) = e.session().await;
    let cand = s.sandbox_id.clone().unwrap();
    e.fake
        .put_file(&cand, &format!("{WORKDIR}/solution.py"), GOOD.as_bytes());
    let acc = e.submit(&s).await.unwrap();
    let s = e.graded(&s).await;
    // The suite's runner now fails everything (a flaky grader, say).
    e.fake.on_exec(
        |sp: &ExecSpec| sp.argv.get(1).is_some_and(|a| a.ends_with("run_tests.py")),
        |spec, files| {
            let report = r#"{"cases":[{"name":"test_add.py","ok":false},{"name":"test_doc.py","ok":false}]}"#;
            files.insert(spec.env["HATCHERY_REPORT"].clone(), report.into());
            ExecOutcome {
                reason: "exited".into(),
                ..ExecOutcome::default()
            }
        },
    );
    let again = e
        .rounds
        .regrade(&s.round_id, &s.id, &acc.submission_id)
        .await
        .unwrap();
    assert_eq!((again.passed, again.total), (0, 2));
    let graders = e.fake.made("round-grader");
    assert_eq!(graders.len(), 2);
    assert!(graders.iter().all(|g| !g.alive));
    assert_ne!(graders[0].id, graders[1].id);
    let report = e.rounds.report(&s.round_id, &s.id).await.unwrap();
    let passed: Vec<u32> = report.submissions[0]
        .gradings
        .iter()
        .map(|g| g.passed)
        .collect();
    assert_eq!(passed, [1, 0], "the regrade is added after the first");
    let res = e.rounds.session_view(&s, &r).await.unwrap().result.unwrap();
    assert_eq!(res.passed, 1, "the candidate keeps the first grading");
    assert_eq!(
        e.store.get_session(&s.id).await.unwrap().unwrap().state,
        SessionState::Graded
    );
}

/// A regrade asked for while the submission's first grading still runs is
/// refused (409 grading_in_progress): stored first, it made the first
/// grading's result be dropped and left the session `submitted` for good.
#[tokio::test]
async fn a_regrade_during_the_first_grading_is_refused_and_the_session_is_graded() {
    let e = Env::new().await;
    let (_, s) = e.session().await;
    e.fake.inject(
        Fault::on(Op::Exec, Effect::Hang)
            .kind("round-grader")
            .skip(1),
    );
    let acc = e.submit(&s).await.unwrap();
    while e.fake.hung() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let err = e
        .rounds
        .regrade(&s.round_id, &s.id, &acc.submission_id)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            RoundsError::State {
                code: "grading_in_progress",
                ..
            }
        ),
        "{err:?}"
    );
    e.fake.release();
    let s = e.graded(&s).await;
    assert_eq!(s.state, SessionState::Graded);
    // Once graded, a regrade is taken.
    e.rounds
        .regrade(&s.round_id, &s.id, &acc.submission_id)
        .await
        .unwrap();
    assert_eq!(
        e.store
            .list_gradings(&acc.submission_id)
            .await
            .unwrap()
            .len(),
        2
    );
}
