//! Interview rounds on Hatchery: a round is defined once (a pinned
//! template version, starter files, setup into a prepared snapshot, a
//! hidden test suite kept on the control side, limits); each candidate gets
//! a persistent sandbox forked from it and a link with a capability token;
//! Run gives a verdict under the round's CPU limit; Submit captures the
//! files and grades them in a fresh grader the candidate never touched;
//! replays keep the session for the retention window.
//!
//! Sandboxes are reached only through [`sandbox::Sandboxes`] (implemented
//! over the public API by `hatchery-client`); state lives behind
//! [`store::RoundStore`].

mod auth;
pub mod client_backend;
mod error;
mod extract;
mod grading;
#[cfg(test)]
mod grading_tests;
pub mod ids;
pub mod limits;
pub mod models;
pub mod openapi;
mod pages;
mod ratelimit;
mod reference;
mod replays;
pub mod room;
mod round_ops;
mod routes;
mod run_ops;
pub mod sandbox;
mod service;
mod session_ops;
pub mod state;
pub mod store;
mod tenant_meta;
#[cfg(test)]
mod tenant_tests;
pub mod tokens;
mod verdict;

pub use auth::Caller;
pub use error::RoundsError;
pub use service::{Rounds, RoundsConfig};
pub use session_ops::files_sha256;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

/// The routes under `/v1/rounds` (and the pages under `/rounds/`). No
/// fallback of its own, so the daemon can merge it with its API router.
pub fn router(rounds: Arc<Rounds>) -> Router {
    use routes::{admin, candidate as c, interview as iv, playback as pb, review as r, room};
    let s = "/v1/rounds/{id}/sessions/{sid}";
    Router::new()
        .route("/v1/rounds", post(admin::create).get(admin::list))
        .route("/v1/rounds/{id}", get(admin::get))
        .route("/v1/rounds/{id}/archive", post(admin::archive))
        .route(
            "/v1/rounds/{id}/reviewer-tokens",
            post(admin::reviewer_token),
        )
        .route(
            "/v1/rounds/{id}/sessions",
            post(admin::invite).get(r::sessions),
        )
        .route(s, get(c::get))
        .route(&format!("{s}/files"), get(c::files))
        .route(&format!("{s}/run"), post(c::run))
        .route(&format!("{s}/run/stream"), post(c::run_stream))
        .route(&format!("{s}/submit"), post(c::submit))
        .route(&format!("{s}/terminal"), post(c::terminal))
        .route(&format!("{s}/end"), post(c::end))
        .route(&format!("{s}/room"), get(room::room))
        .route(&format!("{s}/room/pairing"), post(iv::pairing))
        .route(&format!("{s}/timeline"), get(pb::timeline))
        .route(&format!("{s}/document"), get(pb::document))
        .route(&format!("{s}/notes"), get(iv::get_notes).put(iv::put_notes))
        .route(
            "/v1/rounds/{id}/interviewer-tokens",
            post(iv::interviewer_token),
        )
        .route(&format!("{s}/runs"), get(r::runs))
        .route(&format!("{s}/report"), get(r::report))
        .route(&format!("{s}/submissions/{{sub}}"), get(r::submission))
        .route(
            &format!("{s}/submissions/{{sub}}/regrade"),
            post(r::regrade),
        )
        .route(
            &format!("{s}/replays"),
            post(r::take_replay).get(r::replays),
        )
        .route("/v1/rounds/{id}/replays/{rid}", get(r::replay))
        .route("/v1/rounds/{id}/replays/{rid}/forks", post(r::fork))
        .route(
            "/v1/rounds/{id}/forks/{fid}",
            axum::routing::delete(r::delete_fork),
        )
        .route("/v1/rounds/{id}/forks/{fid}/files", get(r::fork_files))
        .route("/v1/rounds/{id}/forks/{fid}/file", get(r::fork_file))
        .route("/v1/rounds/{id}/forks/{fid}/exec", post(r::fork_exec))
        .route("/rounds/room", get(pages::room_redirect))
        .route("/rounds/room/", get(pages::room))
        .route("/rounds/review", get(pages::review_redirect))
        .route("/rounds/review/", get(pages::review))
        .route("/rounds/assets/{file}", get(pages::file))
        .layer(DefaultBodyLimit::max(limits::MAX_BODY))
        .with_state(rounds)
}
