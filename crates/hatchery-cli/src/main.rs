//! `hatchery`: the command line. `serve` execs the daemon (`hatcheryd`,
//! a binary of its own: the CLI links no daemon code); every other
//! subcommand is a client of a running daemon (sandbox, exec, ps, attach,
//! wait, kill, cp, shell, run, snapshot, template, network, host), except
//! `template build-local`, which builds a template's root filesystem on this
//! host (how `make run` makes the default template).

mod cleanup;
mod client;
mod commands;
mod output;
mod serve;

use clap::{Parser, Subcommand};
use client::{Api, EXIT_HATCHERY};
use commands::{exec, network, procs, run, sandbox, snapshot, template};

#[derive(Parser)]
#[command(
    name = "hatchery",
    about = "Hatchery: disposable, isolated sandboxes",
    version
)]
struct Cli {
    #[command(flatten)]
    api: Api,
    #[command(subcommand)]
    cmd: Cmd,
}

const EXIT_CODES: &str = "Exit status: the command's own; 128+N when signal N killed it; \
124 when the timeout killed it; 125 when hatchery itself failed (daemon unreachable, unknown \
sandbox, invalid request).";

const RUN_EXIT_CODES: &str = "Exit status: the program's own; 128+N when signal N killed it; \
124 when the timeout killed it; 125 when hatchery itself failed (daemon unreachable, unknown \
template, invalid request). With --code: 0, 1 when the code raised (sys.exit(N): N), 124 on \
timeout, 125 when hatchery failed.";

const PROC_EXIT_CODES: &str = "Exit status: the process's own once it has exited; 128+N when \
signal N killed it; 124 when `wait --timeout` passed with it still running; 130 when Ctrl-C \
detached `attach`; 125 when hatchery itself failed (daemon unreachable, unknown sandbox or \
process, invalid request).";
const SHELL_HELP: &str = "On a terminal: the sandbox's login shell (or CMD) on a pseudo-terminal; \
exits with its status. The terminal and everything started in it end when you leave, when the \
daemon's idle timeout (15 min without a key press) passes, or when the sandbox goes. Not on a \
terminal (a pipe, a file): each line runs as its own /bin/sh -c command, the directory carries \
over, variables do not; exits with the last command's status.";

