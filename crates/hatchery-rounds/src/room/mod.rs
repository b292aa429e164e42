//! The live room: one shared Yjs document per candidate session, kept by
//! this process while anyone is connected, with every accepted update
//! appended to the session's log in the rounds store (`round_doc_log`)
//! before it is fanned out. Run and Submit read the files from here, the
//! server's copy, never from what a client posts.
//!
//! One process keeps a room: the one whose WebSocket opened it. Another
//! control process on the same database that opens the same session
//! rebuilds it from the log and appends after it; two appending at once
//! collide on the log's unique `(session_id, idx)` and the loser's room
//! closes its connections, which reconnect and resync (docs/rounds.md).

mod checkpoint;
pub mod doc;
mod playback;
mod rate;
pub(crate) mod socket;
#[cfg(test)]
mod tests;

use crate::ids::now_ms;
use crate::limits::*;
use crate::store::{DocLogRecord, RoundStore, SessionRecord, StoreError};
use crate::{Rounds, RoundsError};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::broadcast;
use yrs::sync::awareness::AwarenessUpdateEntry;
use yrs::sync::protocol::SyncMessage;
use yrs::sync::{AwarenessUpdate, Message};
use yrs::updates::decoder::DecoderV1;
use yrs::updates::encoder::Encode;
use yrs::Doc;

#[derive(Debug, thiserror::Error)]
pub enum RoomError {
    #[error(transparent)]
    Malformed(#[from] doc::DocError),
    #[error("the document log would pass {cap} bytes")]
    TooLarge { cap: u64 },
    #[error("presence: {0}")]
    Presence(String),
    #[error("the room's log: {0}")]
    Store(#[source] StoreError),
    #[error("the room closed; reconnect")]
    Closed,
}

impl RoomError {
    /// The WebSocket close code and reason this error ends a connection
    /// with (4xxx: the application's range).
    pub fn close(&self) -> (u16, &'static str) {
        match self {
            RoomError::Malformed(_) | RoomError::Presence(_) => (4400, "malformed message"),
            RoomError::TooLarge { .. } => (4413, "document too large"),
            RoomError::Store(_) => (1011, "the room's log failed"),
            RoomError::Closed => (1012, "room reloading; reconnect"),
        }
    }
}

/// Who is on a connection: their name in the log, whether their updates
/// are taken, and the key their membership is counted under.
#[derive(Debug, Clone)]
pub struct Member {
    pub author: String,
    pub key: String,
    pub can_write: bool,
    /// An interviewer: writes only while the room is in pairing mode.
    pub interviewer: bool,
    pub expires_at_ms: u64,
}

/// One message fanned out to a room: from a connection (which skips its
/// own), or the room's closing (`bytes` empty).
#[derive(Clone)]
pub(crate) struct Frame {
    pub from: u64,
    pub bytes: Arc<Vec<u8>>,
}

struct Inner {
    doc: Doc,
    next_idx: u64,
    log_bytes: u64,
    /// Awareness client id → (clock, JSON state, owning connection).
    presence: HashMap<u64, (u32, Arc<str>, u64)>,
}

pub(crate) struct Room {
    pub session_id: String,
    inner: tokio::sync::Mutex<Inner>,
    tx: broadcast::Sender<Frame>,
    slots: Mutex<Slots>,
    next_conn: AtomicU64,
    closed: AtomicBool,
    /// Interviewers may type too. Off by default, and off again when the
    /// room is rebuilt (the safe side: watching).
    pairing: AtomicBool,
}

#[derive(Default)]
struct Slots {
    conns: usize,
    members: HashMap<String, usize>,
}

/// A place in a room, held by one connection (or reserved for one about
/// to open); given back when dropped.
pub(crate) struct Slot {
    pub room: Arc<Room>,
    pub conn: u64,
    key: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.room.slots.lock().unwrap_or_else(|p| p.into_inner());
        s.conns = s.conns.saturating_sub(1);
        if let Some(n) = s.members.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                s.members.remove(&self.key);
            }
        }
    }
}

fn encode(m: &Message) -> Vec<u8> {
    m.encode_v1()
}

/// The message type of the room's own events (JSON), beside Yjs's sync
/// (0), awareness (1), auth (2) and awareness query (3).
pub const MSG_ROOM_EVENT: u8 = 100;

/// The Yjs encoding of an update that changes nothing (what a client
/// sends as sync step 2 when it has nothing the server lacks).
const EMPTY_UPDATE: &[u8] = &[0, 0];

impl Room {
    fn new(session_id: &str, doc: Doc, next_idx: u64, log_bytes: u64) -> Arc<Room> {
        let (tx, _) = broadcast::channel(ROOM_FANOUT_QUEUE);
        Arc::new(Room {
            session_id: session_id.to_string(),
            inner: tokio::sync::Mutex::new(Inner {
                doc,
                next_idx,
                log_bytes,
                presence: HashMap::new(),
            }),
            tx,
            slots: Mutex::new(Slots::default()),
            next_conn: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            pairing: AtomicBool::new(false),
        })
    }

