//! A private PostgreSQL for the tests: the Debian package's binaries on a
//! free loopback port, data and socket in a temporary directory that Drop
//! removes. As root it runs as the `postgres` user (the server refuses
//! root). `HATCHERY_TEST_PG_DSN` names an existing database instead.
//! Anything that keeps it from starting fails the test: nothing is skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct TestPg {
    dir: Option<PathBuf>,
    pub dsn: String,
}

fn pg_bin(name: &str) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed under /usr/lib/postgresql (scripts/setup-host.sh installs it)")
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin").join(name))
        .filter(|p| p.exists())
        .collect();
    found.sort_by_key(|p| {
        p.components()
            .nth(4)
            .and_then(|c| c.as_os_str().to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found
        .pop()
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

fn run(args: &[&str]) {
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]);
        c
    } else {
        Command::new(args[0])
    };
    let args = if is_root() { args } else { &args[1..] };
    let out = cmd.args(args).output().expect("spawn");
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
        let dir = std::env::temp_dir().join(format!("hxpg-store-{}", rand_suffix()));
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            let ok = Command::new("chown")
                .args(["postgres:postgres", dir.to_str().unwrap()])
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown to postgres failed (is the postgres user there?)");
        }
        let data = dir.join("data");
        let (d, dd) = (dir.to_str().unwrap(), data.to_str().unwrap());
        let port = free_port();
        run(&[
            pg_bin("initdb").to_str().unwrap(),
            "-D",
            dd,
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        ]);
        let fsync = if fsync { "on" } else { "off" };
        let opts = format!("-p {port} -k {d} -c listen_addresses=127.0.0.1 -c fsync={fsync}");
        let log = dir.join("pg.log");
        run(&[
            pg_bin("pg_ctl").to_str().unwrap(),
            "-D",
            dd,
            "-l",
            log.to_str().unwrap(),
            "-w",
            "-t",
            "60",
            "start",
            "-o",
            &opts,
        ]);
        let pg = TestPg {
            dir: Some(dir.clone()),
            dsn: format!("postgres://postgres@127.0.0.1:{port}/hatchery"),
        };
        run(&[
            pg_bin("createdb").to_str().unwrap(),
            "-h",
            d,
            "-p",
            &port.to_string(),
            "hatchery",
        ]);
        pg
    }
}

fn rand_suffix() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{}-{t:x}", std::process::id())
}

impl Drop for TestPg {
    fn drop(&mut self) {
        let Some(dir) = &self.dir else { return };
        let data = dir.join("data");
        if Path::new(&data).join("postmaster.pid").exists() {
            let mut cmd = if is_root() {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(pg_bin("pg_ctl"));
                c
            } else {
                Command::new(pg_bin("pg_ctl"))
            };
            let _ = cmd
                .args([
                    "-D",
                    data.to_str().unwrap(),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ])
                .output();
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
