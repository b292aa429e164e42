//! A credential binding as a policy document writes it (docs/policy.md,
//! "Credentials"): which stored secret a rule of the `egress` tool adds to
//! requests, and how. Validated by `compile::credential`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialBinding {
    /// The name of a secret stored with `/v1/secrets`; a policy naming a
    /// secret that does not exist is refused.
    pub secret: String,
    /// How the secret goes into the request.
    pub inject: Injection,
    /// Upper-case HTTP methods the secret is added to; absent: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<String>>,
    /// Request paths the secret is added to (starting with `/`); absent:
    /// every path. A path with `.`/`..` segments or an encoded dot never
    /// matches, so a prefix cannot be walked out of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// `https` (the default): the proxy terminates TLS for the rule's hosts
    /// and adds the secret inside it. `http` (a cleartext request) is
    /// refused unless every host of the rule is a loopback address (tests).
    #[serde(default)]
    pub scheme: Scheme,
    /// An environment variable the agent gets with a placeholder value
    /// (for tools that insist on one being set); never the secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scheme {
    #[default]
    Https,
    Http,
}

/// Where the secret goes. Exactly one of the three.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Injection {
    /// A header, replacing any the guest sent under that name:
    /// `{"header": {"name": "Authorization", "template": "Bearer {secret}"}}`.
    Header { name: String, template: String },
    /// HTTP basic auth with this username and the secret as the password.
    Basic { username: String },
    /// A query parameter, replacing any of that name the guest sent.
    Query { param: String },
}