    /// Reserves a connection's place: 429 past the caps.
    pub fn reserve(self: &Arc<Self>, key: &str) -> Result<Slot, RoundsError> {
        let mut s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if s.conns >= MAX_ROOM_CONNECTIONS {
            return Err(RoundsError::RoomFull(format!(
                "the room has {MAX_ROOM_CONNECTIONS} connections, the most it takes"
            )));
        }
        if !s.members.contains_key(key) && s.members.len() >= MAX_ROOM_MEMBERS {
            return Err(RoundsError::RoomFull(format!(
                "the room has {MAX_ROOM_MEMBERS} members, the most it takes"
            )));
        }
        s.conns += 1;
        *s.members.entry(key.to_string()).or_default() += 1;
        Ok(Slot {
            room: self.clone(),
            conn: self.next_conn.fetch_add(1, Ordering::Relaxed),
            key: key.to_string(),
        })
    }

    pub fn pairing(&self) -> bool {
        self.pairing.load(Ordering::Relaxed)
    }

    /// Turns pairing on or off and tells everyone in the room (a custom
    /// message, [`MSG_ROOM_EVENT`]).
    pub fn set_pairing(&self, on: bool) {
        self.pairing.store(on, Ordering::Relaxed);
        self.event(&serde_json::json!({"event": "pairing", "pairing": on}));
    }

    /// Fans a room event (JSON) out to every connection: pairing changes
    /// and a Run's output as it streams.
    pub fn event(&self, ev: &serde_json::Value) {
        let msg = encode(&Message::Custom(
            MSG_ROOM_EVENT,
            ev.to_string().into_bytes(),
        ));
        let _ = self.tx.send(Frame {
            from: 0,
            bytes: Arc::new(msg),
        });
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Frame> {
        self.tx.subscribe()
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Every open connection closes (they reconnect and the room is
    /// rebuilt from the log): the in-memory document may hold an update
    /// the log does not.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        let _ = self.tx.send(Frame {
            from: 0,
            bytes: Arc::new(Vec::new()),
        });
    }

    /// What a connection is sent first: the server's state vector (sync
    /// step 1; the client answers with what the server lacks) and who is
    /// here.
    pub async fn greeting(&self) -> Vec<Vec<u8>> {
        let g = self.inner.lock().await;
        let sv = {
            use yrs::{ReadTxn, Transact};
            g.doc.transact().state_vector()
        };
        let mut out = vec![encode(&Message::Sync(SyncMessage::SyncStep1(sv)))];
        if !g.presence.is_empty() {
            out.push(encode(&Message::Awareness(presence_update(&g.presence))));
        }
        let pairing = serde_json::json!({"event": "pairing", "pairing": self.pairing()});
        out.push(encode(&Message::Custom(
            MSG_ROOM_EVENT,
            pairing.to_string().into_bytes(),
        )));
        out
    }

    /// Handles one WebSocket message from connection `conn`: answers for
    /// it, or the error that closes it.
    pub async fn handle(
        &self,
        store: &dyn RoundStore,
        conn: u64,
        who: &Member,
        bytes: &[u8],
    ) -> Result<Vec<Vec<u8>>, RoomError> {
        if self.is_closed() {
            return Err(RoomError::Closed);
        }
        let msgs = decode_messages(bytes)?;
        let mut replies = Vec::new();
        for m in msgs {
            match m {
                Message::Sync(SyncMessage::SyncStep1(sv)) => {
                    let g = self.inner.lock().await;
                    let d = doc::diff(&g.doc, &sv);
                    replies.push(encode(&Message::Sync(SyncMessage::SyncStep2(d))));
                }
                Message::Sync(SyncMessage::SyncStep2(u))
                | Message::Sync(SyncMessage::Update(u)) => {
                    // A read-only member's edits are dropped; their editor
                    // resyncs to the server's text.
                    let may = who.can_write || (who.interviewer && self.pairing());
                    if may && u != EMPTY_UPDATE {
                        self.update(store, conn, &who.author, u).await?;
                    }
                }
                Message::Awareness(u) => self.presence(conn, u).await?,
                Message::AwarenessQuery => {
                    let g = self.inner.lock().await;
                    replies.push(encode(&Message::Awareness(presence_update(&g.presence))));
                }
                // Auth is decided before the upgrade; other tags are not ours.
                Message::Auth(_) | Message::Custom(..) => {}
            }
        }
        Ok(replies)
    }

