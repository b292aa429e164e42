//! Relayed TCP connections (wire format and flow control in
//! `hatchery_agent_proto::relay`). Two ways in:
//!
//! - the host asks for a connection to `127.0.0.1:PORT` inside the guest
//!   (`RelayOpen`): port previews;
//! - a guest program connects to a host service listener the agent holds on
//!   guest loopback (`RelayListen`): the agent tells the host with
//!   `RelayIncoming` on a channel of its own.
//!
//! Either way the sandbox never gets a network route to the host: bytes go
//! over the agent's stdio like exec output.
//!
//! One thread runs every connection and listener, on nonblocking sockets
//! and `poll(2)`: threads count against the sandbox's pids limit, and a
//! thread per connection would let 64 relays starve `exec`. The main loop
//! only queues commands and wakes the thread through an eventfd, so it
//! never blocks on a socket; the host never sends more than the window the
//! relay thread has acknowledged, which bounds those queues.

use crate::out::Out;
use hatchery_agent_proto::relay::{
    cost, parse_window, window_payload, ACK_EVERY, CHUNK, GUEST_CHANNEL_BIT, MIN_COST, WINDOW,
};
use hatchery_agent_proto::{
    Frame, GuestError, Kind, RelayIncoming, RelayListen, RelayListening, RelayOpen,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Guest-started connections open at once; more are closed on accept.
/// The host enforces its own cap too.
const MAX_GUEST_CONNS: usize = 64;
/// Reads of one connection per readiness, for fairness between them.
const READS_PER_TURN: usize = 4;
/// How often ports that could not be bound are tried again.
const REBIND_EVERY: Duration = Duration::from_secs(5);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

enum Cmd {
    Listen(u32, RelayListen),
    Open(u32, u16),
    Data(u32, Vec<u8>),
    Shut(u32),
    Close(u32),
    Window(u32, u32),
}

/// The main loop's handle on the relay thread.
#[derive(Clone)]
pub struct Relays(Arc<Shared>);

struct Shared {
    out: Out,
    cmds: Mutex<Vec<Cmd>>,
    /// `None` if no eventfd could be made: relays are then refused.
    wake: Option<OwnedFd>,
    started: Once,
}

impl Relays {
    pub fn new(out: Out) -> Self {
        // SAFETY: eventfd returns a new descriptor we own, or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        // SAFETY: fd is fresh and owned by nothing else.
        let wake = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) });
        Relays(Arc::new(Shared {
            out,
            cmds: Mutex::new(Vec::new()),
            wake,
            started: Once::new(),
        }))
    }

    fn push(&self, chan: u32, c: Cmd) {
        let Some(wake) = &self.0.wake else {
            if matches!(c, Cmd::Listen(..) | Cmd::Open(..)) {
                self.0
                    .out
                    .error(chan, "io", "relays unavailable: no eventfd");
            }
            return;
        };
        // Started on first use, which for every template is the bake: the
        // thread is then inside the checkpoint of every restored sandbox.
        self.0.started.call_once(|| {
            let shared = Arc::clone(&self.0);
            let _ = std::thread::Builder::new()
                .name("relay".into())
                .spawn(move || Loop::new(shared).run());
        });
        lock(&self.0.cmds).push(c);
        let one = 1u64.to_ne_bytes();
        // SAFETY: an 8-byte write from a local buffer to our eventfd.
        unsafe { libc::write(wake.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    pub fn listen(&self, chan: u32, req: RelayListen) {
        self.push(chan, Cmd::Listen(chan, req));
    }

    pub fn open(&self, chan: u32, req: RelayOpen) {
        self.push(chan, Cmd::Open(chan, req.port));
    }

    pub fn data(&self, chan: u32, payload: Vec<u8>) {
        self.push(chan, Cmd::Data(chan, payload));
    }

    pub fn shut(&self, chan: u32) {
        self.push(chan, Cmd::Shut(chan));
    }

    pub fn close(&self, chan: u32) {
        self.push(chan, Cmd::Close(chan));
    }

    pub fn window(&self, chan: u32, payload: &[u8]) {
        if let Some(n) = parse_window(payload) {
            self.push(chan, Cmd::Window(chan, n));
        }
    }
}

struct Conn {
    sock: TcpStream,
    /// The guest port: connected to (host-opened) or listened on.
    port: u16,
    /// Host-opened and still connecting, until this deadline.
    connecting: Option<Instant>,
    /// What may still be sent to the host before it acknowledges.
    credit: u32,
    read_done: bool,
    /// Host bytes waiting for the guest socket, and how far into the first.
    queue: VecDeque<Vec<u8>>,
    offset: usize,
    unacked: u32,
    shut_wanted: bool,
    write_done: bool,
    guest_started: bool,
}

impl Conn {
    fn new(sock: TcpStream, port: u16, connecting: Option<Instant>, guest_started: bool) -> Conn {
        let _ = sock.set_nodelay(true);
        Conn {
            sock,
            port,
            connecting,
            credit: WINDOW,
            read_done: false,
            queue: VecDeque::new(),
            offset: 0,
            unacked: 0,
            shut_wanted: false,
            write_done: false,
            guest_started,
        }
    }

    fn events(&self) -> libc::c_short {
        if self.connecting.is_some() {
            return libc::POLLOUT;
        }
        let mut ev = 0;
        if !self.read_done && self.credit >= MIN_COST {
            ev |= libc::POLLIN;
        }
        if !self.queue.is_empty() {
            ev |= libc::POLLOUT;
        }
        ev
    }
}

#[derive(Clone, Copy)]
enum Slot {
    Wake,
    Listener(u16),
    Conn(u32),
}

struct Loop {
    shared: Arc<Shared>,
    conns: HashMap<u32, Conn>,
    listeners: BTreeMap<u16, TcpListener>,
    ports: Vec<u16>,
    failed: Vec<(u16, String)>,
    retry_at: Option<Instant>,
    next_guest: u32,
    buf: Vec<u8>,
}

impl Loop {
    fn new(shared: Arc<Shared>) -> Loop {
        Loop {
            shared,
            conns: HashMap::new(),
            listeners: BTreeMap::new(),
            ports: Vec::new(),
            failed: Vec::new(),
            retry_at: None,
            next_guest: 0,
            buf: vec![0u8; CHUNK],
        }
    }

    fn send(&self, f: Frame) {
        self.shared.out.send(&f);
    }

    fn run(mut self) {
        let wake = self
            .shared
            .wake
            .as_ref()
            .map(|w| w.as_raw_fd())
            .expect("started only with an eventfd");
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut slots: Vec<Slot> = Vec::new();
        loop {
            let cmds = std::mem::take(&mut *lock(&self.shared.cmds));
            for c in cmds {
                self.command(c);
            }
            if self.retry_at.is_some_and(|t| Instant::now() >= t) {
                self.bind_missing();
            }
            self.settle();

            fds.clear();
            slots.clear();
            let mut add = |fd, events, slot| {
                fds.push(libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                });
                slots.push(slot);
            };
            add(wake, libc::POLLIN, Slot::Wake);
            for (&p, l) in &self.listeners {
                add(l.as_raw_fd(), libc::POLLIN, Slot::Listener(p));
            }
            // Only sockets with something to do: poll reports a hang-up even
            // when not asked, and one that cannot be read yet must not spin.
            for (&chan, c) in &self.conns {
                let ev = c.events();
                if ev != 0 {
                    add(c.sock.as_raw_fd(), ev, Slot::Conn(chan));
                }
            }
            let timeout = self.timeout();
            // SAFETY: poll over a vector of initialised pollfds we own.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if n <= 0 {
                self.expire_connects();
                continue;
            }
            for (pfd, slot) in fds.iter().zip(slots.iter()) {
                if pfd.revents == 0 {
                    continue;
                }
                match *slot {
                    Slot::Wake => {
                        let mut b = [0u8; 8];
                        // SAFETY: an 8-byte read into a local buffer from our eventfd.
                        unsafe { libc::read(wake, b.as_mut_ptr().cast(), 8) };
                    }
                    Slot::Listener(p) => self.accept(p),
                    Slot::Conn(chan) => self.ready(chan, pfd.revents),
                }
            }
            self.expire_connects();
        }
    }

    fn timeout(&self) -> libc::c_int {
        let now = Instant::now();
        self.conns
            .values()
            .filter_map(|c| c.connecting)
            .chain(self.retry_at)
            .map(|t| t.saturating_duration_since(now).as_millis().min(60_000) as libc::c_int + 1)
            .min()
            .unwrap_or(-1)
    }

    fn command(&mut self, c: Cmd) {
        match c {
            Cmd::Listen(chan, req) => self.listen(chan, req),
            Cmd::Open(chan, port) => self.open(chan, port),
            Cmd::Data(chan, d) => {
                if let Some(c) = self.conns.get_mut(&chan) {
                    if !c.shut_wanted && !d.is_empty() {
                        c.queue.push_back(d);
                    }
                }
            }
            Cmd::Shut(chan) => {
                if let Some(c) = self.conns.get_mut(&chan) {
                    c.shut_wanted = true;
                }
            }
            Cmd::Close(chan) => {
                match self.conns.get_mut(&chan) {
                    // The host finished writing (Shut came first) and then
                    // stopped reading: an HTTP server answering
                    // `Connection: close` does exactly that. What it wrote
                    // must still reach the guest, so the connection stays
                    // until the queue is written and the write side shut
                    // (`settle`); whatever the guest sends now is not read.
                    Some(c) if c.shut_wanted => c.read_done = true,
                    // An abort: dropping the socket closes it.
                    _ => {
                        self.conns.remove(&chan);
                    }
                }
            }
            Cmd::Window(chan, n) => {
                if let Some(c) = self.conns.get_mut(&chan) {
                    c.credit = c.credit.saturating_add(n);
                }
            }
        }
    }

    fn listen(&mut self, chan: u32, req: RelayListen) {
        if req.reset {
            // A new host: nothing of the old one's connections can be
            // reached any more, and listeners restored from a checkpoint
            // are bound afresh rather than trusted to still accept.
            self.conns.clear();
            self.listeners.clear();
        }
        let mut ports = req.ports;
        ports.sort_unstable();
        ports.dedup();
        self.ports = ports;
        self.listeners.retain(|p, _| self.ports.contains(p));
        self.bind_missing();
        let answer = RelayListening {
            listening: self.listeners.keys().copied().collect(),
            failed: self.failed.clone(),
        };
        self.send(Frame::json(chan, Kind::Ok, &answer));
    }

    fn bind_missing(&mut self) {
        self.failed.clear();
        for &p in &self.ports {
            if self.listeners.contains_key(&p) {
                continue;
            }
            let bound = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], p)))
                .and_then(|l| l.set_nonblocking(true).map(|_| l));
            match bound {
                Ok(l) => {
                    self.listeners.insert(p, l);
                }
                Err(e) => self.failed.push((p, e.to_string())),
            }
        }
        self.retry_at = (!self.failed.is_empty()).then(|| Instant::now() + REBIND_EVERY);
    }

    fn open(&mut self, chan: u32, port: u16) {
        match connect_nonblocking(port) {
            Ok(sock) => {
                let c = Conn::new(sock, port, Some(Instant::now() + CONNECT_TIMEOUT), false);
                self.conns.insert(chan, c);
            }
            Err(e) => self.refuse(chan, port, &e),
        }
    }

    fn refuse(&self, chan: u32, port: u16, e: &std::io::Error) {
        let code = if e.kind() == ErrorKind::ConnectionRefused {
            "port_closed"
        } else {
            "connect_failed"
        };
        let err = GuestError::new(code, format!("127.0.0.1:{port}: {e}"));
        self.send(Frame::json(chan, Kind::Error, &err));
    }

    fn accept(&mut self, port: u16) {
        let Some(l) = self.listeners.get(&port) else {
            return;
        };
        loop {
            match l.accept() {
                Ok((s, _)) => {
                    let guests = self.conns.values().filter(|c| c.guest_started).count();
                    if guests >= MAX_GUEST_CONNS || s.set_nonblocking(true).is_err() {
                        // Refused: the guest program sees the connection close.
                        continue;
                    }
                    let chan = loop {
                        self.next_guest = self.next_guest.wrapping_add(1);
                        let id = GUEST_CHANNEL_BIT | (self.next_guest & !GUEST_CHANNEL_BIT);
                        if !self.conns.contains_key(&id) {
                            break id;
                        }
                    };
                    self.send(Frame::json(
                        chan,
                        Kind::RelayIncoming,
                        &RelayIncoming { port },
                    ));
                    self.conns.insert(chan, Conn::new(s, port, None, true));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    // Out of descriptors, or a listener gone bad: bind it
                    // again later rather than spin on it.
                    self.listeners.remove(&port);
                    self.failed.push((port, e.to_string()));
                    self.retry_at = Some(Instant::now() + REBIND_EVERY);
                    return;
                }
            }
        }
    }

    fn ready(&mut self, chan: u32, revents: libc::c_short) {
        let Some(c) = self.conns.get_mut(&chan) else {
            return;
        };
        if c.connecting.is_some() {
            let (err, port) = (socket_error(&c.sock), c.port);
            match err {
                None => {
                    c.connecting = None;
                    self.send(Frame::new(chan, Kind::RelayOpened, vec![]));
                }
                Some(e) => {
                    self.conns.remove(&chan);
                    self.refuse(chan, port, &e);
                }
            }
            return;
        }
        let asked = c.events();
        if asked & libc::POLLOUT != 0
            && revents & (libc::POLLOUT | libc::POLLERR | libc::POLLHUP) != 0
        {
            self.write(chan);
        }
        if !self.conns.contains_key(&chan) {
            return;
        }
        if asked & libc::POLLIN != 0
            && revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0
        {
            // A few chunks while the data and the credit last, then the
            // other connections get their turn.
            for _ in 0..READS_PER_TURN {
                if !self.read(chan) {
                    break;
                }
            }
        }
    }

    /// One read, within the credit the host has granted. True if another
    /// may follow at once (a full chunk came and credit remains).
    fn read(&mut self, chan: u32) -> bool {
        let Some(c) = self.conns.get_mut(&chan) else {
            return false;
        };
        if c.read_done || c.credit < MIN_COST {
            return false;
        }
        let want = CHUNK.min(c.credit as usize);
        match c.sock.read(&mut self.buf[..want]) {
            Ok(0) => {
                c.read_done = true;
                self.send(Frame::new(chan, Kind::RelayGuestShut, vec![]));
                false
            }
            Ok(n) => {
                c.credit -= cost(n);
                let f = Frame::new(chan, Kind::RelayGuestData, self.buf[..n].to_vec());
                self.send(f);
                n == want
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => true,
            Err(e) if e.kind() == ErrorKind::WouldBlock => false,
            Err(_) => {
                self.fail(chan);
                false
            }
        }
    }

    /// As much of the queue as the socket takes; acknowledges whole frames.
    fn write(&mut self, chan: u32) {
        let Some(c) = self.conns.get_mut(&chan) else {
            return;
        };
        let mut ack = None;
        while let Some(front) = c.queue.front() {
            match c.sock.write(&front[c.offset..]) {
                Ok(n) => {
                    c.offset += n;
                    if c.offset == front.len() {
                        c.unacked += cost(front.len());
                        c.queue.pop_front();
                        c.offset = 0;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => return self.fail(chan),
            }
        }
        if c.unacked >= ACK_EVERY {
            ack = Some(c.unacked);
            c.unacked = 0;
        }
        if let Some(n) = ack {
            self.send(Frame::new(chan, Kind::RelayGuestWindow, window_payload(n)));
        }
    }

    /// Half-closes what the host has finished, forgets what both ends have.
    fn settle(&mut self) {
        for c in self.conns.values_mut() {
            if c.shut_wanted && c.queue.is_empty() && !c.write_done && c.connecting.is_none() {
                let _ = c.sock.shutdown(Shutdown::Write);
                c.write_done = true;
            }
        }
        self.conns.retain(|_, c| !(c.read_done && c.write_done));
    }

    fn fail(&mut self, chan: u32) {
        if self.conns.remove(&chan).is_some() {
            self.send(Frame::new(chan, Kind::RelayGuestClose, vec![]));
        }
    }

    fn expire_connects(&mut self) {
        let now = Instant::now();
        let late: Vec<(u32, u16)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.connecting.is_some_and(|t| now >= t))
            .map(|(ch, c)| (*ch, c.port))
            .collect();
        for (chan, port) in late {
            self.conns.remove(&chan);
            let e = std::io::Error::from(ErrorKind::TimedOut);
            self.refuse(chan, port, &e);
        }
    }
}

/// Starts a connect to 127.0.0.1:port without waiting for it.
fn connect_nonblocking(port: u16) -> std::io::Result<TcpStream> {
    // SAFETY: socket(2) returns a new descriptor we own, or -1.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is fresh and owned by nothing else; TcpStream closes it.
    let sock = unsafe { TcpStream::from_raw_fd(fd) };
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: connect with a pointer to a local sockaddr_in and its size.
    let r = unsafe {
        libc::connect(
            fd,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r == 0 {
        return Ok(sock);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EINPROGRESS) {
        Ok(sock)
    } else {
        Err(e)
    }
}

/// The pending error of a socket whose connect finished (`SO_ERROR`).
fn socket_error(s: &TcpStream) -> Option<std::io::Error> {
    match s.take_error() {
        Ok(None) => None,
        Ok(Some(e)) | Err(e) => Some(e),
    }
}
