//! Multi-node checkpoint coordination: epochs, barriers, key/value exchange, abort,
//! authentication and a tree of sub-coordinators.
//!
//! One agent per node (the dumper or restorer) connects to a coordinator with the blocking
//! [`client::Agent`] API; the coordinator drives every node through the same phases and
//! commits an epoch only when all of them have their images on disk ([`store`]).
//!
//! The coordinator is split in three layers, each knowing nothing of the one above:
//!
//! * `engine`: a state machine without I/O; events in (with the time), actions out.
//!   `round` counts barriers, `state` holds what root and relay share. `handshake` is
//!   the same for a connection's authentication and version negotiation.
//! * `policy`: where root and relay differ, as two types: `root::Root` (starts rounds,
//!   commits, aborts) and `relay::Relay` (a sub-coordinator standing for its agents).
//! * [`server`]: the `mio` loop that moves bytes, feeds the handshake and the engine,
//!   carries out their `action`s, and has the epoch store's durable writes done on a
//!   thread of its own.
//!
//! See `docs/coord.md` for the protocol, the failure semantics and the benchmark.
#![deny(unsafe_code)]
#![warn(missing_docs)]

/// Logs through a `log_line` method: the I/O layer's sink (the `log` facade and the
/// in-memory tail) or the engine's outbox.
macro_rules! log {
    ($s:expr, $($arg:tt)*) => {
        $s.log_line(format!($($arg)*))
    };
}

mod action;
pub mod addr;
mod admit;
pub mod auth;
pub mod client;
mod engine;
mod handshake;
pub mod kv;
#[cfg(feature = "pmix")]
pub mod pmix;
mod policy;
pub mod protocol;
mod relay;
mod root;
mod round;
pub mod server;
mod socket_file;
mod state;
pub mod store;
mod sys;
mod throttle;

pub use addr::{Endpoint, PeerAddr};
pub use admit::ConnLimits;
pub use auth::Secret;
pub use client::{Agent, AgentOptions, ClientError, Control, Directive, PhaseBackend, Step};
pub use protocol::{AfterCommit, Intent, Phase, PhaseInfo, RoundKind};
pub use server::{CoordConfig, CoordHandle, FaultPoint, ServerError, Stopper, spawn};
pub use store::{EpochStore, GlobalManifest};
