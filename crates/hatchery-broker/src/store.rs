//! The broker's own record of every call, keyed by (session, seq), in
//! DATA_DIR/broker.db. A call row is written before anything else happens
//! for that key, and it moves through
//! `awaiting_approval → pending → executing → done | failed | needs_review`
//! (or straight to `denied`); every update names the states it may move
//! from, so two racing requests cannot both take a call into `executing`.

use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::{Arc, Mutex};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("broker store: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("broker store task: {0}")]
    Task(String),
    #[error("broker store: unknown call state {0:?}")]
    Corrupt(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallState {
    AwaitingApproval,
    Pending,
    Executing,
    Done,
    Failed,
    Denied,
    NeedsReview,
}

impl CallState {
    pub fn as_str(self) -> &'static str {
        match self {
            CallState::AwaitingApproval => "awaiting_approval",
            CallState::Pending => "pending",
            CallState::Executing => "executing",
            CallState::Done => "done",
            CallState::Failed => "failed",
            CallState::Denied => "denied",
            CallState::NeedsReview => "needs_review",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        use CallState::*;
        [
            AwaitingApproval,
            Pending,
            Executing,
            Done,
            Failed,
            Denied,
            NeedsReview,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }
    pub fn is_final(self) -> bool {
        matches!(
            self,
            CallState::Done | CallState::Failed | CallState::Denied | CallState::NeedsReview
        )
    }
    /// The graph: which states a call may move to from `self`.
    pub fn valid_transition(self, to: CallState) -> bool {
        use CallState::*;
        matches!(
            (self, to),
            (AwaitingApproval, Pending)
                | (AwaitingApproval, Denied)
                | (Pending, Executing)
                // An effect-free tool (`noop`): its result is known
                // before anything happens.
                | (Pending, Done)
                | (Pending, Failed)
                | (Executing, Done)
                | (Executing, Failed)
                | (Executing, NeedsReview)
                // An operator's resolution (POST .../tool-calls/{seq}/resolve).
                | (NeedsReview, Done)
                | (NeedsReview, Failed)
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub session_id: String,
    pub seq: u64,
    pub epoch: u64,
    pub tool: String,
    pub args_sha256: String,
    pub args: String,
    pub state: CallState,
    pub decision: String,
    pub rule_id: Option<String>,
    pub approval_id: Option<String>,
    /// The session event seq of the call's `broker_call` event, once written.
    pub event_seq: Option<u64>,
    /// The seq of its `broker_result` event, once written.
    pub result_event_seq: Option<u64>,
    /// What the effect is about to do (JSON), written before it starts.
    pub effect: Option<String>,
    pub output: Option<String>,
    /// The seq of the `broker_call_resolved` event of an operator's
    /// resolution of a `needs_review` call.
    pub review_event_seq: Option<u64>,
    pub created_at: String,
    pub updated_at: String,
}

/// What an [`BrokerStore::advance_recorded`] writes besides the state.
#[derive(Debug, Default)]
pub struct Recorded {
    pub effect: Option<String>,
    pub output: Option<String>,
    pub event_seq: Option<u64>,
    pub result_event_seq: Option<u64>,
}

/// What `begin` found or made.
#[derive(Debug)]
pub enum Begin {
    New(Call),
    Existing(Call),
    /// The key is taken by a call with other arguments or another tool.
    Conflict(Call),
}

const MIGRATIONS: &[(u32, &str)] = &[
    (
        1,
        "CREATE TABLE calls (
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        epoch INTEGER NOT NULL,
        tool TEXT NOT NULL,
        args_sha256 TEXT NOT NULL,
        args TEXT NOT NULL,
        state TEXT NOT NULL,
        decision TEXT NOT NULL,
        rule_id TEXT,
        approval_id TEXT,
        event_seq INTEGER,
        result_event_seq INTEGER,
        effect TEXT,
        output TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;
    CREATE INDEX calls_state ON calls(state);
    CREATE TABLE epochs (
        sandbox_id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        UNIQUE (session_id, epoch)
    ) WITHOUT ROWID;",
    ),
    (2, "ALTER TABLE calls ADD COLUMN review_event_seq INTEGER;"),
];

/// Which of a call's events a seq is stored for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventRef {
    /// The `broker_call` event written before the effect.
    Call,
    /// The event with the call's result.
    Result,
    /// The `broker_call_resolved` event of a reviewed call.
    Review,
}

impl EventRef {
    fn update_sql(self) -> &'static str {
        match self {
            EventRef::Call => "UPDATE calls SET event_seq = ?3 WHERE session_id = ?1 AND seq = ?2 AND event_seq IS NULL",
            EventRef::Result => "UPDATE calls SET result_event_seq = ?3 WHERE session_id = ?1 AND seq = ?2 AND result_event_seq IS NULL",
            EventRef::Review => "UPDATE calls SET review_event_seq = ?3 WHERE session_id = ?1 AND seq = ?2 AND review_event_seq IS NULL",
        }
    }
}

#[derive(Clone)]
pub struct BrokerStore {
    conn: Arc<Mutex<Connection>>,
}

fn now() -> String {
    hatchery_audit::event::now_rfc3339()
}

impl BrokerStore {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let mut c = Connection::open(path)?;
        // FULL: a call row is on disk before its effect starts.
        c.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA busy_timeout=5000;",
        )?;
        migrate(&mut c)?;
        Ok(BrokerStore {
            conn: Arc::new(Mutex::new(c)),
        })
    }

    pub fn open_in_memory() -> Result<Self, StoreError> {
        let mut c = Connection::open_in_memory()?;
        migrate(&mut c)?;
        Ok(BrokerStore {
            conn: Arc::new(Mutex::new(c)),
        })
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut c)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
    }

    /// The epoch of `sandbox_id` in `session_id`: known ones keep theirs;
    /// a new sandbox (the session was resumed or forked) gets the next one.
    pub async fn epoch_for(&self, session_id: &str, sandbox_id: &str) -> Result<u64, StoreError> {
        let (ses, sbx) = (session_id.to_string(), sandbox_id.to_string());
        self.with(move |c| {
            let tx = c.transaction()?;
            let known: Option<(String, u64)> = tx
                .query_row(
                    "SELECT session_id, epoch FROM epochs WHERE sandbox_id = ?1",
                    params![sbx],
                    |r| Ok((r.get("session_id")?, r.get("epoch")?)),
                )
                .optional()?;
            let e = match known {
                Some((s, e)) if s == ses => e,
                // A sandbox id is never reused across sessions; treat a
                // mismatch as a new instance all the same.
                _ => {
                    let next: u64 = tx.query_row(
                        "SELECT COALESCE(MAX(epoch), 0) + 1 AS next FROM epochs WHERE session_id = ?1",
                        params![ses],
                        |r| r.get("next"),
                    )?;
                    tx.execute(
                        "INSERT OR REPLACE INTO epochs (sandbox_id, session_id, epoch) VALUES (?1, ?2, ?3)",
                        params![sbx, ses, next],
                    )?;
                    next
                }
            };
            tx.commit()?;
            Ok(e)
        })
        .await
    }

    /// The epoch a sandbox had, if the broker has seen it.
    pub async fn known_epoch(&self, sandbox_id: &str) -> Result<Option<(String, u64)>, StoreError> {
        let sbx = sandbox_id.to_string();
        self.with(move |c| {
            Ok(c.query_row(
                "SELECT session_id, epoch FROM epochs WHERE sandbox_id = ?1",
                params![sbx],
                |r| Ok((r.get("session_id")?, r.get("epoch")?)),
            )
            .optional()?)
        })
        .await
    }

    /// Records the call under its key unless the key is taken; in one
    /// transaction, so two racing first attempts make one row.
    pub async fn begin(&self, new: Call) -> Result<Begin, StoreError> {
        self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            if let Some(old) = get_tx(&tx, &new.session_id, new.seq)? {
                tx.commit()?;
                return Ok(if old.args_sha256 == new.args_sha256 && old.tool == new.tool {
                    Begin::Existing(old)
                } else {
                    Begin::Conflict(old)
                });
            }
            tx.execute(
                "INSERT INTO calls (session_id, seq, epoch, tool, args_sha256, args, state, decision, \
                 rule_id, approval_id, event_seq, result_event_seq, effect, output, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?13, ?14, ?15, ?11, ?12, ?12)",
                params![
                    new.session_id,
                    new.seq,
                    new.epoch,
                    new.tool,
                    new.args_sha256,
                    new.args,
                    new.state.as_str(),
                    new.decision,
                    new.rule_id,
                    new.approval_id,
                    new.output,
                    new.created_at,
                    new.event_seq,
                    new.result_event_seq,
                    new.effect,
                ],
            )?;
            tx.commit()?;
            Ok(Begin::New(new))
        })
        .await
    }

    pub async fn get(&self, session_id: &str, seq: u64) -> Result<Option<Call>, StoreError> {
        let s = session_id.to_string();
        self.with(move |c| {
            let tx = c.transaction()?;
            let r = get_tx(&tx, &s, seq)?;
            tx.commit()?;
            Ok(r)
        })
        .await
    }

    /// Stores the seq of one of the call's events, once: a column already
    /// set keeps its value (a retry never moves it).
    pub async fn set_event_ref(
        &self,
        which: EventRef,
        session_id: &str,
        seq: u64,
        ev: u64,
    ) -> Result<(), StoreError> {
        let s = session_id.to_string();
        self.with(move |c| {
            c.execute(which.update_sql(), params![s, seq, ev])?;
            Ok(())
        })
        .await
    }

    /// [`advance`](Self::advance) that also stores the seqs of the events
    /// just written for the call, in the same transaction (one commit
    /// instead of two or three).
    pub async fn advance_recorded(
        &self,
        session_id: &str,
        seq: u64,
        from: CallState,
        to: CallState,
        r: Recorded,
    ) -> Result<Option<Call>, StoreError> {
        debug_assert!(from.valid_transition(to), "{from:?} -> {to:?}");
        let s = session_id.to_string();
        self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let n = tx.execute(
                "UPDATE calls SET state = ?4, effect = COALESCE(?5, effect), \
                 output = COALESCE(?6, output), updated_at = ?7, \
                 event_seq = COALESCE(event_seq, ?8), \
                 result_event_seq = COALESCE(result_event_seq, ?9) \
                 WHERE session_id = ?1 AND seq = ?2 AND state = ?3",
                params![
                    s,
                    seq,
                    from.as_str(),
                    to.as_str(),
                    r.effect,
                    r.output,
                    now(),
                    r.event_seq,
                    r.result_event_seq
                ],
            )?;
            let r = if n == 1 { get_tx(&tx, &s, seq)? } else { None };
            tx.commit()?;
            Ok(r)
        })
        .await
    }

    /// Moves the call to `to` if it is in `from`; `None` when it was not
    /// (someone else moved it first). `effect`/`output` are set if given.
    pub async fn advance(
        &self,
        session_id: &str,
        seq: u64,
        from: CallState,
        to: CallState,
        effect: Option<String>,
        output: Option<String>,
    ) -> Result<Option<Call>, StoreError> {
        debug_assert!(from.valid_transition(to), "{from:?} -> {to:?}");
        let s = session_id.to_string();
        self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let n = tx.execute(
                "UPDATE calls SET state = ?4, effect = COALESCE(?5, effect), \
                 output = COALESCE(?6, output), updated_at = ?7 \
                 WHERE session_id = ?1 AND seq = ?2 AND state = ?3",
                params![s, seq, from.as_str(), to.as_str(), effect, output, now()],
            )?;
            let r = if n == 1 { get_tx(&tx, &s, seq)? } else { None };
            tx.commit()?;
            Ok(r)
        })
        .await
    }

    /// Calls caught in `executing` (the process stopped mid-effect).
    pub async fn executing(&self) -> Result<Vec<Call>, StoreError> {
        self.with(|c| {
            let mut st =
                c.prepare("SELECT * FROM calls WHERE state = 'executing' ORDER BY created_at")?;
            let rows = st.query_map([], row_call)?;
            let mut out = vec![];
            for r in rows {
                out.push(r??);
            }
            Ok(out)
        })
        .await
    }

    /// Every call of a session, in seq order (tests and the CLI).
    pub async fn calls(&self, session_id: &str) -> Result<Vec<Call>, StoreError> {
        let s = session_id.to_string();
        self.with(move |c| {
            let mut st = c.prepare("SELECT * FROM calls WHERE session_id = ?1 ORDER BY seq")?;
            let rows = st.query_map(params![s], row_call)?;
            let mut out = vec![];
            for r in rows {
                out.push(r??);
            }
            Ok(out)
        })
        .await
    }
}

