//! What the coordinator engine asks its I/O layer to do.
//!
//! The engine (`engine`) never touches a socket, a file or a clock; it returns
//! these, in order, and the I/O layer (`server`) carries them out. Store actions
//! whose result matters ([`Action::ReserveEpoch`], [`Action::Commit`]) are answered by
//! feeding the matching event back into the engine.

use crate::kv::ConnId;
use crate::protocol::{Message, Phase};
use crate::store::NodeManifest;

/// One thing for the I/O layer to do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Queue `msg` on one downstream connection.
    Send {
        /// Recipient.
        to: ConnId,
        /// Message.
        msg: Message,
    },
    /// Queue the same message on many downstream connections (encoded once).
    Broadcast {
        /// Recipients.
        to: Vec<ConnId>,
        /// Message.
        msg: Message,
    },
    /// Queue `msg` on the link to the parent coordinator (relays only).
    SendUp(Message),
    /// Answer a status query; the I/O layer adds its traffic counters.
    SendStatus {
        /// Recipient.
        to: ConnId,
        /// The engine's part of the status.
        snapshot: Snapshot,
    },
    /// Tell the peer why it is refused, then hang up after it had a moment to read it.
    Refuse {
        /// Connection.
        conn: ConnId,
        /// Reason sent to the peer.
        reason: String,
    },
    /// Close a connection that broke the protocol. The engine has already forgotten the
    /// peer; no disconnect event is expected back.
    Expel {
        /// Connection.
        conn: ConnId,
        /// Why (logged).
        reason: String,
    },
    /// A log line.
    Log(String),
    /// Reserve the next epoch number durably; answer with
    /// `engine::Event::EpochReserved` or
    /// `engine::Event::EpochUnavailable`.
    ReserveEpoch {
        /// Last committed epoch; the new number is above it and above any reserved one.
        last_committed: Option<u64>,
    },
    /// Write the epoch's global manifest atomically; answer with
    /// `engine::Event::CommitWritten` or `engine::Event::CommitFailed`.
    /// Nobody is told COMMIT before that answer.
    Commit {
        /// Epoch.
        epoch: u64,
        /// Every node's part, sorted by node name.
        nodes: Vec<NodeManifest>,
    },
    /// Record an aborted epoch for the operator (best effort, no answer).
    RecordAbort {
        /// Epoch.
        epoch: u64,
        /// Phase that was running.
        phase: Phase,
        /// Node held responsible.
        node: String,
        /// Why.
        reason: String,
    },
}

/// The engine's view of the coordinator for a status answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// Nodes registered.
    pub(crate) registered: u32,
    /// Nodes expected.
    pub(crate) expect: u32,
    /// Last committed epoch.
    pub(crate) last_committed: Option<u64>,
    /// Running round.
    pub(crate) running: Option<RunningPhase>,
}

/// The epoch and phase of a running round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunningPhase {
    /// Epoch.
    pub(crate) epoch: u64,
    /// Phase.
    pub(crate) phase: Phase,
}
