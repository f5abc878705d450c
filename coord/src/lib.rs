//! Multi-node checkpoint coordination: epochs, barriers, key/value exchange, abort,
//! authentication and a tree of sub-coordinators.
//!
//! One agent per node (the dumper or restorer) connects to a coordinator with the blocking
//! [`client::Agent`] API; the coordinator ([`server`]) drives every node through the same
//! phases and commits an epoch only when all of them have their images on disk
//! ([`store`]). See `docs/coord.md` for the protocol, the failure semantics and the
//! benchmark.
#![deny(unsafe_code)]
#![warn(missing_docs)]

/// Logs through the coordinator's sink (stderr and the in-memory tail).
macro_rules! log {
    ($s:expr, $($arg:tt)*) => {
        $s.log_line(format!($($arg)*))
    };
}

pub mod auth;
pub mod client;
pub mod kv;
#[cfg(feature = "pmix")]
pub mod pmix;
pub mod protocol;
mod round;
pub mod server;
pub mod store;
mod tree;

pub use auth::Secret;
pub use client::{Agent, AgentOptions, ClientError, Control, Directive, PhaseBackend, Step};
pub use protocol::{AfterCommit, Intent, Phase, PhaseInfo, RoundKind};
pub use server::{CoordConfig, CoordHandle, FaultPoint, ServerError, spawn};
pub use store::{EpochStore, GlobalManifest};
