//! Interpreter contexts for `run_code`: long-lived kernels that keep a
//! notebook's variables between runs. The default context is started with
//! the agent, so it is running (and clean) in every sandbox restored from a
//! template checkpoint: a run costs no process start.

mod kernel;
mod run;

use crate::exec::Registry;
use crate::out::Out;
use crate::reaper::Reaper;
use hatchery_agent_proto::{CodeRequest, ContextInfo, ContextRequest, Frame, Kind};
use kernel::Kernel;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

pub const DEFAULT: &str = "default";
/// Contexts per sandbox, the default one included. Each is a process of
/// about 10 MiB.
pub const MAX_CONTEXTS: usize = 16;
const DEFAULT_CWD: &str = "/workspace";
/// Touches the kernel's paths for a cell (parse, exec, a stream write, the
/// last-expression eval) and unbinds what it bound.
const WARM_CELL: &str =
    "import sys as __hx_w\n__hx_w.stdout.write('')\ndel __hx_w\n(lambda: None)()";

pub struct Context {
    id: String,
    language: String,
    /// Where the interpreter starts (and restarts). The default context's
    /// moves once if a run asks for an `initial_cwd`.
    cwd: Mutex<String>,
    /// Creation order: contexts are listed oldest first, as E2B lists them.
    seq: u64,
    /// Whether the context's directory was chosen by a client: at
    /// creation, or by a run's `initial_cwd`. Only the default context
    /// starts unsettled.
    settled: AtomicBool,
    /// None while the interpreter is being (re)started. Held for a whole
    /// run, so runs in one context queue up.
    kernel: Mutex<Option<Kernel>>,
    count: AtomicU64,
    /// The tree of the run in progress, so restart and delete can cut it.
    running: Mutex<Option<Arc<crate::exec::Tree>>>,
}

impl Context {
    fn info(&self) -> ContextInfo {
        let state = match self.kernel.try_lock() {
            Ok(g) if g.is_some() => "ready",
            Ok(_) => "starting",
            Err(_) => "busy",
        };
        ContextInfo {
            id: self.id.clone(),
            language: self.language.clone(),
            cwd: self.cwd(),
            state: state.into(),
            execution_count: self.count.load(Ordering::SeqCst),
        }
    }

    fn cwd(&self) -> String {
        self.cwd.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The directory the kernel must move to before a run, if the run
    /// places an unsettled context: created here, as the agent (the
    /// kernel only changes into it). `None` if nothing is to move, or the
    /// directory cannot be made (the context stays where it is).
    fn place(&self, initial_cwd: Option<&str>) -> Option<String> {
        let dir = initial_cwd?;
        if self.settled.swap(true, Ordering::SeqCst) {
            return None;
        }
        std::fs::create_dir_all(dir).ok()?;
        *self.cwd.lock().unwrap_or_else(|p| p.into_inner()) = dir.to_string();
        Some(dir.to_string())
    }

    /// Stops the run in progress, if any (it answers `cancelled`).
    fn cancel_run(&self) {
        let t = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(t) = t {
            t.stop(hatchery_agent_proto::EndReason::Cancelled);
        }
    }

    /// Replaces the interpreter with a clean one (killing all it started).
    fn restart(&self, reaper: &Arc<Reaper>) -> std::io::Result<()> {
        self.cancel_run();
        let mut g = self.kernel.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = g.take() {
            old.tree.kill_all();
        }
        self.count.store(0, Ordering::SeqCst);
        *g = Some(Kernel::start(&self.language, &self.cwd(), reaper)?);
        Ok(())
    }
}

#[derive(Clone)]
pub struct Contexts {
    map: Arc<Mutex<BTreeMap<String, Arc<Context>>>>,
    next_seq: Arc<AtomicU64>,
    reaper: Arc<Reaper>,
    execs: Registry,
}

fn languages() -> &'static [&'static str] {
    static L: OnceLock<Vec<&'static str>> = OnceLock::new();
    L.get_or_init(|| {
        let mut l = vec![];
        if Path::new(kernel::PYTHON).exists() {
            l.push("python");
            // The Bash kernel is a Python driver of one bash.
            if Path::new("/bin/bash").exists() {
                l.push("bash");
            }
        }
        if Path::new(kernel::NODE).exists() {
            l.push("javascript");
            if TS_COMPILERS.iter().any(|p| Path::new(p).exists()) {
                l.push("typescript");
            }
        }
        // Started on a context's first run or creation, never with the
        // agent: an idle sandbox pays for no R process and no JVM.
        if Path::new(kernel::RSCRIPT).exists() {
            l.push("r");
        }
        if Path::new(kernel::JAVA).exists() && Path::new(kernel::JSHELL).exists() {
            l.push("java");
        }
        l
    })
}

