//! `--role all` and `--role host`: the runtime, the network, the core, the
//! v1 API and E2B's, and each product a host runs, assembled and served.

use crate::listeners::{bind_preview, local_addr, local_port, serve_both_until};
use crate::DaemonError;
use hatchery_api::AppState;
use hatchery_config::DaemonArgs;
use hatchery_core::{Caps, ImageConfig, Manager, PoolConfig};
use hatchery_runtime_gvisor::{GvisorConfig, GvisorRuntime};
use hatchery_serve::origin_guard::{self, Origins};
use hatchery_templates::ImageStore;
use hatchery_templates::Templates;
use std::path::PathBuf;
use std::sync::Arc;

fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

fn which(p: &PathBuf) -> Option<PathBuf> {
    if p.components().count() > 1 {
        return p.exists().then(|| p.clone());
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| PathBuf::from(d).join(p))
        .find(|c| c.exists())
}

/// `--role all` or `host`: the runtime, the API and the products a host runs.
pub async fn run(args: DaemonArgs) -> Result<(), DaemonError> {
    let data = args.data_dir.clone();
    crate::key::prepare_data_dir(&data)?;
    // Checked before anything is registered: a host that cannot reach the
    // shared store must not start (it could not serve shared snapshots).
    let shared_snapshots = match &args.snapshot_store {
        hatchery_templates::SnapshotStoreSpec::Local => None,
        spec => {
            let s = spec.open(&data.join("snapshots"))?;
            tracing::info!(store = ?spec, "snapshots go to the shared store");
            Some(s)
        }
    };
    let runsc = which(&args.runsc)
        .ok_or_else(|| DaemonError::Missing("runsc", args.runsc.display().to_string()))?;
    let agent = sibling("hatchery-agent");
    let shim = sibling("hatchery-shim");
    for (name, p) in [("hatchery-agent", &agent), ("hatchery-shim", &shim)] {
        if !p.exists() {
            return Err(DaemonError::Missing(name, p.display().to_string()));
        }
    }
    let (key, key_path) =
        crate::key::load_or_create(&data).map_err(|e| DaemonError::DataDir(data.clone(), e))?;
    match &key_path {
        Some(p) => {
            tracing::info!(path = %p.display(), "API key file (send as: Authorization: Bearer <key>)")
        }
        None => tracing::info!("API key taken from HATCHERY_API_KEY"),
    }

    let preview = hatchery_core::PreviewKey::load_or_create(&data)
        .map_err(|e| DaemonError::DataDir(data.join(hatchery_core::preview::KEY_FILE), e))?;
    let terminal_secret = crate::key::terminal_secret(&data)
        .map_err(|e| DaemonError::DataDir(data.join("terminal_secret"), e))?;

    let db = crate::state_db::open_db(&args, &data).await?;
    let store = crate::state_db::open(&args, &db, &data).await?;
    let daemon_key = crate::key::daemon_key(&*store)
        .await
        .map_err(DaemonError::DaemonKey)?;
    let state = hatchery_core::lease::take_host_lease(store.clone(), &args.host_id)
        .await
        .map_err(hatchery_core::CoreError::from)?;
    let runtime = GvisorRuntime::new(GvisorConfig {
        state_dir: data.clone(),
        runsc,
        shim,
        agent,
        platform: args.platform.clone(),
        network: args.network.is_on(),
    })?;
    let templates = Templates::new(
        args.templates_dir
            .clone()
            .unwrap_or_else(|| data.join("templates")),
    );
    if templates.list().is_empty() {
        tracing::warn!(dir = %templates.dir().display(), "no templates; run `make template` (hatchery template build-local) or POST /v1/templates");
    }
    let caps = Caps {
        max_ttl_s: args.max_ttl,
        max_live_sandboxes: args.max_sandboxes,
        max_output_bytes: args.max_output_bytes,
        max_file_bytes: args.max_file_bytes,
        terminal_idle_timeout_s: args.terminal_idle_timeout,
        idle_park_ms: args.idle_park_ms,
        max_snapshot_store_bytes: args.snapshot_store_max_mb << 20,
        max_terminals_per_sandbox: args.max_terminals as usize,
        ..Caps::default()
    }
    .normalized();
    let dir_err = |d: PathBuf| move |e: std::io::Error| DaemonError::DataDir(d, e);
    let images = ImageConfig {
        template_images: ImageStore::new(data.join("images"))
            .map_err(dir_err(data.join("images")))?,
        snapshots: ImageStore::new(data.join("snapshots"))
            .map_err(dir_err(data.join("snapshots")))?,
        shared_snapshots,
        pool: PoolConfig {
            size: args.pool_size,
            memory_budget_mb: args.pool_memory_mb,
            min_available_fraction: args.pool_min_available,
            ..PoolConfig::default()
        },
    };
    let metrics = hatchery_core::metrics::Metrics::new();
    let net = if args.network.is_on() {
        let cfg = hatchery_net::NetworkConfig {
            prefix: args.net_prefix.clone(),
            range: args.net_range.parse()?,
            ready_target: args.net_ready_slots,
            limits: caps.net_limits,
            hosts_file: args.net_hosts_file.clone(),
        };
        Some(hatchery_net::Network::start(cfg, metrics.net_metrics())?)
    } else {
        None
    };
    let manager = Manager::new(
        caps,
        state,
        Arc::new(runtime),
        templates,
        images,
        net,
        metrics,
    );
    // Before reconcile, so that re-adopted sandboxes listen for them too.
    for svc in &args.host_services {
        manager.add_host_service(svc.clone())?;
    }
    if let Some(svc) = hatchery_agents::broker::host_service(&args, &data) {
        manager.add_host_service(svc)?;
    }
    let advertise = args
        .advertise_url
        .clone()
        .unwrap_or_else(|| args.listen.to_string());
    manager.register_host(&advertise).await?;
    // Renewed from here, not after reconcile: the lease was taken above,
    // and a slow reconcile (17-25 s in issue 38; 19.9 s for three orphans
    // on a loaded machine) plus the first renewal period (a third of the
    // lease) can outlast the lease, and the sweepers would then mark a
    // host that is still starting as lost.
    let _lease = manager.spawn_lease_keeper();
    // `/readyz`: reconciled and listening are set below, the lease is the
    // manager's; role `all` is also its own control plane.
    let host_checks = hatchery_hosts::readiness::HostChecks::new(manager.clone());
    let report = manager.reconcile().await?;
    tracing::info!(?report, "state reconciled with the host");
    host_checks
        .reconciled
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let _reaper = manager.spawn_reaper();
    let _idle_parker = manager.spawn_idle_parker();
    // Bake missing template checkpoints in the background; until one is
    // ready, creates of that template boot cold.
    for t in manager.templates().list() {
        manager.spawn_bake(&t);
    }
    // Templates to build at start: `building` from the first request on,
    // built once the daemon serves (spawned below).
    let start_builds = manager.queue_builds(
        args.build_templates
            .iter()
            .map(|f| f.spec.clone())
            .collect(),
    );
    let _pool = manager.spawn_pool_filler();

    // Policies have migrations of their own: their own file on one host,
    // their own tables in the shared database on many.
    let policies = crate::state_db::open_policies(&db, &data).await?;
    let secrets = hatchery_agents::open_secrets(&args, &db, &data).await?;
    let session_store = hatchery_agents::open_store(&args, &db, &data).await?;
    // One resolver for the API's and the sessions' routes, so a revoke
    // empties the one cache both read.
    let tenant_store = crate::state_db::open_tenants(&db).await?;
    // A tenant holds its live sandboxes (any host's, in the store) and
    // its unfinished sessions: both keep it from being deleted.
    let tenants = Arc::new(hatchery_tenants::Tenants::new(
        tenant_store.clone(),
        Arc::new(hatchery_tenants::SumUsage(vec![
            Arc::new(hatchery_api::scope::ManagerUsage(manager.clone())),
            Arc::new(hatchery_sessions::tenant_usage::SessionUsage(
                session_store.clone(),
            )),
        ])),
    ));
    let agents = hatchery_agents::start_host(hatchery_agents::HostParts {
        args: &args,
        data: &data,
        db: &db,
        manager: &manager,
        keys: (&key, &daemon_key),
        session_store: session_store.clone(),
        policies: policies.clone(),
        secrets: secrets.clone(),
        tenants: tenants.clone(),
    })
    .await?;
    // E2B's protocol, over the same manager and tenants (docs/e2b.md);
    // its header transforms over the agents' egress proxy.
    let mut e2b_backend =
        hatchery_e2b_backend::ManagerBackend::new(manager.clone(), key.clone(), store.clone())
            .with_tenants(tenants.clone());
    if let Some(h) = agents.e2b_headers.clone() {
        e2b_backend = e2b_backend.with_headers(h);
    }
    let e2b = hatchery_e2b::router(Arc::new(e2b_backend), manager.caps.max_file_bytes);
    let sessions = agents.sessions.clone();
    // Bound before the API state is made: the preview URLs it hands out
    // name this listener's port (which may be ephemeral).
    let preview_listener = bind_preview(&args).await?;
    let origins = Origins {
        preview: hatchery_serve::origin::PreviewOrigin::new(
            args.preview_url.as_deref(),
            local_port(&preview_listener),
        ),
        daemon_key: daemon_key.clone().into(),
        relayed_elsewhere: hatchery_e2b::sandbox::relayed_elsewhere,
    };
    let api_state = AppState {
        tenants: tenants.clone(),
        manager: manager.clone(),
        api_key: key.clone().into(),
        preview: Arc::new(preview),
        preview_origin: origins.preview.clone(),
        terminal_tokens: Arc::new(hatchery_api::terminal_token::TerminalTokens::new(
            terminal_secret,
        )),
    };
    // The preview listener: previews and E2B's relayed ports, nothing
    // else (origin_guard::preview_only refuses the rest before routing).
    let preview_app = hatchery_api::preview_router(api_state.clone()).merge(e2b.clone());
    let app = hatchery_api::router_with(
        api_state,
        hatchery_policy::http::router_with_secrets(policies, Some(Arc::new(secrets.clone())))
            .merge(hatchery_secrets::http::router(secrets))
            .merge(agents.broker_operator)
            .merge(hatchery_tenants::http::router(tenants.clone())),
    )
    .merge(agents.routes)
    .merge(e2b)
    // A cordoned or draining host refuses creates that reach it directly.
    .layer(axum::middleware::from_fn_with_state(
        hatchery_hosts::hold_guard::HoldGuard {
            store: store.clone(),
            me: manager.host_id().to_string(),
            sessions: Some(Arc::new(session_store.clone())),
        },
        hatchery_hosts::hold_guard::refuse_when_held,
    ))
    .merge(hatchery_hosts::api::router(hatchery_hosts::api::HostsApi {
        store: store.clone(),
        lease_ttl_ms: hatchery_core::lease::host_lease_ttl_ms(),
        api_key: key.clone().into(),
        sessions: Some(Arc::new(session_store.clone())),
    }))
    .merge(hatchery_hosts::readiness::router(
        hatchery_hosts::readiness::ReadyChecks {
            host: Some(host_checks.clone()),
            control: (args.role == hatchery_config::Role::All).then(|| {
                hatchery_hosts::readiness::ControlChecks {
                    store: store.clone(),
                    lease_ttl_ms: hatchery_core::lease::host_lease_ttl_ms(),
                }
            }),
        },
    ));
    // Role `all` is its own control plane: the hosts' gauges too.
    let _gauges = (args.role == hatchery_config::Role::All).then(|| {
        hatchery_hosts::gauges::HostGauges::new(&manager.metrics.registry).spawn(
            store.clone(),
            Some(Arc::new(session_store.clone())),
            hatchery_core::lease::host_lease_ttl_ms(),
        )
    });
    // On a shared store, requests for another host's sandboxes go there,
    // and every daemon (not only a control plane) marks lost hosts.
    let shared = args.shared_db().is_some();
    let _sweeper = shared.then(|| {
        hatchery_hosts::sweeper::spawn(
            store.clone(),
            hatchery_core::lease::host_lease_ttl_ms(),
            hatchery_hosts::sweeper::counter(&manager.metrics.registry),
            Some(Arc::new(sessions.clone())),
        )
    });
    // A drained or stopping host moves its sessions to another host, and
    // each host adopts the sessions handed to it (hatchery-hosts
    // shedding, hatchery-sessions handoff). Only where another host can
    // resume them: a shared store and shared snapshots.
    let shedder = (shared && manager.has_shared_snapshots()).then(|| {
        hatchery_hosts::shedding::Shedder::new(
            Arc::new(sessions.clone()),
            Arc::new(hatchery_hosts::handoff_targets::DirectoryTargets {
                directory: Arc::new(hatchery_hosts::StoreDirectory {
                    store: store.clone(),
                    me: manager.host_id().to_string(),
                    lease_ttl_ms: hatchery_core::lease::host_lease_ttl_ms(),
                    local: None,
                    sessions: None,
                    environments: None,
                }),
                me: manager.host_id().to_string(),
            }),
            store.clone(),
            manager.host_id().to_string(),
        )
    });
    if shared && shedder.is_none() {
        tracing::warn!("no shared snapshot store: a drain or a stop leaves this host's sessions here (they resume when it starts again)");
    }
    let _drain_watch = shedder
        .as_ref()
        .map(|s| s.spawn_drain_watch(std::time::Duration::from_secs(1)));
    let _adopter = shared.then(|| sessions.spawn_adopter(std::time::Duration::from_secs(1)));
    // One set of counters for both listeners' routing.
    let route_metrics = hatchery_route::RouteMetrics::new(&manager.metrics.registry);
    let routing = |forward_key: Option<Arc<str>>| hatchery_route::layer::HostRouting {
        directory: Arc::new(hatchery_hosts::StoreDirectory {
            store: store.clone(),
            me: manager.host_id().to_string(),
            lease_ttl_ms: hatchery_core::lease::host_lease_ttl_ms(),
            local: Some(manager.clone()),
            sessions: Some(session_store.clone()),
            // Hosts route; only the control role places sessions.
            environments: None,
        }),
        me: manager.host_id().to_string(),
        api_key: key.clone().into(),
        metrics: route_metrics.clone(),
        forward_key,
        tenant_keys: Some(Arc::new(crate::tenant_keys::StoreTenantKeys(
            tenant_store.clone(),
        ))),
    };
    let (app, preview_app) = if shared {
        (
            app.layer(axum::middleware::from_fn_with_state(
                routing(None),
                hatchery_route::layer::route,
            )),
            preview_app.layer(axum::middleware::from_fn_with_state(
                routing(Some(origins.daemon_key.clone())),
                hatchery_route::layer::route,
            )),
        )
    } else {
        (app, preview_app)
    };
    let origins = Arc::new(origins);
    let preview_app = preview_app.layer(axum::middleware::from_fn_with_state(
        origins.clone(),
        origin_guard::preview_only,
    ));
    // Interview rounds are the control plane's on many hosts: a host
    // (`--role host`) serves none; `all` serves them from its store.
    let rounds = if args.role.serves_rounds() {
        let r = crate::rounds::start(&args, &data, &db, &key, &manager.metrics.registry).await?;
        r.set_tenants(tenants.clone());
        Some(r)
    } else {
        None
    };
    // The rounds router has no fallback, so the API's answers unknown routes.
    let app = match &rounds {
        Some(r) => hatchery_rounds::router(r.clone()).merge(app),
        None => app,
    };
    let render = {
        let m = manager.clone();
        Arc::new(move || m.metrics.render())
    };
    let app = crate::listeners::with_metrics_token(app, &args, render)?;
    // Outermost: nothing behind it serves guest content on this origin
    // unless another daemon's preview listener forwarded it.
    let app = app.layer(axum::middleware::from_fn_with_state(
        origins,
        origin_guard::api_guard,
    ));
    // hatchery-serve sets TCP_NODELAY on every accepted connection.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| DaemonError::Listen(args.listen, e))?;
    // After the bind: the reaper's first act may be resuming gradings,
    // which call this daemon's own API.
    let _rounds_reaper = rounds.as_ref().map(|r| r.spawn_reaper());
    // Reconciled and bound: placed on and routed to from now on (requests
    // queue in the backlog until serve below accepts them).
    host_checks
        .listening
        .store(true, std::sync::atomic::Ordering::SeqCst);
    manager.mark_ready().await?;
    let _start_builds = start_builds.spawn();
    // Runners talk to this daemon's API, so they start once it listens.
    let recovering = sessions.clone();
    tokio::spawn(async move {
        match recovering.recover().await {
            Ok(n) => tracing::info!(sessions = n, "unfinished sessions resumed"),
            Err(e) => tracing::error!(error = %e, "sessions not recovered"),
        }
    });
    tracing::info!(listen = %args.listen, preview_listen = %local_addr(&preview_listener),
                   data_dir = %data.display(), "hatcheryd ready");
    // On SIGTERM: no new work, sessions moved to other hosts while the
    // API still listens (their runners call it), then requests in flight
    // get the stop grace to finish; SSE follows and the like are cut
    // after that (clients reconnect to the restarted daemon).
    let grace = std::time::Duration::from_secs(args.stop_grace);
    let stop = {
        let (manager, checks, shedder) = (manager.clone(), host_checks.clone(), shedder.clone());
        let sessions = sessions.clone();
        async move {
            crate::listeners::shutdown_signal().await;
            hatchery_hosts::graceful_stop::prepare(
                &*manager,
                &checks,
                &sessions,
                shedder.as_ref(),
                grace,
            )
            .await;
        }
    };
    serve_both_until(listener, app, preview_listener, preview_app, &args, stop).await?;
    manager.shutdown().await;
    // Sandboxes outlive the daemon on purpose: their shims keep the agent
    // channel and the TTL, and the next start re-adopts them.
    tracing::info!(
        live = manager.live_count(),
        "hatcheryd stopped; sandboxes keep running under their shims"
    );
    Ok(())
}
