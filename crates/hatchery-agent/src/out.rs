use hatchery_agent_proto::{write_frame, Frame, GuestError, Kind};
use std::fs::File;
use std::sync::{Arc, Mutex, MutexGuard};

/// The single writer to the host. Frames are written whole under the lock,
/// and a blocked pipe blocks the writer: that is the backpressure that keeps
/// a flooding command from outrunning the host.
#[derive(Clone)]
pub struct Out(Arc<Mutex<File>>);

impl Out {
    pub fn new(f: File) -> Self {
        Out(Arc::new(Mutex::new(f)))
    }

    pub fn lock(&self) -> MutexGuard<'_, File> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn send(&self, f: &Frame) {
        send_locked(&mut self.lock(), f);
    }

    pub fn error(&self, chan: u32, code: &str, message: impl Into<String>) {
        self.send(&Frame::json(
            chan,
            Kind::Error,
            &GuestError::new(code, message),
        ));
    }
}

pub fn send_locked(w: &mut File, f: &Frame) {
    if let Err(e) = write_frame(w, f) {
        // The host end is gone; the main loop will see EOF and exit.
        eprintln!("hatchery-agent: write to host failed: {e}");
    }
}
