//! The OpenAPI document of `/v1/rounds`, generated from the handlers and
//! wire types; `tests/openapi_snapshot.rs` pins it to
//! `docs/openapi-rounds.json`.

use crate::error::{ErrorBody, ErrorDetail};
use crate::models::*;
use crate::routes::{admin, candidate, interview, playback, review, room};
use crate::state::{RoundState, SessionState};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Hatchery interview rounds",
        version = "1",
        description = "Rounds, candidate sessions, Run, grading, replays. Bearer: the API key, a candidate token or a reviewer token (see docs/interviews.md)."
    ),
    paths(
        admin::create,
        admin::list,
        admin::get,
        admin::archive,
        admin::invite,
        admin::reviewer_token,
        candidate::get,
        candidate::files,
        candidate::run,
        candidate::run_stream,
        candidate::submit,
        candidate::terminal,
        candidate::end,
        review::sessions,
        review::runs,
        review::report,
        review::submission,
        review::regrade,
        review::take_replay,
        review::replays,
        review::replay,
        review::fork,
        review::fork_files,
        review::fork_file,
        review::fork_exec,
        review::delete_fork,
        room::room,
        interview::interviewer_token,
        interview::get_notes,
        interview::put_notes,
        interview::pairing,
        playback::timeline,
        playback::document,
    ),
    components(schemas(
        CreateRound,
        NotesBody,
        Notes,
        Pairing,
        TimelineEntry,
        Timeline,
        DocumentAt,
        TestSuiteBody,
        SetupBody,
        RunMode,
        Round,
        RoundSpec,
        RoundList,
        RoundState,
        CreateSession,
        Session,
        SessionCreated,
        SessionList,
        SessionState,
        CandidateResult,
        RunBody,
        RunResult,
        RunList,
        Verdict,
        SubmitBody,
        SubmitAccepted,
        Report,
        SubmissionReport,
        GradingReport,
        CaseReport,
        SubmissionFiles,
        Replay,
        ReplayList,
        Fork,
        ForkExecBody,
        ForkExecResult,
        FileContent,
        FileTree,
        CreateReviewerToken,
        ReviewerToken,
        TerminalGrant,
        candidate::CandidateFiles,
        ErrorBody,
        ErrorDetail
    ))
)]
pub struct RoundsDoc;

pub fn json() -> String {
    RoundsDoc::openapi().to_pretty_json().unwrap_or_default()
}
