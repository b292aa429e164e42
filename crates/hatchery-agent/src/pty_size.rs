//! A terminal's window size, and the one thread per terminal that changes
//! it.
//!
//! Why a resize is more than one ioctl: GNU readline (bash's line editor)
//! "touches" the window size each time it prepares the terminal for a new
//! line (`set_winsize` in rltty.c: TIOCGWINSZ, then TIOCSWINSZ with what it
//! read). A resize that lands between those two calls is overwritten with
//! the old size, and the new one is lost for good. That is what the SDKs'
//! terminal tests hit once in a while: a resize sent right after a command's
//! output, while bash prepares the next prompt, then `stty size` still says
//! the old size, for ever. The same race exists on Linux; there a user just
//! resizes again.
//!
//! So each resize is applied, read back, checked again after [`SETTLE`]
//! (and re-applied if the size went back to exactly the previous one), and
//! only then answered; for [`GUARD_FOR`] afterwards the size is watched and
//! a return to the previous size is undone the same way. A program that
//! sets some other size itself ends the watch: that size is its choice.
//!
//! Answers go out in the order resizes came, since one thread serves all of
//! a terminal's resizes.

use crate::out::Out;
use hatchery_agent_proto::{Frame, Kind, PtyResized, PtySize};
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest window accepted (the host refuses more before it gets here).
pub(crate) const MAX_CELLS: u16 = 1000;
/// How long after setting a size it is checked again before the answer:
/// readline's read-then-write takes microseconds, so a revert racing the
/// set shows within this.
const SETTLE: Duration = Duration::from_millis(20);
/// How long a new size is watched for a revert to the previous one.
const GUARD_FOR: Duration = Duration::from_secs(2);
const GUARD_POLL: Duration = Duration::from_millis(10);
/// Set-and-read-back attempts before a resize is reported as failed.
const TRIES: usize = 3;

/// Reading and setting a window size (the terminal's master in the guest;
/// a double in the tests).
pub(crate) trait WinSize {
    fn get(&self) -> Result<PtySize, String>;
    fn set(&self, size: PtySize) -> Result<(), String>;
}

/// The window size of the terminal behind a descriptor.
pub(crate) struct Tty(pub RawFd);

impl WinSize for Tty {
    fn get(&self) -> Result<PtySize, String> {
        let mut ws = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one winsize to a valid pointer.
        if unsafe { libc::ioctl(self.0, libc::TIOCGWINSZ, &mut ws) } != 0 {
            return Err(format!("TIOCGWINSZ: {}", std::io::Error::last_os_error()));
        }
        Ok(PtySize {
            cols: ws.ws_col,
            rows: ws.ws_row,
        })
    }

    fn set(&self, size: PtySize) -> Result<(), String> {
        check_range(size)?;
        let ws = libc::winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // A signal arriving mid-call must not lose the resize.
        let mut last = String::new();
        for _ in 0..8 {
            // SAFETY: TIOCSWINSZ reads one winsize from a valid pointer.
            if unsafe { libc::ioctl(self.0, libc::TIOCSWINSZ, &ws) } == 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            last = format!("TIOCSWINSZ: {e}");
            if e.kind() != std::io::ErrorKind::Interrupted {
                break;
            }
        }
        Err(last)
    }
}

pub(crate) fn check_range(size: PtySize) -> Result<(), String> {
    let ok = |v: u16| (1..=MAX_CELLS).contains(&v);
    if ok(size.cols) && ok(size.rows) {
        Ok(())
    } else {
        Err(format!("window size out of range (1..={MAX_CELLS})"))
    }
}

/// Sets the size and reads it back, trying again while the terminal
/// reports another. Err carries the size read last, if any.
pub(crate) fn apply(w: &dyn WinSize, size: PtySize) -> Result<PtySize, (Option<PtySize>, String)> {
    let mut seen = None;
    let mut why = String::new();
    for _ in 0..TRIES {
        if let Err(e) = w.set(size) {
            return Err((w.get().ok(), e));
        }
        match w.get() {
            Ok(got) if got == size => return Ok(got),
            Ok(got) => {
                seen = Some(got);
                why = format!(
                    "the terminal reports {}x{} after being set to {}x{}",
                    got.cols, got.rows, size.cols, size.rows
                );
            }
            Err(e) => why = e,
        }
    }
    Err((seen, why))
}

