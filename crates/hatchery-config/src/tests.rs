//! Parsing, validation and precedence of the configuration.

use super::*;
use std::io::Write;

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

/// Parsing reads the environment, which one test changes: setenv while
/// another thread reads it is not safe, so every parse holds this.
static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn locked<T>(f: impl FnOnce() -> T) -> T {
    let _g = ENV.lock().unwrap_or_else(|p| p.into_inner());
    f()
}

fn run(argv: &[&str]) -> Result<DaemonArgs, ConfigError> {
    locked(|| run_unlocked(argv))
}

fn run_unlocked(argv: &[&str]) -> Result<DaemonArgs, ConfigError> {
    match parse(argv.iter().map(OsString::from).collect())? {
        Invocation::Run(a) => Ok(*a),
        _ => panic!("not a run"),
    }
}

fn check(path: &std::path::Path) -> Result<DaemonArgs, ConfigError> {
    locked(|| check_file(path))
}

fn problems(e: ConfigError) -> Vec<String> {
    match e {
        ConfigError::Invalid(ps) => ps.iter().map(|p| p.to_string()).collect(),
        other => panic!("expected problems, got {other}"),
    }
}

#[test]
fn every_flag_is_a_key_and_every_key_a_flag() {
    let cmd = Cli::command();
    let longs: Vec<&str> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|l| !["config", "help", "version"].contains(l))
        .collect();
    for l in &longs {
        assert!(keys::of_flag(l).is_some(), "--{l} has no config key");
    }
    assert_eq!(longs.len(), keys::KEYS.len(), "a key names no flag");
    for k in keys::KEYS {
        assert!(keys::SECTIONS.contains(&k.section), "{}", k.path());
        assert_eq!(
            keys::find(k.section, k.name).unwrap().long,
            k.long,
            "{} twice",
            k.path()
        );
    }
}

#[test]
fn the_file_sets_what_no_flag_does_and_a_flag_beats_it() {
    let f = file(
        "[pool]\nsize = 2\nmin_available = 0.5\n[server]\nlog_json = true\n\
         [network]\nmode = \"off\"\nhost_services = [\"a=81=127.0.0.1:9\", \"b=82=127.0.0.1:9\"]\n\
         [role]\nhost_lease_ttl = 12\n",
    );
    let p = f.path().to_str().unwrap();
    let a = run(&["hatcheryd", "--config", p]).unwrap();
    assert_eq!(a.pool_size, 2);
    assert!(a.log_json);
    assert_eq!(a.network, NetworkMode::Off);
    assert_eq!(a.host_services.len(), 2);
    assert_eq!(a.host_lease_ttl, 12);
    // Untouched keys keep their defaults.
    assert_eq!(a.max_sandboxes, 64);
    let a = run(&[
        "hatcheryd",
        "--pool-size",
        "7",
        &format!("--config={p}"),
        "--network",
        "on",
    ])
    .unwrap();
    assert_eq!((a.pool_size, a.network), (7, NetworkMode::On));
    assert_eq!(a.host_lease_ttl, 12);
}

#[test]
fn unknown_keys_and_sections_are_named_with_the_file() {
    let f = file("[pool]\nsize = 2\nsise = 3\n[nope]\nx = 1\n");
    let e = problems(run(&["hatcheryd", "--config", f.path().to_str().unwrap()]).unwrap_err());
    let shown = f.path().display().to_string();
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(e.iter().all(|p| p.starts_with(&shown)), "{e:?}");
    assert!(
        e.iter().any(|p| p.contains("unknown key `pool.sise`")),
        "{e:?}"
    );
    assert!(e.iter().any(|p| p.contains("unknown key `nope`")), "{e:?}");
}

#[test]
fn a_wrong_type_or_value_names_the_key_and_the_file() {
    let f = file(
        "[pool]\nsize = \"four\"\n[role]\nname = \"boss\"\nhost_lease_ttl = 5\n\
         [server]\nlisten = \"nowhere\"\n[network]\nhost_services = \"a=1=b\"\n",
    );
    let e = problems(run(&["hatcheryd", "--config", f.path().to_str().unwrap()]).unwrap_err());
    let shown = f.path().display().to_string();
    let has = |needle: &str| {
        e.iter()
            .any(|p| p.starts_with(&shown) && p.contains(needle))
    };
    assert!(has("`pool.size` must be an integer, not a string"), "{e:?}");
    assert!(
        has("`network.host_services` must be an array of strings"),
        "{e:?}"
    );
    assert!(
        has("`role.name` = \"boss\": must be one of all, control, host"),
        "{e:?}"
    );
    assert!(
        has("`role.host_lease_ttl` = 5: 5 is not in 6..=300"),
        "{e:?}"
    );
    assert!(has("`server.listen` = \"nowhere\""), "{e:?}");
    assert_eq!(e.len(), 5, "{e:?}");
}

