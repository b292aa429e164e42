//! `--role control`: the public API without a runtime. Creates are placed
//! on registered hosts, sandbox requests forwarded to their owners
//! (hatchery-route), and lost hosts' sandboxes marked (hatchery-hosts). It
//! serves interview rounds, and the model gateway and tool broker when
//! asked to, for all hosts.

use crate::DaemonError;
use hatchery_config::DaemonArgs;
use hatchery_hosts::StoreDirectory;
use hatchery_route::control::{self, ControlState};
use std::sync::Arc;

pub async fn run(args: DaemonArgs) -> Result<(), DaemonError> {
    let data = args.data_dir.clone();
    crate::key::prepare_data_dir(&data)?;
    let (key, _) =
        crate::key::load_or_create(&data).map_err(|e| DaemonError::DataDir(data.clone(), e))?;
    let db = crate::state_db::open_db(&args, &data).await?;
    let store = crate::state_db::open(&args, &db, &data).await?;
    let daemon_key = crate::key::daemon_key(&*store)
        .await
        .map_err(DaemonError::DaemonKey)?;
    let registry = prometheus::Registry::new();
    let metrics = hatchery_route::RouteMetrics::new(&registry);
    let lease_ttl_ms = hatchery_core::lease::host_lease_ttl_ms();
    let lost = hatchery_hosts::sweeper::counter(&registry);
    let _sweeper = hatchery_hosts::sweeper::spawn(store.clone(), lease_ttl_ms, lost, None);
    // Read only here (which host owns a session); the control role runs
    // no session.
    let sessions = hatchery_agents::open_store(&args, &db, &data).await?;
    let _gauges = hatchery_hosts::gauges::HostGauges::new(&registry).spawn(
        store.clone(),
        Some(Arc::new(sessions.clone())),
        lease_ttl_ms,
    );
    // The operator's hosts API and `/readyz` (the store reachable and a
    // ready host), answered here rather than forwarded.
    let hosts_app = hatchery_hosts::api::router(hatchery_hosts::api::HostsApi {
        store: store.clone(),
        lease_ttl_ms,
        api_key: key.clone().into(),
        sessions: Some(Arc::new(sessions.clone())),
    })
    .merge(hatchery_hosts::readiness::router(
        hatchery_hosts::readiness::ReadyChecks {
            host: None,
            control: Some(hatchery_hosts::readiness::ControlChecks {
                store: store.clone(),
                lease_ttl_ms,
            }),
        },
    ));
    let directory: Arc<dyn hatchery_route::Directory> = Arc::new(StoreDirectory {
        store,
        me: args.host_id.clone(),
        lease_ttl_ms,
        local: None,
        sessions: Some(sessions.clone()),
        // A session from an environment is placed by its snapshot's pool.
        environments: Some(hatchery_agents::open_environments(&db).await?),
    });
    let owner_post = || hatchery_sessions::owner_post::OwnerPost {
        owners: Arc::new(sessions.clone()),
        directory: directory.clone(),
        me: args.host_id.clone(),
        api_key: key.clone(),
        daemon_key: daemon_key.clone(),
    };
    // The model gateway, when the upstream options are given here: the
    // hosts relay their sandboxes' calls to it and hold no upstream key.
    let policies = crate::state_db::open_policies(&db, &data).await?;
    let gateway = hatchery_agents::control::gateway(
        &args.gateway,
        (&db, &data),
        &registry,
        owner_post(),
        (sessions.clone(), policies.clone()),
    )
    .await?;
    // The tool broker, when asked for here: hosts relay their sandboxes'
    // calls to it and hold no credential.
    let broker = hatchery_agents::control::broker(
        &args,
        (&data, &db),
        (&key, &daemon_key),
        &registry,
        (sessions.clone(), policies),
        owner_post(),
    )
    .await?;
    let (key_for_rounds, rounds_registry) = (key.clone(), registry.clone());
    let control_state = ControlState {
        directory,
        me: args.host_id.clone(),
        api_key: key.into(),
        metrics,
        registry,
        default_template: hatchery_templates::DEFAULT_TEMPLATE.into(),
        forward_key: None,
        tenant_keys: Some(Arc::new(crate::tenant_keys::StoreTenantKeys(
            crate::state_db::open_tenants(&db).await?,
        ))),
    };
    // The preview listener forwards previews and E2B's relayed ports to
    // their owners with the daemon key, which is what lets an owner serve
    // them on its API listener (hatchery_serve::origin_guard); it serves nothing else.
    let preview_listener = crate::listeners::bind_preview(&args).await?;
    let origins = Arc::new(hatchery_serve::origin_guard::Origins {
        preview: hatchery_serve::origin::PreviewOrigin::new(
            args.preview_url.as_deref(),
            preview_listener.local_addr().map(|a| a.port()).unwrap_or(0),
        ),
        daemon_key: daemon_key.clone().into(),
        relayed_elsewhere: hatchery_e2b::sandbox::relayed_elsewhere,
    });
    let preview_app = control::router(ControlState {
        forward_key: Some(daemon_key.clone().into()),
        ..control_state.clone()
    })
    .layer(axum::middleware::from_fn_with_state(
        origins.clone(),
        hatchery_serve::origin_guard::preview_only,
    ));
    let app = hosts_app.merge(control::router(control_state));
    let app = match gateway {
        Some(g) => g.merge(app),
        None => app,
    };
    let app = match broker {
        Some(b) => b.merge(app),
        None => app,
    };
    // Interview rounds: their state in the shared database, their
    // sandboxes through this role's own API (placed on and routed to the
    // hosts), like any client's.
    let rounds = crate::rounds::start(&args, &data, &db, &key_for_rounds, &rounds_registry).await?;
    rounds.set_tenants(Arc::new(hatchery_tenants::Tenants::new(
        crate::state_db::open_tenants(&db).await?,
        Arc::new(crate::tenant_keys::NothingCounted),
    )));
    let app = crate::listeners::with_metrics_token(
        hatchery_rounds::router(rounds.clone()).merge(app),
        &args,
        Arc::new(move || {
            prometheus::TextEncoder::new()
                .encode_to_string(&rounds_registry.gather())
                .unwrap_or_default()
        }),
    )?
    .layer(axum::middleware::from_fn_with_state(
        origins,
        hatchery_serve::origin_guard::api_guard,
    ));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| DaemonError::Listen(args.listen, e))?;
    // After the bind: resuming gradings calls this role's own API.
    let _rounds_reaper = rounds.spawn_reaper();
    tracing::info!(listen = %args.listen, preview_listen = ?preview_listener.local_addr().ok(),
                   role = "control", "hatcheryd ready");
    crate::listeners::serve_both(listener, app, preview_listener, preview_app, &args).await?;
    // As a host does: an operator's stop is seen to have ended.
    tracing::info!(role = "control", "hatcheryd stopped");
    Ok(())
}
