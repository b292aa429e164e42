//! The guest agent. It is the init process of every sandbox and talks to the
//! host over its stdin/stdout, which survive checkpoint/restore in gVisor and
//! map onto a vsock stream under Firecracker. Plain threads, no async runtime:
//! it must start fast and stay small, and everything it does blocks anyway.

mod cgroup;
mod code;
mod exec;
mod files;
mod kill;
mod out;
mod pool;
mod procs;
mod pty;
mod pty_size;
mod quiet;
mod reaper;
mod relay;
mod spawner;

use hatchery_agent_proto::{read_frame, Frame, Kind};
use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::os::fd::FromRawFd;
use std::sync::Arc;

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--cgroup-keeper") {
        cgroup::keeper::main();
    }
    // SAFETY: fd 0 is the host channel handed to us as init's stdin; nothing
    // else in this process owns it.
    let input = unsafe { File::from_raw_fd(0) };
    // SAFETY: fd 1 is the host channel's write side, owned only by `Out`.
    let output = unsafe { File::from_raw_fd(1) };
    let out = out::Out::new(output);
    silence_stderr();
    let reaper = reaper::Reaper::start();
    pool::prestart(4);
    spawner::prestart();
    // Started now, so that it is inside the template's checkpoint and every
    // restored sandbox has it running.
    pool::run(|| {
        cgroup::keeper().available();
    });
    let execs = exec::Registry::default();
    let ptys = pty::Ptys::default();
    let contexts = code::Contexts::new(Arc::clone(&reaper), execs.clone());
    contexts.start_default();
    let procs = procs::Procs::default();
    let relays = relay::Relays::new(out.clone());
    let mut writes: HashMap<u32, files::PendingWrite> = HashMap::new();
    let mut input = BufReader::with_capacity(256 * 1024, input);

    loop {
        let frame = match read_frame(&mut input) {
            Ok(Some(f)) => f,
            // The host closed the channel for good: nobody can reach this
            // sandbox any more, so there is nothing left to serve.
            Ok(None) => std::process::exit(0),
            Err(e) => {
                eprintln!("hatchery-agent: channel broken: {e}");
                std::process::exit(1);
            }
        };
        let chan = frame.channel;
        match frame.kind {
            Kind::Exec => match frame.parse() {
                Ok(req) => exec::spawn(chan, req, out.clone(), Arc::clone(&reaper), execs.clone()),
                Err(e) => out.error(chan, "invalid", e.to_string()),
            },
            Kind::Kill => {
                if !procs.stop_reader(chan) {
                    execs.kill(chan)
                }
            }
            Kind::ProcStart => match frame.parse() {
                Ok(req) => procs.start(chan, req, out.clone(), Arc::clone(&reaper)),
                Err(e) => out.error(chan, "invalid", e.to_string()),
            },
            Kind::ProcList => procs.list(chan, &out),
            Kind::ProcStdin => procs.stdin(chan, &frame.payload, &out),
            Kind::ProcRead
            | Kind::ProcStdinClose
            | Kind::ProcSignal
            | Kind::ProcWait
            | Kind::ProcKill => match frame.parse() {
                Ok(req) => match frame.kind {
                    Kind::ProcRead => procs.read(chan, req, out.clone()),
                    Kind::ProcStdinClose => procs.close_stdin(chan, req, &out),
                    Kind::ProcSignal => procs.signal(chan, req, &out),
                    Kind::ProcWait => procs.wait(chan, req, out.clone()),
                    _ => procs.kill(chan, req, out.clone()),
                },
                Err(e) => out.error(chan, "invalid", e.to_string()),
            },
            Kind::CodeRun => match frame.parse() {
                Ok(req) => contexts.run(chan, req, out.clone()),
                Err(e) => out.error(chan, "invalid", e.to_string()),
            },
            Kind::ContextCreate | Kind::ContextRestart | Kind::ContextDelete => {
                match frame.parse() {
                    Ok(req) if frame.kind == Kind::ContextCreate => {
                        contexts.create(chan, req, out.clone())
                    }
                    Ok(req) if frame.kind == Kind::ContextRestart => {
                        contexts.restart(chan, req, out.clone())
                    }
                    Ok(req) => contexts.delete(chan, req, out.clone()),
                    Err(e) => out.error(chan, "invalid", e.to_string()),
                }
            }
            Kind::ContextList => contexts.list(chan, &out),
            Kind::FileWriteStart => match frame.parse() {
                Ok(req) => {
                    writes.insert(chan, files::PendingWrite::open(&req));
                }
                Err(e) => out.error(chan, "invalid", e.to_string()),
            },
            Kind::FileData => {
                if let Some(w) = writes.get_mut(&chan) {
                    w.write(&frame.payload);
                }
            }
            Kind::FileWriteEnd => match writes.remove(&chan) {
                Some(w) => match w.finish() {
                    Ok(()) => out.send(&Frame::new(chan, Kind::Ok, b"{}".to_vec())),
                    Err(e) => out.send(&Frame::json(chan, Kind::Error, &e)),
                },
                None => out.error(chan, "invalid", "no write in progress"),
            },
            Kind::FileRead => match frame.parse() {
                Ok(req) => {
                    let out = out.clone();
                    pool::run(move || files::read(chan, req, &out));
                }
                Err(e) => out.error(chan, "invalid", e.to_string()),
            },
            // Off the frame loop: nothing a file operation meets may stall
            // the channel every other request of this sandbox rides on.
            Kind::FileList => match frame.parse() {
                Ok(req) => {
                    let out = out.clone();
                    pool::run(move || files::list(chan, req, &out));
                }
                Err(e) => out.error(chan, "invalid", e.to_string()),
            },
            Kind::FileRemove => match frame.parse() {
                Ok(req) => {
                    let out = out.clone();
                    pool::run(move || files::remove(chan, req, &out));
                }
                Err(e) => out.error(chan, "invalid", e.to_string()),
            },
            Kind::PtyOpen => match frame.parse() {
                Ok(req) => ptys.open(chan, req, out.clone(), Arc::clone(&reaper)),
                Err(e) => out.error(chan, "invalid", e.to_string()),
            },
            Kind::PtyInput => ptys.input(chan, frame.payload),
            Kind::PtyResize => match frame.parse() {
                Ok(size) => ptys.resize(chan, size, &out),
                Err(e) => pty_size::refuse(&out, chan, format!("invalid resize: {e}")),
            },
            Kind::PtyClose => ptys.close(chan),
            Kind::Ping => out.send(&Frame::new(chan, Kind::Pong, frame.payload)),
            Kind::Quiet => out.send(&Frame::json(
                chan,
                Kind::Ok,
                &quiet::report(&contexts, !writes.is_empty()),
            )),
            Kind::RelayListen => match frame.parse() {
                Ok(req) => relays.listen(chan, req),
                Err(e) => out.error(chan, "invalid", e.to_string()),
            },
            Kind::RelayOpen => match frame.parse() {
                Ok(req) => relays.open(chan, req),
                Err(e) => out.error(chan, "invalid", e.to_string()),
            },
            Kind::RelayData => relays.data(chan, frame.payload),
            Kind::RelayShut => relays.shut(chan),
            Kind::RelayClose => relays.close(chan),
            Kind::RelayWindow => relays.window(chan, &frame.payload),
            other => out.error(chan, "invalid", format!("unexpected frame kind {other:?}")),
        }
    }
}

/// Our stderr is runsc's, which lands in a host log file. Guest code runs as
/// root and could write to it through /proc/1/fd/2 without bound, so point
/// it at /dev/null.
fn silence_stderr() {
    use std::os::fd::AsRawFd;
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 onto fd 2 with a descriptor we own.
        unsafe { libc::dup2(null.as_raw_fd(), 2) };
    }
}
