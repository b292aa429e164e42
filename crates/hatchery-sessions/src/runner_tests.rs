//! The runner's state machine against the in-memory sandboxes
//! ([`crate::sandbox::fake`]), the real SQLite store in a tempdir and a
//! local git repository: start, steering, the idle snapshot and the resume
//! from it, cancel, and a sandbox lost while the agent runs. The test plays
//! the agent: it prints protocol lines into the fake process and reads
//! what the runner wrote to its stdin.

use crate::config::SessionsConfig;
use crate::events::EventKind;
use crate::models::CreateSessionBody;
use crate::policy::BuiltinPolicies;
use crate::sandbox::fake::{Effect, FakeSandboxes, Fault, Op};
use crate::scheduler::LocalScheduler;
use crate::service::Sessions;
use crate::state::SessionState as S;
use crate::store::{Session, SessionStore, SqliteStore};
use std::sync::Arc;
use std::time::Duration;

struct Env {
    svc: Arc<Sessions>,
    fake: FakeSandboxes,
    repo: String,
    _dir: tempfile::TempDir,
}

fn git(dir: &std::path::Path, args: &[&str]) {
    let ok = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .status()
        .unwrap()
        .success();
    assert!(ok, "git {args:?}");
}

impl Env {
    fn new(tune: impl FnOnce(&mut SessionsConfig)) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("repo");
        std::fs::create_dir(&src).unwrap();
        git(&src, &["init", "-q", "-b", "main"]);
        std::fs::write(src.join("README"), "hello").unwrap();
        git(&src, &["add", "."]);
        git(
            &src,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-q",
                "-m",
                "one",
            ],
        );
        let mut cfg = SessionsConfig {
            file_repo_roots: vec![dir.path().to_path_buf()],
            ..SessionsConfig::default()
        };
        tune(&mut cfg);
        let store: Arc<dyn SessionStore> =
            Arc::new(SqliteStore::open(&dir.path().join("hatchery.db")).unwrap());
        let fake = FakeSandboxes::new();
        fake.add_template("code-interpreter");
        let svc = Sessions::new(
            store,
            cfg,
            Arc::new(BuiltinPolicies),
            Arc::new(fake.clone()),
            Arc::new(LocalScheduler::new(4)),
        );
        Env {
            svc,
            fake,
            repo: format!("file://{}", src.display()),
            _dir: dir,
        }
    }

    async fn create(&self) -> String {
        let body: CreateSessionBody = serde_json::from_value(serde_json::json!({
            "repo": self.repo, "task": "fix the bug"
        }))
        .unwrap();
        self.svc.create(body, None).await.unwrap().0.session_id
    }

    async fn get(&self, id: &str) -> Session {
        self.svc.core.store.get(id).await.unwrap()
    }

    /// Waits (polling every millisecond) until `ok` holds of the session.
    async fn until(&self, id: &str, what: &str, ok: impl Fn(&Session) -> bool) -> Session {
        for _ in 0..5000 {
            let s = self.get(id).await;
            if ok(&s) {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let s = self.get(id).await;
        panic!("{what}: session is {} ({:?})", s.state, s.reason);
    }

    async fn state(&self, id: &str, st: S) -> Session {
        self.until(id, st.as_str(), |s| s.state == st).await
    }

    async fn events(&self, id: &str) -> Vec<&'static str> {
        self.svc
            .core
            .store
            .events(id, 0, 10_000)
            .await
            .unwrap()
            .iter()
            .map(|e| e.kind.type_name())
            .collect()
    }

    /// Waits until the agent's stdin holds `needle`.
    async fn stdin_has(&self, sbx: &str, pid: &str, needle: &str) {
        for _ in 0..5000 {
            if String::from_utf8_lossy(&self.fake.stdin(sbx, pid)).contains(needle) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!(
            "the agent never got {needle:?}; stdin: {}",
            String::from_utf8_lossy(&self.fake.stdin(sbx, pid))
        );
    }
}

fn ids(s: &Session) -> (String, String) {
    (s.sandbox_id.clone().unwrap(), s.process_id.clone().unwrap())
}

/// A person's decision on an approval, as the API takes it.
fn approval_body(decision: &str, remember: Option<&str>) -> crate::models::ApprovalBody {
    crate::models::ApprovalBody {
        decision: decision.into(),
        note: String::new(),
        remember: remember.map(String::from),
    }
}

/// The id of session `id`'s pending approval, once it has one.
async fn pending_id(e: &Env, id: &str) -> String {
    for _ in 0..5000 {
        if let Some(a) = e.svc.core.store.pending_approval(id).await.unwrap() {
            return a.approval_id;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("no pending approval");
}

/// `events` holds `want` in this order (other events may come between).
fn in_order(events: &[&str], want: &[&str]) {
    let mut it = events.iter();
    for w in want {
        assert!(
            it.any(|e| e == w),
            "{w} missing or out of order in {events:?}"
        );
    }
}

#[tokio::test]
async fn start_checks_out_starts_the_agent_and_completes() {
    let e = Env::new(|_| {});
    let id = e.create().await;
    let s = e.state(&id, S::Running).await;
    let (sbx, pid) = ids(&s);
    let sb = e.fake.sandbox(&sbx).unwrap();
    assert_eq!(sb.template, "code-interpreter");
    assert_eq!(sb.metadata.get("hatchery_session"), Some(&id));
    assert!(
        sb.files["/opt/hatchery/base.tar"].len() > 100,
        "the checkout"
    );
    let conf: serde_json::Value =
        serde_json::from_slice(&sb.files["/opt/hatchery/session.json"]).unwrap();
    assert_eq!(conf["task"], "fix the bug");
    let p = &sb.processes[&pid];
    assert_eq!(p.argv[2], "/opt/hatchery/reference_agent.py");
    assert_eq!(p.env["HATCHERY_SESSION_ID"], id);
    in_order(
        &e.events(&id).await,
        &[
            "sandbox_requested",
            "sandbox_ready",
            "repo_fetch_started",
            "repo_checked_out",
            "agent_started",
        ],
    );

    e.fake.emit_line(
        &sbx,
        &pid,
        serde_json::json!({"n": 1, "type": "done", "summary": "fixed"}),
    );
    e.fake.exit(&sbx, &pid, 0);
    let s = e.state(&id, S::Completed).await;
    assert_eq!(s.sandbox_id, None);
    assert!(!e.fake.sandbox(&sbx).unwrap().alive, "released");
    assert_eq!(s.reason.as_deref(), Some("agent finished: fixed"));
}

#[tokio::test]
async fn a_failed_start_fails_the_session_and_deletes_its_sandbox() {
    let e = Env::new(|_| {});
    // The agent's files cannot be written: after the sandbox exists.
    e.fake
        .inject(Fault::on(Op::WriteFile, Effect::Fail("disk full".into())));
    let id = e.create().await;
    let s = e.state(&id, S::Failed).await;
    assert!(
        s.reason
            .as_deref()
            .unwrap_or("")
            .starts_with("sandbox_error"),
        "{:?}",
        s.reason
    );
    assert_eq!(e.fake.all().len(), 1);
    assert!(e.fake.live().is_empty(), "the sandbox was left behind");
}

#[tokio::test]
async fn a_message_steers_the_running_agent() {
    let e = Env::new(|_| {});
    let id = e.create().await;
    let s = e.state(&id, S::Running).await;
    let (sbx, pid) = ids(&s);
    let acc = e.svc.message(&id, "use the other API").await.unwrap();
    e.stdin_has(&sbx, &pid, "use the other API").await;
    let line = String::from_utf8_lossy(&e.fake.stdin(&sbx, &pid)).into_owned();
    let msg: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(msg["type"], "message");
    assert_eq!(msg["seq"], acc.seq);
    e.until(&id, "delivered", |s| s.delivered_seq == acc.seq)
        .await;
}

/// Waiting too long: a snapshot, the sandbox goes, idle; a message forks
/// the snapshot into a new sandbox with the same agent, which gets it.
#[tokio::test]
async fn idle_snapshots_and_a_message_resumes_from_it() {
    let e = Env::new(|c| c.idle_timeout = Duration::from_millis(30));
    let id = e.create().await;
    let s = e.state(&id, S::Running).await;
    let (sbx, pid) = ids(&s);
    e.fake.emit_line(
        &sbx,
        &pid,
        serde_json::json!({"n": 1, "type": "waiting", "waiting_for": "message"}),
    );
    let idle = e.state(&id, S::Idle).await;
    let snap = idle
        .snapshot_id
        .clone()
        .expect("an idle snapshot on record");
    assert_eq!(idle.sandbox_id, None);
    assert!(!e.fake.sandbox(&sbx).unwrap().alive, "the sandbox is freed");
    let taken = e.fake.snapshot_of(&snap).unwrap();
    assert_eq!(taken.source, sbx);
    assert_eq!(taken.metadata["purpose"], "idle");

    e.svc.message(&id, "carry on").await.unwrap();
    let s = e
        .until(&id, "running again", |s| {
            s.state == S::Running && s.sandbox_id.is_some()
        })
        .await;
    let (sbx2, pid2) = ids(&s);
    assert_ne!(sbx2, sbx);
    assert_eq!(pid2, pid, "the same agent, restored");
    assert_eq!(
        e.fake.sandbox(&sbx2).unwrap().forked_from.as_deref(),
        Some(snap.as_str())
    );
    e.stdin_has(&sbx2, &pid, "carry on").await;
    let s = e
        .until(&id, "snapshot cleared", |s| s.snapshot_id.is_none())
        .await;
    assert_eq!(s.state, S::Running);
    for _ in 0..1000 {
        if e.fake.snapshot_of(&snap).unwrap().deleted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(
        e.fake.snapshot_of(&snap).unwrap().deleted,
        "idle snapshot deleted"
    );
    in_order(
        &e.events(&id).await,
        &[
            "snapshot_started",
            "snapshot_taken",
            "sandbox_released",
            "resumed",
        ],
    );
}

#[tokio::test]
async fn cancel_stops_the_agent_keeps_a_review_snapshot_and_releases() {
    let e = Env::new(|_| {});
    let id = e.create().await;
    let s = e.state(&id, S::Running).await;
    let (sbx, pid) = ids(&s);
    let v = e.svc.cancel(&id, Duration::from_secs(5)).await.unwrap();
    assert_eq!(v.state, S::Cancelled);
    let s = e.get(&id).await;
    let sb = e.fake.sandbox(&sbx).unwrap();
    assert!(sb.processes[&pid].killed, "the agent was stopped");
    assert!(!sb.alive, "the sandbox was released");
    let review = s.review_snapshot_id.clone().expect("a review snapshot");
    let snap = e.fake.snapshot_of(&review).unwrap();
    assert_eq!(snap.metadata["purpose"], "review");
    assert!(!snap.deleted);
    assert_eq!(s.sandbox_id, None);
}

#[tokio::test]
async fn cancel_while_idle_keeps_the_idle_snapshot_for_review() {
    let e = Env::new(|c| c.idle_timeout = Duration::from_millis(30));
    let id = e.create().await;
    let s = e.state(&id, S::Running).await;
    let (sbx, pid) = ids(&s);
    e.fake
        .emit_line(&sbx, &pid, serde_json::json!({"n": 1, "type": "waiting"}));
    let idle = e.state(&id, S::Idle).await;
    let forks = e.fake.calls(Op::Fork);
    let v = e.svc.cancel(&id, Duration::from_secs(5)).await.unwrap();
    assert_eq!(v.state, S::Cancelled);
    let s = e.get(&id).await;
    assert_eq!(s.review_snapshot_id, idle.snapshot_id);
    assert_eq!(s.snapshot_id, None);
    assert_eq!(e.fake.calls(Op::Fork), forks, "not resumed to be cancelled");
    assert!(e.fake.live().is_empty());
}

#[tokio::test]
async fn a_lost_sandbox_without_a_checkpoint_fails_the_session() {
    let e = Env::new(|_| {});
    let id = e.create().await;
    let s = e.state(&id, S::Running).await;
    let (sbx, _) = ids(&s);
    e.fake.vanish(&sbx);
    let s = e.state(&id, S::Failed).await;
    assert!(
        s.reason
            .as_deref()
            .unwrap_or("")
            .starts_with("lost_sandbox"),
        "{:?}",
        s.reason
    );
    assert_eq!(e.fake.calls(Op::Fork), 0);
}

/// A session whose agent handled line 1 before a checkpoint and line 2
/// after it, then lost its sandbox and resumed from the checkpoint: the
/// line 2 it then sends is `again` (what the re-run agent asks). Returns
/// the session's id and the new sandbox and process.
async fn resumed_after_line_2(
    e: &Env,
    first: serde_json::Value,
    again: serde_json::Value,
) -> (String, String, String) {
    let id = e.create().await;
    let s = e.state(&id, S::Running).await;
    let (sbx, pid) = ids(&s);
    e.fake.emit_line(
        &sbx,
        &pid,
        serde_json::json!({"n": 1, "type": "agent_message", "text": "before the checkpoint"}),
    );
    // A checkpoint taken after that line was handled (its offset says so).
    let fake = e.fake.clone();
    e.until(&id, "checkpointed", move |s| {
        s.snapshot_id
            .as_deref()
            .and_then(|c| fake.snapshot_of(c))
            .is_some_and(|c| c.metadata["output_offset"] != "0")
    })
    .await;
    // No later checkpoint: line 2 is handled after the last one only.
    e.fake
        .inject(Fault::on(Op::Snapshot, Effect::Fail("disk full".into())).times(1_000_000));
    e.fake.emit_line(&sbx, &pid, first);
    let s = e.until(&id, "line 2 handled", |s| s.agent_seq == 2).await;
    let line2_end = s.output_offset;

    e.fake.vanish(&sbx);
    let s = e
        .until(&id, "resumed elsewhere", |s| {
            s.sandbox_id.as_deref().is_some_and(|x| x != sbx)
        })
        .await;
    assert_eq!(s.state, S::Running);
    let (sbx2, pid2) = ids(&s);
    let forked = e.fake.sandbox(&sbx2).unwrap();
    // Forked from a checkpoint with line 1 in it and line 2 not.
    let snap = e.fake.snapshot_of(&forked.forked_from.unwrap()).unwrap();
    assert_eq!(snap.metadata["purpose"], "checkpoint");
    let at: u64 = snap.metadata["output_offset"].parse().unwrap();
    assert!(at > 0 && at < line2_end, "{at} of {line2_end}");
    // The restored agent is where the checkpoint was: it sends line 2
    // again.
    e.fake.emit_line(&sbx2, &pid2, again);
    (id, sbx2, pid2)
}

/// Lost while running, with a checkpoint: the checkpoint is forked, the
/// runner reads the restored agent again from the checkpoint's offset,
/// and a message the agent repeats (handled after the checkpoint, before
/// the loss) is not recorded twice: it is logged as `replayed`, matching.
#[tokio::test]
async fn a_lost_sandbox_resumes_from_its_checkpoint() {
    let e = Env::new(|c| c.checkpoint_every = Some(Duration::from_millis(20)));
    let line2 =
        serde_json::json!({"n": 2, "type": "agent_message", "text": "after the checkpoint"});
    let (id, sbx2, pid) = resumed_after_line_2(&e, line2.clone(), line2).await;
    e.fake.emit_line(
        &sbx2,
        &pid,
        serde_json::json!({"n": 3, "type": "agent_message", "text": "after the resume"}),
    );
    e.fake
        .emit_line(&sbx2, &pid, serde_json::json!({"n": 4, "type": "done"}));
    e.fake.exit(&sbx2, &pid, 0);
    e.state(&id, S::Completed).await;
    let evs = e.events(&id).await;
    in_order(
        &evs,
        &[
            "agent_message",
            "agent_message",
            "resumed_from_checkpoint",
            "replayed",
            "agent_message",
        ],
    );
    let said = evs.iter().filter(|k| **k == "agent_message").count();
    assert_eq!(said, 3, "each agent message recorded once: {evs:?}");
    let all = e.svc.core.store.events(&id, 0, 10_000).await.unwrap();
    let replayed: Vec<_> = all
        .iter()
        .filter_map(|ev| match &ev.kind {
            EventKind::Replayed { n, matches, .. } => Some((*n, *matches)),
            _ => None,
        })
        .collect();
    assert_eq!(replayed, [(2, Some(true))]);
    assert!(e.fake.live().is_empty());
}

/// The re-run agent asks for another tool call under the number of one
/// it made before the loss (a model that answers differently the second
/// time): logged as `replayed` with `matches: false`, never acknowledged,
/// and the session ends `failed` (`replay_diverged`).
#[tokio::test]
async fn a_rerun_that_asks_for_something_else_ends_the_session() {
    let e = Env::new(|c| c.checkpoint_every = Some(Duration::from_millis(20)));
    let call = |args: &str| {
        serde_json::json!({"n": 2, "ack": true, "type": "tool_call", "call_id": "c1",
                           "tool": "shell", "arguments": args})
    };
    let (id, sbx2, pid) = resumed_after_line_2(
        &e,
        call(r#"{"command":"ls"}"#),
        call(r#"{"command":"curl x"}"#),
    )
    .await;
    let s = e.state(&id, S::Failed).await;
    let reason = s.reason.unwrap_or_default();
    assert!(reason.starts_with("replay_diverged"), "{reason}");
    let all = e.svc.core.store.events(&id, 0, 10_000).await.unwrap();
    assert!(
        all.iter().any(|ev| matches!(&ev.kind,
        EventKind::Replayed { n: 2, matches: Some(false), asked, .. } if asked.contains("curl x")))
    );
    // The new sandbox's agent never got an ack for the different call.
    let sent = String::from_utf8_lossy(&e.fake.stdin(&sbx2, &pid)).to_string();
    let ack = String::from_utf8(crate::agent_proto::ack(2)).unwrap();
    assert!(!sent.contains(ack.trim()), "{sent}");
}

/// The sandbox is deleted just as the runner acks a line (ci's
/// `test_lost_sandbox_resumes_from_checkpoint` saw the stdin write answer
/// 409 `sandbox_not_running`): that is a lost sandbox, resumed from the
/// checkpoint, not a `sandbox_error` that fails the session.
#[tokio::test]
async fn a_sandbox_lost_under_an_ack_resumes_from_its_checkpoint() {
    let e = Env::new(|c| c.checkpoint_every = Some(Duration::from_millis(20)));
    let id = e.create().await;
    let s = e.state(&id, S::Running).await;
    let (sbx, pid) = ids(&s);
    e.until(&id, "checkpointed", |s| s.snapshot_id.is_some())
        .await;
    e.fake
        .inject(Fault::on(Op::WriteStdin, Effect::Vanish).times(1));
    e.fake.emit_line(
        &sbx,
        &pid,
        serde_json::json!({"n": 1, "ack": true, "type": "agent_message", "text": "hi"}),
    );
    let s = e
        .until(&id, "resumed elsewhere", |s| {
            s.sandbox_id.as_deref().is_some_and(|x| x != sbx)
        })
        .await;
    assert_eq!(s.state, S::Running, "{:?}", s.reason);
    let evs = e.events(&id).await;
    in_order(&evs, &["agent_message", "resumed_from_checkpoint"]);
}

/// The agent floods its stdout: the byte cap stores up to it, then one
/// `output_capped` marker, then nothing more of the flood (the offset
/// still moves past every line); the session's view shows the use. A
/// protocol line that waits for its ack after the cap ends the session.
#[tokio::test]
async fn a_flooding_agent_is_cut_at_the_output_cap_with_one_marker() {
    let e = Env::new(|c| {
        c.output.max_bytes = 200_000;
        c.output.max_blob_bytes = 8192;
    });
    let id = e.create().await;
    let s = e.state(&id, S::Running).await;
    let (sbx, pid) = ids(&s);
    let line = "x".repeat(20_000);
    for _ in 0..100 {
        e.fake
            .emit(&sbx, &pid, true, format!("{line}\n").as_bytes());
    }
    let end = e.fake.stdin(&sbx, &pid); // nothing asked yet
    assert!(end.is_empty());
    let last = e
        .until(&id, "every line read", |s| s.output_offset >= 100 * 20_001)
        .await;
    let evs = e.events(&id).await;
    let outputs = evs.iter().filter(|t| **t == "agent_output").count();
    let markers = evs.iter().filter(|t| **t == "output_capped").count();
    assert_eq!(markers, 1, "{evs:?}");
    // Each line keeps an 8 KiB blob: about 12 KiB stored a line.
    assert!((10..=20).contains(&outputs), "{outputs} lines stored");
    let v = e.svc.view(&id).await.unwrap();
    let st = v.storage.unwrap();
    assert!(st.output_bytes <= 200_000, "{}", st.output_bytes);
    assert_eq!(st.caps_reached, vec!["output_bytes".to_string()]);
    assert!(st.blob_bytes <= outputs as u64 * 8192);
    assert_eq!(last.state, S::Running);
    // More flood: still one marker.
    for _ in 0..10 {
        e.fake
            .emit(&sbx, &pid, true, format!("{line}\n").as_bytes());
    }
    e.until(&id, "flood read", |s| s.output_offset >= 110 * 20_001)
        .await;
    let evs = e.events(&id).await;
    assert_eq!(evs.iter().filter(|t| **t == "output_capped").count(), 1);
    // A line that waits for its ack now: the session fails, saying why.
    e.fake.emit_line(
        &sbx,
        &pid,
        serde_json::json!({"n": 1, "ack": true, "type": "tool_call", "call_id": "c", "tool": "shell", "arguments": "{}"}),
    );
    let s = e.state(&id, S::Failed).await;
    assert!(
        s.reason
            .as_deref()
            .unwrap_or("")
            .starts_with("output_capped"),
        "{:?}",
        s.reason
    );
}

/// Past `max_open_approvals` an approval the agent asks for is denied by
/// the system at once (the agent gets the decision), with one marker.
#[tokio::test]
async fn approvals_past_the_cap_are_denied_at_once() {
    let e = Env::new(|c| c.max_open_approvals = 2);
    let id = e.create().await;
    let s = e.state(&id, S::Running).await;
    let (sbx, pid) = ids(&s);
    for n in 1..=4u64 {
        e.fake.emit_line(
            &sbx,
            &pid,
            serde_json::json!({"n": n, "ack": true, "type": "approval_request", "action": format!("a{n}")}),
        );
        e.stdin_has(&sbx, &pid, &format!("\"n\":{n}")).await;
    }
    let u = e.svc.core.store.usage(&id).await.unwrap();
    assert_eq!(u.open_approvals, 2, "N open, N+1 refused");
    e.stdin_has(&sbx, &pid, "session_approval_cap").await;
    let evs = e.events(&id).await;
    assert_eq!(evs.iter().filter(|t| **t == "output_capped").count(), 1);
    assert_eq!(evs.iter().filter(|t| **t == "approval_decided").count(), 2);
    // A second approval while one is open no longer fails the session.
    assert_eq!(e.get(&id).await.state, S::WaitingApproval);
}

/// Where a shedding host's sessions go, fixed for the test.
struct To(Option<&'static str>);

#[async_trait::async_trait]
impl crate::handoff::HandoffTargets for To {
    async fn pick(&self) -> Option<String> {
        self.0.map(String::from)
    }
}

/// A drained or stopping host hands a running session over: a fresh
/// checkpoint, its sandbox let go (said first), then the move in the
/// store (`host_changed`), after which this host's runner stops. With no
/// host to take it, it stays and keeps running.
#[tokio::test]
async fn a_shedding_host_checkpoints_releases_and_hands_a_running_session_over() {
    use crate::handoff::ShedReason;
    let e = Env::new(|_| {});
    let id = e.create().await;
    let s = e.state(&id, S::Running).await;
    let (sbx, _) = ids(&s);

    // Nowhere to go: nothing moves, the agent keeps its sandbox.
    e.svc.shed(Arc::new(To(None)), ShedReason::HostDraining);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let s = e.get(&id).await;
    assert_eq!(
        (s.host_id.as_str(), s.state),
        (e.svc.core.store.host_id(), S::Running)
    );
    assert_eq!(e.fake.live(), vec![sbx.clone()]);

    e.svc
        .shed(Arc::new(To(Some("host-b"))), ShedReason::HostStopping);
    let s = e.until(&id, "handed over", |s| s.host_id == "host-b").await;
    assert_eq!((s.state, s.epoch), (S::Running, 2));
    let ckpt = s.snapshot_id.clone().expect("a checkpoint to resume from");
    assert_eq!(
        e.fake.snapshot_of(&ckpt).unwrap().metadata["purpose"],
        "checkpoint"
    );
    let evs = e.events(&id).await;
    in_order(
        &evs,
        &["snapshot_taken", "sandbox_released", "host_changed"],
    );
    assert_eq!(evs.last(), Some(&"host_changed"));
    // Its sandbox is gone (the new owner resumes from the checkpoint) and
    // this host adopts nothing while it sheds.
    assert!(e.fake.live().is_empty());
    // Counted just after the hand-over commits (which `until` saw).
    for _ in 0..100 {
        if e.svc.metrics().handed_over.get() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(e.svc.metrics().handed_over.get(), 1);
    assert_eq!(e.svc.adopt().await.unwrap(), 0);
    assert_eq!(e.svc.owned().await.unwrap(), 0);
}

mod egress_approvals;
mod model_call_approvals;
mod replay_policy;
mod tenant;
