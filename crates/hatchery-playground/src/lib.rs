//! hatchery-playground: an anonymous Run-button gateway in front of a
//! Hatchery daemon, and the widget a docs site embeds. See docs/playground.md.

pub mod app;
pub mod assets;
pub mod cache;
pub mod config;
pub mod events;
pub mod limits;
pub mod metrics;
pub mod refusal;
pub mod routes;
pub mod run;
pub mod runs;
