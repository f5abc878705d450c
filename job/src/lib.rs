//! Multi-node job orchestration, as a library: the `ckpt` CLI is a thin
//! layer over it (arguments in, messages and exit codes out).
//!
//! Errors are typed: [`JobError`] for becoming a job's user, and one enum
//! per module ([`DirError`], [`LaunchError`], [`RoundError`],
//! [`AgentError`], [`part::PartError`], the `slurm` modules' own); each
//! names the part, node, file or pid it is about, and keeps the failing
//! call's error as its source so a caller can classify it.

pub mod agent;
pub mod dir;
mod error;
pub mod launch;
pub mod part;
pub mod round;
pub mod slurm;
pub mod sys;
pub mod user;

pub use agent::{AgentError, Session};
pub use dir::{DirError, JobDir};
pub use error::JobError;
pub use launch::{LaunchError, Launcher};
pub use round::{Round, RoundConfig, RoundError};
pub use user::JobUser;
