//! Multi-node checkpoint coordination: epochs, barriers, key/value exchange, abort,
//! authentication and a tree of sub-coordinators.
//!
//! One agent per node (the dumper or restorer) connects to a coordinator with the blocking
//! [`client::Agent`] API; the coordinator drives every node through the same phases and
//! commits an epoch only when all of them have their images on disk ([`store`]).
//!
//! See `docs/coord.md` for the protocol, the failure semantics and the benchmark.
#![deny(unsafe_code)]
#![warn(missing_docs)]

/// Logs through a `log_line` method: the I/O layer's sink (stderr and the in-memory tail)
/// or the engine's outbox.
macro_rules! log {
    ($s:expr, $($arg:tt)*) => {
        $s.log_line(format!($($arg)*))
    };
}

// The engine and its policies are complete and unit-tested here; the I/O layer switches
// over to them in the next step, until then they are unused outside the tests.
#[allow(dead_code)]
mod action;
pub mod auth;
pub mod client;
#[allow(dead_code)]
mod engine;
pub mod kv;
mod legacy_round;
#[cfg(feature = "pmix")]
pub mod pmix;
#[allow(dead_code)]
mod policy;
pub mod protocol;
#[allow(dead_code)]
mod relay;
#[allow(dead_code)]
mod root;
#[allow(dead_code)]
mod round;
pub mod server;
#[allow(dead_code)]
mod state;
pub mod store;
mod tree;

pub use auth::Secret;
pub use client::{Agent, AgentOptions, ClientError, Control, Directive, PhaseBackend, Step};
pub use protocol::{AfterCommit, Intent, Phase, PhaseInfo, RoundKind};
pub use server::{CoordConfig, CoordHandle, FaultPoint, ServerError, spawn};
pub use store::{EpochStore, GlobalManifest};