#[derive(Subcommand)]
enum Cmd {
    /// Run the daemon in the foreground: execs `hatcheryd` (next to this
    /// binary, else on PATH) with the arguments that follow.
    #[command(disable_help_flag = true)]
    Serve(serve::ServeArgs),
    /// Create, list, inspect, extend and destroy sandboxes.
    #[command(subcommand, alias = "sandboxes")]
    Sandbox(sandbox::SandboxCmd),
    /// Run a command in a sandbox, streaming its output; exits with its status.
    #[command(after_help = EXIT_CODES)]
    Exec(exec::ExecArgs),
    /// List a sandbox's background processes (`exec --background` starts them).
    Ps(procs::PsArgs),
    /// Stream a background process's output (and feed it our stdin); exits
    /// with its status. Ctrl-C detaches and leaves it running.
    #[command(after_help = PROC_EXIT_CODES)]
    Attach(procs::AttachArgs),
    /// Wait for a background process to end; exits with its status.
    #[command(after_help = PROC_EXIT_CODES)]
    Wait(procs::WaitArgs),
    /// Kill a background process and everything it started, or (--signal)
    /// send it a signal.
    Kill(procs::KillArgs),
    /// Copy a file between here and a sandbox: `hatchery cp main.py ID:/workspace/`.
    Cp {
        /// Local path, `-` (stdin) or ID:/path.
        src: String,
        /// Local path, `-` (stdout) or ID:/path.
        dst: String,
    },
    /// A shell in a sandbox: a real terminal when stdin is one (raw mode,
    /// window size, Ctrl-C goes to the sandbox), else line by line.
    #[command(after_help = SHELL_HELP)]
    Shell {
        id: String,
        /// Starting directory (default: /root on a terminal, / line by line).
        #[arg(long)]
        cwd: Option<String>,
        /// Line by line even on a terminal.
        #[arg(long)]
        lines: bool,
        /// Run this program on the terminal instead of a login shell
        /// (`hatchery shell ID -- python3`). Terminal mode only.
        #[arg(last = true)]
        cmd: Vec<String>,
    },
    /// Run a local file (or, with --code, Python code in the sandbox's
    /// interpreter) in a fresh sandbox, print its output, destroy the sandbox.
    #[command(after_help = RUN_EXIT_CODES)]
    Run(run::RunArgs),
    /// Snapshots of running sandboxes, and forks from them.
    #[command(subcommand, alias = "snapshots")]
    Snapshot(snapshot::SnapshotCmd),
    /// Templates.
    #[command(subcommand, alias = "templates")]
    Template(template::TemplateCmd),
    /// A sandbox's network egress policy.
    #[command(subcommand)]
    Network(network::NetworkCmd),
    /// Interview rounds: create, list, invite, reports, replays.
    #[command(subcommand, alias = "rounds")]
    Round(commands::round::RoundCmd),
    /// Audit logs: `audit verify --db FILE [CHAIN]` checks hash chains
    /// offline (exit 3 names the first bad seq).
    #[command(subcommand)]
    Audit(commands::audit::AuditCmd),
    /// Agent sessions: a coding agent on a repository, in a sandbox.
    #[command(subcommand, alias = "sessions")]
    Session(commands::session::SessionCmd),
    /// Environments: a repository's set-up built once, for sessions to
    /// start from (`env create|build|ls|get|rm`).
    #[command(subcommand, alias = "envs")]
    Env(commands::env::EnvCmd),
    /// Tenants and their API keys (operator key only).
    #[command(subcommand, alias = "tenants")]
    Tenant(commands::tenant::TenantCmd),
    /// Secrets the egress proxy injects into sessions' requests (operator
    /// key only): `secret create NAME --value-file F | --value-stdin`,
    /// `secret list`, `secret delete NAME`.
    #[command(subcommand, alias = "secrets")]
    Secret(commands::secret::SecretCmd),
    /// The hosts sharing the state store: list, cordon, uncordon, drain.
    #[command(subcommand, alias = "hosts")]
    Host(commands::host::HostCmd),
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let api = cli.api;
    // exec and run share their exit status with the command they ran, so
    // their own failures get a status of their own.
    let fail = match cli.cmd {
        Cmd::Exec(_) | Cmd::Run(_) | Cmd::Attach(_) | Cmd::Wait(_) => EXIT_HATCHERY,
        _ => 1,
    };
    if !matches!(cli.cmd, Cmd::Serve(_) | Cmd::Run(_)) {
        // Like other Unix tools, end quietly when a reader goes away
        // (`hatchery sandbox ls | head -1`) instead of panicking in println!.
        // `run` keeps ignoring SIGPIPE: it must live to destroy its sandbox.
        // SAFETY: signal(2) with SIG_DFL has no memory-safety preconditions;
        // it only changes the process-wide disposition, and nothing here
        // (the runtime's idle workers included) relies on SIGPIPE being ignored.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let result = match cli.cmd {
        // Returns only if the exec failed.
        Cmd::Serve(args) => Err(serve::exec_daemon(args).into()),
        Cmd::Run(args) => {
            match cleanup::on_signals() {
                Ok(watch) => drop(tokio::spawn(watch)),
                Err(e) => eprintln!("hatchery: cannot watch signals: {e}"),
            }
            blocking(move || run::run(&api, args)).await
        }
        Cmd::Round(c) => commands::round::run(&api, c).await,
        // Blocking HTTP is fine for the rest: the CLI does one thing at a time.
        cmd => blocking(move || client_cmd(&api, cmd)).await,
    };
    if cleanup::interrupted() {
        // The signal handler is destroying our sandbox and exits with
        // 128 + N; the error its deletion caused here is not the story.
        tokio::time::sleep(std::time::Duration::from_secs(120)).await;
    }
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("hatchery: {e:#}");
            std::process::exit(fail);
        }
    }
}

async fn blocking(f: impl FnOnce() -> anyhow::Result<i32> + Send + 'static) -> anyhow::Result<i32> {
    tokio::task::spawn_blocking(f).await?
}

fn client_cmd(api: &Api, cmd: Cmd) -> anyhow::Result<i32> {
    match cmd {
        Cmd::Sandbox(c) => sandbox::run(api, c),
        Cmd::Exec(a) => exec::run(api, a),
        Cmd::Ps(a) => procs::ps(api, a),
        Cmd::Attach(a) => procs::attach(api, a),
        Cmd::Wait(a) => procs::wait(api, a),
        Cmd::Kill(a) => procs::kill(api, a),
        Cmd::Cp { src, dst } => commands::cp::run(api, &src, &dst),
        Cmd::Shell {
            id,
            cwd,
            lines,
            cmd,
        } => commands::shell::run(api, &id, cwd, lines, &cmd),
        Cmd::Snapshot(c) => snapshot::run(api, c),
        Cmd::Template(c) => template::run(api, c),
        Cmd::Network(c) => network::run(api, c),
        Cmd::Audit(c) => commands::audit::run(c),
        Cmd::Session(c) => commands::session::run(api, c),
        Cmd::Env(c) => commands::env::run(api, c),
        Cmd::Tenant(c) => commands::tenant::run(api, c),
        Cmd::Host(c) => commands::host::run(api, c),
        Cmd::Secret(c) => commands::secret::run(api, c),
        Cmd::Serve(_) | Cmd::Run(_) | Cmd::Round(_) => unreachable!("handled in main"),
    }
}