fn migrate(c: &mut Connection) -> Result<(), StoreError> {
    let current: u32 = c.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    for (n, sql) in MIGRATIONS {
        if *n <= current {
            continue;
        }
        let tx = c.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", n)?;
        tx.commit()?;
    }
    Ok(())
}

fn get_tx(tx: &rusqlite::Transaction<'_>, s: &str, seq: u64) -> Result<Option<Call>, StoreError> {
    let r = tx
        .query_row(
            "SELECT * FROM calls WHERE session_id = ?1 AND seq = ?2",
            params![s, seq],
            row_call,
        )
        .optional()?;
    r.transpose()
}

fn row_call(r: &rusqlite::Row<'_>) -> rusqlite::Result<Result<Call, StoreError>> {
    let state: String = r.get("state")?;
    let Some(st) = CallState::parse(&state) else {
        return Ok(Err(StoreError::Corrupt(state)));
    };
    Ok(Ok(Call {
        session_id: r.get("session_id")?,
        seq: r.get("seq")?,
        epoch: r.get("epoch")?,
        tool: r.get("tool")?,
        args_sha256: r.get("args_sha256")?,
        args: r.get("args")?,
        state: st,
        decision: r.get("decision")?,
        rule_id: r.get("rule_id")?,
        approval_id: r.get("approval_id")?,
        event_seq: r.get("event_seq")?,
        result_event_seq: r.get("result_event_seq")?,
        effect: r.get("effect")?,
        output: r.get("output")?,
        review_event_seq: r.get("review_event_seq")?,
        created_at: r.get("created_at")?,
        updated_at: r.get("updated_at")?,
    }))
}

