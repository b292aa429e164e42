//! The contract of the broker's store, run on both databases: SQLite (a
//! scratch database and a file) and a private PostgreSQL
//! (`conformance_on_postgres`). Session and sandbox ids carry a per-run
//! prefix, so a database may be reused by later runs.

use super::{Begin, BrokerStore, Call, CallState, EventRef, Recorded};
use hatchery_db::{race, Db};
use std::collections::BTreeSet;
use CallState::*;

/// Unique per call: the process id and the clock, so two runs (or two
/// suites in one run) on one database never share a session.
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("t{}x{nanos:x}", std::process::id())
}

fn call(session: &str, seq: u64, sha: &str) -> Call {
    let mut c = Call::new(session, seq, 1, "git_push", "{}".into(), sha.into());
    c.decision = "allow".into();
    c
}

fn in_state(session: &str, seq: u64, st: CallState) -> Call {
    let mut c = call(session, seq, "a");
    c.state = st;
    c
}

/// Moves call `seq` from `from` to `to`, recording nothing else: the
/// moved row, or `None` when it was not in `from`.
async fn step(s: &BrokerStore, ses: &str, seq: u64, moves: [CallState; 2]) -> Option<Call> {
    record(s, ses, seq, moves, Recorded::default()).await
}

/// The same, recording `r`.
async fn record(
    s: &BrokerStore,
    ses: &str,
    seq: u64,
    moves: [CallState; 2],
    r: Recorded,
) -> Option<Call> {
    let [from, to] = moves;
    s.advance_recorded(ses, seq, from, to, r).await.unwrap()
}

/// Every check, on fresh ids.
pub async fn run_all(s: &BrokerStore) {
    let run = run_id();
    begin_is_once_per_key_and_refuses_other_args(s, &run).await;
    begin_keeps_every_field_of_an_adopted_call(s, &run).await;
    concurrent_begins_make_one_call(s, &run).await;
    epochs_fence_replaced_sandboxes(s, &run).await;
    concurrent_sandboxes_get_distinct_epochs(s, &run).await;
    every_transition_names_its_source_state(s, &run).await;
    advance_keeps_effect_and_output(s, &run).await;
    event_seqs_go_with_the_row_and_are_set_once(s, &run).await;
    executing_lists_only_executing_calls(s, &run).await;
    calls_are_in_seq_order(s, &run).await;
    the_runner_goes_with_the_call(s, &run).await;
    usage_counts_calls_argument_bytes_and_approvals(s, &run).await;
}

