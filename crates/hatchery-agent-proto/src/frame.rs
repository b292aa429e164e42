use std::io::{self, Read, Write};

/// Largest frame either side accepts. Data is chunked well below this, so a
/// bigger length prefix can only come from a broken or hostile peer.
pub const MAX_FRAME: usize = 1 << 20;
/// channel (4) + kind (1)
pub const HEADER_LEN: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("i/o on agent channel: {0}")]
    Io(#[from] io::Error),
    #[error("frame of {0} bytes exceeds the {MAX_FRAME} byte limit")]
    TooLarge(usize),
    #[error("frame shorter than its header ({0} bytes)")]
    TooShort(usize),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("bad JSON payload: {0}")]
    Json(#[from] serde_json::Error),
}

macro_rules! kinds {
    ($($name:ident = $v:expr),* $(,)?) => {
        /// What a frame carries. Host→guest kinds are < 100, guest→host ≥ 100.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(u8)]
        pub enum Kind { $($name = $v),* }
        impl TryFrom<u8> for Kind {
            type Error = FrameError;
            fn try_from(v: u8) -> Result<Self, FrameError> {
                match v { $($v => Ok(Kind::$name),)* other => Err(FrameError::UnknownKind(other)) }
            }
        }
    };
}

kinds! {
    // host → guest
    Exec = 1,
    Kill = 2,
    FileWriteStart = 10,
    FileData = 11,
    FileWriteEnd = 12,
    FileRead = 13,
    FileList = 14,
    FileRemove = 15,
    Ping = 20,
    // is the guest quiet (nothing of the user's running)? Answered with Ok
    // and a QuietReport; the host parks a quiet, unused sandbox (idle.rs)
    Quiet = 21,
    CodeRun = 30,
    ContextCreate = 31,
    ContextList = 32,
    ContextRestart = 33,
    ContextDelete = 34,
    // background processes: 60-69 (replies 160-169)
    ProcStart = 60,
    ProcList = 61,
    ProcRead = 62,
    // payload: the process id, a NUL, then the bytes
    ProcStdin = 63,
    ProcStdinClose = 64,
    ProcSignal = 65,
    ProcWait = 66,
    ProcKill = 67,
    // port relay (relay.rs), host → guest. Listen on these guest loopback
    // ports for host services (RelayListen), answered with Ok (RelayListening)
    RelayListen = 40,
    // connect to 127.0.0.1:port in the guest (RelayOpen); RelayOpened or Error
    RelayOpen = 41,
    // bytes for the guest socket
    RelayData = 42,
    // the host end will send nothing more (half-close)
    RelayShut = 43,
    // abort the connection both ways
    RelayClose = 44,
    // the host consumed this much of the guest's window (u32 BE)
    RelayWindow = 45,
    // a terminal: start it (PtyOpen), keystrokes (raw bytes), a new
    // window size (PtySize, JSON), end it and everything started in it
    PtyOpen = 50,
    PtyInput = 51,
    PtyResize = 52,
    PtyClose = 53,
    // guest → host
    Stdout = 101,
    Stderr = 102,
    ExitResult = 103,
    // a rich result or an error from an interpreter (JSON)
    CodeEvent = 104,
    // the end of a code run (CodeResult)
    CodeDone = 105,
    // the answer to a PtyResize (PtyResized, JSON): the size the terminal
    // reports now, so a resize that did not take is seen, not silent
    PtyResized = 106,
    // payload: u64 BE offset, u8 stream (1 stdout, 2 stderr), the bytes
    ProcChunk = 160,
    // a ProcInfo: the end of a ProcRead
    ProcEnd = 161,
    Ok = 110,
    Error = 111,
    FileChunk = 112,
    FileEof = 113,
    Pong = 120,
    // port relay, guest → host. A guest program connected to a host service
    // listener (RelayIncoming); its channel id has GUEST_CHANNEL_BIT set
    RelayIncoming = 140,
    // the guest connected (reply to RelayOpen)
    RelayOpened = 141,
    // bytes from the guest socket
    RelayGuestData = 142,
    // the guest end will send nothing more (half-close)
    RelayGuestShut = 143,
    // the guest aborted the connection
    RelayGuestClose = 144,
    // the guest consumed this much of the host's window (u32 BE)
    RelayGuestWindow = 145,
    // a terminal is running (PtyStarted), its output (raw bytes), its end
    // (PtyExit, the last frame of the channel)
    PtyStarted = 150,
    PtyOutput = 151,
    PtyExit = 152,
    // shim control, channel 0, either direction
    Control = 200,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub channel: u32,
    pub kind: Kind,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn new(channel: u32, kind: Kind, payload: Vec<u8>) -> Self {
        Frame {
            channel,
            kind,
            payload,
        }
    }

    pub fn json<T: serde::Serialize>(channel: u32, kind: Kind, v: &T) -> Self {
        // Serializing our own plain structs cannot fail.
        let payload = serde_json::to_vec(v).expect("serializable message");
        Frame {
            channel,
            kind,
            payload,
        }
    }

    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, FrameError> {
        Ok(serde_json::from_slice(&self.payload)?)
    }

    /// The whole frame as bytes, length prefix included.
    pub fn encode(&self) -> Vec<u8> {
        let len = HEADER_LEN + self.payload.len();
        let mut out = Vec::with_capacity(4 + len);
        out.extend_from_slice(&(len as u32).to_be_bytes());
        out.extend_from_slice(&self.channel.to_be_bytes());
        out.push(self.kind as u8);
        out.extend_from_slice(&self.payload);
        out
    }

    /// Decodes the body of a frame (everything after the length prefix).
    pub fn decode_body(body: &[u8]) -> Result<Frame, FrameError> {
        if body.len() < HEADER_LEN {
            return Err(FrameError::TooShort(body.len()));
        }
        let channel = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
        let kind = Kind::try_from(body[4])?;
        Ok(Frame {
            channel,
            kind,
            payload: body[HEADER_LEN..].to_vec(),
        })
    }
}

