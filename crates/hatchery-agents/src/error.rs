//! What can keep the agent platform from starting: each variant names the
//! part and keeps its cause as the source (hatcheryd's main prints the
//! chain).

#[derive(Debug, thiserror::Error)]
pub enum AgentsError {
    #[error("sessions' store")]
    SessionsStore(#[from] hatchery_sessions::store::StoreError),
    #[error("environments store")]
    Environments(#[from] hatchery_sessions::environments::EnvError),
    #[error("a client of this daemon's own API")]
    OwnApi(#[from] hatchery_client::ClientError),
    #[error("metrics")]
    Metrics(#[from] prometheus::Error),
    #[error("registering a host service")]
    HostService(#[from] hatchery_core::CoreError),
    #[error("egress proxy")]
    Egress(#[from] hatchery_sessions::egress::EgressError),
    #[error("egress credential injection")]
    EgressCa(#[from] hatchery_egress::intercept::ca::CaError),
    #[error("secrets key")]
    SecretsKey(#[from] hatchery_secrets::KeyError),
    #[error("secrets store")]
    Secrets(#[from] hatchery_secrets::StoreError),
    #[error("model gateway")]
    Gateway(#[from] hatchery_gateway::embed::EmbedError),
    #[error("tool broker")]
    Broker(#[from] hatchery_broker::embed::EmbedError),
}