    /// Applies, logs, then fans out one update, in one turn of the
    /// room's lock, so every member sees updates in log order.
    async fn update(
        &self,
        store: &dyn RoundStore,
        conn: u64,
        author: &str,
        u: Vec<u8>,
    ) -> Result<(), RoomError> {
        let mut g = self.inner.lock().await;
        if g.log_bytes + u.len() as u64 > MAX_DOC_LOG_BYTES {
            return Err(RoomError::TooLarge {
                cap: MAX_DOC_LOG_BYTES,
            });
        }
        doc::apply(&g.doc, &u)?;
        let rec = DocLogRecord {
            session_id: self.session_id.clone(),
            idx: g.next_idx,
            kind: "update".into(),
            author: author.to_string(),
            ref_id: None,
            body: u,
            created_at_ms: now_ms(),
        };
        if let Err(e) = store.append_doc_log(&rec).await {
            self.close();
            return Err(RoomError::Store(e));
        }
        g.next_idx += 1;
        g.log_bytes += rec.body.len() as u64;
        let msg = encode(&Message::Sync(SyncMessage::Update(rec.body)));
        let _ = self.tx.send(Frame {
            from: conn,
            bytes: Arc::new(msg),
        });
        Ok(())
    }

    async fn presence(&self, conn: u64, u: AwarenessUpdate) -> Result<(), RoomError> {
        let mut g = self.inner.lock().await;
        for id in u.clients.keys() {
            match g.presence.get(&id.get()) {
                Some((_, _, owner)) if *owner != conn => {
                    return Err(RoomError::Presence(format!(
                        "client id {} belongs to another connection",
                        id.get()
                    )))
                }
                _ => {}
            }
        }
        for (id, e) in &u.clients {
            if &*e.json == "null" {
                g.presence.remove(&id.get());
            } else {
                g.presence.insert(id.get(), (e.clock, e.json.clone(), conn));
            }
        }
        let owned = g.presence.values().filter(|(_, _, c)| *c == conn).count();
        if owned > MAX_AWARENESS_CLIENTS {
            return Err(RoomError::Presence(format!(
                "more than {MAX_AWARENESS_CLIENTS} presence entries on one connection"
            )));
        }
        let msg = encode(&Message::Awareness(u));
        let _ = self.tx.send(Frame {
            from: conn,
            bytes: Arc::new(msg),
        });
        Ok(())
    }

    /// A connection left: its presence entries go, and everyone is told.
    pub async fn leave(&self, conn: u64) {
        let mut g = self.inner.lock().await;
        let gone: Vec<u64> = g
            .presence
            .iter()
            .filter(|(_, (_, _, c))| *c == conn)
            .map(|(id, _)| *id)
            .collect();
        if gone.is_empty() {
            return;
        }
        let mut clients = HashMap::new();
        for id in gone {
            if let Some((clock, _, _)) = g.presence.remove(&id) {
                clients.insert(
                    yrs::ClientID::new(id),
                    AwarenessUpdateEntry {
                        clock: clock.wrapping_add(1),
                        json: "null".into(),
                    },
                );
            }
        }
        let msg = encode(&Message::Awareness(AwarenessUpdate { clients }));
        let _ = self.tx.send(Frame {
            from: conn,
            bytes: Arc::new(msg),
        });
    }

    /// The document's files as a Run or Submit takes them, with a marker
    /// in the log at that point (`kind` `run` or `submit`, `ref_id` the
    /// Run's or the submission's id).
    pub async fn capture(
        &self,
        store: &dyn RoundStore,
        kind: &str,
        ref_id: &str,
    ) -> Result<BTreeMap<String, String>, RoomError> {
        if self.is_closed() {
            return Err(RoomError::Closed);
        }
        let mut g = self.inner.lock().await;
        let files = doc::files(&g.doc);
        let rec = DocLogRecord {
            session_id: self.session_id.clone(),
            idx: g.next_idx,
            kind: kind.into(),
            author: "candidate".into(),
            ref_id: Some(ref_id.to_string()),
            body: Vec::new(),
            created_at_ms: now_ms(),
        };
        if let Err(e) = store.append_doc_log(&rec).await {
            self.close();
            return Err(RoomError::Store(e));
        }
        g.next_idx += 1;
        Ok(files)
    }
}

fn presence_update(p: &HashMap<u64, (u32, Arc<str>, u64)>) -> AwarenessUpdate {
    AwarenessUpdate {
        clients: p
            .iter()
            .map(|(id, (clock, json, _))| {
                (
                    yrs::ClientID::new(*id),
                    AwarenessUpdateEntry {
                        clock: *clock,
                        json: json.clone(),
                    },
                )
            })
            .collect(),
    }
}