impl Call {
    pub fn new(
        session_id: &str,
        seq: u64,
        epoch: u64,
        tool: &str,
        args: String,
        args_sha256: String,
    ) -> Call {
        let t = now();
        Call {
            session_id: session_id.into(),
            seq,
            epoch,
            tool: tool.into(),
            args_sha256,
            args,
            state: CallState::Pending,
            decision: String::new(),
            rule_id: None,
            approval_id: None,
            event_seq: None,
            result_event_seq: None,
            effect: None,
            output: None,
            review_event_seq: None,
            created_at: t.clone(),
            updated_at: t,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(seq: u64, sha: &str) -> Call {
        let mut c = Call::new("ses_a", seq, 1, "git_push", "{}".into(), sha.into());
        c.decision = "allow".into();
        c
    }

    #[tokio::test]
    async fn begin_is_once_per_key_and_refuses_other_args() {
        let s = BrokerStore::open_in_memory().unwrap();
        assert!(matches!(
            s.begin(call(1, "a")).await.unwrap(),
            Begin::New(_)
        ));
        assert!(matches!(
            s.begin(call(1, "a")).await.unwrap(),
            Begin::Existing(_)
        ));
        assert!(matches!(
            s.begin(call(1, "b")).await.unwrap(),
            Begin::Conflict(_)
        ));
        assert!(matches!(
            s.begin(call(2, "b")).await.unwrap(),
            Begin::New(_)
        ));
    }

    #[tokio::test]
    async fn begin_keeps_every_field_of_an_adopted_call() {
        // A call taken over from the session's log starts `executing`
        // with its plan and its logged event seqs.
        let s = BrokerStore::open_in_memory().unwrap();
        let mut c = call(3, "a");
        c.state = CallState::Executing;
        c.effect = Some(r#"{"commit":"c1"}"#.into());
        c.event_seq = Some(4);
        let Begin::New(_) = s.begin(c.clone()).await.unwrap() else {
            panic!("not new")
        };
        assert_eq!(s.get("ses_a", 3).await.unwrap(), Some(c));
    }

    #[tokio::test]
    async fn advance_names_its_source_state() {
        let s = BrokerStore::open_in_memory().unwrap();
        s.begin(call(1, "a")).await.unwrap();
        let x = s
            .advance(
                "ses_a",
                1,
                CallState::Pending,
                CallState::Executing,
                Some("e".into()),
                None,
            )
            .await
            .unwrap();
        assert_eq!(x.unwrap().state, CallState::Executing);
        // A second racer finds it moved already.
        assert!(s
            .advance(
                "ses_a",
                1,
                CallState::Pending,
                CallState::Executing,
                None,
                None
            )
            .await
            .unwrap()
            .is_none());
        assert_eq!(s.executing().await.unwrap().len(), 1);
        let d = s
            .advance(
                "ses_a",
                1,
                CallState::Executing,
                CallState::Done,
                None,
                Some("ok".into()),
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(d.output.as_deref(), Some("ok"));
        assert_eq!(d.effect.as_deref(), Some("e"));
        assert!(s.executing().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn event_seqs_go_with_the_row_and_reviews_resolve_once() {
        let s = BrokerStore::open_in_memory().unwrap();
        let mut c = call(1, "a");
        (c.state, c.event_seq, c.result_event_seq) = (CallState::Done, Some(7), Some(8));
        let Begin::New(_) = s.begin(c).await.unwrap() else {
            panic!("not new")
        };
        let got = s.get("ses_a", 1).await.unwrap().unwrap();
        assert_eq!((got.event_seq, got.result_event_seq), (Some(7), Some(8)));
        s.begin(call(2, "b")).await.unwrap();
        let r = Recorded {
            effect: Some("e".into()),
            event_seq: Some(9),
            ..Default::default()
        };
        let x = s
            .advance_recorded("ses_a", 2, CallState::Pending, CallState::Executing, r)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((x.state, x.event_seq), (CallState::Executing, Some(9)));
        s.advance(
            "ses_a",
            2,
            CallState::Executing,
            CallState::NeedsReview,
            None,
            None,
        )
        .await
        .unwrap()
        .unwrap();
        let d = s
            .advance(
                "ses_a",
                2,
                CallState::NeedsReview,
                CallState::Failed,
                None,
                Some("r".into()),
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(d.state, CallState::Failed);
        // Only from needs_review.
        assert!(s
            .advance(
                "ses_a",
                2,
                CallState::NeedsReview,
                CallState::Done,
                None,
                None
            )
            .await
            .unwrap()
            .is_none());
        s.set_event_ref(EventRef::Review, "ses_a", 2, 11)
            .await
            .unwrap();
        s.set_event_ref(EventRef::Review, "ses_a", 2, 12)
            .await
            .unwrap();
        assert_eq!(
            s.get("ses_a", 2).await.unwrap().unwrap().review_event_seq,
            Some(11)
        );
    }

    #[tokio::test]
    async fn epochs_fence_replaced_sandboxes() {
        let s = BrokerStore::open_in_memory().unwrap();
        assert_eq!(s.epoch_for("ses_a", "sbx_1").await.unwrap(), 1);
        assert_eq!(s.epoch_for("ses_a", "sbx_1").await.unwrap(), 1);
        assert_eq!(s.epoch_for("ses_a", "sbx_2").await.unwrap(), 2);
        assert_eq!(s.epoch_for("ses_b", "sbx_3").await.unwrap(), 1);
        assert_eq!(
            s.known_epoch("sbx_1").await.unwrap(),
            Some(("ses_a".into(), 1))
        );
        assert_eq!(s.known_epoch("sbx_9").await.unwrap(), None);
    }

    #[test]
    fn transitions() {
        use CallState::*;
        assert!(Pending.valid_transition(Executing));
        assert!(!Done.valid_transition(Executing));
        assert!(!Executing.valid_transition(Pending));
        assert!(NeedsReview.is_final());
        assert!(NeedsReview.valid_transition(Done) && NeedsReview.valid_transition(Failed));
        assert!(!NeedsReview.valid_transition(Executing));
    }
}