/// Where the JavaScript kernel finds a TypeScript compiler: Debian's
/// node-typescript, or an npm global install (js_kernel.js's TS_PATHS).
const TS_COMPILERS: &[&str] = &[
    "/usr/share/nodejs/typescript/package.json",
    "/usr/lib/node_modules/typescript/package.json",
    "/usr/local/lib/node_modules/typescript/package.json",
];

/// Why this sandbox cannot run `language`: what a client is told (400).
fn unavailable(language: &str) -> String {
    match language {
        "javascript" => format!(
            "no javascript interpreter in this sandbox: its template has no {} (Debian's nodejs; \
             the code-interpreter-full template has it)",
            kernel::NODE
        ),
        "typescript" if Path::new(kernel::NODE).exists() => {
            "no typescript compiler in this sandbox: its template has no typescript module \
             (Debian's node-typescript; the code-interpreter-full template has it)"
                .to_string()
        }
        "typescript" => format!(
            "no typescript interpreter in this sandbox: its template has no {} and no \
             typescript module (Debian's nodejs and node-typescript; the code-interpreter-full \
             template has them)",
            kernel::NODE
        ),
        "r" => format!(
            "no r interpreter in this sandbox: its template has no {} (Debian's r-base-core; \
             the code-interpreter-full template has it)",
            kernel::RSCRIPT
        ),
        "java" => format!(
            "no java interpreter in this sandbox: its template has no JDK with jshell ({}; \
             Debian's openjdk-17-jdk-headless; the code-interpreter-full template has it)",
            kernel::JSHELL
        ),
        other => format!("no {other} interpreter in this sandbox"),
    }
}

fn new_id() -> String {
    let mut b = [0u8; 8];
    // SAFETY: getrandom into a local buffer of the given length.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("ctx_{hex}")
}

impl Contexts {
    pub fn new(reaper: Arc<Reaper>, execs: Registry) -> Self {
        Contexts {
            map: Arc::default(),
            next_seq: Arc::default(),
            reaper,
            execs,
        }
    }

    /// Starts the default Python context, and the default JavaScript one
    /// where the template has Node (in the background; a run that comes
    /// first waits for it): both are running in every sandbox restored from
    /// the template's checkpoint, so their first run starts no process.
    pub fn start_default(&self) {
        let cwd = if Path::new(DEFAULT_CWD).is_dir() {
            DEFAULT_CWD
        } else {
            "/"
        };
        let mut started = vec![];
        if languages().contains(&"python") {
            started.push(self.insert(DEFAULT.into(), "python".into(), cwd.into(), false));
        }
        if languages().contains(&"javascript") {
            started.push(self.insert(
                format!("{DEFAULT}-javascript"),
                "javascript".into(),
                cwd.into(),
                false,
            ));
        }
        for ctx in started {
            let reaper = Arc::clone(&self.reaper);
            crate::pool::run(move || {
                let _ = ctx.restart(&reaper);
            });
        }
    }

