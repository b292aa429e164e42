//! Drives a live daemon through every part of the client: sandboxes, exec
//! (buffered and streamed, with env/cwd/cpu_limit_ms), files, processes,
//! code and contexts, network, snapshots and forks, previews, terminal
//! tokens, errors, and teardown. Run by tests/client/test_client.py
//! (`make client-test`) with HATCHERY_URL and HATCHERY_API_KEY; prints one
//! JSON line of what it saw and exits non-zero on the first surprise.

use anyhow::{bail, ensure, Context, Result};
use hatchery_client::blocking::BlockingClient;
use hatchery_client::*;
use std::collections::BTreeMap;

macro_rules! check {
    ($cond:expr, $($msg:tt)+) => { ensure!($cond, $($msg)+) };
}

async fn exercise(
    c: &Client,
    report: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    c.wait_healthy(std::time::Duration::from_secs(30)).await?;
    let h = c.health().await?;
    check!(h.status == "ok", "health: {h:?}");
    let templates = c.list_templates().await?;
    check!(!templates.is_empty(), "no templates");
    let tname = std::env::var("HATCHERY_TEMPLATE").unwrap_or_else(|_| "code-interpreter".into());
    let t = c.get_template(&tname).await?;
    report.insert("template_version".into(), t.version.clone().into());

    let meta = BTreeMap::from([("suite".to_string(), "client-smoke".to_string())]);
    let sbx = c
        .create_sandbox(&CreateSandbox {
            template: Some(tname.clone()),
            ttl_seconds: Some(600),
            metadata: meta.clone(),
            env: BTreeMap::from([("FROM_CREATE".to_string(), "yes".to_string())]),
            network: Some(NetworkPolicy::deny_all()),
        })
        .await?;
    let id = sbx.id.clone();
    let result = async {
        check!(c.get_sandbox(&id).await?.id == id, "get");
        let listed = c.list_sandboxes(&meta).await?;
        check!(listed.iter().any(|s| s.id == id), "list by metadata");
        let other = BTreeMap::from([("suite".to_string(), "nope".to_string())]);
        check!(c.list_sandboxes(&other).await?.is_empty(), "filter");
        let before = c.get_sandbox(&id).await?.expires_at;
        let after = c.set_ttl(&id, 900).await?.expires_at;
        check!(after > before, "ttl {before} -> {after}");

        // exec, buffered
        let out = c
            .exec(
                &id,
                &ExecRequest::cmd("echo $FROM_CREATE $X; pwd; echo err >&2; exit 3")
                    .env("X", "x1")
                    .cwd("/tmp"),
            )
            .await?;
        check!(
            out.stdout == "yes x1\n/tmp\n",
            "exec stdout {:?}",
            out.stdout
        );
        check!(out.stderr == "err\n" && out.exit_code == 3, "exec {out:?}");
        check!(out.reason == ExecReason::Exited, "reason {:?}", out.reason);
        let burn = c
            .exec(
                &id,
                &ExecRequest::argv(["python3", "-c", "while True: pass"])
                    .cpu_limit_ms(300)
                    .timeout_seconds(60),
            )
            .await?;
        check!(burn.reason == ExecReason::CpuLimit, "cpu limit: {burn:?}");
        report.insert("cpu_limit_cpu_ms".into(), burn.cpu_ms.into());
        let slow = c
            .exec(&id, &ExecRequest::cmd("sleep 30").timeout_seconds(1))
            .await?;
        check!(
            slow.reason == ExecReason::Timeout && slow.timed_out,
            "timeout: {slow:?}"
        );

        // exec, streamed
        let mut s = c
            .exec_stream(
                &id,
                &ExecRequest::cmd("for i in 1 2 3; do echo $i; done; echo e >&2"),
            )
            .await?;
        let (mut so, mut se, mut exit) = (String::new(), String::new(), None);
        while let Some(ev) = s.next().await? {
            match ev {
                ExecEvent::Stdout(d) => so.push_str(&d),
                ExecEvent::Stderr(d) => se.push_str(&d),
                ExecEvent::Exit(r) => exit = Some(r.exit_code),
            }
        }
        check!(
            so == "1\n2\n3\n" && se == "e\n" && exit == Some(0),
            "stream {so:?} {se:?} {exit:?}"
        );
        let all = c
            .exec_stream(&id, &ExecRequest::cmd("echo collected"))
            .await?
            .collect()
            .await?;
        check!(all.stdout == "collected\n", "collect {all:?}");

        // files
        c.write_file(&id, "/workspace/dir/a b.txt", "hello\n")
            .await?;
        let back = c.read_file(&id, "/workspace/dir/a b.txt").await?;
        check!(&back[..] == b"hello\n", "read back {back:?}");
        let list = c.list_files(&id, "/workspace/dir").await?;
        check!(
            list.entries
                .iter()
                .any(|e| e.name == "a b.txt" && e.kind == "file" && e.size == 6),
            "list {list:?}"
        );
        c.delete_file(&id, "/workspace/dir/a b.txt").await?;
        let gone = c.read_file(&id, "/workspace/dir/a b.txt").await;
        check!(
            gone.as_ref().is_err_and(|e| e.is_not_found()),
            "deleted file: {gone:?}"
        );
        check!(
            matches!(
                c.read_file(&id, "relative").await,
                Err(ClientError::InvalidRequest(_))
            ),
            "relative path"
        );

        // background processes
        let p = c
            .start_process(
                &id,
                &ExecRequest::argv([
                    "python3",
                    "-u",
                    "-c",
                    "import sys\nfor l in sys.stdin: print('got', l.strip())",
                ]),
            )
            .await?;
        check!(p.is_running(), "started {p:?}");
        check!(
            c.list_processes(&id).await?.iter().any(|x| x.id == p.id),
            "ps"
        );
        c.write_stdin(&id, &p.id, "one\n").await?;
        c.write_stdin(&id, &p.id, "two\n").await?;
        c.close_stdin(&id, &p.id).await?;
        let done = c.wait_process(&id, &p.id, Some(30)).await?;
        check!(
            !done.is_running() && done.exit_code == Some(0),
            "wait {done:?}"
        );
        let mut out = c
            .process_output(&id, &p.id, &OutputOptions::default())
            .await?;
        let mut text = String::new();
        let mut last = None;
        while let Some(ev) = out.next().await? {
            match ev {
                ProcessEvent::Stdout(ch) => text.push_str(&ch.data),
                ProcessEvent::Stderr(_) => {}
                ProcessEvent::Exit(i) | ProcessEvent::End(i) => last = Some(i),
            }
        }
        check!(
            text == "got one\ngot two\n" && last.is_some(),
            "output {text:?}"
        );
        check!(
            c.get_process(&id, &p.id).await?.exit_code == Some(0),
            "get process"
        );
        let sleeper = c.start_process(&id, &ExecRequest::cmd("sleep 300")).await?;
        let sig = c.signal_process(&id, &sleeper.id, "TERM").await?;
        let _ = sig;
        let ended = c.wait_process(&id, &sleeper.id, Some(30)).await?;
        check!(!ended.is_running(), "signalled {ended:?}");
        let sleeper = c.start_process(&id, &ExecRequest::cmd("sleep 300")).await?;
        let killed = c.kill_process(&id, &sleeper.id).await?;
        check!(!killed.is_running(), "killed {killed:?}");

        // code
        let r = c
            .run_code(&id, &CodeRequest::python("x = 20\nprint('hi')\nx * 2"))
            .await?;
        check!(r.stdout == "hi\n", "code stdout {r:?}");
        check!(
            r.results
                .iter()
                .any(|i| i.is_main_result && i.data.get("text/plain") == Some(&"40".into())),
            "code result {r:?}"
        );
        let mut cs = c
            .run_code_stream(&id, &CodeRequest::python("print(x + 1)\n1/0"))
            .await?;
        let (mut cout, mut err, mut summary) = (String::new(), None, None);
        while let Some(ev) = cs.next().await? {
            match ev {
                CodeEvent::Stdout(d) => cout.push_str(&d),
                CodeEvent::Error(e) => err = Some(e.name),
                CodeEvent::Done(s) => summary = Some(s),
                _ => {}
            }
        }
        check!(
            cout == "21\n" && err.as_deref() == Some("ZeroDivisionError"),
            "code stream {cout:?} {err:?}"
        );
        check!(summary.is_some_and(|s| s.error.is_some()), "summary");
        let ctx = c
            .create_context(
                &id,
                &CreateContext {
                    cwd: Some("/tmp".into()),
                    ..Default::default()
                },
            )
            .await?;
        let r = c
            .run_code(
                &id,
                &CodeRequest {
                    code: "import os; print(os.getcwd()); y = 5".into(),
                    context_id: Some(ctx.id.clone()),
                    ..Default::default()
                },
            )
            .await?;
        check!(r.stdout == "/tmp\n", "context cwd {r:?}");
        check!(
            c.list_contexts(&id).await?.iter().any(|x| x.id == ctx.id),
            "contexts"
        );
        c.restart_context(&id, &ctx.id).await?;
        let r = c
            .run_code(
                &id,
                &CodeRequest {
                    code: "print('y' in dir())".into(),
                    context_id: Some(ctx.id.clone()),
                    ..Default::default()
                },
            )
            .await?;
        check!(r.stdout == "False\n", "restart cleared state {r:?}");
        c.delete_context(&id, &ctx.id).await?;

        // network
        let pol = c.get_network(&id).await?;
        check!(pol.egress == EgressMode::Deny, "policy {pol:?}");
        let set = c
            .set_network(
                &id,
                &NetworkPolicy::allow_only(vec![NetworkRule {
                    cidr: Some("10.99.0.0/16".into()),
                    ports: vec![443],
                    ..Default::default()
                }]),
            )
            .await?;
        check!(set.allow.len() == 1, "set policy {set:?}");
        c.network_events(&id).await?;

        // previews and terminals
        let pv = c.preview_url(&id, 8000, Some(60)).await?;
        check!(
            pv.port == 8000 && pv.path.starts_with("/preview/"),
            "preview {pv:?}"
        );
        let tok = c.terminal_token(&id).await?;
        check!(!tok.token.is_empty(), "token");

        // snapshots and forks
        c.write_file(&id, "/workspace/state.txt", "before snapshot")
            .await?;
        let snap = c
            .create_snapshot(
                &id,
                &CreateSnapshot {
                    retention_seconds: Some(600),
                    metadata: meta.clone(),
                    memory: None,
                },
            )
            .await?;
        check!(
            c.get_snapshot(&snap.id).await?.sandbox_id == id,
            "snapshot get"
        );
        check!(
            c.list_snapshots(&meta)
                .await?
                .iter()
                .any(|s| s.id == snap.id),
            "snapshots list"
        );
        let forks = c
            .fork(
                &snap.id,
                &ForkRequest {
                    count: Some(2),
                    ttl_seconds: Some(300),
                    ..Default::default()
                },
            )
            .await?;
        check!(forks.len() == 2, "forks {forks:?}");
        let restored = c.restore(&snap.id, &ForkRequest::default()).await?;
        let mut children: Vec<String> = forks.iter().map(|s| s.id.clone()).collect();
        children.push(restored.id.clone());
        let res = async {
            for f in &children {
                let b = c.read_file(f, "/workspace/state.txt").await?;
                check!(&b[..] == b"before snapshot", "fork {f} sees {b:?}");
                // A fork's network is deny-all unless asked otherwise.
                check!(
                    c.get_network(f).await?.egress == EgressMode::Deny,
                    "fork network"
                );
            }
            c.write_file(&children[0], "/workspace/state.txt", "changed")
                .await?;
            let b = c.read_file(&children[1], "/workspace/state.txt").await?;
            check!(&b[..] == b"before snapshot", "forks isolated");
            Ok(())
        }
        .await;
        for f in &children {
            c.delete_sandbox(f).await?;
        }
        res?;
        c.delete_snapshot(&snap.id).await?;
        let gone = c.get_snapshot(&snap.id).await;
        check!(gone.is_err_and(|e| e.is_not_found()), "snapshot deleted");
        report.insert("forks".into(), children.len().into());

        // errors name the call
        let e = c.get_sandbox("sbx_doesnotexist000").await.unwrap_err();
        check!(
            e.is_not_found() && e.call() == Some(("GET", "/v1/sandboxes/sbx_doesnotexist000")),
            "404: {e}"
        );
        let e = c.exec(&id, &ExecRequest::default()).await.unwrap_err();
        check!(e.status() == Some(400), "no command: {e}");
        let bad = Client::new(&c.base_url(), "wrong-key")?;
        let e = bad.list_templates().await.unwrap_err();
        check!(e.is_unauthorized(), "bad key: {e}");
        Ok::<_, anyhow::Error>(())
    }
    .await;
    c.delete_sandbox(&id).await?;
    result?;
    let e = c.get_sandbox(&id).await.unwrap_err();
    check!(e.is_not_found(), "deleted sandbox still answers: {e}");
    check!(c.list_sandboxes(&meta).await?.is_empty(), "sandboxes left");
    check!(c.list_snapshots(&meta).await?.is_empty(), "snapshots left");
    Ok(())
}

