//! The wire format spoken between the host (daemon or shim) and the guest
//! agent. It is deliberately tiny and transport-agnostic: today it runs over
//! the stdio pipes of the sandbox's init process (gVisor), tomorrow over a
//! vsock stream (Firecracker). Every frame is
//!
//! ```text
//! u32 BE  length of what follows (channel + kind + payload)
//! u32 BE  channel: one exec or file operation; 0 is reserved for the shim
//! u8      kind
//! ...     payload: JSON for control kinds, raw bytes for data kinds
//! ```
//!
//! The guest is untrusted: the host side must treat every frame it reads as
//! hostile input, which is why decoding enforces [`MAX_FRAME`].

mod frame;
mod messages;
pub mod relay;

pub use frame::{
    check_len, read_frame, write_frame, Frame, FrameError, Kind, HEADER_LEN, MAX_FRAME,
};
pub use messages::{
    CodeRequest, CodeResult, ContextInfo, ContextRequest, EndReason, ExecRequest, ExecResult,
    FileEntry, FileListRequest, FilePathRequest, FileReadRequest, FileWriteRequest, GuestError,
    ProcInfo, ProcRequest, PtyExit, PtyRequest, PtyResized, PtySize, PtyStarted, QuietReport,
    ShimControl,
};
pub use relay::{RelayIncoming, RelayListen, RelayListening, RelayOpen};
