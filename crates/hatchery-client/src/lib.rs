//! A typed async client of Hatchery's public HTTP API, for products built
//! on sandboxes (the playground, interview rounds, agent sessions, the
//! CLI). It speaks plain HTTP/1.1 (hyper) to a daemon on loopback or a
//! private network, bounds every call in time and every answer in size,
//! and reports failures as one `ClientError` naming the call.
//!
//! ```no_run
//! # async fn demo() -> Result<(), hatchery_client::ClientError> {
//! use hatchery_client::{Client, CreateSandbox, ExecRequest};
//! let c = Client::new("http://127.0.0.1:7423", "KEY")?;
//! let sbx = c.create_sandbox(&CreateSandbox::default()).await?;
//! let out = c.exec(&sbx.id, &ExecRequest::cmd("echo hi").cpu_limit_ms(1000)).await?;
//! assert_eq!(out.stdout, "hi\n");
//! c.delete_sandbox(&sbx.id).await?;
//! # Ok(()) }
//! ```
//!
//! Depends on no other hatchery crate: the wire shapes are its own
//! (`models`), checked against docs/openapi.json by a unit test.

pub mod blocking;
mod client;
pub mod error;
#[cfg(any(test, feature = "faults"))]
pub mod faults;
#[cfg(test)]
mod limits_tests;
pub mod models;
#[cfg(test)]
mod openapi_check;
pub mod sse;
pub mod streams;
mod transport;

pub use client::{encode_component, Client, MAX_STDIN_WRITE};
pub use error::ClientError;
pub use hyper::Method;
pub use models::*;
pub use streams::{
    BuildStream, CodeEvent, CodeStream, ExecEvent, ExecStream, ProcessEvent, ProcessStream,
};
pub use transport::{ClientConfig, EventStream};