#[test]
fn templates_to_build_at_start_are_read_when_the_config_is() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("small.json");
    std::fs::write(&good, r#"{"name": "small"}"#).unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"name": "Bad Name"}"#).unwrap();
    let missing = dir.path().join("missing.json");

    let f = file(&format!(
        "[templates]\nbuild_at_start = [\"{}\"]\n",
        good.display()
    ));
    let a = run(&["hatcheryd", "--config", f.path().to_str().unwrap()]).unwrap();
    let names: Vec<&str> = a
        .build_templates
        .iter()
        .map(|s| s.spec.name.as_str())
        .collect();
    assert_eq!(names, ["small"]);
    // Repeatable on the command line, in order.
    let a = run(&[
        "hatcheryd",
        "--build-template",
        good.to_str().unwrap(),
        "--build-template",
        good.to_str().unwrap(),
    ])
    .unwrap();
    assert_eq!(a.build_templates.len(), 2);
    assert!(run(&["hatcheryd"]).unwrap().build_templates.is_empty());

    // A bad file is a start error naming the key, the config file and the
    // spec file.
    let f = file(&format!(
        "[templates]\nbuild_at_start = [\"{}\", \"{}\"]\n",
        missing.display(),
        bad.display()
    ));
    let e = problems(run(&["hatcheryd", "--config", f.path().to_str().unwrap()]).unwrap_err());
    let shown = f.path().display().to_string();
    assert!(
        e.iter().any(|p| p.starts_with(&shown)
            && p.contains("`templates.build_at_start`")
            && p.contains("missing.json: cannot read it: ")),
        "{e:?}"
    );
    // And as a flag, the flag and the file.
    let e = run(&["hatcheryd", "--build-template", bad.to_str().unwrap()]).unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("--build-template") && m.contains("bad.json: invalid template spec"),
        "{m}"
    );
}

#[test]
fn the_file_s_problems_come_with_the_rules_it_breaks() {
    let f = file("[pool]\nsize = \"x\"\n[role]\nname = \"control\"\n");
    let e = problems(run(&["hatcheryd", "--config", f.path().to_str().unwrap()]).unwrap_err());
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].contains("`pool.size` must be an integer")
            && e[1].contains("`control` needs --db postgres")
    );
}

#[test]
fn rules_are_checked_as_a_whole_and_name_where_the_value_came_from() {
    let f = file("[role]\nname = \"host\"\n[gateway]\nopenai_upstream = \"http://127.0.0.1:1\"\n");
    let p = f.path().to_str().unwrap();
    let e = problems(run(&["hatcheryd", "--config", p]).unwrap_err());
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with(&format!("{p}: `role.name`: `host` needs --db postgres")),
        "{e:?}"
    );
    assert!(
        e[1].starts_with("`gateway.prices` (--gateway-prices): is required"),
        "{e:?}"
    );
    // The same rule, broken by a flag, names the flag.
    let e = problems(run(&["hatcheryd", "--role", "control"]).unwrap_err());
    assert!(
        e[0].starts_with("--role: `control` needs --db postgres"),
        "{e:?}"
    );
    // And a flag can mend what the file broke.
    run(&[
        "hatcheryd",
        "--config",
        p,
        "--role",
        "all",
        "--gateway-prices",
        "/p.json",
    ])
    .unwrap();
}

#[test]
fn the_environment_beats_the_file() {
    // Holds ENV: no other parse sees the variable.
    let f = file("[pool]\nmin_available = 0.5\n");
    let a = locked(|| {
        std::env::set_var("HATCHERY_POOL_MIN_AVAILABLE", "0.25");
        let a = run_unlocked(&["hatcheryd", "--config", f.path().to_str().unwrap()]);
        std::env::remove_var("HATCHERY_POOL_MIN_AVAILABLE");
        a
    });
    assert_eq!(a.unwrap().pool_min_available, 0.25);
}

#[test]
fn each_role_s_example_passes_its_own_check() {
    for role in [Role::All, Role::Host, Role::Control] {
        let text = example::example(&Cli::command(), role);
        let f = file(&text);
        let a = check(f.path()).unwrap_or_else(|e| panic!("{role:?}: {e}\n{text}"));
        assert_eq!(a.role, role);
        // Every key that matters to the role is in it, set or commented.
        let shown = text.lines().filter(|l| l.contains(" = ")).count();
        assert!(shown > 20, "{role:?}: {shown} keys\n{text}");
    }
    let host = example::example(&Cli::command(), Role::Host);
    assert!(
        host.contains("\n[runtime]\n") && !host.contains("\n[rounds]\n"),
        "{host}"
    );
    let control = example::example(&Cli::command(), Role::Control);
    assert!(
        !control.contains("\n[pool]\n") && control.contains("for_hosts = true"),
        "{control}"
    );
}

