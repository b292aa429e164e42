//! What can go wrong talking to an MCP server, from loading its config to
//! a call's answer.
//!
//! Its own module because both the MCP client (mcp.rs) and its stdio
//! transport (mcp_stdio.rs) raise it, and the transport must not depend on
//! the client that drives it.

#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("mcp config: {0}")]
    Config(String),
    #[error("starting the server: {0}")]
    Start(String),
    #[error("the server is restarting after a failure; next start in {0} ms")]
    Backoff(u128),
    #[error("{0}")]
    Closed(String),
    #[error("the server answered with more than {0} bytes")]
    TooLarge(usize),
    #[error("the server broke the protocol: {0}")]
    Protocol(String),
    #[error("no answer within {0} s")]
    Timeout(u64),
    #[error("the HTTP transport")]
    Http(#[source] crate::http_client::HttpError),
}
