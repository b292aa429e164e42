//! Tampering with a real SQLite audit file behind the log's back (a second
//! connection, plain SQL) and checking that verify names the first bad seq
//! for each kind of damage, and that anchors catch what the chain alone
//! cannot (a dropped or consistently rewritten tail).

use hatchery_audit::event::{from_hex, to_hex, Event};
use hatchery_audit::{read_anchors, Anchor, Problem, SqliteAuditLog};
use rusqlite::{params, Connection};
use serde_json::json;
use std::path::PathBuf;

struct Tmp(PathBuf);
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmpdir() -> Tmp {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let d = std::env::temp_dir().join(format!("hatchery-audit-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    Tmp(d)
}

/// A log with 20 events on chain `ses_a` and 5 on `ses_b`.
fn fixture(dir: &Tmp) -> PathBuf {
    let path = dir.0.join("audit.db");
    let mut log = SqliteAuditLog::open(&path).unwrap();
    for i in 0..20 {
        log.append(
            "ses_a",
            "tool_call.recorded",
            json!({"seq": i, "tool": "git_push", "args": {"branch": "b"}}),
        )
        .unwrap();
        if i < 5 {
            log.append(
                "ses_b",
                "egress.denied",
                json!({"host": "evil.example", "port": 443}),
            )
            .unwrap();
        }
    }
    path
}

fn first_bad(path: &std::path::Path, chain: &str) -> Option<(u64, Problem)> {
    let log = SqliteAuditLog::open_read_only(path).unwrap();
    let r = log.verify_chain(chain, &[]).unwrap();
    r.first_bad.map(|b| (b.seq, b.problem))
}

fn sql(path: &std::path::Path, stmt: &str) {
    Connection::open(path).unwrap().execute_batch(stmt).unwrap();
}

#[test]
fn untouched_log_verifies() {
    let d = tmpdir();
    let path = fixture(&d);
    let log = SqliteAuditLog::open_read_only(&path).unwrap();
    let r = log.verify_chain("ses_a", &[]).unwrap();
    assert!(r.ok(), "{r:?}");
    assert_eq!(r.verified, 20);
    assert_eq!(r.head.as_ref().unwrap().seq, 20);
    assert_eq!(log.chains().unwrap(), vec!["ses_a", "ses_b"]);
    let heads = log.heads().unwrap();
    assert_eq!(
        heads
            .iter()
            .map(|h| (h.chain.as_str(), h.seq))
            .collect::<Vec<_>>(),
        vec![("ses_a", 20), ("ses_b", 5)]
    );
    assert_eq!(first_bad(&path, "ses_b"), None);
}

#[test]
fn edited_rows_are_caught_at_their_seq() {
    for (stmt, seq) in [
        ("UPDATE audit_events SET data = '{\"seq\":6,\"tool\":\"git_push\",\"args\":{\"branch\":\"main\"}}' WHERE chain='ses_a' AND seq=7", 7),
        ("UPDATE audit_events SET kind = 'noop' WHERE chain='ses_a' AND seq=1", 1),
        ("UPDATE audit_events SET ts = '2020-01-01T00:00:00Z' WHERE chain='ses_a' AND seq=20", 20),
        // Data the verifier cannot even parse is still reported at its seq.
        ("UPDATE audit_events SET data = 'not json' WHERE chain='ses_a' AND seq=12", 12),
    ] {
        let d = tmpdir();
        let path = fixture(&d);
        sql(&path, stmt);
        assert_eq!(first_bad(&path, "ses_a"), Some((seq, Problem::HashMismatch)), "{stmt}");
        assert_eq!(first_bad(&path, "ses_b"), None, "the other chain is untouched");
    }
    // A hash edited to match nothing, or to garbage.
    let d = tmpdir();
    let path = fixture(&d);
    sql(
        &path,
        &format!(
            "UPDATE audit_events SET hash = '{}' WHERE chain='ses_a' AND seq=4",
            "0".repeat(64)
        ),
    );
    assert_eq!(first_bad(&path, "ses_a"), Some((4, Problem::HashMismatch)));
    let d = tmpdir();
    let path = fixture(&d);
    sql(
        &path,
        "UPDATE audit_events SET prev_hash = 'zz' WHERE chain='ses_a' AND seq=9",
    );
    assert_eq!(
        first_bad(&path, "ses_a"),
        Some((9, Problem::PrevHashMismatch))
    );
}

#[test]
fn deleted_rows_are_caught() {
    let d = tmpdir();
    let path = fixture(&d);
    sql(
        &path,
        "DELETE FROM audit_events WHERE chain='ses_a' AND seq=5",
    );
    assert_eq!(
        first_bad(&path, "ses_a"),
        Some((5, Problem::SeqGap { found: 6 }))
    );
    let d = tmpdir();
    let path = fixture(&d);
    sql(
        &path,
        "DELETE FROM audit_events WHERE chain='ses_a' AND seq=1",
    );
    assert_eq!(
        first_bad(&path, "ses_a"),
        Some((1, Problem::SeqGap { found: 2 }))
    );
    // Deleting a row and renumbering the rest to close the gap.
    let d = tmpdir();
    let path = fixture(&d);
    sql(
        &path,
        "DELETE FROM audit_events WHERE chain='ses_a' AND seq=5;
         UPDATE audit_events SET seq = -(seq - 1) WHERE chain='ses_a' AND seq > 5;
         UPDATE audit_events SET seq = -seq WHERE chain='ses_a' AND seq < 0;",
    );
    assert_eq!(
        first_bad(&path, "ses_a"),
        Some((5, Problem::PrevHashMismatch))
    );
}

#[test]
fn reordered_rows_are_caught() {
    // Swap the seq numbers of two rows.
    let d = tmpdir();
    let path = fixture(&d);
    sql(
        &path,
        "UPDATE audit_events SET seq = -1 WHERE chain='ses_a' AND seq=3;
         UPDATE audit_events SET seq = 3 WHERE chain='ses_a' AND seq=4;
         UPDATE audit_events SET seq = 4 WHERE chain='ses_a' AND seq=-1;",
    );
    assert_eq!(
        first_bad(&path, "ses_a"),
        Some((3, Problem::PrevHashMismatch))
    );
    // Swap everything but seq (rows' content changes places).
    let d = tmpdir();
    let path = fixture(&d);
    sql(
        &path,
        "CREATE TEMP TABLE t AS SELECT * FROM audit_events WHERE chain='ses_a' AND seq IN (10, 11);
         UPDATE audit_events SET (ts, kind, data, prev_hash, hash) =
           (SELECT ts, kind, data, prev_hash, hash FROM t WHERE t.seq = 21 - audit_events.seq)
         WHERE chain='ses_a' AND seq IN (10, 11);",
    );
    assert_eq!(
        first_bad(&path, "ses_a"),
        Some((10, Problem::PrevHashMismatch))
    );
    // Move a row to another chain.
    let d = tmpdir();
    let path = fixture(&d);
    sql(
        &path,
        "UPDATE audit_events SET chain='ses_b', seq=6 WHERE chain='ses_a' AND seq=20",
    );
    assert_eq!(
        first_bad(&path, "ses_b"),
        Some((6, Problem::PrevHashMismatch))
    );
}

#[test]
fn anchors_catch_a_dropped_or_rewritten_tail() {
    let d = tmpdir();
    let path = fixture(&d);
    let anchors_path = d.0.join("anchors.jsonl");
    let hook_out = d.0.join("hook.out");
    let anchor = Anchor::new(&anchors_path).with_hook(vec![
        "/bin/sh".into(),
        "-c".into(),
        format!("cat >> {}", hook_out.display()),
    ]);
    let heads = SqliteAuditLog::open(&path).unwrap().heads().unwrap();
    anchor.anchor(&heads).unwrap();
    assert_eq!(
        std::fs::read_to_string(&anchors_path).unwrap(),
        std::fs::read_to_string(&hook_out).unwrap()
    );
    let anchors = read_anchors(&anchors_path).unwrap();
    assert_eq!(anchors, heads);

    // Dropping the last event leaves a valid, shorter chain.
    sql(
        &path,
        "DELETE FROM audit_events WHERE chain='ses_a' AND seq=20",
    );
    let log = SqliteAuditLog::open_read_only(&path).unwrap();
    assert!(log.verify_chain("ses_a", &[]).unwrap().ok());
    let r = log.verify_chain("ses_a", &anchors).unwrap();
    let bad = r.first_bad.unwrap();
    assert_eq!(bad.seq, 20);
    assert!(matches!(bad.problem, Problem::AnchorMismatch { .. }));
    assert!(log.verify_chain("ses_b", &anchors).unwrap().ok());
    drop(log);

    // Rewriting from seq 15 on with freshly computed hashes also verifies
    // on its own; the anchor of seq 20 does not match any more.
    let d = tmpdir();
    let path = fixture(&d);
    let c = Connection::open(&path).unwrap();
    let mut prev: [u8; 32] = {
        let h: String = c
            .query_row(
                "SELECT hash FROM audit_events WHERE chain='ses_a' AND seq=14",
                [],
                |r| r.get(0),
            )
            .unwrap();
        from_hex(&h).unwrap()
    };
    for seq in 15..=20u64 {
        let ts: String = c
            .query_row(
                "SELECT ts FROM audit_events WHERE chain='ses_a' AND seq=?1",
                [seq],
                |r| r.get(0),
            )
            .unwrap();
        let ev = Event {
            chain: "ses_a".into(),
            seq,
            ts,
            kind: "tool_call.recorded".into(),
            data: json!({"forged": true}),
        };
        let s = ev.seal(prev).unwrap();
        c.execute(
            "UPDATE audit_events SET data = ?1, prev_hash = ?2, hash = ?3 WHERE chain='ses_a' AND seq=?4",
            params![s.event.data.to_string(), to_hex(&s.prev_hash), to_hex(&s.hash), seq],
        )
        .unwrap();
        prev = s.hash;
    }
    drop(c);
    let log = SqliteAuditLog::open_read_only(&path).unwrap();
    assert!(
        log.verify_chain("ses_a", &[]).unwrap().ok(),
        "a consistent rewrite passes the chain check alone"
    );
    let r = log.verify_chain("ses_a", &anchors).unwrap();
    assert_eq!(r.first_bad.map(|b| b.seq), Some(20));
}

/// An error and its sources, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s += &format!(": {x}");
        src = x.source();
    }
    s
}

