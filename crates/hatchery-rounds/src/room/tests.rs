//! The room end to end over real WebSockets on loopback: the rounds
//! router served by axum, clients speaking the Yjs protocol with `yrs`
//! through `tokio-tungstenite`, the real SQLite store, the in-memory
//! sandboxes. Refusals before the upgrade, two clients converging, Run
//! and Submit taking the server's document, the caps at their
//! boundaries, bad input closing only its own connection, and a room
//! rebuilt from its log.

use super::doc;
use crate::grading_tests::Env;
use crate::limits::*;
use crate::models::{RunBody, SubmitBody};
use crate::store::{Scope, SessionRecord};
use futures::{SinkExt, StreamExt};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error as WsError, Message as Ws};
use yrs::sync::protocol::SyncMessage;
use yrs::sync::Message;
use yrs::updates::decoder::DecoderV1;
use yrs::updates::encoder::Encode;
use yrs::{Doc, Map, Out, ReadTxn, Text, Transact};

type Stream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn serve(e: &Env) -> SocketAddr {
    let app = crate::router(e.rounds.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

fn url(addr: SocketAddr, s: &SessionRecord) -> String {
    format!(
        "ws://{addr}/v1/rounds/{}/sessions/{}/room",
        s.round_id, s.id
    )
}

/// Connects with `token` as a bearer header (or none): the socket, or
/// the HTTP status of the refusal.
async fn dial(addr: SocketAddr, s: &SessionRecord, token: Option<&str>) -> Result<Stream, u16> {
    let mut req = url(addr, s).into_client_request().unwrap();
    if let Some(t) = token {
        req.headers_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => Ok(ws),
        Err(WsError::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("dial: {e}"),
    }
}

/// A Yjs client: its document and its socket.
struct Client {
    ws: Stream,
    doc: Doc,
    /// The room's own events received (Run output, pairing).
    events: Vec<serde_json::Value>,
}

/// How a connection ended, as the server said.
#[derive(Debug, PartialEq)]
enum Ended {
    Code(u16),
    Dropped,
}

impl Client {
    async fn join(addr: SocketAddr, s: &SessionRecord, token: &str) -> Client {
        let ws = dial(addr, s, Some(token)).await.expect("room refused");
        let mut c = Client {
            ws,
            doc: Doc::new(),
            events: Vec::new(),
        };
        // Our state vector: the server answers with everything.
        let sv = c.doc.transact().state_vector();
        c.send(&Message::Sync(SyncMessage::SyncStep1(sv))).await;
        c
    }

    async fn send(&mut self, m: &Message) {
        self.ws
            .send(Ws::Binary(m.encode_v1().into()))
            .await
            .unwrap();
    }

    /// Reads one message and handles it; `Err` when the connection ends.
    async fn pump(&mut self) -> Result<(), Ended> {
        let m = match tokio::time::timeout(Duration::from_secs(10), self.ws.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(_) => return Err(Ended::Dropped),
            Err(_) => panic!("nothing from the room in 10 s"),
        };
        match m {
            Ws::Binary(b) => {
                let mut dec = DecoderV1::from(&b[..]);
                let msgs = yrs::sync::MessageReader::new(&mut dec)
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap();
                for m in msgs {
                    match m {
                        Message::Sync(SyncMessage::SyncStep1(sv)) => {
                            let d = self.doc.transact().encode_diff_v1(&sv);
                            self.send(&Message::Sync(SyncMessage::SyncStep2(d))).await;
                        }
                        Message::Sync(SyncMessage::SyncStep2(u))
                        | Message::Sync(SyncMessage::Update(u)) => {
                            doc::apply(&self.doc, &u).unwrap();
                        }
                        Message::Custom(super::MSG_ROOM_EVENT, data) => {
                            self.events.push(serde_json::from_slice(&data).unwrap());
                        }
                        _ => {}
                    }
                }
                Ok(())
            }
            Ws::Close(f) => Err(f.map_or(Ended::Dropped, |f| Ended::Code(f.code.into()))),
            _ => Ok(()),
        }
    }

    /// Pumps until `path` reads `want`.
    async fn until(&mut self, path: &str, want: &str) {
        for _ in 0..1000 {
            if doc::files(&self.doc).get(path).map(String::as_str) == Some(want) {
                return;
            }
            self.pump().await.expect("the room closed");
        }
        panic!("{path} never became {want:?}");
    }

    /// Pumps until the server closes; its close code.
    async fn closed(&mut self) -> Ended {
        loop {
            if let Err(e) = self.pump().await {
                return e;
            }
        }
    }

    /// Inserts `text` at `at` in `path` and sends the update.
    async fn type_in(&mut self, path: &str, at: u32, text: &str) {
        let u = self.local_edit(path, at, text);
        self.send(&Message::Sync(SyncMessage::Update(u))).await;
    }

    fn local_edit(&self, path: &str, at: u32, text: &str) -> Vec<u8> {
        let before = self.doc.transact().state_vector();
        let map = self.doc.get_or_insert_map(doc::FILES);
        let mut txn = self.doc.transact_mut();
        let Some(Out::YText(t)) = map.get(&txn, path) else {
            panic!("no file {path}")
        };
        t.insert(&mut txn, at, text);
        drop(txn);
        self.doc.transact().encode_diff_v1(&before)
    }
}

const STARTER: &str = "def add(a, b):\n    pass\n";

#[tokio::test]
async fn refusals_come_before_the_upgrade() {
    let e = Env::new().await;
    let (_, s, token) = e.session_with_token().await;
    let (_, other, other_token) = e.session_with_token().await;
    let addr = serve(&e).await;
    assert_eq!(dial(addr, &s, None).await.err(), Some(401), "no token");
    let wrong = crate::tokens::mint();
    assert_eq!(
        dial(addr, &s, Some(&wrong)).await.err(),
        Some(401),
        "wrong token"
    );
    assert_eq!(
        dial(addr, &s, Some(&other_token)).await.err(),
        Some(403),
        "another session's candidate"
    );
    // A reviewer token of the round: not a room member.
    let rev = crate::tokens::mint();
    let rec = crate::tokens::record(
        &rev,
        Scope::Reviewer,
        &s.round_id,
        None,
        crate::ids::now_ms(),
        60,
    );
    e.store.insert_token(&rec).await.unwrap();
    assert_eq!(
        dial(addr, &s, Some(&rev)).await.err(),
        Some(403),
        "reviewer"
    );
    // An expired candidate token of this very session.
    let old = crate::tokens::mint();
    let mut rec = crate::tokens::record(&old, Scope::Candidate, &s.round_id, Some(&s.id), 1, 1);
    rec.expires_at_ms = crate::ids::now_ms() - 1;
    e.store.insert_token(&rec).await.unwrap();
    assert_eq!(dial(addr, &s, Some(&old)).await.err(), Some(401), "expired");
    // An interviewer token of this round a millisecond past its expiry:
    // 401 (one that expires later opens the room, below).
    let now = crate::ids::now_ms();
    let late = crate::tokens::mint();
    let mut rec = crate::tokens::record(&late, Scope::Interviewer, &s.round_id, None, 1, 1);
    rec.expires_at_ms = now - 1;
    e.store.insert_token(&rec).await.unwrap();
    assert_eq!(
        dial(addr, &s, Some(&late)).await.err(),
        Some(401),
        "expired interviewer"
    );
    // An ended session has no room.
    e.rounds.end_session(&other, "ended").await.unwrap();
    assert_eq!(
        dial(addr, &other, Some(&other_token)).await.err(),
        Some(409)
    );
    // Nothing was seeded by any refusal.
    assert!(e.store.doc_log(&s.id, None).await.unwrap().is_empty());
    // (After the check above: opening seeds the room.)
    let live = crate::tokens::mint();
    let mut rec = crate::tokens::record(&live, Scope::Interviewer, &s.round_id, None, 1, 1);
    rec.expires_at_ms = now + 60_000;
    e.store.insert_token(&rec).await.unwrap();
    drop(
        dial(addr, &s, Some(&live))
            .await
            .expect("a live interviewer token opens the room"),
    );
    // The right token opens it; the upgrade selected only the room's
    // subprotocol.
    let mut c = Client::join(addr, &s, &token).await;
    c.until("solution.py", STARTER).await;
}

#[tokio::test]
async fn two_clients_converge_and_run_and_submit_take_the_servers_copy() {
    let e = Env::new().await;
    let (_, s, token) = e.session_with_token().await;
    let addr = serve(&e).await;
    let mut a = Client::join(addr, &s, &token).await;
    let mut b = Client::join(addr, &s, "key").await;
    a.until("solution.py", STARTER).await;
    b.until("solution.py", STARTER).await;
    a.type_in("solution.py", 0, "# by a\n").await;
    let want = format!("# by a\n{STARTER}");
    b.until("solution.py", &want).await;
    b.type_in("solution.py", 0, "# by b\n").await;
    let want = format!("# by b\n# by a\n{STARTER}");
    a.until("solution.py", &want).await;

    // A Run posting other files runs the room's document.
    let sbx = s.sandbox_id.clone().unwrap();
    let posted = BTreeMap::from([("solution.py".to_string(), "posted".to_string())]);
    let res = e
        .rounds
        .run(
            &s.round_id,
            &s.id,
            RunBody {
                files: posted.clone(),
            },
        )
        .await
        .unwrap();
    let written = e.fake.sandbox(&sbx).unwrap().files[&format!("{WORKDIR}/solution.py")].clone();
    assert_eq!(String::from_utf8(written).unwrap(), want);

    // So does a Submit: the captured files are the document's.
    let acc = e
        .rounds
        .submit(
            &s.round_id,
            &s.id,
            SubmitBody {
                files: Some(posted),
            },
        )
        .await
        .unwrap();
    e.graded(&s).await;
    let sub = e
        .rounds
        .submission_files(&s.round_id, &s.id, &acc.submission_id)
        .await
        .unwrap();
    assert_eq!(sub.files["solution.py"], want);

    // The log: the seed, two updates, then the Run's and the Submit's
    // markers; replaying it gives the same files byte for byte.
    let log = e.store.doc_log(&s.id, None).await.unwrap();
    let kinds: Vec<&str> = log.iter().map(|l| l.kind.as_str()).collect();
    assert_eq!(kinds, ["seed", "update", "update", "run", "submit"]);
    assert_eq!(log[1].author, "candidate");
    assert_eq!(log[2].author, "api_key");
    assert_eq!(log[3].ref_id.as_deref(), Some(res.run_id.as_str()));
    assert_eq!(log[4].ref_id.as_deref(), Some(acc.submission_id.as_str()));
    let replayed = doc::replay(
        log.iter()
            .map(|l| l.body.as_slice())
            .filter(|b| !b.is_empty()),
    )
    .unwrap();
    assert_eq!(doc::files(&replayed)["solution.py"], want);

    // Playback: the document at each entry, by the API.
    let at = |i: u64| e.rounds.document_at(&s.round_id, &s.id, i);
    assert_eq!(at(0).await.unwrap().files["solution.py"], STARTER);
    assert_eq!(
        at(1).await.unwrap().files["solution.py"],
        format!("# by a\n{STARTER}")
    );
    assert_eq!(
        at(3).await.unwrap().files["solution.py"],
        want,
        "at the Run"
    );
    assert_eq!(
        at(4).await.unwrap().files,
        sub.files,
        "at the Submit, byte for byte"
    );
    assert!(matches!(at(5).await, Err(crate::RoundsError::NotFound(_))));
    let tl = e.rounds.timeline(&s.round_id, &s.id).await.unwrap();
    assert_eq!(tl.entries.len(), 5);
    assert_eq!(tl.entries[3].ref_id.as_deref(), Some(res.run_id.as_str()));
    // Reviewer side only.
    let app = crate::router(e.rounds.clone());
    let path = format!("/v1/rounds/{}/sessions/{}/document?at=1", s.round_id, s.id);
    assert_eq!(http(&app, "GET", &path, &token, "").await.0, 403);
    let (st, v) = http(&app, "GET", &path, "key", "").await;
    assert_eq!((st, v["idx"].as_u64()), (200, Some(1)));
    let bad = format!("/v1/rounds/{}/sessions/{}/document?at=x", s.round_id, s.id);
    assert_eq!(http(&app, "GET", &bad, "key", "").await.0, 400);
}

#[tokio::test]
async fn a_rejoin_or_a_restart_loses_nothing() {
    let e = Env::new().await;
    let (_, s, token) = e.session_with_token().await;
    let addr = serve(&e).await;
    let mut a = Client::join(addr, &s, &token).await;
    a.until("solution.py", STARTER).await;
    a.type_in("solution.py", 0, "x = 1\n").await;
    // Typed while disconnected is sent on the next join (sync step 2).
    let offline = a.local_edit("notes.md", 0, "offline ");
    drop(a);
    let mut b = Client::join(addr, &s, "key").await;
    b.until("solution.py", &format!("x = 1\n{STARTER}")).await;
    let mut back = Client::join(addr, &s, &token).await;
    back.send(&Message::Sync(SyncMessage::Update(offline)))
        .await;
    back.until("solution.py", &format!("x = 1\n{STARTER}"))
        .await;
    b.until("notes.md", "offline scratch").await;
    drop((b, back));

    // A new process on the same store rebuilds the room from the log.
    let again = crate::Rounds::new(
        e.store.clone(),
        e.fake.clone(),
        "key".into(),
        crate::RoundsConfig::default(),
        &prometheus::Registry::new(),
    );
    let app = crate::router(again.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr2 = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    let mut c = Client::join(addr2, &s, &token).await;
    c.until("solution.py", &format!("x = 1\n{STARTER}")).await;
    c.until("notes.md", "offline scratch").await;
    let seeds = e.store.doc_log(&s.id, None).await.unwrap();
    assert_eq!(
        seeds.iter().filter(|l| l.kind == "seed").count(),
        1,
        "seeded once"
    );
    // Ending the session closes the room; the log stays.
    again.end_session(&s, "ended").await.unwrap();
    assert_eq!(c.closed().await, Ended::Code(1012));
    assert_eq!(
        e.store.doc_log(&s.id, None).await.unwrap().len(),
        seeds.len()
    );
}

#[tokio::test]
async fn bad_input_closes_only_its_own_connection() {
    let e = Env::new().await;
    let (_, s, token) = e.session_with_token().await;
    let addr = serve(&e).await;
    let mut good = Client::join(addr, &s, &token).await;
    good.until("solution.py", STARTER).await;
    let before = e.store.doc_log(&s.id, None).await.unwrap().len();
    let cases: Vec<(Ws, u16)> = vec![
        // A sync update whose payload is not a Yjs update.
        (
            Ws::Binary(vec![0, 2, 5, 0xff, 0xff, 0xff, 0xff, 0xff].into()),
            4400,
        ),
        // An unknown sync step.
        (Ws::Binary(vec![0, 9, 0].into()), 4400),
        // Truncated.
        (Ws::Binary(vec![0].into()), 4400),
        (Ws::Text("hello".into()), 4400),
    ];
    for (msg, code) in cases {
        let mut bad = Client::join(addr, &s, "key").await;
        bad.until("solution.py", STARTER).await;
        bad.ws.send(msg).await.unwrap();
        assert_eq!(bad.closed().await, Ended::Code(code));
    }
    // One message over the cap: the socket is cut (no close code needed).
    let mut big = Client::join(addr, &s, "key").await;
    big.until("solution.py", STARTER).await;
    let huge = big.local_edit("notes.md", 0, &"x".repeat(MAX_ROOM_MESSAGE_BYTES));
    let _ = big.ws.send(Ws::Binary(huge.into())).await;
    let ended = big.closed().await;
    assert!(
        matches!(ended, Ended::Dropped | Ended::Code(1009)),
        "{ended:?}"
    );
    // Nothing of it reached the log; the good client carries on.
    assert_eq!(e.store.doc_log(&s.id, None).await.unwrap().len(), before);
    good.type_in("solution.py", 0, "ok\n").await;
    let mut check = Client::join(addr, &s, "key").await;
    check.until("solution.py", &format!("ok\n{STARTER}")).await;
}

#[tokio::test]
async fn message_size_cap_boundary() {
    let e = Env::new().await;
    let (_, s, token) = e.session_with_token().await;
    let addr = serve(&e).await;
    let mut c = Client::join(addr, &s, &token).await;
    c.until("notes.md", "scratch").await;
    // An update message of exactly the cap is taken.
    let fits = |n: usize| {
        let probe = twin(&c.doc);
        let p = Client::local_edit_on(&probe, "notes.md", &"y".repeat(n));
        Message::Sync(SyncMessage::Update(p)).encode_v1().len()
    };
    let mut n = MAX_ROOM_MESSAGE_BYTES - 64;
    while fits(n) < MAX_ROOM_MESSAGE_BYTES {
        n += 1;
    }
    assert_eq!(fits(n), MAX_ROOM_MESSAGE_BYTES, "an exact fit exists");
    let u = c.local_edit("notes.md", 0, &"y".repeat(n));
    let msg = Message::Sync(SyncMessage::Update(u));
    assert_eq!(msg.encode_v1().len(), MAX_ROOM_MESSAGE_BYTES);
    c.send(&msg).await;
    let mut other = Client::join(addr, &s, "key").await;
    other
        .until("notes.md", &format!("{}scratch", "y".repeat(n)))
        .await;
    // One byte over: cut by its size (not a 4400 for its content).
    let mut over = vec![0u8; MAX_ROOM_MESSAGE_BYTES + 1];
    over[1] = 2;
    let _ = other.ws.send(Ws::Binary(over.into())).await;
    let ended = other.closed().await;
    assert!(
        matches!(ended, Ended::Dropped | Ended::Code(1009)),
        "{ended:?}"
    );
}

impl Client {
    fn local_edit_on(d: &Doc, path: &str, text: &str) -> Vec<u8> {
        let before = d.transact().state_vector();
        let map = d.get_or_insert_map(doc::FILES);
        let mut txn = d.transact_mut();
        let Some(Out::YText(t)) = map.get(&txn, path) else {
            panic!("no file {path}")
        };
        t.insert(&mut txn, 0, text);
        drop(txn);
        d.transact().encode_diff_v1(&before)
    }
}

#[tokio::test]
async fn document_log_cap_boundary() {
    let e = Env::new().await;
    let (_, s, token) = e.session_with_token().await;
    let addr = serve(&e).await;
    let mut c = Client::join(addr, &s, &token).await;
    c.until("notes.md", "scratch").await;
    let logged = |log: &[crate::store::DocLogRecord]| -> u64 {
        log.iter().map(|l| l.body.len() as u64).sum()
    };
    // Fill with 200 KiB updates, then one sized to land exactly on the
    // cap, each checked accepted by a second client seeing it.
    let chunk = 200 << 10;
    loop {
        let used = logged(&e.store.doc_log(&s.id, None).await.unwrap());
        let left = MAX_DOC_LOG_BYTES - used;
        let u = c.local_edit("notes.md", 0, &"z".repeat(chunk));
        if u.len() as u64 >= left {
            // Undo locally: rebuild the client from the server.
            c = Client::join(addr, &s, &token).await;
            let want = doc::files(&rebuilt(&e, &s).await)["notes.md"].clone();
            c.until("notes.md", &want).await;
            break;
        }
        c.send(&Message::Sync(SyncMessage::Update(u))).await;
        let want = doc::files(&c.doc)["notes.md"].clone();
        wait_logged(&e, &s, &want).await;
    }
    let used = logged(&e.store.doc_log(&s.id, None).await.unwrap());
    let left = (MAX_DOC_LOG_BYTES - used) as usize;
    // The text whose update is exactly `left` bytes: n ASCII characters,
    // or n and one two-byte character where a length prefix grows by a
    // byte and skips the size.
    let size = |t: &str| Client::local_edit_on(&twin(&c.doc), "notes.md", t).len();
    let fill = (left.saturating_sub(64)..left)
        .flat_map(|n| ["", "é"].map(|tail| format!("{}{tail}", "w".repeat(n))))
        .find(|t| size(t) == left)
        .expect("an exact fit exists");
    let u = c.local_edit("notes.md", 0, &fill);
    assert_eq!(u.len(), left);
    c.send(&Message::Sync(SyncMessage::Update(u))).await;
    let want = doc::files(&c.doc)["notes.md"].clone();
    wait_logged(&e, &s, &want).await;
    assert_eq!(
        logged(&e.store.doc_log(&s.id, None).await.unwrap()),
        MAX_DOC_LOG_BYTES
    );
    // One byte more: refused, this connection closes with 4413.
    c.type_in("notes.md", 0, "!").await;
    assert_eq!(c.closed().await, Ended::Code(4413));
    assert_eq!(
        logged(&e.store.doc_log(&s.id, None).await.unwrap()),
        MAX_DOC_LOG_BYTES
    );
}

/// A copy of `d` under the same client id: a local edit on it encodes
/// exactly as the same edit on `d` would.
fn twin(d: &Doc) -> Doc {
    let t = Doc::with_client_id(d.client_id().get());
    doc::apply(&t, &doc::full_state(d)).unwrap();
    t
}

async fn rebuilt(e: &Env, s: &SessionRecord) -> Doc {
    let log = e.store.doc_log(&s.id, None).await.unwrap();
    doc::replay(
        log.iter()
            .map(|l| l.body.as_slice())
            .filter(|b| !b.is_empty()),
    )
    .unwrap()
}

/// Waits until the log replays to `want` in notes.md.
async fn wait_logged(e: &Env, s: &SessionRecord, want: &str) {
    for _ in 0..2000 {
        if doc::files(&rebuilt(e, s).await)["notes.md"] == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the update never reached the log");
}

#[tokio::test]
async fn rate_cap_closes_a_flooding_connection() {
    let e = Env::new().await;
    let (_, s, token) = e.session_with_token().await;
    let addr = serve(&e).await;
    let mut calm = Client::join(addr, &s, &token).await;
    calm.until("solution.py", STARTER).await;
    let mut flood = Client::join(addr, &s, "key").await;
    flood.until("solution.py", STARTER).await;
    // Far past the burst at once (awareness queries: cheap, valid).
    let q = Message::AwarenessQuery.encode_v1();
    for _ in 0..(ROOM_RATE_BURST as usize * 3) {
        if flood.ws.send(Ws::Binary(q.clone().into())).await.is_err() {
            break;
        }
    }
    assert_eq!(flood.closed().await, Ended::Code(4429));
    calm.type_in("solution.py", 0, "still here\n").await;
    let mut check = Client::join(addr, &s, "key").await;
    check
        .until("solution.py", &format!("still here\n{STARTER}"))
        .await;
}

/// The rate cap's lower side over a real socket: a burst of exactly
/// `ROOM_RATE_BURST` messages at once (the handshake's two among them) is
/// all taken and the connection stays; the bucket's exact edge at the
/// real constants is `rate::tests::room_caps_at_the_boundary`, the upper
/// side `rate_cap_closes_a_flooding_connection`.
#[tokio::test]
async fn a_burst_of_exactly_the_cap_is_taken() {
    let e = Env::new().await;
    let (_, s, token) = e.session_with_token().await;
    let addr = serve(&e).await;
    let mut calm = Client::join(addr, &s, &token).await;
    calm.until("solution.py", STARTER).await;
    // Two messages spent: our sync step 1, and our step 2 answering the
    // server's step 1 (which `until` pumped before the document).
    let mut burst = Client::join(addr, &s, "key").await;
    burst.until("solution.py", STARTER).await;
    let q = Message::AwarenessQuery.encode_v1();
    for _ in 0..(ROOM_RATE_BURST as usize - 3) {
        burst.ws.send(Ws::Binary(q.clone().into())).await.unwrap();
    }
    // The burst's last message is an edit: taken, logged, fanned out.
    burst.type_in("solution.py", 0, "a\n").await;
    calm.until("solution.py", &format!("a\n{STARTER}")).await;
    // Still open once the bucket refills a little.
    tokio::time::sleep(Duration::from_millis(50)).await;
    burst.type_in("solution.py", 0, "b\n").await;
    calm.until("solution.py", &format!("b\na\n{STARTER}")).await;
}

/// Presence: MAX_AWARENESS_CLIENTS entries on one connection are kept;
/// one more closes that connection (4400) and only it.
#[tokio::test]
async fn presence_cap_boundary() {
    use yrs::sync::awareness::AwarenessUpdateEntry;
    use yrs::sync::AwarenessUpdate;
    let e = Env::new().await;
    let (_, s, token) = e.session_with_token().await;
    let addr = serve(&e).await;
    let mut calm = Client::join(addr, &s, &token).await;
    calm.until("solution.py", STARTER).await;
    let mut many = Client::join(addr, &s, "key").await;
    many.until("solution.py", STARTER).await;
    let presence = |ids: std::ops::Range<u64>| {
        Message::Awareness(AwarenessUpdate {
            clients: ids
                .map(|id| {
                    (
                        yrs::ClientID::new(id),
                        AwarenessUpdateEntry {
                            clock: 1,
                            json: r#"{"user":{"name":"x"}}"#.into(),
                        },
                    )
                })
                .collect(),
        })
    };
    let cap = MAX_AWARENESS_CLIENTS as u64;
    many.send(&presence(1..cap + 1)).await;
    many.type_in("solution.py", 0, "kept\n").await;
    calm.until("solution.py", &format!("kept\n{STARTER}")).await;
    many.send(&presence(cap + 1..cap + 2)).await;
    assert_eq!(many.closed().await, Ended::Code(4400));
    calm.type_in("solution.py", 0, "on\n").await;
    let mut check = Client::join(addr, &s, "key").await;
    check
        .until("solution.py", &format!("on\nkept\n{STARTER}"))
        .await;
}

#[tokio::test]
async fn connection_and_member_caps() {
    let e = Env::new().await;
    let (_, s, token) = e.session_with_token().await;
    let addr = serve(&e).await;
    // MAX_ROOM_CONNECTIONS tabs of one member fit; one more is 429.
    let mut open = Vec::new();
    for _ in 0..MAX_ROOM_CONNECTIONS {
        let mut c = Client::join(addr, &s, &token).await;
        c.until("solution.py", STARTER).await;
        open.push(c);
    }
    assert_eq!(dial(addr, &s, Some(&token)).await.err(), Some(429));
    // A place frees when a connection closes.
    let gone = open.pop().unwrap();
    drop(gone);
    let mut back = None;
    for _ in 0..200 {
        if let Ok(ws) = dial(addr, &s, Some(&token)).await {
            back = Some(ws);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(back.is_some(), "the freed place was never given back");
    drop((open, back));

    // Members, on a room of their own.
    let (_, s, token) = e.session_with_token().await;

    // MAX_ROOM_MEMBERS distinct tokens fit; another one is 429, while a
    // member already in may still open another tab.
    let mut tokens = vec![token.clone()];
    while tokens.len() < MAX_ROOM_MEMBERS + 1 {
        let t = crate::tokens::mint();
        let rec = crate::tokens::record(
            &t,
            Scope::Candidate,
            &s.round_id,
            Some(&s.id),
            crate::ids::now_ms(),
            600,
        );
        e.store.insert_token(&rec).await.unwrap();
        tokens.push(t);
    }
    let mut members = Vec::new();
    for t in &tokens[..MAX_ROOM_MEMBERS] {
        let mut c = Client::join(addr, &s, t).await;
        c.until("solution.py", STARTER).await;
        members.push(c);
    }
    assert_eq!(
        dial(addr, &s, Some(&tokens[MAX_ROOM_MEMBERS])).await.err(),
        Some(429)
    );
    let mut again = Client::join(addr, &s, &tokens[0]).await;
    again.until("solution.py", STARTER).await;
}

async fn interviewer_token(app: &axum::Router, round: &str) -> String {
    let out = http(
        app,
        "POST",
        &format!("/v1/rounds/{round}/interviewer-tokens"),
        "key",
        "{}",
    )
    .await;
    assert_eq!(out.0, 201, "{}", out.1);
    out.1["token"].as_str().unwrap().to_string()
}

/// One HTTP request on loopback: status and JSON body.
async fn http(
    app: &axum::Router,
    method: &str,
    path: &str,
    token: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    use tower::ServiceExt;
    let req = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let b = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null),
    )
}

#[tokio::test]
async fn interviewer_watches_pairs_sees_runs_and_keeps_notes_from_the_candidate() {
    let e = Env::new().await;
    let (_, s, token) = e.session_with_token().await;
    let app = crate::router(e.rounds.clone());
    let addr = serve(&e).await;
    let it = interviewer_token(&app, &s.round_id).await;
    // Not a reviewer: no report, and not the candidate: no Run.
    let (st, _) = http(
        &app,
        "GET",
        &format!("/v1/rounds/{}/sessions/{}/report", s.round_id, s.id),
        &it,
        "",
    )
    .await;
    assert_eq!(st, 403);
    let (st, _) = http(
        &app,
        "POST",
        &format!("/v1/rounds/{}/sessions/{}/run", s.round_id, s.id),
        &it,
        "{}",
    )
    .await;
    assert_eq!(st, 403);
    // Only the API key makes interviewer tokens.
    let (st, _) = http(
        &app,
        "POST",
        &format!("/v1/rounds/{}/interviewer-tokens", s.round_id),
        &token,
        "{}",
    )
    .await;
    assert_eq!(st, 403);

    let mut cand = Client::join(addr, &s, &token).await;
    let mut int = Client::join(addr, &s, &it).await;
    cand.until("solution.py", STARTER).await;
    int.until("solution.py", STARTER).await;
    cand.type_in("solution.py", 0, "# c\n").await;
    int.until("solution.py", &format!("# c\n{STARTER}")).await;

    // Read-only: the interviewer's edit is dropped by the server.
    int.type_in("solution.py", 0, "# i\n").await;
    cand.type_in("solution.py", 0, "# c2\n").await;
    let mut probe = Client::join(addr, &s, "key").await;
    probe
        .until("solution.py", &format!("# c2\n# c\n{STARTER}"))
        .await;
    assert!(!e
        .store
        .doc_log(&s.id, None)
        .await
        .unwrap()
        .iter()
        .any(|l| l.author.starts_with("interviewer")));
    drop(probe);

    // Pairing on: the interviewer types too; everyone is told.
    let pair = format!("/v1/rounds/{}/sessions/{}/room/pairing", s.round_id, s.id);
    let (st, _) = http(&app, "POST", &pair, &token, r#"{"pairing":true}"#).await;
    assert_eq!(st, 403, "the candidate cannot switch it");
    let (st, v) = http(&app, "POST", &pair, &it, r#"{"pairing":true}"#).await;
    assert_eq!((st, v["pairing"].as_bool()), (200, Some(true)));
    let mut int = Client::join(addr, &s, &it).await;
    int.until("solution.py", &format!("# c2\n# c\n{STARTER}"))
        .await;
    int.type_in("solution.py", 0, "# pair\n").await;
    cand.until("solution.py", &format!("# pair\n# c2\n# c\n{STARTER}"))
        .await;
    assert!(cand
        .events
        .iter()
        .any(|v| v["event"] == "pairing" && v["pairing"] == true));

    // A streamed Run by the candidate reaches the interviewer as it runs.
    let ev = e
        .rounds
        .run_stream(&s.round_id, &s.id, RunBody::default())
        .await
        .unwrap();
    let got: Vec<_> = ev.collect().await;
    assert!(matches!(
        got.last(),
        Some(crate::run_ops::RunEvent::Result(_))
    ));
    for _ in 0..100 {
        if int.events.iter().any(|v| v["event"] == "run_result") {
            break;
        }
        int.pump().await.unwrap();
    }
    let kinds: Vec<&str> = int
        .events
        .iter()
        .filter_map(|v| v["event"].as_str())
        .collect();
    assert!(
        kinds.contains(&"run_started") && kinds.contains(&"run_result"),
        "{kinds:?}"
    );

    // Notes: interviewers write, the candidate never reads them.
    let notes = format!("/v1/rounds/{}/sessions/{}/notes", s.round_id, s.id);
    let secret = "SECRET-NOTE: strong on tests";
    let (st, _) = http(
        &app,
        "PUT",
        &notes,
        &it,
        &serde_json::json!({"text": secret}).to_string(),
    )
    .await;
    assert_eq!(st, 200);
    let (st, v) = http(&app, "GET", &notes, &it, "").await;
    assert_eq!((st, v["text"].as_str()), (200, Some(secret)));
    assert!(v["author"].as_str().unwrap().starts_with("interviewer:"));
    let (st, v) = http(&app, "GET", &notes, &token, "").await;
    assert_eq!(st, 403);
    assert!(!v.to_string().contains("SECRET-NOTE"));
    let (st, _) = http(&app, "PUT", &notes, &token, r#"{"text":"x"}"#).await;
    assert_eq!(st, 403);
    // Nothing the candidate's socket got carries them.
    for _ in 0..3 {
        let _ = tokio::time::timeout(Duration::from_millis(50), cand.pump()).await;
    }
    assert!(!cand
        .events
        .iter()
        .any(|v| v.to_string().contains("SECRET-NOTE")));
    // The cap, at its boundary.
    let at = "n".repeat(MAX_NOTES_BYTES);
    let (st, _) = http(
        &app,
        "PUT",
        &notes,
        &it,
        &serde_json::json!({"text": at}).to_string(),
    )
    .await;
    assert_eq!(st, 200);
    let over = "n".repeat(MAX_NOTES_BYTES + 1);
    let (st, _) = http(
        &app,
        "PUT",
        &notes,
        &it,
        &serde_json::json!({"text": over}).to_string(),
    )
    .await;
    assert_eq!(st, 413);
    // An interviewer token of another round opens nothing here.
    let (_, other, _) = e.session_with_token().await;
    let other_it = interviewer_token(&app, &other.round_id).await;
    assert_eq!(dial(addr, &s, Some(&other_it)).await.err(), Some(403));
    let (st, _) = http(&app, "GET", &notes, &other_it, "").await;
    assert_eq!(st, 403);
}

/// A long log in the real store (a typist's keystrokes through the room,
/// Run markers between): playback at every entry from the stored
/// checkpoints is what replaying the whole log gives, the checkpoints stay
/// within their bounds, a room rebuilt by another process starts from
/// them, and retention deletes them with the log.
#[tokio::test]
async fn playback_from_checkpoints_matches_the_full_rebuild() {
    let e = Env::new().await;
    let (_, s, _) = e.session_with_token().await;
    let room = e.rounds.room(&s, true).await.unwrap().unwrap();
    let typist = Doc::new();
    let seed = e.store.doc_log(&s.id, None).await.unwrap();
    doc::apply(&typist, &seed[0].body).unwrap();
    let n = 3 * DOC_CHECKPOINT_MIN_ENTRIES as usize + 100;
    for i in 0..n {
        if i % 97 == 96 {
            room.capture(e.store.as_ref(), "run", &format!("run_{i}"))
                .await
                .unwrap();
            continue;
        }
        let sv = typist.transact().state_vector();
        {
            let files = typist.get_or_insert_map(doc::FILES);
            let mut txn = typist.transact_mut();
            let Some(Out::YText(t)) = files.get(&txn, "solution.py") else {
                panic!("no solution.py")
            };
            let len = t.len(&txn);
            if i % 5 == 4 {
                t.remove_range(&mut txn, (i as u32 * 7) % len, 1);
            } else {
                t.insert(&mut txn, (i as u32 * 13) % (len + 1), "ab\n");
            }
        }
        let u = typist.transact().encode_diff_v1(&sv);
        room.update(e.store.as_ref(), 1, "candidate", u)
            .await
            .unwrap();
    }
    let log = e.store.doc_log(&s.id, None).await.unwrap();
    let last = log.last().unwrap().idx;
    // The whole log replayed, after each entry.
    let full = Doc::new();
    let mut want = Vec::new();
    for l in &log {
        if !l.body.is_empty() {
            doc::apply(&full, &l.body).unwrap();
        }
        want.push(doc::files(&full));
    }
    assert_eq!(want[last as usize], doc::files(&typist));
    // The end first (one replay passes every checkpoint), then all.
    let at = |i: u64| e.rounds.document_at(&s.round_id, &s.id, i);
    assert_eq!(at(last).await.unwrap().files, want[last as usize]);
    let cps = e.store.doc_checkpoints(&s.id).await.unwrap();
    assert!(cps.len() >= 2, "{} checkpoints", cps.len());
    for i in (0..=last).rev() {
        assert_eq!(at(i).await.unwrap().files, want[i as usize], "at {i}");
    }
    assert!(matches!(
        at(last + 1).await,
        Err(crate::RoundsError::NotFound(_))
    ));
    // Bounds: spaced, and together at most twice the log.
    let log_bytes: u64 = log.iter().map(|l| l.body.len() as u64).sum();
    let cp_bytes: u64 = cps.iter().map(|c| c.state.len() as u64).sum();
    assert!(cp_bytes <= 2 * log_bytes, "{cp_bytes} > 2 x {log_bytes}");
    for w in cps.windows(2) {
        assert!(w[1].idx - w[0].idx >= DOC_CHECKPOINT_MIN_ENTRIES);
    }
    for c in &cps {
        let upto: u64 = log[..=c.idx as usize]
            .iter()
            .map(|l| l.body.len() as u64)
            .sum();
        assert_eq!(c.log_bytes, upto, "log bytes at {}", c.idx);
    }
    assert_eq!(
        e.store.doc_checkpoints(&s.id).await.unwrap(),
        cps,
        "no more"
    );

    // Another process rebuilds the room from the last checkpoint and the
    // entries after it, and appends after the log's end.
    drop(room);
    let again = crate::Rounds::new(
        e.store.clone(),
        e.fake.clone(),
        "key".into(),
        crate::RoundsConfig::default(),
        &prometheus::Registry::new(),
    );
    let r2 = again.room(&s, false).await.unwrap().unwrap();
    {
        let g = r2.inner.lock().await;
        assert_eq!(doc::files(&g.doc), want[last as usize]);
        assert_eq!((g.next_idx, g.log_bytes), (last + 1, log_bytes));
    }
    let sv = typist.transact().state_vector();
    {
        let files = typist.get_or_insert_map(doc::FILES);
        let mut txn = typist.transact_mut();
        let Some(Out::YText(t)) = files.get(&txn, "solution.py") else {
            panic!("no solution.py")
        };
        t.insert(&mut txn, 0, "# more\n");
    }
    let u = typist.transact().encode_diff_v1(&sv);
    r2.update(e.store.as_ref(), 1, "candidate", u)
        .await
        .unwrap();
    let end = again
        .document_at(&s.round_id, &s.id, last + 1)
        .await
        .unwrap();
    assert_eq!(end.files, doc::files(&typist));

    // Retention deletes them with the log.
    assert_eq!(e.store.delete_room_data(&s.id).await.unwrap(), last + 2);
    assert!(e.store.doc_checkpoints(&s.id).await.unwrap().is_empty());
}
