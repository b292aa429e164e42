//! A private PostgreSQL for the tests: the Debian package's binaries on a
//! free loopback port, data and socket in a temporary directory that Drop
//! removes. As root it runs as the `postgres` user (the server refuses
//! root). `HATCHERY_TEST_PG_DSN` names an existing database instead.
//! Anything that keeps it from starting fails the test: nothing is skipped.

use std::path::PathBuf;
use std::process::Command;

pub struct TestPg {
    dir: Option<PathBuf>,
    pub dsn: String,
}

/// The newest installed version's `name`.
fn pg_bin(name: &str) -> PathBuf {
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed under /usr/lib/postgresql (scripts/setup-host.sh installs it)")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort();
    versions
        .iter()
        .rev()
        .map(|v| PathBuf::from(format!("/usr/lib/postgresql/{v}/bin/{name}")))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no {name} under /usr/lib/postgresql/*/bin"))
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// A PostgreSQL program, as the `postgres` user when this is root.
pub fn pg(name: &str) -> Command {
    if !is_root() {
        return Command::new(pg_bin(name));
    }
    let mut c = Command::new("runuser");
    c.args(["-u", "postgres", "--"]).arg(pg_bin(name));
    c
}

fn run(c: &mut Command) {
    let out = c.output().expect("spawn");
    assert!(
        out.status.success(),
        "{c:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestPg {
    /// For tests: fsync off (they test behaviour, not durability).
    pub fn start() -> TestPg {
        Self::start_with(false)
    }

    pub fn start_with(fsync: bool) -> TestPg {
        if let Ok(dsn) = std::env::var("HATCHERY_TEST_PG_DSN") {
            return TestPg { dir: None, dsn };
        }
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!("hxpg-store-{}-{t:x}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            run(Command::new("chown").arg("postgres:postgres").arg(&dir));
        }
        let data = dir.join("data");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        run(pg("initdb").arg("-D").arg(&data).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        ]));
        let fsync = if fsync { "on" } else { "off" };
        let d = dir.display();
        let opts = format!("-p {port} -k {d} -c listen_addresses=127.0.0.1 -c fsync={fsync}");
        run(pg("pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(dir.join("pg.log"))
            .args(["-w", "-t", "60", "start", "-o", &opts]));
        let server = TestPg {
            dir: Some(dir.clone()),
            dsn: format!("postgres://postgres@127.0.0.1:{port}/hatchery"),
        };
        run(pg("createdb")
            .arg("-h")
            .arg(&dir)
            .args(["-p", &port.to_string(), "hatchery"]));
        server
    }
}

impl Drop for TestPg {
    fn drop(&mut self) {
        let Some(dir) = &self.dir else { return };
        let data = dir.join("data");
        if data.join("postmaster.pid").exists() {
            let stop = ["-m", "immediate", "-w", "stop"];
            let _ = pg("pg_ctl").arg("-D").arg(&data).args(stop).output();
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