/// A size just set, watched for a program writing back the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Guard {
    pub want: PtySize,
    pub before: PtySize,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// The terminal reports the size asked for.
    Holds,
    /// It had gone back to the previous size; the new one is set again.
    Restored,
    /// A program set a size of its own: not ours to undo.
    Moved(PtySize),
    Failed(String),
}

impl Guard {
    pub(crate) fn check(&self, w: &dyn WinSize) -> Check {
        match w.get() {
            Ok(s) if s == self.want => Check::Holds,
            Ok(s) if s == self.before => match apply(w, self.want) {
                Ok(_) => Check::Restored,
                Err((_, e)) => Check::Failed(e),
            },
            Ok(s) => Check::Moved(s),
            Err(e) => Check::Failed(e),
        }
    }
}

/// One resize: set, read back, settle, check again. The answer for it and
/// the guard to keep watching with, if any.
pub(crate) fn resize_once(
    w: &dyn WinSize,
    size: PtySize,
    settle: &dyn Fn(),
) -> (PtyResized, Option<Guard>) {
    let before = w.get().ok();
    if let Err((now, e)) = apply(w, size) {
        return (
            PtyResized {
                size: now,
                error: Some(e),
            },
            None,
        );
    }
    let guard = before
        .filter(|b| *b != size)
        .map(|before| Guard { want: size, before });
    settle();
    let answer = match guard.map(|g| g.check(w)) {
        None | Some(Check::Holds) | Some(Check::Restored) => Ok(size),
        Some(Check::Moved(s)) => {
            Err((Some(s), "a program in the terminal set another size".into()))
        }
        Some(Check::Failed(e)) => Err((w.get().ok(), e)),
    };
    match answer {
        Ok(s) => (
            PtyResized {
                size: Some(s),
                error: None,
            },
            guard,
        ),
        Err((now, e)) => (
            PtyResized {
                size: now,
                error: Some(e),
            },
            None,
        ),
    }
}

/// Sends the answer to a resize.
fn answer(out: &Out, chan: u32, a: &PtyResized) {
    out.send(&Frame::json(chan, Kind::PtyResized, a));
}

/// Answers a resize that never reached a terminal's resizer.
pub(crate) fn refuse(out: &Out, chan: u32, why: String) {
    answer(
        out,
        chan,
        &PtyResized {
            size: None,
            error: Some(why),
        },
    );
}

/// Serves a terminal's resizes until it is gone (its sender dropped).
pub(crate) fn resizer(chan: u32, master: Arc<File>, leader: i32, rx: Receiver<PtySize>, out: Out) {
    let tty = Tty(master.as_raw_fd());
    let mut watch: Option<(Guard, Instant)> = None;
    loop {
        let next = match watch {
            Some(_) => match rx.recv_timeout(GUARD_POLL) {
                Ok(s) => Some(s),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            },
            None => match rx.recv() {
                Ok(s) => Some(s),
                Err(_) => return,
            },
        };
        match next {
            Some(size) => {
                let (a, guard) = resize_once(&tty, size, &|| std::thread::sleep(SETTLE));
                let changed = a.size == Some(size);
                answer(&out, chan, &a);
                watch = guard.map(|g| (g, Instant::now() + GUARD_FOR));
                if changed {
                    winch_session(leader);
                }
            }
            None => {
                let Some((g, until)) = watch else { continue };
                match g.check(&tty) {
                    Check::Restored => winch_session(leader),
                    Check::Holds => {}
                    Check::Moved(_) | Check::Failed(_) => watch = None,
                }
                if Instant::now() >= until {
                    watch = None;
                }
            }
        }
    }
}

/// Linux signals the terminal's foreground job itself when the master sets
/// a new size; gVisor does not, and will not tell the agent which group is
/// in the foreground (TIOCGPGRP on a master that is not the caller's
/// terminal is ENOTTY there, and /proc shows no tpgid). So every process of
/// the terminal's session gets SIGWINCH: the foreground job as on Linux,
/// plus background jobs of the session, for which it is harmless (ignored
/// by default; a program that handles it just looks at the size again).
fn winch_session(leader: i32) {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
        if session_of(pid) == Some(leader) {
            // SAFETY: plain signal delivery to a pid just read from /proc.
            unsafe { libc::kill(pid, libc::SIGWINCH) };
        }
    }
}