#[test]
fn anchor_hook_failure_is_an_error_and_the_file_keeps_the_line() {
    let d = tmpdir();
    let path = d.0.join("a.jsonl");
    let a = Anchor::new(&path).with_hook(vec![
        "/bin/sh".into(),
        "-c".into(),
        "echo nope >&2; exit 3".into(),
    ]);
    let heads = vec![hatchery_audit::Head {
        chain: "c".into(),
        seq: 1,
        hash: "00".repeat(32),
    }];
    let e = chain(&a.anchor(&heads).unwrap_err());
    assert!(e.contains("exit") && e.contains("nope"), "{e}");
    assert_eq!(read_anchors(&path).unwrap(), heads);
    // More than a pipe holds, to a hook that never reads its stdin: the
    // write meets EPIPE every time, and the hook's own exit status and
    // stderr must still be the error (it was once a bare "Broken pipe").
    let many: Vec<hatchery_audit::Head> = (0..4000)
        .map(|i| hatchery_audit::Head {
            chain: format!("chain-{i}"),
            seq: i,
            hash: "11".repeat(32),
        })
        .collect();
    let e = chain(&a.anchor(&many).unwrap_err());
    assert!(e.contains("exit") && e.contains("nope"), "{e}");
    std::fs::write(&path, "{broken\n").unwrap();
    assert!(read_anchors(&path).is_err());
}