fn main() -> Result<()> {
    let url = std::env::var("HATCHERY_URL").context("HATCHERY_URL")?;
    let key = std::env::var("HATCHERY_API_KEY").context("HATCHERY_API_KEY")?;
    let client = Client::new(&url, &key)?;
    let mut report = serde_json::Map::new();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let t0 = std::time::Instant::now();
    rt.block_on(exercise(&client, &mut report))?;
    drop(rt);
    // The blocking facade, as the CLI uses it.
    let b = BlockingClient::new(client.clone())?;
    let sbx = b.run(b.client().create_sandbox(&CreateSandbox {
        ttl_seconds: Some(120),
        ..Default::default()
    }))?;
    let stream = b.run(
        b.client()
            .exec_stream(&sbx.id, &ExecRequest::cmd("echo a; echo b")),
    )?;
    let events: Vec<_> = b.iter(stream).collect::<Result<_, _>>()?;
    b.run(b.client().delete_sandbox(&sbx.id))?;
    if events.len() < 2 || !matches!(events.last(), Some(ExecEvent::Exit(_))) {
        bail!("blocking stream: {events:?}");
    }
    report.insert("blocking_events".into(), events.len().into());
    report.insert("seconds".into(), t0.elapsed().as_secs_f64().into());
    report.insert("ok".into(), true.into());
    println!("{}", serde_json::Value::Object(report));
    Ok(())
}
