//! `git_push` through the broker with the sandbox faked
//! ([`crate::sandbox::fake`]): the session is a real one of
//! `hatchery-sessions` (its own in-memory sandboxes, SQLite in a tempdir),
//! the remote a local bare repository, the broker's record SQLite in the
//! same tempdir. Planning (the export of the work tree from the sandbox)
//! failing or cut off, and calls a dead process left `executing`.

use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::git::tests::sh;
use crate::sandbox::fake::{Effect, FakeSandboxes, Fault, Files, Op};
use crate::sandbox::Exec;
use crate::service::{session_branch, Broker};
use crate::store::{BrokerStore, Call, CallState, Recorded};
use crate::wire::InvokeRequest;
use hatchery_sessions::sandbox::fake::FakeSandboxes as SessionSandboxes;
use hatchery_sessions::state::SessionState;
use hatchery_sessions::store::SessionStore;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

struct Env {
    dir: tempfile::TempDir,
    policies: Arc<hatchery_policy::DbPolicyStore>,
    sessions: Arc<hatchery_sessions::Sessions>,
    store: Arc<dyn SessionStore>,
    fake: Arc<FakeSandboxes>,
    session: String,
    sandbox: String,
    remote: String,
}

fn git_out(dir: &Path, args: &[&str]) -> String {
    let o = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// What `export_tree.py` writes: the files under /workspace as a tree
/// stream (`replace`, then one `file` record each).
fn export(argv: &[String], files: &mut Files) -> Exec {
    let ws: Vec<(String, Vec<u8>)> = files
        .iter()
        .filter_map(|(p, d)| Some((p.strip_prefix("/workspace/")?.to_string(), d.clone())))
        .collect();
    let recs: Vec<(&str, &[u8], &[u8])> = ws
        .iter()
        .map(|(p, d)| ("100644", p.as_bytes(), d.as_slice()))
        .collect();
    files.insert(argv[3].clone(), crate::tree::tests::stream(&recs));
    Exec {
        exit_code: 0,
        stdout: String::new(),
        stderr: String::new(),
    }
}

fn is_export(argv: &[String]) -> bool {
    argv.get(1).is_some_and(|a| a.ends_with("export_tree.py"))
}

/// Resolves one stored policy (and `pol_standard`) for sessions made here.
struct Catalog(String);

#[async_trait::async_trait]
impl hatchery_sessions::policy::PolicyCatalog for Catalog {
    async fn resolve(&self, id: &str) -> Option<hatchery_sessions::policy::PolicyRef> {
        (id == self.0 || id == "pol_standard").then(|| hatchery_sessions::policy::PolicyRef {
            id: id.to_string(),
            version: 1,
            tenant: None,
            builtin: id == "pol_standard",
        })
    }
}

impl Env {
    async fn new() -> Env {
        Env::with_policy(None).await
    }

    /// A session pinned to `policy` (stored in the brokers' policy
    /// store), or to `pol_standard`.
    async fn with_policy(policy: Option<serde_json::Value>) -> Env {
        use hatchery_policy::PolicyStore;
        let policies = Arc::new(hatchery_policy::DbPolicyStore::scratch().await.unwrap());
        let policy_id = match policy {
            Some(doc) => {
                policies
                    .create(serde_json::from_value(doc).unwrap(), None)
                    .await
                    .unwrap()
                    .id
            }
            None => "pol_standard".to_string(),
        };
        let dir = tempfile::tempdir().unwrap();
        sh(
            dir.path(),
            "git init -q --bare -b main remote.git && git init -q -b main w && cd w \
             && echo base > README && git add README && git commit -qm base \
             && git push -q ../remote.git main",
        );
        let remote = format!("file://{}/remote.git", dir.path().display());
        let cfg = hatchery_sessions::SessionsConfig {
            file_repo_roots: vec![dir.path().to_path_buf()],
            ..Default::default()
        };
        let sfake = SessionSandboxes::new();
        sfake.add_template("code-interpreter");
        let store: Arc<dyn SessionStore> = Arc::new(
            hatchery_sessions::store::SqliteStore::open(&dir.path().join("hatchery.db")).unwrap(),
        );
        let sessions = hatchery_sessions::Sessions::new(
            store.clone(),
            cfg,
            Arc::new(Catalog(policy_id.clone())),
            Arc::new(sfake),
            Arc::new(hatchery_sessions::scheduler::LocalScheduler::new(2)),
        );
        let body = serde_json::from_value(
            serde_json::json!({"repo": remote, "task": "t", "policy_id": policy_id}),
        )
        .unwrap();
        let session = sessions.create(body, None).await.unwrap().0.session_id;
        let mut sandbox = None;
        for _ in 0..5000 {
            let s = store.get(&session).await.unwrap();
            if s.state == SessionState::Running {
                sandbox = s.sandbox_id;
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let sandbox = sandbox.expect("the session runs");
        let fake = Arc::new(FakeSandboxes::new());
        fake.add(
            &sandbox,
            Files::from([("/workspace/app.py".to_string(), b"print(1)\n".to_vec())]),
        );
        fake.on_exec(is_export, export);
        fake.on_exec(
            |a| a.first().is_some_and(|c| c == "rm"),
            |a, files| {
                for p in a.iter().skip(1).filter(|p| !p.starts_with('-')) {
                    files.remove(p);
                }
                Exec {
                    exit_code: 0,
                    stdout: String::new(),
                    stderr: String::new(),
                }
            },
        );
        Env {
            dir,
            policies,
            sessions,
            store,
            fake,
            session,
            sandbox,
            remote,
        }
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("hatchery.db")
    }

    /// A broker process on the shared record.
    async fn broker(&self) -> Arc<Broker> {
        self.broker_with(|_| {}).await
    }

    /// A broker whose config `f` changed first.
    async fn broker_with(&self, f: impl FnOnce(&mut BrokerConfig)) -> Arc<Broker> {
        let policies = self.policies.clone();
        let mut cfg = BrokerConfig {
            guest_port: 0,
            push_rewrites: vec![],
            git_credential_file: None,
            git_credential_hosts: vec![],
            github_api: None,
            github_token_file: None,
            trust: Default::default(),
            mcp: Arc::new(crate::mcp::McpHub::new(vec![])),
            caps: Default::default(),
            scratch: crate::git::scratch_root(self.dir.path()).unwrap(),
        };
        f(&mut cfg);
        Broker::new(
            BrokerStore::open(hatchery_db::Db::sqlite(&self.db()).await.unwrap())
                .await
                .unwrap(),
            Arc::new(crate::session_log::Local(self.sessions.clone())),
            hatchery_policy::cache::CompiledPolicies::new(policies),
            self.fake.clone(),
            cfg,
        )
    }

    fn push(&self, seq: u64) -> InvokeRequest {
        InvokeRequest {
            seq,
            tool: "git_push".into(),
            args: serde_json::json!({"branch": session_branch(&self.session), "message": "work"}),
        }
    }

    fn tip(&self) -> String {
        git_out(
            &self.dir.path().join("remote.git"),
            &[
                "rev-parse",
                "--verify",
                "-q",
                &format!("refs/heads/{}", session_branch(&self.session)),
            ],
        )
    }

    fn exports(&self) -> usize {
        self.fake
            .execs()
            .iter()
            .filter(|(_, a)| is_export(a))
            .count()
    }
}

#[tokio::test]
async fn git_push_commits_the_sandbox_tree_once() {
    let e = Env::new().await;
    let b = e.broker().await;
    let r = b.invoke(&e.sandbox, e.push(1)).await.unwrap();
    assert_eq!(r.status, "done", "{:?}", r.output);
    let commit = r.output["commit"].as_str().unwrap().to_string();
    assert_eq!(e.tip(), commit);
    let remote = e.dir.path().join("remote.git");
    assert_eq!(
        git_out(&remote, &["show", &format!("{commit}:app.py")]),
        "print(1)"
    );
    assert_eq!(
        git_out(&remote, &["rev-parse", &format!("{commit}^")]),
        git_out(&remote, &["rev-parse", "main"])
    );
    // The export's output file is removed from the sandbox afterwards.
    let files = e.fake.files(&e.sandbox);
    let left: Vec<&String> = files.keys().collect();
    assert!(
        !left.iter().any(|p| p.starts_with("/tmp/hatchery-push-")),
        "{left:?}"
    );
    // A retry is answered from the record: no second export, no push.
    let again = b.invoke(&e.sandbox, e.push(1)).await.unwrap();
    assert_eq!(again, r);
    assert_eq!(e.exports(), 1);
    // The row names the events it committed with, each written once:
    // `broker_call` and `broker_effect_started` with the move to
    // `executing`, `broker_result` with the move to `done`.
    let row = b.store().get(&e.session, 1).await.unwrap().unwrap();
    let evs = e.store.events(&e.session, 0, 1000).await.unwrap();
    let of = |t: &str| {
        evs.iter()
            .filter(|x| x.kind.type_name() == t)
            .map(|x| x.seq)
            .collect::<Vec<_>>()
    };
    assert_eq!(of("broker_call"), vec![row.event_seq.unwrap()]);
    assert_eq!(of("broker_result"), vec![row.result_event_seq.unwrap()]);
    assert_eq!(
        of("broker_effect_started"),
        vec![row.event_seq.unwrap() + 1]
    );
}

/// A call decided at once (effect-free, denied) is one commit: its row
/// with its `broker_call` and `broker_result` events.
#[tokio::test]
async fn a_call_decided_at_once_commits_with_its_events() {
    let e = Env::new().await;
    let b = e.broker().await;
    let before = e.store.get(&e.session).await.unwrap().last_seq;
    let noop = InvokeRequest {
        seq: 5,
        tool: "noop".into(),
        args: serde_json::json!({}),
    };
    let r = b.invoke(&e.sandbox, noop.clone()).await.unwrap();
    // The session's standard policy has no rule for it: denied.
    assert_eq!(r.status, "denied");
    let row = b.store().get(&e.session, 5).await.unwrap().unwrap();
    assert_eq!(
        (row.event_seq, row.result_event_seq),
        (Some(before + 1), Some(before + 2))
    );
    let evs = e.store.events(&e.session, before, 100).await.unwrap();
    let types: Vec<&str> = evs.iter().map(|x| x.kind.type_name()).collect();
    assert_eq!(types, ["broker_call", "broker_result"]);
    // Asked again: answered from the row, nothing written.
    assert_eq!(b.invoke(&e.sandbox, noop).await.unwrap(), r);
    assert_eq!(e.store.get(&e.session).await.unwrap().last_seq, before + 2);
}

/// Each sandbox step of the plan failing or losing the sandbox: nothing is
/// pushed, nothing of the call is recorded (a push is planned before it
/// is decided, to be measured; 503, the agent asks again), and the retry
/// pushes once.
#[tokio::test]
async fn a_sandbox_failing_during_the_plan_leaves_no_effect_and_the_retry_pushes() {
    for (what, fault) in [
        (
            "writing the script",
            Fault::on(Op::WriteFile, Effect::Fail("busy".into())),
        ),
        (
            "running the export",
            Fault::on(Op::Exec, Effect::Fail("connection reset".into())),
        ),
        (
            "reading the tree",
            Fault::on(Op::ReadFile, Effect::Fail("timeout".into())),
        ),
    ] {
        let e = Env::new().await;
        e.fake.inject(fault);
        let b = e.broker().await;
        let err = b.invoke(&e.sandbox, e.push(1)).await.unwrap_err();
        assert!(
            matches!(err, BrokerError::Unavailable(_)),
            "{what}: {err:?}"
        );
        assert_eq!(e.tip(), "", "{what}: pushed");
        assert_eq!(b.store().get(&e.session, 1).await.unwrap(), None, "{what}");
        let r = b.invoke(&e.sandbox, e.push(1)).await.unwrap();
        assert_eq!(r.status, "done", "{what}: {:?}", r.output);
        assert_eq!(e.tip(), r.output["commit"].as_str().unwrap(), "{what}");
    }
}

#[tokio::test]
async fn a_sandbox_lost_during_the_plan_leaves_no_effect() {
    let e = Env::new().await;
    e.fake.inject(Fault::on(Op::ReadFile, Effect::Vanish));
    let b = e.broker().await;
    let err = b.invoke(&e.sandbox, e.push(1)).await.unwrap_err();
    assert!(matches!(err, BrokerError::Unavailable(_)), "{err:?}");
    assert_eq!(e.tip(), "");
    assert_eq!(b.store().get(&e.session, 1).await.unwrap(), None);
}

#[tokio::test]
async fn an_export_that_fails_in_the_sandbox_fails_the_call_for_good() {
    let e = Env::new().await;
    e.fake.on_exec(is_export, |_, _| Exec {
        exit_code: 1,
        stdout: String::new(),
        stderr: "work tree over 64 MiB".into(),
    });
    let b = e.broker().await;
    let r = b.invoke(&e.sandbox, e.push(1)).await.unwrap();
    assert_eq!(r.status, "failed");
    assert!(r.output["error"]
        .as_str()
        .unwrap()
        .contains("work tree over 64 MiB"));
    assert_eq!(e.tip(), "");
    // Failed before any effect: the retry is the same answer, not a new try.
    assert_eq!(b.invoke(&e.sandbox, e.push(1)).await.unwrap(), r);
    assert_eq!(e.exports(), 1);
}

/// A tree stream that is not the grammar's (here the injection of issue
/// 31: after a valid record, the sandbox opens its own commit with
/// another author and merges history of its own) fails the call before
/// anything reaches the remote, with a code the agent can read, and the
/// refusal is in the session's log (`broker_call`, then `broker_result`
/// with the reason).
#[tokio::test]
async fn a_tree_stream_that_opens_its_own_commit_is_refused_and_logged() {
    let e = Env::new().await;
    e.fake.on_exec(is_export, |argv, files| {
        let mut s = crate::tree::tests::stream(&[("100644", b"app.py", b"x\n")]);
        s.truncate(s.len() - b"end\n".len());
        s.extend_from_slice(
            b"commit refs/hatchery/push\nauthor Evil <e@x> 0 +0000\ncommitter Evil <e@x> 0 +0000\n\
              data 5\nowned\nmerge :1\nend\n",
        );
        files.insert(argv[3].clone(), s);
        Exec {
            exit_code: 0,
            stdout: String::new(),
            stderr: String::new(),
        }
    });
    let b = e.broker().await;
    let r = b.invoke(&e.sandbox, e.push(1)).await.unwrap();
    assert_eq!(r.status, "failed", "{:?}", r.output);
    assert_eq!(r.output["code"], "tree_stream_refused", "{:?}", r.output);
    let msg = r.output["error"].as_str().unwrap();
    assert!(
        msg.contains("`commit` at byte") && msg.contains("host writes the commit"),
        "{msg}"
    );
    assert_eq!(e.tip(), "");
    let c = b.store().get(&e.session, 1).await.unwrap().unwrap();
    assert_eq!((c.state, c.effect), (CallState::Failed, None));
    let evs = e.store.events(&e.session, 0, 10_000).await.unwrap();
    let kinds: Vec<&str> = evs
        .iter()
        .map(|e| e.kind.type_name())
        .filter(|k| k.starts_with("broker_"))
        .collect();
    assert_eq!(kinds, ["broker_call", "broker_result"]);
    let logged = evs
        .iter()
        .find_map(|e| match &e.kind {
            hatchery_sessions::events::EventKind::BrokerResult { status, output, .. } => {
                Some((status.clone(), output.clone()))
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(logged.0, "failed");
    assert!(logged.1.contains("tree_stream_refused"), "{}", logged.1);
    // Refused for good: the retry is the same answer, no second export.
    assert_eq!(b.invoke(&e.sandbox, e.push(1)).await.unwrap(), r);
    assert_eq!(e.exports(), 1);
}

/// The broker process stops while it plans (here: while it reads the tree
/// out of the sandbox). A new process's retry plans again and pushes once.
#[tokio::test]
async fn a_crash_during_the_plan_is_planned_again_by_the_next_process() {
    let e = Env::new().await;
    e.fake.inject(Fault::on(Op::ReadFile, Effect::Hang));
    let first = e.broker().await;
    let (sbx, req) = (e.sandbox.clone(), e.push(1));
    let task = tokio::spawn(async move { first.invoke(&sbx, req).await });
    while e.fake.hung() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    task.abort();
    let _ = task.await;
    let next = e.broker().await;
    let r = next.invoke(&e.sandbox, e.push(1)).await.unwrap();
    assert_eq!(r.status, "done", "{:?}", r.output);
    assert_eq!(e.tip(), r.output["commit"].as_str().unwrap());
    assert_eq!(e.exports(), 2, "planned twice, pushed once");
}

/// A call a dead process left `executing` (its effect recorded, its
/// runner's heartbeat gone): `recover` asks the remote. At the recorded
/// commit: done. Anywhere else: needs_review, never pushed again, until an
/// operator resolves it.
#[tokio::test]
async fn calls_left_executing_are_resolved_against_the_remote_or_marked_for_review() {
    let e = Env::new().await;
    let b = e.broker().await;
    let first = b.invoke(&e.sandbox, e.push(1)).await.unwrap();
    let commit = first.output["commit"].as_str().unwrap().to_string();
    let branch = session_branch(&e.session);
    let left = |seq: u64, commit: &str| {
        let store = b.store();
        let (session, branch, remote) = (e.session.clone(), branch.clone(), e.remote.clone());
        let commit = commit.to_string();
        async move {
            let mut c = Call::new(
                &session,
                seq,
                1,
                "git_push",
                "{}".into(),
                format!("sha{seq}"),
            );
            c.decision = "allow".into();
            c.state = CallState::Pending;
            store.begin(c).await.unwrap();
            let effect = serde_json::json!({"remote": remote, "branch": branch, "commit": commit, "parent": "p"});
            store
                .advance_recorded(
                    &session,
                    seq,
                    CallState::Pending,
                    CallState::Executing,
                    Recorded {
                        effect: Some(effect.to_string()),
                        runner: Some("brn_gone".into()),
                        ..Recorded::default()
                    },
                )
                .await
                .unwrap()
                .unwrap();
        }
    };
    left(2, &commit).await;
    left(3, "0000000000000000000000000000000000000000").await;
    let next = e.broker().await;
    assert_eq!(next.recover().await.unwrap(), 2);
    let done = next.store().get(&e.session, 2).await.unwrap().unwrap();
    assert_eq!(done.state, CallState::Done);
    let out: serde_json::Value = serde_json::from_str(done.output.as_deref().unwrap()).unwrap();
    assert_eq!(out["recovered"], true);
    let review = next.store().get(&e.session, 3).await.unwrap().unwrap();
    assert_eq!(review.state, CallState::NeedsReview);
    assert!(
        review.result_event_seq.is_some(),
        "the result is in the session's log"
    );
    assert_eq!(e.tip(), commit, "not pushed again");
    assert_eq!(next.recover().await.unwrap(), 0, "resolved once");

    let resolved = next
        .resolve_review(&e.session, 3, CallState::Failed, "checked: not pushed")
        .await
        .unwrap();
    assert_eq!(resolved.state, CallState::Failed);
    let err = next
        .resolve_review(&e.session, 3, CallState::Done, "changed my mind")
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::NotNeedsReview(_)), "{err:?}");
    let err = next
        .resolve_review(&e.session, 2, CallState::Failed, "")
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::NotNeedsReview(_)), "{err:?}");
}

/// The agent retries a call its broker process left `executing` (the
/// process died mid-push, or after the push before the result): the retry
/// resolves it against the remote and is never run again; one the remote
/// cannot confirm is needs_review, and after an operator resolves it the
/// retry answers the resolution.
#[tokio::test]
async fn an_agent_retry_of_a_call_left_executing_is_resolved_not_run_again() {
    let e = Env::new().await;
    let b = e.broker().await;
    b.invoke(&e.sandbox, e.push(1)).await.unwrap();
    let done = b.store().get(&e.session, 1).await.unwrap().unwrap();
    let effect: serde_json::Value = serde_json::from_str(done.effect.as_deref().unwrap()).unwrap();
    // Rows for seqs 2 and 3 with the same arguments, as the dead process
    // left them: the plan recorded, no result.
    let left = |seq: u64, commit: &str| {
        let mut c = done.clone();
        c.seq = seq;
        c.state = CallState::Pending;
        c.effect = None;
        c.output = None;
        c.event_seq = None;
        c.result_event_seq = None;
        c.runner = None;
        let mut effect = effect.clone();
        effect["commit"] = commit.into();
        let store = b.store();
        let session = e.session.clone();
        async move {
            store.begin(c).await.unwrap();
            store
                .advance_recorded(
                    &session,
                    seq,
                    CallState::Pending,
                    CallState::Executing,
                    Recorded {
                        effect: Some(effect.to_string()),
                        runner: Some("brn_gone".into()),
                        ..Recorded::default()
                    },
                )
                .await
                .unwrap()
                .unwrap();
        }
    };
    let pushed = effect["commit"].as_str().unwrap().to_string();
    left(2, &pushed).await;
    left(3, "0000000000000000000000000000000000000000").await;

    let next = e.broker().await;
    let r = next.invoke(&e.sandbox, e.push(2)).await.unwrap();
    assert_eq!(r.status, "done", "{:?}", r.output);
    assert_eq!(r.output["recovered"], true);
    let r = next.invoke(&e.sandbox, e.push(3)).await.unwrap();
    assert_eq!(r.status, "needs_review", "{:?}", r.output);
    assert_eq!(e.exports(), 1, "nothing planned again");
    assert_eq!(e.tip(), pushed, "nothing pushed again");
    // Asked again before anyone looked: the same answer, still not run.
    assert_eq!(next.invoke(&e.sandbox, e.push(3)).await.unwrap(), r);

    next.resolve_review(&e.session, 3, CallState::Done, "pushed by hand")
        .await
        .unwrap();
    let r = next.invoke(&e.sandbox, e.push(3)).await.unwrap();
    assert_eq!(r.status, "done", "{:?}", r.output);
    assert_eq!(e.exports(), 1);
}

/// One HTTP/1.1 request to the guest router on its Unix socket; the
/// status and the JSON body.
async fn over_socket(
    sock: &Path,
    method: &str,
    path: &str,
    sandbox: Option<&str>,
    body: &str,
) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::UnixStream::connect(sock).await.unwrap();
    let id = sandbox
        .map(|s| format!("x-hatchery-sandbox: {s}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: broker\r\n{id}content-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    let status = text[9..12].parse().unwrap();
    let (_, body) = text.split_once("\r\n\r\n").unwrap();
    (status, serde_json::from_str(body).unwrap_or_default())
}

/// `GET /v1/tools` answers only a running session's sandbox: without an
/// identity, or from a sandbox of no session, it is refused exactly as
/// `/v1/invoke` is (403 `unknown_sandbox`, the broker's error shape).
#[tokio::test]
async fn the_tool_list_needs_a_session_identity() {
    let e = Env::new().await;
    let b = e.broker().await;
    let sock = e.dir.path().join("broker.sock");
    tokio::spawn(crate::routes::serve_socket(b, sock.clone()));
    for _ in 0..5000 {
        if tokio::net::UnixStream::connect(&sock).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let call = serde_json::json!({"seq": 1, "tool": "noop", "args": {}}).to_string();
    for who in [None, Some("sbx_of_no_session")] {
        let (st, v) = over_socket(&sock, "GET", "/v1/tools", who, "").await;
        assert_eq!(st, 403, "{who:?}: {v}");
        assert_eq!(v["error"]["code"], "unknown_sandbox", "{who:?}: {v}");
        assert!(v.get("tools").is_none(), "{v}");
        let (ist, iv) = over_socket(&sock, "POST", "/v1/invoke", who, &call).await;
        assert_eq!((ist, &iv["error"]["code"]), (st, &v["error"]["code"]));
    }
    let (st, v) = over_socket(&sock, "GET", "/v1/tools", Some(&e.sandbox), "").await;
    assert_eq!(st, 200, "{v}");
    let names: Vec<&str> = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"git_push"), "{names:?}");
}

/// Issue 36: the docs' big-diff rule ahead of the session's own branch.
fn big_diff_policy() -> serde_json::Value {
    serde_json::json!({"name": "diff-test", "rules": [
        {"id": "huge-diff", "effect": "deny",
         "match": {"tools": ["git_push"], "args": [{"field": "diff.lines", "op": "gt", "value": 2000}]}},
        {"id": "big-diff", "effect": "require_approval",
         "match": {"tools": ["git_push"], "args": [{"field": "diff.lines", "op": "gt", "value": 500}]}},
        {"id": "push-session-branch", "effect": "allow",
         "match": {"tools": ["git_push"], "args": [{"field": "branch", "op": "eq", "value": {"ctx": "session_branch"}}]}}
    ]})
}

fn lines(n: usize) -> Vec<u8> {
    (1..=n)
        .map(|i| format!("{i}\n"))
        .collect::<String>()
        .into_bytes()
}

impl Env {
    async fn put(&self, path: &str, data: Vec<u8>) {
        use crate::sandbox::SandboxAccess;
        self.fake
            .write_file(&self.sandbox, &format!("/workspace/{path}"), data)
            .await
            .unwrap();
    }

    /// A push whose agent claims a diff of its own.
    fn push_claiming(&self, seq: u64, claimed: u64) -> InvokeRequest {
        let mut r = self.push(seq);
        r.args["diff"] = serde_json::json!({"lines": claimed, "files": 1});
        r
    }
}

/// The policy's `diff.lines` is the size of the commit the host built
/// (against the session's base, for a new branch), whatever the agent
/// claims: 800 real lines claimed as 10 ask for the approval of rule
/// big-diff, and nothing is pushed; the call's record shows the host's
/// count. A 10-line push claimed as 9999 is allowed, and the event logged
/// before the push records the host's size. Fails on a broker that lets
/// the agent's `diff` through (the first call would be allowed).
#[tokio::test]
async fn the_policy_sees_the_diff_measured_on_the_host() {
    let e = Env::with_policy(Some(big_diff_policy())).await;
    e.put("big.txt", lines(800)).await;
    let b = e.broker().await;
    let r = b.invoke(&e.sandbox, e.push_claiming(1, 10)).await.unwrap();
    assert_eq!(
        (r.status.as_str(), r.rule_id.as_deref()),
        ("awaiting_approval", Some("big-diff")),
        "{r:?}"
    );
    assert_eq!(e.tip(), "");
    let row = b.store().get(&e.session, 1).await.unwrap().unwrap();
    let effect: serde_json::Value = serde_json::from_str(row.effect.as_deref().unwrap()).unwrap();
    // The fake's export replaces the tree: app.py (1 line) and big.txt
    // (800) added, the base's README (1 line) removed.
    assert_eq!(
        effect["diff"],
        serde_json::json!({"files": 3, "lines_added": 801, "lines_removed": 1, "lines": 802})
    );
    assert_eq!(b.metrics().agent_diff_ignored.get(), 1);

    // A small push, claimed huge: allowed, on the host's count.
    let e = Env::with_policy(Some(big_diff_policy())).await;
    e.put("small.txt", lines(9)).await;
    let b = e.broker().await;
    let r = b
        .invoke(&e.sandbox, e.push_claiming(1, 9999))
        .await
        .unwrap();
    assert_eq!(
        (r.status.as_str(), r.rule_id.as_deref()),
        ("done", Some("push-session-branch")),
        "{r:?}"
    );
    assert_eq!(e.tip(), r.output["commit"].as_str().unwrap());
    let evs = e.store.events(&e.session, 0, 1000).await.unwrap();
    let started = evs
        .iter()
        .find_map(|x| match &x.kind {
            hatchery_sessions::events::EventKind::BrokerEffectStarted { detail, .. } => {
                Some(serde_json::from_str::<serde_json::Value>(detail).unwrap())
            }
            _ => None,
        })
        .expect("broker_effect_started");
    assert_eq!(started["diff"]["lines"], 11, "{started}");
    assert_eq!(started["diff"]["files"], 3, "{started}");
    assert_eq!(started["commit"], r.output["commit"]);
    // Measured once: the commit measured is the commit pushed.
    assert_eq!(e.exports(), 1);
}

/// A push whose tree grows after its approval is measured again when it
/// runs: the policy now denies it (rule huge-diff), so it fails with
/// `push_not_allowed_as_measured` and nothing is pushed.
#[tokio::test]
async fn an_approved_push_is_measured_again_when_it_runs() {
    let e = Env::with_policy(Some(big_diff_policy())).await;
    e.put("big.txt", lines(800)).await;
    let b = e.broker().await;
    let r = b.invoke(&e.sandbox, e.push(1)).await.unwrap();
    assert_eq!(r.status, "awaiting_approval", "{r:?}");
    let aid = r.approval_id.clone().unwrap();
    e.sessions
        .decide(
            &e.session,
            &aid,
            &hatchery_sessions::models::ApprovalBody {
                decision: "approve".into(),
                note: String::new(),
                remember: None,
            },
        )
        .await
        .unwrap();
    e.put("big.txt", lines(3000)).await;
    let r = b.invoke(&e.sandbox, e.push(1)).await.unwrap();
    assert_eq!(r.status, "failed", "{r:?}");
    assert_eq!(r.output["code"], "push_not_allowed_as_measured", "{r:?}");
    let msg = r.output["error"].as_str().unwrap();
    assert!(msg.contains("+3001") && msg.contains("huge-diff"), "{msg}");
    assert_eq!(e.tip(), "");
}

/// Measuring failing (git failing, here through the sizer) refuses the
/// push with `diff_unavailable`: never allowed at an unknown size, and
/// nothing reaches the remote. A push the policy denies anyway is denied.
#[tokio::test]
async fn a_push_that_cannot_be_measured_is_refused() {
    struct Broken;
    #[async_trait::async_trait]
    impl crate::diffstat::DiffSizer for Broken {
        async fn size(
            &self,
            _: &crate::git::Scratch,
            _: &str,
            _: &str,
        ) -> Result<crate::diffstat::DiffSize, crate::diffstat::DiffError> {
            Err(crate::diffstat::DiffError::Git(crate::git::GitError::Git {
                step: "diff",
                stderr: "fatal: bad object".into(),
            }))
        }
    }
    let e = Env::new().await;
    let b = e.broker().await;
    b.set_diff_sizer(Arc::new(Broken));
    let r = b.invoke(&e.sandbox, e.push(1)).await.unwrap();
    assert_eq!(r.status, "failed", "{r:?}");
    assert_eq!(r.output["code"], "diff_unavailable", "{r:?}");
    assert!(
        r.output["error"].as_str().unwrap().contains("bad object"),
        "{r:?}"
    );
    assert_eq!(e.tip(), "");
    let mut main = e.push(2);
    main.args["branch"] = "main".into();
    let r = b.invoke(&e.sandbox, main).await.unwrap();
    assert_eq!(
        (r.status.as_str(), r.rule_id.as_deref()),
        ("denied", Some("push-protected"))
    );
}

/// A sandbox the session has replaced (a resume on another sandbox, a
/// takeover) is fenced: its calls, new or repeated, are refused 409
/// `fenced` over the guest socket and nothing is recorded for them, while
/// the session's current sandbox is served.
#[tokio::test]
async fn a_replaced_sandbox_is_fenced() {
    let e = Env::new().await;
    let b = e.broker().await;
    let noop = |seq| InvokeRequest {
        seq,
        tool: "noop".into(),
        args: serde_json::json!({}),
    };
    // The old sandbox has called: the record knows its epoch.
    b.invoke(&e.sandbox, noop(1)).await.unwrap();
    let replacement = format!("{}_next", e.sandbox);
    let p = hatchery_sessions::store::Patch {
        sandbox_id: Some(Some(replacement.clone())),
        ..Default::default()
    };
    e.store.append(&e.session, vec![], p).await.unwrap();

    let sock = e.dir.path().join("broker.sock");
    tokio::spawn(crate::routes::serve_socket(b.clone(), sock.clone()));
    for _ in 0..5000 {
        if tokio::net::UnixStream::connect(&sock).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for seq in [1, 2] {
        let call = serde_json::json!({"seq": seq, "tool": "noop", "args": {}}).to_string();
        let (st, v) = over_socket(&sock, "POST", "/v1/invoke", Some(&e.sandbox), &call).await;
        assert_eq!(
            (st, v["error"]["code"].as_str()),
            (409, Some("fenced")),
            "{v}"
        );
    }
    assert!(b.store().get(&e.session, 2).await.unwrap().is_none());
    assert!(matches!(
        b.caller(&e.sandbox).await,
        Err(BrokerError::Fenced(_))
    ));
    let current = b.caller(&replacement).await.unwrap();
    assert_eq!(current.id, e.session);
}

/// Issue 36: a tenant names its session's repository, so its push gets
/// the write credential only on a `--broker-git-credential-host`; the
/// operator's session gets it wherever it pushes.
#[tokio::test]
async fn a_tenant_s_push_gets_the_credential_only_on_a_listed_host() {
    let e = Env::new().await;
    let cred = e.dir.path().join("push-credential");
    std::fs::write(&cred, "Authorization: Bearer operator-secret\n").unwrap();
    let b = e
        .broker_with(|c| {
            c.git_credential_file = Some(cred);
            c.git_credential_hosts = vec!["git.corp.example".into()];
        })
        .await;
    let mut s = e.store.get(&e.session).await.unwrap();
    let header = |s: &hatchery_sessions::store::Session| b.remote(s).unwrap().header;
    let want = Some("Authorization: Bearer operator-secret".to_string());
    for (repo, tenant, sent) in [
        ("https://evil.example/r.git", None, true),
        ("https://evil.example/r.git", Some("ten_a"), false),
        (
            "https://git.corp.example.evil.example/r.git",
            Some("ten_a"),
            false,
        ),
        ("https://git.corp.example/r.git", Some("ten_a"), true),
    ] {
        s.spec.repo = repo.into();
        s.spec.tenant = tenant.map(str::to_string);
        let got = header(&s);
        assert_eq!(got.is_some(), sent, "{repo} {tenant:?}");
        if sent {
            assert_eq!(got, want);
        }
    }
}

/// Issue 36: `open_pr` acts with the forge token on the owner/repo the
/// session's repository URL names; a tenant's is planned only for a
/// repository on a listed host, the operator's wherever.
#[tokio::test]
async fn a_tenant_s_pull_request_is_refused_off_the_listed_hosts() {
    let e = Env::new().await;
    let token = e.dir.path().join("forge-token");
    std::fs::write(&token, "forge-secret\n").unwrap();
    let b = e
        .broker_with(|c| {
            c.github_api = Some("http://127.0.0.1:9".into());
            c.github_token_file = Some(token);
            c.git_credential_hosts = vec!["github.com".into()];
        })
        .await;
    let mut s = e.store.get(&e.session).await.unwrap();
    let args = serde_json::json!({"title": "t"});
    for (repo, tenant, ok) in [
        ("https://evil.example/acme/api.git", None, true),
        ("https://evil.example/acme/api.git", Some("ten_a"), false),
        ("https://github.com/acme/api.git", Some("ten_a"), true),
    ] {
        s.spec.repo = repo.into();
        s.spec.tenant = tenant.map(str::to_string);
        match b.plan_pr(&s, &args) {
            Ok(_) => assert!(ok, "{repo} {tenant:?} planned"),
            Err(crate::service::PlanError::Refused { code, .. }) => {
                assert!(!ok, "{repo} {tenant:?} refused");
                assert_eq!(code, "repo_host_not_listed");
            }
            Err(other) => panic!("{repo} {tenant:?}: {other:?}"),
        }
    }
}
