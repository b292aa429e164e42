//! Building a template's root filesystem: debootstrap of the base plus the
//! spec's packages, from the Debian mirror the host already uses. Runs on
//! the host, as root, into a private directory; nothing of the spec but
//! validated package names reaches the command line.

use crate::spec::TemplateSpec;
use crate::TemplateError;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

/// The first `URIs:` of the host's Debian sources, else deb.debian.org.
pub fn default_mirror() -> String {
    std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("URIs:").map(|u| u.trim().to_string()))
        })
        .unwrap_or_else(|| "http://deb.debian.org/debian".to_string())
}

/// How much of the host's CPU a build's commands may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BuildPriority {
    /// A build someone waits for (`POST /v1/templates`, `build-local`).
    #[default]
    Normal,
    /// A build nobody waits for (`--build-template` at start): its
    /// commands run under `nice -n 19`, so the sandboxes the daemon serves
    /// meanwhile keep the CPU.
    Low,
}

impl BuildPriority {
    /// `program` as a command at this priority.
    fn command(self, program: &str) -> Command {
        match self {
            BuildPriority::Normal => Command::new(program),
            BuildPriority::Low => {
                let mut cmd = Command::new("nice");
                cmd.args(["-n", "19", program]);
                cmd
            }
        }
    }
}

/// Makes `dest` (if not already complete), reporting progress lines to
/// `log`. A crash mid-build leaves only `dest.partial`, never a `dest` that
/// looks finished.
pub fn build_rootfs(
    spec: &TemplateSpec,
    dest: &Path,
    mirror: &str,
    priority: BuildPriority,
    log: &mut dyn FnMut(&str),
) -> Result<(), TemplateError> {
    if dest.join(".complete").exists() {
        log("rootfs already built for these packages; reusing it");
        return Ok(());
    }
    spec.validate()?;
    let io = |e: std::io::Error| TemplateError::Io(e.to_string());
    let partial = dest.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let mut cmd = priority.command("debootstrap");
    cmd.arg("--variant=minbase")
        .arg(format!("--include={}", spec.all_packages().join(",")))
        .arg("bookworm")
        .arg(&partial)
        .arg(mirror);
    if let Err(e) = run_logged(cmd, "debootstrap", log) {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(e);
    }
    // What a sandbox never needs: apt caches and docs.
    for d in [
        "var/cache/apt/archives",
        "var/lib/apt/lists",
        "usr/share/doc",
        "usr/share/man",
    ] {
        let p = partial.join(d);
        let _ = std::fs::remove_dir_all(&p);
        let _ = std::fs::create_dir_all(&p);
    }
    if !spec.pip.is_empty() {
        log(&format!("pip: {}", spec.pip.join(" ")));
        if let Err(e) = run_logged(
            pip_command(&partial, &spec.pip, priority),
            "pip install",
            log,
        ) {
            let _ = std::fs::remove_dir_all(&partial);
            return Err(e);
        }
    }
    for d in ["opt/hatchery", "workspace"] {
        std::fs::create_dir_all(partial.join(d)).map_err(io)?;
    }
    std::fs::write(partial.join(".complete"), spec.rootfs_key()).map_err(io)?;
    let _ = std::fs::remove_dir_all(dest);
    std::fs::rename(&partial, dest).map_err(io)?;
    Ok(())
}

/// The host's Debian pip (`/usr/bin/python3`, the same Python 3.11 the
/// bookworm rootfs has, so wheels and shebangs fit) installs into the
/// rootfs's `/usr/local`, ignoring whatever the host itself has installed.
/// No `--prefix`: Debian's default scheme for root is already `/usr/local`,
/// and its patched sysconfig would turn `--prefix /usr/local` into
/// `/usr/local/local`.
/// Only validated requirement specifiers reach the command line; the index
/// is the host pip's own configuration (PIP_INDEX_URL, PIP_FIND_LINKS,
/// PIP_NO_INDEX in the daemon's environment).
fn pip_command(root: &Path, reqs: &[String], priority: BuildPriority) -> Command {
    let mut cmd = priority.command("/usr/bin/python3");
    cmd.args(["-m", "pip", "install", "--root"])
        .arg(root)
        .args([
            "--ignore-installed",
            "--no-cache-dir",
            "--no-input",
            "--disable-pip-version-check",
            "--no-warn-script-location",
            "--break-system-packages",
            "--progress-bar",
            "off",
        ])
        .args(reqs)
        // Root's pip complains about running as root: it is meant to here.
        .env("PIP_ROOT_USER_ACTION", "ignore");
    cmd
}

/// Runs a build command with its output (stdout and stderr together) as
/// progress lines; a failure carries the last lines.
fn run_logged(
    mut cmd: Command,
    what: &str,
    log: &mut dyn FnMut(&str),
) -> Result<(), TemplateError> {
    let io = |e: std::io::Error| TemplateError::Io(format!("{what}: {e}"));
    let (reader, writer) = std::io::pipe().map_err(io)?;
    cmd.stdin(Stdio::null())
        .stdout(writer.try_clone().map_err(io)?)
        .stderr(writer);
    let mut child = cmd.spawn().map_err(io)?;
    // Our copies of the pipe's write end must go, or EOF never comes.
    drop(cmd);
    let mut tail = Vec::new();
    for line in BufReader::new(reader).lines().map_while(Result::ok) {
        log(&line);
        tail.push(line);
        if tail.len() > 5 {
            tail.remove(0);
        }
    }
    let status = child.wait().map_err(io)?;
    if !status.success() {
        return Err(TemplateError::Build(format!(
            "{what} failed ({status}): {}",
            tail.join(" | ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pip_installs_into_the_rootfs_only() {
        let cmd = pip_command(
            Path::new("/t/rootfs.partial"),
            &["a==1".into(), "b[x]".into()],
            BuildPriority::Normal,
        );
        assert_eq!(cmd.get_program(), "/usr/bin/python3");
        let args: Vec<_> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args.join(" "),
            "-m pip install --root /t/rootfs.partial --ignore-installed \
             --no-cache-dir --no-input --disable-pip-version-check --no-warn-script-location \
             --break-system-packages --progress-bar off a==1 b[x]"
        );
    }

    #[test]
    fn a_low_priority_build_runs_its_commands_under_nice() {
        let cmd = pip_command(Path::new("/r"), &["a".into()], BuildPriority::Low);
        assert_eq!(cmd.get_program(), "nice");
        let args: Vec<_> = cmd
            .get_args()
            .take(5)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(args, ["-n", "19", "/usr/bin/python3", "-m", "pip"]);
        // The command really runs (nice is on every host that builds).
        let mut echo = BuildPriority::Low.command("/bin/echo");
        echo.arg("hi");
        let mut seen = Vec::new();
        run_logged(echo, "echo", &mut |l| seen.push(l.to_string())).unwrap();
        assert_eq!(seen, ["hi"]);
    }

    #[test]
    fn a_failing_command_reports_its_last_lines() {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "for i in 1 2 3 4 5 6 7; do echo line$i; done; exit 3"]);
        let mut seen = Vec::new();
        let e = run_logged(cmd, "demo", &mut |l| seen.push(l.to_string())).unwrap_err();
        assert_eq!(seen.len(), 7);
        let m = e.to_string();
        assert!(
            m.contains("demo failed") && m.contains("line7") && !m.contains("line2"),
            "{m}"
        );
    }
}