/// What the per-session caps read (caps.rs): every call of the session,
/// the bytes of their stored arguments, the calls awaiting approval; no
/// other session's. On PostgreSQL this is the only check of its SQL.
async fn usage_counts_calls_argument_bytes_and_approvals(s: &BrokerStore, run: &str) {
    let ses = format!("ses_usage_{run}");
    let usage = |ses: String| async move {
        let u = s.usage(&ses).await.unwrap();
        (u.calls, u.arg_bytes, u.awaiting_approval)
    };
    assert_eq!(usage(ses.clone()).await, (0, 0, 0));
    let args = ["{}", r#"{"path":"a"}"#, r#"{"x":"éé"}"#];
    for (i, a) in args.iter().enumerate() {
        let c = Call::new(&ses, i as u64 + 1, 1, "git_push", a.to_string(), "h".into());
        s.begin(c).await.unwrap();
    }
    s.begin(in_state(&ses, 4, AwaitingApproval)).await.unwrap();
    let other = in_state(&format!("ses_usage_other_{run}"), 1, AwaitingApproval);
    s.begin(other).await.unwrap();
    let bytes = args.iter().map(|a| a.len()).sum::<usize>() + "{}".len();
    assert_eq!(usage(ses.clone()).await, (4, bytes as u64, 1));
    // Decided: no longer open, still counted as a call.
    step(s, &ses, 4, [AwaitingApproval, Denied]).await.unwrap();
    assert_eq!(usage(ses).await, (4, bytes as u64, 0));
}

/// The process that took a call into `executing` is recorded with it
/// and kept by later moves; a heartbeat makes a runner alive on the
/// shared database only (on SQLite no other process can be running it).
async fn the_runner_goes_with_the_call(s: &BrokerStore, run: &str) {
    let ses = format!("ses_runner_{run}");
    s.begin(call(&ses, 1, "a")).await.unwrap();
    let r = Recorded {
        effect: Some("e".into()),
        runner: Some(format!("brn_a_{run}")),
        ..Default::default()
    };
    let x = record(s, &ses, 1, [Pending, Executing], r).await.unwrap();
    let (a, b) = (format!("brn_a_{run}"), format!("brn_b_{run}"));
    assert_eq!(x.runner.as_deref(), Some(&*a));
    let y = step(s, &ses, 1, [Executing, Done]).await.unwrap();
    assert_eq!(y.runner, x.runner, "a later move keeps the runner");
    assert!(!s.runner_alive(&a).await.unwrap(), "no heartbeat yet");
    s.heartbeat(&a, 30).await.unwrap();
    s.heartbeat(&a, 30).await.unwrap();
    let shared = s.backend() == "postgres";
    assert_eq!(s.runner_alive(&a).await.unwrap(), shared);
    assert!(!s.runner_alive(&b).await.unwrap());
    // A lapsed heartbeat (ttl 0: expired at once, by the database's clock).
    s.heartbeat(&a, 0).await.unwrap();
    assert!(!s.runner_alive(&a).await.unwrap());
}

async fn begin_is_once_per_key_and_refuses_other_args(s: &BrokerStore, run: &str) {
    let ses = format!("ses_begin_{run}");
    let Begin::New(made) = s.begin(call(&ses, 1, "a")).await.unwrap() else {
        panic!("first begin not new")
    };
    let Begin::Existing(found) = s.begin(call(&ses, 1, "a")).await.unwrap() else {
        panic!("same call again not existing")
    };
    assert_eq!(found.args_sha256, made.args_sha256);
    let Begin::Conflict(old) = s.begin(call(&ses, 1, "b")).await.unwrap() else {
        panic!("other args not a conflict")
    };
    assert_eq!(old.args_sha256, "a");
    let mut other_tool = call(&ses, 1, "a");
    other_tool.tool = "github_pr".into();
    let other_tool = s.begin(other_tool).await.unwrap();
    assert!(matches!(other_tool, Begin::Conflict(_)));
    let next = s.begin(call(&ses, 2, "b")).await.unwrap();
    assert!(matches!(next, Begin::New(_)));
    assert_eq!(s.get(&ses, 3).await.unwrap(), None);
}

async fn begin_keeps_every_field_of_an_adopted_call(s: &BrokerStore, run: &str) {
    // A call taken over from the session's log starts `executing` with
    // its plan and its logged event seqs.
    let ses = format!("ses_adopt_{run}");
    let c = Call {
        effect: Some(r#"{"commit":"c1"}"#.into()),
        output: Some("partial".into()),
        event_seq: Some(4),
        result_event_seq: Some(5),
        review_event_seq: Some(6),
        rule_id: Some("r1".into()),
        approval_id: Some("apr_1".into()),
        ..in_state(&ses, 3, Executing)
    };
    assert!(matches!(s.begin(c.clone()).await.unwrap(), Begin::New(_)));
    // The same `Call`, field for field, from either backend.
    assert_eq!(s.get(&ses, 3).await.unwrap(), Some(c));
}

async fn concurrent_begins_make_one_call(s: &BrokerStore, run: &str) {
    let ses = format!("ses_race_{run}");
    let begun = race(8, |_| {
        let (s, c) = (s.clone(), call(&ses, 1, "a"));
        async move { s.begin(c).await.unwrap() }
    });
    let mut new = 0;
    for b in begun.await {
        match b {
            Begin::New(_) => new += 1,
            Begin::Existing(_) => {}
            Begin::Conflict(c) => panic!("same call a conflict: {c:?}"),
        }
    }
    assert_eq!(new, 1, "exactly one of 8 racing first attempts is new");
    assert_eq!(s.calls(&ses).await.unwrap().len(), 1);
}

async fn epochs_fence_replaced_sandboxes(s: &BrokerStore, run: &str) {
    let (a, b) = (format!("ses_ea_{run}"), format!("ses_eb_{run}"));
    let sbx = |n: u32| format!("sbx_{n}_{run}");
    assert_eq!(s.epoch_for(&a, &sbx(1)).await.unwrap(), 1);
    assert_eq!(s.epoch_for(&a, &sbx(1)).await.unwrap(), 1);
    assert_eq!(s.epoch_for(&a, &sbx(2)).await.unwrap(), 2);
    assert_eq!(s.epoch_for(&a, &sbx(1)).await.unwrap(), 1);
    assert_eq!(s.epoch_for(&b, &sbx(3)).await.unwrap(), 1);
    assert_eq!(s.known_epoch(&sbx(1)).await.unwrap(), Some((a.clone(), 1)));
    assert_eq!(s.known_epoch(&sbx(2)).await.unwrap(), Some((a.clone(), 2)));
    assert_eq!(s.known_epoch(&sbx(9)).await.unwrap(), None);
    // A sandbox id seen under another session is a new instance there.
    assert_eq!(s.epoch_for(&b, &sbx(1)).await.unwrap(), 2);
    assert_eq!(s.known_epoch(&sbx(1)).await.unwrap(), Some((b, 2)));
}

async fn concurrent_sandboxes_get_distinct_epochs(s: &BrokerStore, run: &str) {
    let ses = &format!("ses_ec_{run}");
    // The epochs 8 tasks get at once, task `n` asking for `sandbox(n)`.
    let epochs = |sandbox: fn(usize, &str) -> String| {
        race(8, move |n| {
            let (s, ses, sbx) = (s.clone(), ses.clone(), sandbox(n, run));
            async move { s.epoch_for(&ses, &sbx).await.unwrap() }
        })
    };
    let got = epochs(|n, run| format!("sbx_c{n}_{run}")).await;
    let got: BTreeSet<u64> = got.into_iter().collect();
    assert_eq!(got, (1..=8).collect());
    // One new sandbox asked for by 8 tasks at once: one epoch for all.
    let same = epochs(|_, run| format!("sbx_same_{run}")).await;
    assert_eq!(same, [9; 8]);
}

async fn every_transition_names_its_source_state(s: &BrokerStore, run: &str) {
    let ses = format!("ses_tr_{run}");
    let mut seq = 0;
    for &from in CallState::ALL {
        for &to in CallState::ALL.iter().filter(|t| from.valid_transition(**t)) {
            // Allowed from `from`, once: a second racer finds it moved.
            seq += 1;
            s.begin(in_state(&ses, seq, from)).await.unwrap();
            let moved = step(s, &ses, seq, [from, to]).await;
            assert_eq!(moved.map(|c| c.state), Some(to), "{from:?} -> {to:?}");
            let again = step(s, &ses, seq, [from, to]).await;
            assert!(again.is_none(), "{from:?} -> {to:?} twice");
            // Refused from any other state, final ones included: the row
            // keeps its state (no late write overwrites it).
            for other in CallState::ALL.iter().copied().filter(|o| *o != from) {
                seq += 1;
                s.begin(in_state(&ses, seq, other)).await.unwrap();
                let r = Recorded {
                    output: Some("late".into()),
                    event_seq: Some(1),
                    ..Default::default()
                };
                let moved = record(s, &ses, seq, [from, to], r).await;
                let what = format!("{from:?} -> {to:?} applied to a call in {other:?}");
                assert!(moved.is_none(), "{what}");
                let kept = s.get(&ses, seq).await.unwrap().unwrap();
                assert_eq!(kept.state, other);
                assert_eq!((kept.output, kept.event_seq), (None, None));
            }
        }
    }
    // Nothing moves an unknown call.
    assert!(step(s, &ses, seq + 1, [Pending, Executing]).await.is_none());
}

async fn advance_keeps_effect_and_output(s: &BrokerStore, run: &str) {
    let ses = format!("ses_adv_{run}");
    s.begin(call(&ses, 1, "a")).await.unwrap();
    let effect = Recorded {
        effect: Some("e".into()),
        ..Default::default()
    };
    let x = record(s, &ses, 1, [Pending, Executing], effect).await;
    let x = x.unwrap();
    assert_eq!((x.state, x.effect.as_deref()), (Executing, Some("e")));
    let output = Recorded {
        output: Some("ok".into()),
        ..Default::default()
    };
    let d = record(s, &ses, 1, [Executing, Done], output).await.unwrap();
    assert_eq!(d.output.as_deref(), Some("ok"));
    assert_eq!(d.effect.as_deref(), Some("e"));
    assert_eq!(s.get(&ses, 1).await.unwrap(), Some(d));
}

async fn event_seqs_go_with_the_row_and_are_set_once(s: &BrokerStore, run: &str) {
    let ses = format!("ses_ev_{run}");
    s.begin(call(&ses, 2, "b")).await.unwrap();
    let r = Recorded {
        effect: Some("e".into()),
        event_seq: Some(9),
        ..Default::default()
    };
    let x = record(s, &ses, 2, [Pending, Executing], r).await.unwrap();
    assert_eq!((x.state, x.event_seq), (Executing, Some(9)));
    // A seq already stored is kept by a later advance_recorded.
    let r = Recorded {
        event_seq: Some(99),
        result_event_seq: Some(10),
        ..Default::default()
    };
    let y = record(s, &ses, 2, [Executing, NeedsReview], r).await;
    let y = y.unwrap();
    assert_eq!((y.event_seq, y.result_event_seq), (Some(9), Some(10)));
    step(s, &ses, 2, [NeedsReview, Failed]).await.unwrap();
    // Each reference is set once; a retry never moves it.
    s.begin(call(&ses, 3, "c")).await.unwrap();
    for (which, first) in [
        (EventRef::Call, 21),
        (EventRef::Result, 22),
        (EventRef::Review, 23),
    ] {
        s.set_event_ref(which, &ses, 3, first).await.unwrap();
        s.set_event_ref(which, &ses, 3, first + 100).await.unwrap();
    }
    for review in [11, 12] {
        let set = s.set_event_ref(EventRef::Review, &ses, 2, review);
        set.await.unwrap();
    }
    let refs = |seq| {
        let ses = &ses;
        async move {
            let c = s.get(ses, seq).await.unwrap().unwrap();
            [c.event_seq, c.result_event_seq, c.review_event_seq].map(Option::unwrap)
        }
    };
    assert_eq!(refs(3).await, [21, 22, 23]);
    assert_eq!(refs(2).await, [9, 10, 11]);
    // An unknown call is no error (and makes no row).
    s.set_event_ref(EventRef::Call, &ses, 77, 1).await.unwrap();
    assert_eq!(s.get(&ses, 77).await.unwrap(), None);
}

async fn executing_lists_only_executing_calls(s: &BrokerStore, run: &str) {
    let ses = format!("ses_ex_{run}");
    for (seq, st) in CallState::ALL.iter().copied().enumerate() {
        s.begin(in_state(&ses, seq as u64 + 1, st)).await.unwrap();
    }
    s.begin(in_state(&ses, 20, Executing)).await.unwrap();
    // The database may hold other runs' calls: every one listed is
    // executing, and of this run's, exactly the two.
    let mine = || async {
        let all = s.executing().await.unwrap();
        assert!(all.iter().all(|c| c.state == Executing));
        let mine = all.iter().filter(|c| c.session_id == ses);
        mine.map(|c| c.seq).collect::<Vec<u64>>()
    };
    assert_eq!(mine().await, vec![3, 20]);
    step(s, &ses, 3, [Executing, Failed]).await.unwrap();
    assert_eq!(mine().await, vec![20]);
}

async fn calls_are_in_seq_order(s: &BrokerStore, run: &str) {
    let (a, b) = (format!("ses_oa_{run}"), format!("ses_ob_{run}"));
    // Seq 10 after 9: numeric order, not text order.
    for seq in [3, 10, 1, 9, 2] {
        s.begin(call(&a, seq, "a")).await.unwrap();
    }
    s.begin(call(&b, 4, "a")).await.unwrap();
    let seqs: Vec<u64> = s.calls(&a).await.unwrap().iter().map(|c| c.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3, 9, 10]);
    assert!(s.calls(&a).await.unwrap().iter().all(|c| c.session_id == a));
    let none = s.calls(&format!("ses_none_{run}")).await;
    assert!(none.unwrap().is_empty());
}

/// What one store wrote, another opened later on the same database reads;
/// then every check again on the second.
async fn reopened_store_keeps_calls(first: &BrokerStore, second: &BrokerStore) {
    let run = run_id();
    let (ses, sbx) = (format!("ses_reopen_{run}"), format!("sbx_{run}"));
    first.begin(call(&ses, 1, "a")).await.unwrap();
    assert_eq!(first.epoch_for(&ses, &sbx).await.unwrap(), 1);
    let call = first.get(&ses, 1).await.unwrap();
    assert_eq!(second.get(&ses, 1).await.unwrap(), call);
    assert_eq!(second.epoch_for(&ses, &sbx).await.unwrap(), 1);
    run_all(second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_sqlite() {
    run_all(&BrokerStore::open_in_memory().await.unwrap()).await;
    // A file, opened twice: the second open's migrations are a no-op.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hatchery.db");
    let open = || async { BrokerStore::open(Db::sqlite(&path).await.unwrap()).await };
    let s = open().await.unwrap();
    run_all(&s).await;
    reopened_store_keeps_calls(&s, &open().await.unwrap()).await;
}

#[path = "../../../hatchery-store/tests/support/pg_server.rs"]
mod pg_server;

/// On a private PostgreSQL (`make pg-conformance`; `make unit` skips it by
/// its name). Nothing here is skipped: a server that does not start fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_on_postgres() {
    let pg = pg_server::TestPg::start();
    let s = BrokerStore::open(Db::postgres(&pg.dsn, 16).unwrap()).await;
    let s = s.unwrap();
    assert_eq!(s.backend(), "postgres");
    run_all(&s).await;
    // Migrations are idempotent: a second broker on the same database
    // (two at once first, as two daemons starting together).
    let (a, b) = tokio::join!(
        BrokerStore::open(Db::postgres(&pg.dsn, 2).unwrap()),
        BrokerStore::open(Db::postgres(&pg.dsn, 2).unwrap())
    );
    let (again, _) = (a.unwrap(), b.unwrap());
    reopened_store_keeps_calls(&s, &again).await;
}

/// A database that is not there is `unavailable` (retryable), not a
/// generic failure. (That it answers 503 is error.rs's test.)
#[tokio::test]
async fn a_database_that_is_down_is_unavailable() {
    let db = Db::postgres("postgres://postgres@127.0.0.1:1/hatchery", 1).unwrap();
    let Err(e) = BrokerStore::open(db).await else {
        panic!("connected to port 1")
    };
    assert!(e.unavailable(), "{e:?}");
}
