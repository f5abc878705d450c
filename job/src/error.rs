//! The library's one error type.

use crate::user::JobUser;

/// What went wrong in the job library; every variant names the user, part,
/// node, file or pid it is about.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// `--as-user` asked a process that is neither root nor the user to
    /// become the user.
    #[error(
        "--as-user {user}: ckpt runs as uid {me}, which can become no other user (run the hook as root)"
    )]
    NotRoot {
        /// The user asked for.
        user: JobUser,
        /// The effective uid ckpt runs as.
        me: u32,
    },
    /// One step of dropping to the job's user failed.
    #[error("--as-user {user}: {step}")]
    UserStep {
        /// The user asked for.
        user: JobUser,
        /// The call that failed, with its arguments.
        step: String,
        /// Its error.
        #[source]
        source: nix::Error,
    },
    /// Reading back this process's own ids failed.
    #[error("{call}")]
    OwnIds {
        /// `getresuid` or `getresgid`.
        call: &'static str,
        /// Its error.
        #[source]
        source: nix::Error,
    },
    /// The drop to the job's user left some id unchanged.
    #[error("--as-user {user}: the ids did not all change; stopping")]
    IdsUnchanged {
        /// The user asked for.
        user: JobUser,
    },
}