#[test]
fn a_file_that_is_not_toml_or_not_there_says_which() {
    let f = file("[pool\n");
    let e = run(&["hatcheryd", "--config", f.path().to_str().unwrap()]).unwrap_err();
    assert!(
        matches!(e, ConfigError::Syntax { .. }) && e.to_string().contains(".toml"),
        "{e}"
    );
    let e = run(&["hatcheryd", "--config", "/nonexistent/h.toml"]).unwrap_err();
    assert_eq!(e.to_string(), "/nonexistent/h.toml: cannot read it");
}

/// The per-role files docs/operations.md shows ("Configuration") pass the
/// check, and say the role they are for.
#[test]
fn the_documented_examples_pass_the_check() {
    let doc = include_str!("../../../docs/operations.md");
    let section = &doc[doc.find("## Configuration").unwrap()..];
    let section = &section[..section.find("Every key:").unwrap()];
    let blocks: Vec<&str> = section
        .split("```toml\n")
        .skip(1)
        .map(|b| &b[..b.find("```").unwrap()])
        .collect();
    assert_eq!(blocks.len(), 3, "one example per role");
    for (block, role) in blocks.iter().zip([Role::All, Role::Host, Role::Control]) {
        let f = file(block);
        let a = check(f.path()).unwrap_or_else(|e| panic!("{e}\n{block}"));
        assert_eq!(a.role, role, "{block}");
    }
}

/// The files deploy/systemd's units read (deploy/config/) pass the check.
#[test]
fn the_deployed_examples_pass_the_check() {
    for (text, role) in [
        (include_str!("../../../deploy/config/host.toml"), Role::Host),
        (
            include_str!("../../../deploy/config/control.toml"),
            Role::Control,
        ),
    ] {
        let f = file(text);
        let a = check(f.path()).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(a.role, role);
    }
}

#[test]
fn the_anchor_object_store_is_checked_with_the_rest() {
    // A URL without its credentials file, from the file: named by key.
    let f = file("[audit]\nanchor_s3_url = \"http://127.0.0.1:9000/anchors/p\"\n");
    let e = problems(run(&["hatcheryd", "--config", f.path().to_str().unwrap()]).unwrap_err());
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].contains("`audit.anchor_s3_url`")
            && e[0].contains("needs --audit-anchor-s3-credentials-file"),
        "{e:?}"
    );
    // Plain http:// to a non-loopback store: the URL's reason is given.
    let e = problems(
        run(&[
            "hatcheryd",
            "--audit-anchor-s3-url",
            "http://10.0.0.1/anchors",
            "--audit-anchor-s3-credentials-file",
            "/c",
        ])
        .unwrap_err(),
    );
    assert!(e[0].contains("loopback"), "{e:?}");
    let a = run(&[
        "hatcheryd",
        "--audit-anchor-s3-url",
        "https://s3.example.com/anchors/p",
        "--audit-anchor-s3-credentials-file",
        "/c",
        "--audit-anchor-s3-region",
        "eu-west-1",
    ])
    .unwrap();
    assert_eq!(a.broker.anchor_s3_region, "eu-west-1");
}

#[test]
fn the_anchor_object_stores_ca_file_goes_with_an_https_url() {
    // Alone, from the file: named by its own key.
    let f = file("[audit]\nanchor_s3_ca_file = \"/etc/hatchery/s3-ca.pem\"\n");
    let e = problems(run(&["hatcheryd", "--config", f.path().to_str().unwrap()]).unwrap_err());
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].contains("`audit.anchor_s3_ca_file`") && e[0].contains("without"),
        "{e:?}"
    );
    // With a plain http:// (loopback) store: a mistake, refused.
    let e = problems(
        run(&[
            "hatcheryd",
            "--audit-anchor-s3-url",
            "http://127.0.0.1:9000/anchors",
            "--audit-anchor-s3-credentials-file",
            "/c",
            "--audit-anchor-s3-ca-file",
            "/ca.pem",
        ])
        .unwrap_err(),
    );
    assert!(
        e[0].contains("--audit-anchor-s3-ca-file") && e[0].contains("plain http://"),
        "{e:?}"
    );
    let a = run(&[
        "hatcheryd",
        "--audit-anchor-s3-url",
        "https://s3.corp:9000/anchors/p",
        "--audit-anchor-s3-credentials-file",
        "/c",
        "--audit-anchor-s3-ca-file",
        "/ca.pem",
    ])
    .unwrap();
    assert_eq!(
        a.broker.anchor_s3_ca_file.as_deref(),
        Some(std::path::Path::new("/ca.pem"))
    );
}