/// Checks a length prefix before anything is allocated for it.
pub fn check_len(len: usize) -> Result<(), FrameError> {
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    if len < HEADER_LEN {
        return Err(FrameError::TooShort(len));
    }
    Ok(())
}

/// Blocking read of one frame. `Ok(None)` on a clean EOF between frames.
pub fn read_frame<R: Read>(r: &mut R) -> Result<Option<Frame>, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    check_len(len)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Frame::decode_body(&body).map(Some)
}

/// Blocking write of one frame as a single `write_all`, so that frames from
/// different threads sharing a locked writer never interleave.
pub fn write_frame<W: Write>(w: &mut W, f: &Frame) -> Result<(), FrameError> {
    w.write_all(&f.encode())?;
    w.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let f = Frame::new(7, Kind::Stdout, b"hello".to_vec());
        let bytes = f.encode();
        let got = read_frame(&mut &bytes[..]).unwrap().unwrap();
        assert_eq!(got, f);
    }

    #[test]
    fn clean_eof_is_none() {
        assert!(read_frame(&mut &b""[..]).unwrap().is_none());
    }

    #[test]
    fn rejects_oversized_length_before_allocating() {
        let bytes = ((MAX_FRAME + 1) as u32).to_be_bytes();
        assert!(matches!(
            read_frame(&mut &bytes[..]),
            Err(FrameError::TooLarge(_))
        ));
    }

    #[test]
    fn rejects_unknown_kind() {
        let mut bytes = Frame::new(1, Kind::Ping, vec![]).encode();
        bytes[8] = 250;
        assert!(matches!(
            read_frame(&mut &bytes[..]),
            Err(FrameError::UnknownKind(250))
        ));
    }

    #[test]
    fn rejects_short_frame() {
        let bytes = [0, 0, 0, 2, 0, 0];
        assert!(matches!(
            read_frame(&mut &bytes[..]),
            Err(FrameError::TooShort(2))
        ));
    }
}