    fn insert(&self, id: String, language: String, cwd: String, settled: bool) -> Arc<Context> {
        let ctx = Arc::new(Context {
            id: id.clone(),
            language,
            cwd: Mutex::new(cwd),
            seq: self.next_seq.fetch_add(1, Ordering::SeqCst),
            settled: AtomicBool::new(settled),
            kernel: Mutex::new(None),
            count: AtomicU64::new(0),
            running: Mutex::new(None),
        });
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, Arc::clone(&ctx));
        ctx
    }

    /// The interpreters' own processes when none of them is running code
    /// or starting; otherwise what is busy (quiet.rs).
    pub fn idle_pids(&self) -> Result<Vec<u32>, &'static str> {
        let ctxs = self.all();
        let mut pids = Vec::with_capacity(ctxs.len());
        for c in ctxs {
            // The kernel's lock is held for a whole run.
            match c.kernel.try_lock() {
                Ok(g) => match g.as_ref() {
                    Some(k) => pids.push(k.pid()),
                    None => return Err("an interpreter is starting"),
                },
                Err(_) => return Err("an interpreter is running code"),
            }
        }
        Ok(pids)
    }

    fn get(&self, id: &str) -> Option<Arc<Context>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    pub fn run(&self, chan: u32, req: CodeRequest, out: Out) {
        let me = self.clone();
        crate::pool::run(move || me.run_blocking(chan, req, &out));
    }

    /// The default context of a language other than Python, made on its
    /// first run (`default-<language>`); `None` if there is no room.
    fn language_default(&self, language: &str) -> Option<Arc<Context>> {
        let id = format!("{DEFAULT}-{language}");
        if let Some(c) = self.get(&id) {
            return Some(c);
        }
        if !languages().contains(&language)
            || self.map.lock().unwrap_or_else(|p| p.into_inner()).len() >= MAX_CONTEXTS
        {
            return None;
        }
        let cwd = if std::path::Path::new(DEFAULT_CWD).is_dir() {
            DEFAULT_CWD
        } else {
            "/"
        };
        Some(self.insert(id, language.into(), cwd.into(), false))
    }

    fn run_blocking(&self, chan: u32, req: CodeRequest, out: &Out) {
        let id = match &req.context {
            Some(c) => c.clone(),
            None if req.language == "python" => DEFAULT.into(),
            None => format!("{DEFAULT}-{}", req.language),
        };
        if req.context.is_none() && !languages().contains(&req.language.as_str()) {
            return out.error(chan, "invalid", unavailable(&req.language));
        }
        let found = match &req.context {
            None if req.language != "python" => self.language_default(&req.language),
            _ => self.get(&id),
        };
        let Some(ctx) = found else {
            return out.error(chan, "not_found", format!("no context {id}"));
        };
        // An empty language: whatever the named context runs.
        if !req.language.is_empty() && ctx.language != req.language {
            return out.error(
                chan,
                "invalid",
                format!("context {id} runs {}, not {}", ctx.language, req.language),
            );
        }
        let mut g = ctx.kernel.lock().unwrap_or_else(|p| p.into_inner());
        // Placed under the kernel's lock, so no run of the context sees
        // the new directory in the list before its interpreter is in it.
        let chdir = if req.warm {
            None
        } else {
            ctx.place(req.initial_cwd.as_deref())
        };
        if g.is_none() {
            match Kernel::start(&ctx.language, &ctx.cwd(), &self.reaper) {
                Ok(k) => *g = Some(k),
                Err(e) => return out.error(chan, "spawn_failed", e.to_string()),
            }
        }
        let k = g.as_mut().expect("just started");
        self.execs.insert(chan, Arc::clone(&k.tree));
        *ctx.running.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&k.tree));
        let (count, req) = if req.warm {
            // Request id 0 is never a user run's; nothing it binds survives.
            let warm = CodeRequest {
                code: WARM_CELL.into(),
                ..req
            };
            (0, warm)
        } else {
            (ctx.count.fetch_add(1, Ordering::SeqCst) + 1, req)
        };
        let outcome = run::run(k, chan, &req, count, chdir.as_deref(), out);
        *ctx.running.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.execs.remove(chan);
        let mut result = outcome.result;
        result.context = id;
        if outcome.dead {
            if let Some(old) = g.take() {
                old.tree.kill_all();
            }
            ctx.count.store(0, Ordering::SeqCst);
            // A clean interpreter for the next run, started off this
            // run's answer path.
            let (ctx2, reaper) = (Arc::clone(&ctx), Arc::clone(&self.reaper));
            crate::pool::run(move || {
                let mut g = ctx2.kernel.lock().unwrap_or_else(|p| p.into_inner());
                if g.is_none() {
                    *g = Kernel::start(&ctx2.language, &ctx2.cwd(), &reaper).ok();
                }
            });
        }
        drop(g);
        out.send(&Frame::json(chan, Kind::CodeDone, &result));
    }

    pub fn create(&self, chan: u32, req: ContextRequest, out: Out) {
        let me = self.clone();
        crate::pool::run(move || {
            let language = req.language.unwrap_or_else(|| "python".into());
            if !languages().contains(&language.as_str()) {
                return out.error(chan, "invalid", unavailable(&language));
            }
            let cwd = req.cwd.unwrap_or_else(|| DEFAULT_CWD.into());
            if req.make_cwd {
                // Failing here is reported by the is_dir check below.
                let _ = std::fs::create_dir_all(&cwd);
            }
            if !std::path::Path::new(&cwd).is_dir() {
                return out.error(chan, "not_found", format!("cwd {cwd} is not a directory"));
            }
            if me.map.lock().unwrap_or_else(|p| p.into_inner()).len() >= MAX_CONTEXTS {
                return out.error(
                    chan,
                    "too_many",
                    format!("at most {MAX_CONTEXTS} contexts per sandbox"),
                );
            }
            let ctx = me.insert(new_id(), language, cwd, true);
            match ctx.restart(&me.reaper) {
                Ok(()) => out.send(&Frame::json(chan, Kind::Ok, &ctx.info())),
                Err(e) => {
                    me.map
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&ctx.id);
                    out.error(chan, "spawn_failed", e.to_string())
                }
            }
        });
    }

    /// Every context now, in no order.
    fn all(&self) -> Vec<Arc<Context>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    pub fn list(&self, chan: u32, out: &Out) {
        let mut all = self.all();
        all.sort_by_key(|c| c.seq);
        let all: Vec<ContextInfo> = all.iter().map(|c| c.info()).collect();
        out.send(&Frame::json(chan, Kind::Ok, &all));
    }

    pub fn restart(&self, chan: u32, req: ContextRequest, out: Out) {
        let me = self.clone();
        crate::pool::run(move || {
            let id = req.id.unwrap_or_default();
            let Some(ctx) = me.get(&id) else {
                return out.error(chan, "not_found", format!("no context {id}"));
            };
            // A run in progress is cut short: its unit dies with the old
            // interpreter, and the run answers `cancelled`.
            match ctx.restart(&me.reaper) {
                Ok(()) => out.send(&Frame::json(chan, Kind::Ok, &ctx.info())),
                Err(e) => out.error(chan, "spawn_failed", e.to_string()),
            }
        });
    }

    pub fn delete(&self, chan: u32, req: ContextRequest, out: Out) {
        let id = req.id.unwrap_or_default();
        if id == DEFAULT {
            return out.error(
                chan,
                "invalid",
                "the default context can be restarted, not deleted",
            );
        }
        let removed = self
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        let Some(ctx) = removed else {
            return out.error(chan, "not_found", format!("no context {id}"));
        };
        crate::pool::run(move || {
            ctx.cancel_run();
            if let Some(k) = ctx.kernel.lock().unwrap_or_else(|p| p.into_inner()).take() {
                k.tree.kill_all();
            }
            out.send(&Frame::new(chan, Kind::Ok, b"{}".to_vec()));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unavailable_language_says_what_the_template_lacks() {
        let js = unavailable("javascript");
        assert!(
            js.starts_with("no javascript interpreter in this sandbox: "),
            "{js}"
        );
        assert!(
            js.contains("/usr/bin/node") && js.contains("code-interpreter-full"),
            "{js}"
        );
        assert!(unavailable("typescript").contains("node-typescript"));
        assert!(unavailable("r").contains("/usr/bin/Rscript"));
        assert!(unavailable("java").contains("openjdk-17-jdk-headless"));
        assert_eq!(unavailable("cobol"), "no cobol interpreter in this sandbox");
    }
}