#[test]
fn caps_on_appends() {
    let d = tmpdir();
    let mut log = SqliteAuditLog::open(&d.0.join("a.db")).unwrap();
    let max = hatchery_audit::store::MAX_DATA_BYTES;
    // A JSON string of exactly the cap: its two quotes count.
    log.append("c", "k", json!("x".repeat(max - 2))).unwrap();
    assert!(log.append("c", "k", json!("x".repeat(max - 1))).is_err());
    assert!(log.append("", "k", json!({})).is_err());
    assert!(log.append(&"c".repeat(129), "k", json!({})).is_err());
    assert!(
        log.append("c", "k", json!({"f": 1.5})).is_err(),
        "floats have no canonical form"
    );
    let r = log.verify_chain("c", &[]).unwrap();
    assert!(r.ok() && r.verified == 1, "{r:?}");
}

#[tokio::test]
async fn periodic_anchoring_writes_moved_heads_only() {
    let d = tmpdir();
    let path = d.0.join("a.db");
    let mut log = SqliteAuditLog::open(&path).unwrap();
    log.append("c", "k", json!({})).unwrap();
    let anchors = d.0.join("anchors.jsonl");
    let p2 = path.clone();
    let task = hatchery_audit::anchor::spawn_periodic(
        Anchor::new(&anchors),
        std::time::Duration::from_millis(50),
        move || SqliteAuditLog::open_read_only(&p2)?.heads(),
    );
    let wait_for = |n: usize| {
        let anchors = anchors.clone();
        async move {
            for _ in 0..1200 {
                if read_anchors(&anchors).map(|a| a.len()).unwrap_or(0) >= n {
                    return read_anchors(&anchors).unwrap();
                }
                tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            }
            panic!("no {n} anchors");
        }
    };
    let first = wait_for(1).await;
    assert_eq!(first[0].seq, 1);
    // Several idle rounds add nothing.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(read_anchors(&anchors).unwrap().len(), 1);
    log.append("c", "k", json!({})).unwrap();
    let got = wait_for(2).await;
    assert_eq!(got[1].seq, 2);
    task.abort();
}