/// Every Yjs message in one WebSocket message (they may be packed), or
/// the first decoding error. Decoding hostile bytes runs under
/// `catch_unwind` (see `doc.rs`).
fn decode_messages(bytes: &[u8]) -> Result<Vec<Message>, RoomError> {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut dec = DecoderV1::from(bytes);
        yrs::sync::MessageReader::new(&mut dec).collect::<Result<Vec<_>, _>>()
    }));
    match r {
        Ok(Ok(m)) if !m.is_empty() => Ok(m),
        Ok(Ok(_)) => Err(RoomError::Presence("an empty message".into())),
        Ok(Err(e)) => Err(RoomError::Malformed(doc::DocError::Decode(e))),
        Err(_) => Err(RoomError::Malformed(doc::DocError::Panicked)),
    }
}

/// The rooms this process keeps, by session. A room lives while a
/// connection (or a Run's capture) holds it.
#[derive(Default)]
pub(crate) struct Rooms {
    map: Mutex<HashMap<String, Weak<Room>>>,
    /// Opening a room reads the log (and seeds it): one at a time, so
    /// two first connections cannot both seed one session.
    opening: tokio::sync::Mutex<()>,
}

impl Rooms {
    pub(crate) fn live(&self, session_id: &str) -> Option<Arc<Room>> {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.retain(|_, w| w.strong_count() > 0);
        m.get(session_id)
            .and_then(Weak::upgrade)
            .filter(|r| !r.is_closed())
    }

    fn keep(&self, room: &Arc<Room>) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.insert(room.session_id.clone(), Arc::downgrade(room));
    }
}

impl Rounds {
    /// Rebuilds a room from its log (from its last playback checkpoint,
    /// `checkpoint.rs`, and the entries after it); `None` if the session
    /// has none.
    async fn load(&self, session_id: &str) -> Result<Option<Arc<Room>>, RoundsError> {
        let cp = self.store.doc_checkpoint(session_id, u64::MAX).await?;
        let after = cp.as_ref().map(|c| c.idx);
        let tail = self.store.doc_log_tail(session_id, after, u64::MAX).await?;
        let Some(last) = tail.last().map(|e| e.idx).or(after) else {
            return Ok(None);
        };
        let start = cp.as_ref().map(|c| checkpoint::Start {
            state: &c.state,
            log_bytes: c.log_bytes,
        });
        let r = checkpoint::rebuild(start, tail.iter().map(|e| (e.idx, e.body.as_slice())))
            .map_err(|e| {
                RoundsError::Internal(format!("session {session_id}'s document log: {e}"))
            })?;
        self.keep_checkpoints(session_id, r.taken).await;
        Ok(Some(Room::new(session_id, r.doc, last + 1, r.log_bytes)))
    }
}

impl Rounds {
    /// The session's room, rebuilt from its log or, the first time,
    /// seeded from the session's files (`seed` true); `None` if it has
    /// no log and `seed` is false.
    pub(crate) async fn room(
        &self,
        s: &SessionRecord,
        seed: bool,
    ) -> Result<Option<Arc<Room>>, RoundsError> {
        if let Some(r) = self.rooms.live(&s.id) {
            return Ok(Some(r));
        }
        let _one = self.rooms.opening.lock().await;
        if let Some(r) = self.rooms.live(&s.id) {
            return Ok(Some(r));
        }
        if let Some(r) = self.load(&s.id).await? {
            self.rooms.keep(&r);
            return Ok(Some(r));
        }
        if !seed {
            return Ok(None);
        }
        let files = self.candidate_files(s).await?;
        let body = doc::seed_update(&files);
        let rec = DocLogRecord {
            session_id: s.id.clone(),
            idx: 0,
            kind: "seed".into(),
            author: "server".into(),
            ref_id: None,
            body,
            created_at_ms: now_ms(),
        };
        match self.store.append_doc_log(&rec).await {
            Ok(()) => {}
            // Another process seeded it first: take theirs.
            Err(e) if e.conflict() => {}
            Err(e) => return Err(e.into()),
        }
        let r = self
            .load(&s.id)
            .await?
            .ok_or_else(|| RoundsError::Internal("a seeded room has no log".into()))?;
        self.rooms.keep(&r);
        Ok(Some(r))
    }

    /// What a Run or Submit of this session uses: the room's document if
    /// the session has one (a marker is logged), else `None` (no one has
    /// opened the room; the posted files are used as before).
    pub(crate) async fn room_capture(
        &self,
        s: &SessionRecord,
        kind: &str,
        ref_id: &str,
    ) -> Result<Option<BTreeMap<String, String>>, RoundsError> {
        let Some(room) = self.room(s, false).await? else {
            return Ok(None);
        };
        match room.capture(self.store.as_ref(), kind, ref_id).await {
            Ok(f) => Ok(Some(f)),
            Err(RoomError::Store(e)) => Err(e.into()),
            Err(e) => Err(RoundsError::state("room_reloading", e.to_string())),
        }
    }
}