/// The session id in /proc/PID/stat: the fourth field after the command
/// name (which may itself contain spaces and parentheses).
fn session_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    fn sz(cols: u16, rows: u16) -> PtySize {
        PtySize { cols, rows }
    }

    /// A terminal whose size readline-like programs may write back.
    struct Fake {
        size: Cell<PtySize>,
        sets: RefCell<Vec<PtySize>>,
        /// Sets that do not take (the size stays).
        ignore_sets: Cell<usize>,
    }

    impl Fake {
        fn new(s: PtySize) -> Fake {
            Fake {
                size: Cell::new(s),
                sets: RefCell::new(vec![]),
                ignore_sets: Cell::new(0),
            }
        }
    }

    impl WinSize for Fake {
        fn get(&self) -> Result<PtySize, String> {
            Ok(self.size.get())
        }
        fn set(&self, s: PtySize) -> Result<(), String> {
            check_range(s)?;
            self.sets.borrow_mut().push(s);
            if self.ignore_sets.get() > 0 {
                self.ignore_sets.set(self.ignore_sets.get() - 1);
            } else {
                self.size.set(s);
            }
            Ok(())
        }
    }

    #[test]
    fn session_of_reads_this_process() {
        let me = std::process::id() as i32;
        // SAFETY: getsid(0) has no preconditions.
        let sid = unsafe { libc::getsid(0) };
        assert_eq!(session_of(me), Some(sid));
        assert_eq!(session_of(-1), None);
    }

    #[test]
    fn a_plain_resize_is_answered_with_the_size_read_back() {
        let t = Fake::new(sz(100, 30));
        let (a, g) = resize_once(&t, sz(120, 40), &|| {});
        assert_eq!(
            a,
            PtyResized {
                size: Some(sz(120, 40)),
                error: None
            }
        );
        assert_eq!(
            g,
            Some(Guard {
                want: sz(120, 40),
                before: sz(100, 30)
            })
        );
        assert_eq!(*t.sets.borrow(), [sz(120, 40)]);
    }

    #[test]
    fn a_revert_racing_the_resize_is_undone_before_the_answer() {
        // readline read 100x30 before our set and writes it back after.
        let t = Fake::new(sz(100, 30));
        let (a, _) = resize_once(&t, sz(120, 40), &|| t.size.set(sz(100, 30)));
        assert_eq!(a.size, Some(sz(120, 40)));
        assert_eq!(a.error, None);
        assert_eq!(t.size.get(), sz(120, 40));
        assert_eq!(*t.sets.borrow(), [sz(120, 40), sz(120, 40)]);
    }

    #[test]
    fn a_later_revert_is_undone_by_the_guard_but_another_size_is_left_alone() {
        let t = Fake::new(sz(120, 40));
        let g = Guard {
            want: sz(120, 40),
            before: sz(100, 30),
        };
        assert_eq!(g.check(&t), Check::Holds);
        t.size.set(sz(100, 30));
        assert_eq!(g.check(&t), Check::Restored);
        assert_eq!(t.size.get(), sz(120, 40));
        // `stty cols 80` in the terminal: the program's choice.
        t.size.set(sz(80, 40));
        assert_eq!(g.check(&t), Check::Moved(sz(80, 40)));
        assert_eq!(t.size.get(), sz(80, 40));
    }

    #[test]
    fn a_size_that_never_takes_is_an_error_not_silence() {
        let t = Fake::new(sz(100, 30));
        t.ignore_sets.set(TRIES);
        let (a, g) = resize_once(&t, sz(120, 40), &|| {});
        assert_eq!(a.size, Some(sz(100, 30)));
        assert!(a
            .error
            .unwrap()
            .contains("reports 100x30 after being set to 120x40"));
        assert_eq!(g, None);
        // One refusal, then it takes: still a success.
        let t = Fake::new(sz(100, 30));
        t.ignore_sets.set(1);
        assert_eq!(
            resize_once(&t, sz(120, 40), &|| {}).0.size,
            Some(sz(120, 40))
        );
    }

    #[test]
    fn out_of_range_is_refused_and_the_same_size_needs_no_guard() {
        let t = Fake::new(sz(100, 30));
        let (a, g) = resize_once(&t, sz(0, 40), &|| {});
        assert!(a.error.unwrap().contains("out of range"));
        assert_eq!((a.size, g), (Some(sz(100, 30)), None));
        assert_eq!(check_range(sz(MAX_CELLS, 1)), Ok(()));
        assert!(check_range(sz(MAX_CELLS + 1, 1)).is_err());
        let (a, g) = resize_once(&t, sz(100, 30), &|| {});
        assert_eq!((a.size, a.error, g), (Some(sz(100, 30)), None, None));
    }
}
