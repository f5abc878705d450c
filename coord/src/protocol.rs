//! The coordinator wire protocol: framing, message numbers and the typed messages.
//!
//! Every message is one frame: a fixed 12-byte header followed by a postcard-encoded
//! payload.
//!
//! ```text
//! offset  size  field
//!      0     4  magic  b"CKCO"
//!      4     2  version (little endian), within VERSION_MIN..=VERSION_MAX
//!      6     2  message number (MsgType, little endian)
//!      8     4  payload length (little endian), at most MAX_PAYLOAD_LEN
//!     12     n  payload (postcard)
//! ```
//!
//! The length is checked against [`MAX_PAYLOAD_LEN`] before anything is allocated, and
//! decoding never panics: any malformed frame is a [`ProtocolError`], and the peer that
//! sent it loses its connection and nothing else.
//!
//! The same messages are used at every level of the tree: a sub-coordinator talks to its
//! parent exactly like an agent does, except that its `Arrive` messages count many nodes.
//!
//! ```text
//!  agent / sub-coordinator                     coordinator
//!        |  Hello{versions, job, node, nonce_c}   |
//!        |--------------------------------------->|
//!        |  Challenge{version, nonce_s, proof_s}  |   proof_s = MAC(secret, server, nonce_c, nonce_s)
//!        |<---------------------------------------|
//!        |  Auth{proof_c}                          |   proof_c = MAC(secret, client, nonce_s, nonce_c)
//!        |--------------------------------------->|
//!        |  Welcome{last_committed} | Refused     |
//!        |<---------------------------------------|
//!        |  Arrive{phase: Register}  (sub-coords)  |
//!        |--------------------------------------->|   ... all N nodes registered + a trigger
//!        |  PhaseCmd{E, Freeze}                    |
//!        |<---------------------------------------|
//!        |  Arrive{E, Freeze} | Fail{E, Freeze}   |   (+ Arrive{E, Drain} in the same write
//!        |--------------------------------------->|    from a node with nothing to drain)
//!        |  PhaseCmd{E, Drain} ... Dump ...        |   (Drain and Dump in one write once
//!        |<======================================>|    every node acknowledged Drain ahead)
//!        |  PhaseCmd{E, Commit}  (no reply: the coordinator has durably committed E)
//!        |  PhaseCmd{E, Resume | Kill}             |
//!        |<---------------------------------------|
//!        |  Arrive{E, Resume | Kill}               |
//!        |--------------------------------------->|
//!        |           Abort{E, node, reason} at any point before Commit
//!        |<---------------------------------------|
//! ```
//!
//! A restart round is the same with the phases Restore, Publish (Put messages), Subscribe
//! (Get → Values) and Resume. Control clients (`ckpt coord trigger`) send `Trigger` or
//! `StatusQuery` after the handshake and receive `RoundOver` or `Status`.

use serde::{Deserialize, Serialize};

/// First four bytes of every frame; rejects stray connections early.
pub const MAGIC: [u8; 4] = *b"CKCO";
/// Oldest protocol version this build speaks. Version 2 added arrivals ahead of the
/// phase ([`Phase::may_arrive_ahead`]): a version 1 coordinator would drop them and wait
/// for an arrival that never comes. Version 3 added background checkpoints
/// ([`RoundKind::BackgroundCheckpoint`], [`Phase::Capture`],
/// [`Intent::BackgroundCheckpoint`]): a version 2 peer cannot decode a phase command of
/// such a round and would drop out of it mid-round, so the versions do not mix.
pub const VERSION_MIN: u16 = 3;
/// Newest protocol version this build speaks.
pub const VERSION_MAX: u16 = 3;
/// Size of the fixed frame header.
pub const HEADER_LEN: usize = 12;
/// Largest accepted payload. Aggregated key/value batches from a sub-coordinator are the
/// biggest messages; 16 MiB leaves room for them while bounding what one peer can make the
/// coordinator allocate.
pub const MAX_PAYLOAD_LEN: u32 = 16 << 20;
/// Length of the nonces and MACs in the handshake.
pub const NONCE_LEN: usize = 32;

/// Errors decoding a frame. Each one closes the connection that sent it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtocolError {
    /// The frame does not start with [`MAGIC`].
    #[error("bad magic {0:02x?}, not a ckpt-coord peer")]
    BadMagic([u8; 4]),
    /// The frame's version is outside the supported range.
    #[error("unsupported protocol version {got} (supported {VERSION_MIN}..={VERSION_MAX})")]
    UnsupportedVersion {
        /// Version found in the header.
        got: u16,
    },
    /// Unknown message number.
    #[error("unknown message number {0}")]
    UnknownMessage(u16),
    /// Declared payload length is above [`MAX_PAYLOAD_LEN`].
    #[error("message {msg} declares {len} bytes, above the {MAX_PAYLOAD_LEN}-byte limit")]
    TooLarge {
        /// Message number.
        msg: u16,
        /// Declared length.
        len: u32,
    },
    /// The payload does not decode as the message its header announces.
    #[error("malformed payload for message {msg}: {reason}")]
    Malformed {
        /// Message number.
        msg: u16,
        /// What postcard reported.
        reason: String,
    },
    /// Encoding failed (only possible for messages above the size limit).
    #[error("cannot encode message {msg}: {reason}")]
    Encode {
        /// Message number.
        msg: u16,
        /// Why.
        reason: String,
    },
}

/// Message numbers. Explicit and never reused: a removed message keeps its number reserved.
#[repr(u16)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgType {
    /// Client → coordinator: first message.
    Hello = 1,
    /// Coordinator → client: nonce and server proof.
    Challenge = 2,
    /// Client → coordinator: client proof.
    Auth = 3,
    /// Coordinator → client: accepted.
    Welcome = 4,
    /// Coordinator → client: refused, connection closes.
    Refused = 5,
    /// Downstream → upstream: nodes reached the end of a phase.
    Arrive = 16,
    /// Downstream → upstream: a node failed a phase.
    Fail = 17,
    /// Downstream → upstream: key/value pairs published.
    Put = 18,
    /// Downstream → upstream: keys wanted.
    Get = 19,
    /// Control → coordinator: start a round.
    Trigger = 20,
    /// Downstream → upstream: nodes left while no round was running.
    Leave = 21,
    /// Control → coordinator: ask for the state.
    StatusQuery = 22,
    /// Upstream → downstream: enter a phase.
    PhaseCmd = 32,
    /// Upstream → downstream: the round is aborted.
    Abort = 33,
    /// Upstream → downstream: values (or timeouts) for requested keys.
    Values = 34,
    /// Coordinator → control: a round ended.
    RoundOver = 35,
    /// Coordinator → control: state snapshot.
    Status = 36,
}

impl MsgType {
    /// Maps a wire number back to a message type.
    pub fn from_u16(n: u16) -> Option<MsgType> {
        use MsgType::*;
        Some(match n {
            1 => Hello,
            2 => Challenge,
            3 => Auth,
            4 => Welcome,
            5 => Refused,
            16 => Arrive,
            17 => Fail,
            18 => Put,
            19 => Get,
            20 => Trigger,
            21 => Leave,
            22 => StatusQuery,
            32 => PhaseCmd,
            33 => Abort,
            34 => Values,
            35 => RoundOver,
            36 => Status,
            _ => return None,
        })
    }
}

/// What kind of peer is connecting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// One node's checkpoint agent (the dumper or restorer).
    Agent,
    /// A node-level sub-coordinator relaying for its own agents.
    SubCoordinator,
    /// An operator tool that triggers rounds or asks for status.
    Control,
}

/// What an agent came for; a round starts by itself once every node asks for the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Intent {
    /// Wait for a `Trigger` from a control client.
    Standby,
    /// Checkpoint as soon as every node is here, then resume (`ckpt dump --coord`).
    Checkpoint,
    /// Restart as soon as every node is here (`ckpt restore --coord`).
    Restart,
    /// Checkpoint in the background as soon as every node is here, then resume
    /// (`ckpt dump --coord --background`). Registered only by version 3 peers.
    BackgroundCheckpoint,
}

/// The phases of a round, in protocol order.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Phase {
    /// Every node is connected and authenticated.
    Register = 0,
    /// Every node has frozen its local process tree.
    Freeze = 1,
    /// Interconnect state drained (empty for now; its place in the protocol is fixed).
    Drain = 2,
    /// Every node has written and fsynced its images. In a background round, the
    /// command is also the signal to thaw: every node captured its frozen state.
    Dump = 3,
    /// The coordinator has durably committed the epoch; agents do not reply.
    Commit = 4,
    /// Let the processes run again.
    Resume = 5,
    /// Kill the checkpointed processes (checkpoint-and-stop).
    Kill = 6,
    /// Restart: every node restored its part and holds it frozen.
    Restore = 7,
    /// Restart: every node published its key/value pairs.
    Publish = 8,
    /// Restart: every node fetched what it needs.
    Subscribe = 9,
    /// Background checkpoint: every node captured what must be taken frozen (registers,
    /// files, the pages it does not write-protect) and armed write protection on the
    /// rest; its tree is still frozen. The barrier that lets all nodes thaw together.
    Capture = 10,
}

impl Phase {
    /// True for a phase a node may acknowledge ahead, together with the phase before it,
    /// because it has nothing to do in it: DRAIN, for a node without interconnect state.
    /// The coordinator holds such an arrival until the phase starts. No other phase
    /// qualifies: DUMP reports images, and RESUME or KILL must wait for COMMIT.
    pub fn may_arrive_ahead(self) -> bool {
        self == Phase::Drain
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Phase::Register => "REGISTER",
            Phase::Freeze => "FREEZE",
            Phase::Drain => "DRAIN",
            Phase::Dump => "DUMP",
            Phase::Commit => "COMMIT",
            Phase::Resume => "RESUME",
            Phase::Kill => "KILL",
            Phase::Restore => "RESTORE",
            Phase::Publish => "PUBLISH",
            Phase::Subscribe => "SUBSCRIBE",
            Phase::Capture => "CAPTURE",
        };
        f.write_str(s)
    }
}

/// What the processes do once a checkpoint is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AfterCommit {
    /// Keep running.
    Resume,
    /// Stop for good (preemption, migration).
    Kill,
}

/// The two kinds of rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RoundKind {
    /// FREEZE → DRAIN → DUMP → COMMIT → RESUME | KILL.
    Checkpoint {
        /// Final phase after the commit.
        then: AfterCommit,
    },
    /// RESTORE → PUBLISH → SUBSCRIBE → RESUME.
    Restart,
    /// FREEZE → DRAIN → CAPTURE → DUMP → COMMIT → RESUME: every node is frozen only
    /// until every node has captured its frozen state (CAPTURE), then all thaw together
    /// and write their pages while the job runs (DUMP). No KILL: a job that is to stop
    /// has no use for running on while its pages are written.
    BackgroundCheckpoint,
}

impl RoundKind {
    /// True for the rounds that checkpoint (and end in a commit).
    pub fn is_checkpoint(self) -> bool {
        !matches!(self, RoundKind::Restart)
    }

    /// The phases agents are told to enter, in order.
    pub fn phases(self) -> &'static [Phase] {
        match self {
            RoundKind::Checkpoint {
                then: AfterCommit::Resume,
            } => &[
                Phase::Freeze,
                Phase::Drain,
                Phase::Dump,
                Phase::Commit,
                Phase::Resume,
            ],
            RoundKind::Checkpoint {
                then: AfterCommit::Kill,
            } => &[
                Phase::Freeze,
                Phase::Drain,
                Phase::Dump,
                Phase::Commit,
                Phase::Kill,
            ],
            RoundKind::BackgroundCheckpoint => &[
                Phase::Freeze,
                Phase::Drain,
                Phase::Capture,
                Phase::Dump,
                Phase::Commit,
                Phase::Resume,
            ],
            RoundKind::Restart => &[
                Phase::Restore,
                Phase::Publish,
                Phase::Subscribe,
                Phase::Resume,
            ],
        }
    }
}

/// Per-node result carried with an arrival; only phases with something to say use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PhaseInfo {
    /// Nothing to report.
    None,
    /// Registration: what the node came for.
    Register {
        /// The node's intent.
        intent: Intent,
    },
    /// DUMP done: where the images are and the checksum of the node's own manifest.
    Dump {
        /// Image directory on that node.
        image_dir: String,
        /// crc32c of the node's image manifest.
        manifest_crc32c: u32,
    },
}

/// One node's arrival at the end of a phase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    /// Node name (unique within the job).
    pub node: String,
    /// Phase-specific result.
    pub info: PhaseInfo,
}

/// Client → coordinator: first message of a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Oldest version the client speaks.
    pub min_version: u16,
    /// Newest version the client speaks.
    pub max_version: u16,
    /// Job id; a coordinator serves exactly one job.
    pub job: String,
    /// Node name of an agent, or the sub-coordinator's / control client's name.
    pub node: String,
    /// Kind of peer.
    pub role: Role,
    /// Agents only: what the node came for.
    pub intent: Intent,
    /// Sub-coordinators only: how many agents they stand for.
    pub expect: u32,
    /// Client nonce for the mutual challenge-response.
    pub client_nonce: [u8; NONCE_LEN],
}

/// Coordinator → client: its nonce and its proof of knowing the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    /// Version chosen for the rest of the connection.
    pub version: u16,
    /// Server nonce.
    pub server_nonce: [u8; NONCE_LEN],
    /// MAC proving the coordinator holds the job secret.
    pub server_proof: [u8; NONCE_LEN],
}

/// Client → coordinator: its proof of knowing the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auth {
    /// MAC over both nonces and the client's identity.
    pub proof: [u8; NONCE_LEN],
}

/// Coordinator → client: authenticated and registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// Last committed epoch the coordinator knows of.
    pub last_committed: Option<u64>,
}

/// Coordinator → client: connection refused; it closes right after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    /// Why (deliberately vague for authentication failures).
    pub reason: String,
}

/// Downstream → upstream: `count` nodes finished `phase` of `epoch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Arrive {
    /// Epoch (0 for registration).
    pub epoch: u64,
    /// Phase finished.
    pub phase: Phase,
    /// Number of nodes this arrival stands for.
    pub count: u32,
    /// Reports of the nodes that have something to say (all of them for Register and Dump).
    pub reports: Vec<NodeReport>,
}

/// Downstream → upstream: a node failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fail {
    /// Epoch of the round.
    pub epoch: u64,
    /// Phase that failed.
    pub phase: Phase,
    /// Failing node.
    pub node: String,
    /// Why.
    pub reason: String,
}

/// Downstream → upstream: nodes disconnected while no round was running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leave {
    /// Nodes that left.
    pub nodes: Vec<String>,
}

/// Downstream → upstream: published pairs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Put {
    /// Key/value pairs.
    pub entries: Vec<(String, Vec<u8>)>,
}

/// Downstream → upstream: wanted keys; answered once each key exists or after the timeout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Get {
    /// Keys.
    pub keys: Vec<String>,
    /// How long the coordinator holds the request.
    pub timeout_ms: u32,
}

/// Upstream → downstream: answers to `Get`; `None` means the key did not appear in time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Values {
    /// Key, value-or-timeout.
    pub entries: Vec<(String, Option<Vec<u8>>)>,
}

/// Control → coordinator: start a round as soon as every node is registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trigger {
    /// Which round.
    pub kind: RoundKind,
}

/// Upstream → downstream: enter `phase` of `epoch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseCmd {
    /// Epoch of the round.
    pub epoch: u64,
    /// Phase to enter.
    pub phase: Phase,
    /// Kind of round.
    pub kind: RoundKind,
    /// How long nodes have to report.
    pub deadline_ms: u32,
    /// Last committed epoch when the command was sent: the epoch a restart restores, and
    /// during a checkpoint the one that stays valid if this round aborts.
    pub last_committed: Option<u64>,
}

/// Upstream → downstream: the round is aborted; thaw and discard the epoch's images.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Abort {
    /// Aborted epoch.
    pub epoch: u64,
    /// Phase that was running.
    pub phase: Phase,
    /// Node held responsible.
    pub node: String,
    /// Why.
    pub reason: String,
}

/// How a round ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Checkpoint committed and every node resumed or was killed.
    Committed,
    /// Committed, but a node failed after the commit (its processes may need attention).
    CommittedWithErrors {
        /// Node.
        node: String,
        /// Why.
        reason: String,
    },
    /// Restart completed.
    Restarted,
    /// Aborted: the previous committed epoch stays valid.
    Aborted {
        /// Phase that was running.
        phase: Phase,
        /// Node held responsible.
        node: String,
        /// Why.
        reason: String,
    },
}

/// Coordinator → control: a round ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundOver {
    /// Epoch of the round.
    pub epoch: u64,
    /// Kind of round.
    pub kind: RoundKind,
    /// Result.
    pub outcome: Outcome,
}

/// Control → coordinator: ask for a [`Status`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusQuery {}

/// Coordinator → control: current state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// Nodes registered.
    pub registered: u32,
    /// Nodes expected.
    pub expect: u32,
    /// Last committed epoch.
    pub last_committed: Option<u64>,
    /// Running round: epoch and phase.
    pub running: Option<(u64, Phase)>,
    /// Bytes received since start (all connections).
    pub bytes_in: u64,
    /// Bytes sent since start.
    pub bytes_out: u64,
    /// Connections refused (authentication, job, protocol errors).
    pub refused: u64,
}

/// Any protocol message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// See [`Hello`].
    Hello(Hello),
    /// See [`Challenge`].
    Challenge(Challenge),
    /// See [`Auth`].
    Auth(Auth),
    /// See [`Welcome`].
    Welcome(Welcome),
    /// See [`Refused`].
    Refused(Refused),
    /// See [`Arrive`].
    Arrive(Arrive),
    /// See [`Fail`].
    Fail(Fail),
    /// See [`Put`].
    Put(Put),
    /// See [`Get`].
    Get(Get),
    /// See [`Trigger`].
    Trigger(Trigger),
    /// See [`Leave`].
    Leave(Leave),
    /// See [`StatusQuery`].
    StatusQuery(StatusQuery),
    /// See [`PhaseCmd`].
    PhaseCmd(PhaseCmd),
    /// See [`Abort`].
    Abort(Abort),
    /// See [`Values`].
    Values(Values),
    /// See [`RoundOver`].
    RoundOver(RoundOver),
    /// See [`Status`].
    Status(Status),
}

impl Message {
    /// The message number of this message.
    pub fn msg_type(&self) -> MsgType {
        match self {
            Message::Hello(_) => MsgType::Hello,
            Message::Challenge(_) => MsgType::Challenge,
            Message::Auth(_) => MsgType::Auth,
            Message::Welcome(_) => MsgType::Welcome,
            Message::Refused(_) => MsgType::Refused,
            Message::Arrive(_) => MsgType::Arrive,
            Message::Fail(_) => MsgType::Fail,
            Message::Put(_) => MsgType::Put,
            Message::Get(_) => MsgType::Get,
            Message::Trigger(_) => MsgType::Trigger,
            Message::Leave(_) => MsgType::Leave,
            Message::StatusQuery(_) => MsgType::StatusQuery,
            Message::PhaseCmd(_) => MsgType::PhaseCmd,
            Message::Abort(_) => MsgType::Abort,
            Message::Values(_) => MsgType::Values,
            Message::RoundOver(_) => MsgType::RoundOver,
            Message::Status(_) => MsgType::Status,
        }
    }

    /// Appends the framed message to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        let msg = self.msg_type() as u16;
        let start = out.len();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION_MAX.to_le_bytes());
        out.extend_from_slice(&msg.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        let res = match self {
            Message::Hello(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::Challenge(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::Auth(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::Welcome(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::Refused(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::Arrive(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::Fail(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::Put(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::Get(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::Trigger(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::Leave(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::StatusQuery(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::PhaseCmd(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::Abort(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::Values(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::RoundOver(m) => postcard::to_io(m, &mut *out).map(drop),
            Message::Status(m) => postcard::to_io(m, &mut *out).map(drop),
        };
        if let Err(e) = res {
            out.truncate(start);
            return Err(ProtocolError::Encode {
                msg,
                reason: e.to_string(),
            });
        }
        let len = out.len() - start - HEADER_LEN;
        if len > MAX_PAYLOAD_LEN as usize {
            out.truncate(start);
            return Err(ProtocolError::Encode {
                msg,
                reason: format!("{len} bytes exceed the limit"),
            });
        }
        out[start + 8..start + 12].copy_from_slice(&(len as u32).to_le_bytes());
        Ok(())
    }

    /// Encodes the message as one frame.
    pub fn encode(&self) -> Result<Vec<u8>, ProtocolError> {
        let mut v = Vec::with_capacity(64);
        self.encode_into(&mut v)?;
        Ok(v)
    }

    /// Decodes a payload whose header has already been checked.
    pub fn decode_payload(msg: MsgType, payload: &[u8]) -> Result<Message, ProtocolError> {
        fn de<'a, T: Deserialize<'a>>(msg: MsgType, p: &'a [u8]) -> Result<T, ProtocolError> {
            let (v, rest) =
                postcard::take_from_bytes::<T>(p).map_err(|e| ProtocolError::Malformed {
                    msg: msg as u16,
                    reason: e.to_string(),
                })?;
            if !rest.is_empty() {
                return Err(ProtocolError::Malformed {
                    msg: msg as u16,
                    reason: format!("{} trailing bytes", rest.len()),
                });
            }
            Ok(v)
        }
        Ok(match msg {
            MsgType::Hello => Message::Hello(de(msg, payload)?),
            MsgType::Challenge => Message::Challenge(de(msg, payload)?),
            MsgType::Auth => Message::Auth(de(msg, payload)?),
            MsgType::Welcome => Message::Welcome(de(msg, payload)?),
            MsgType::Refused => Message::Refused(de(msg, payload)?),
            MsgType::Arrive => Message::Arrive(de(msg, payload)?),
            MsgType::Fail => Message::Fail(de(msg, payload)?),
            MsgType::Put => Message::Put(de(msg, payload)?),
            MsgType::Get => Message::Get(de(msg, payload)?),
            MsgType::Trigger => Message::Trigger(de(msg, payload)?),
            MsgType::Leave => Message::Leave(de(msg, payload)?),
            MsgType::StatusQuery => Message::StatusQuery(de(msg, payload)?),
            MsgType::PhaseCmd => Message::PhaseCmd(de(msg, payload)?),
            MsgType::Abort => Message::Abort(de(msg, payload)?),
            MsgType::Values => Message::Values(de(msg, payload)?),
            MsgType::RoundOver => Message::RoundOver(de(msg, payload)?),
            MsgType::Status => Message::Status(de(msg, payload)?),
        })
    }
}

/// A checked frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Protocol version of the frame.
    pub version: u16,
    /// Message type.
    pub msg: MsgType,
    /// Payload length, already checked against [`MAX_PAYLOAD_LEN`].
    pub len: u32,
}

/// Checks a header. Done before reading (let alone allocating) the payload.
pub fn decode_header(h: &[u8; HEADER_LEN]) -> Result<Header, ProtocolError> {
    let magic = [h[0], h[1], h[2], h[3]];
    if magic != MAGIC {
        return Err(ProtocolError::BadMagic(magic));
    }
    let version = u16::from_le_bytes([h[4], h[5]]);
    if !(VERSION_MIN..=VERSION_MAX).contains(&version) {
        return Err(ProtocolError::UnsupportedVersion { got: version });
    }
    let n = u16::from_le_bytes([h[6], h[7]]);
    let msg = MsgType::from_u16(n).ok_or(ProtocolError::UnknownMessage(n))?;
    let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if len > MAX_PAYLOAD_LEN {
        return Err(ProtocolError::TooLarge { msg: n, len });
    }
    Ok(Header { version, msg, len })
}

/// Reassembles frames from a byte stream delivered in arbitrary pieces.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    pos: usize,
}

impl FrameReader {
    /// An empty reader.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered but not yet decoded.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Next complete message, `Ok(None)` if more bytes are needed.
    ///
    /// The header is validated as soon as its 12 bytes are in, so an oversized or
    /// garbage frame is rejected without waiting for (or buffering) its payload.
    pub fn next_message(&mut self) -> Result<Option<Message>, ProtocolError> {
        let avail = &self.buf[self.pos..];
        if avail.len() < HEADER_LEN {
            self.compact();
            return Ok(None);
        }
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&avail[..HEADER_LEN]);
        let header = decode_header(&h)?;
        let total = HEADER_LEN + header.len as usize;
        if avail.len() < total {
            self.compact();
            return Ok(None);
        }
        let msg = Message::decode_payload(header.msg, &avail[HEADER_LEN..total])?;
        self.pos += total;
        Ok(Some(msg))
    }

    fn compact(&mut self) {
        // Keep memory bounded when a stream delivers many small pieces.
        if self.pos > 0 && self.pos * 2 >= self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
    }
}

/// Decodes exactly one frame from `bytes` (header and payload, nothing more).
pub fn decode_frame(bytes: &[u8]) -> Result<Message, ProtocolError> {
    if bytes.len() < HEADER_LEN {
        return Err(ProtocolError::Malformed {
            msg: 0,
            reason: format!("{} bytes, shorter than a header", bytes.len()),
        });
    }
    let mut h = [0u8; HEADER_LEN];
    h.copy_from_slice(&bytes[..HEADER_LEN]);
    let header = decode_header(&h)?;
    let payload = &bytes[HEADER_LEN..];
    if payload.len() != header.len as usize {
        return Err(ProtocolError::Malformed {
            msg: header.msg as u16,
            reason: format!(
                "header says {} payload bytes, frame has {}",
                header.len,
                payload.len()
            ),
        });
    }
    Message::decode_payload(header.msg, payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Message> {
        vec![
            Message::Hello(Hello {
                min_version: 1,
                max_version: 1,
                job: "job".into(),
                node: "n0".into(),
                role: Role::Agent,
                intent: Intent::Checkpoint,
                expect: 1,
                client_nonce: [7; NONCE_LEN],
            }),
            Message::Challenge(Challenge {
                version: 1,
                server_nonce: [1; NONCE_LEN],
                server_proof: [2; NONCE_LEN],
            }),
            Message::Auth(Auth {
                proof: [3; NONCE_LEN],
            }),
            Message::Welcome(Welcome {
                last_committed: Some(4),
            }),
            Message::Refused(Refused { reason: "x".into() }),
            Message::Arrive(Arrive {
                epoch: 3,
                phase: Phase::Dump,
                count: 2,
                reports: vec![NodeReport {
                    node: "n1".into(),
                    info: PhaseInfo::Dump {
                        image_dir: "/img".into(),
                        manifest_crc32c: 9,
                    },
                }],
            }),
            Message::Fail(Fail {
                epoch: 3,
                phase: Phase::Freeze,
                node: "n2".into(),
                reason: "r".into(),
            }),
            Message::Put(Put {
                entries: vec![("k".into(), vec![1, 2])],
            }),
            Message::Get(Get {
                keys: vec!["k".into()],
                timeout_ms: 5,
            }),
            Message::Trigger(Trigger {
                kind: RoundKind::Restart,
            }),
            Message::Leave(Leave {
                nodes: vec!["a".into()],
            }),
            Message::StatusQuery(StatusQuery {}),
            Message::PhaseCmd(PhaseCmd {
                epoch: 1,
                phase: Phase::Freeze,
                kind: RoundKind::Checkpoint {
                    then: AfterCommit::Kill,
                },
                deadline_ms: 10,
                last_committed: Some(0),
            }),
            Message::Abort(Abort {
                epoch: 1,
                phase: Phase::Drain,
                node: "n".into(),
                reason: "why".into(),
            }),
            Message::Values(Values {
                entries: vec![("k".into(), None), ("j".into(), Some(vec![0]))],
            }),
            Message::RoundOver(RoundOver {
                epoch: 2,
                kind: RoundKind::Restart,
                outcome: Outcome::Aborted {
                    phase: Phase::Publish,
                    node: "n".into(),
                    reason: "r".into(),
                },
            }),
            Message::Status(Status {
                registered: 1,
                expect: 2,
                last_committed: None,
                running: Some((1, Phase::Dump)),
                bytes_in: 1,
                bytes_out: 2,
                refused: 0,
            }),
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for m in samples() {
            let bytes = m.encode().unwrap();
            assert_eq!(decode_frame(&bytes).unwrap(), m);
            let mut r = FrameReader::new();
            for b in &bytes {
                r.push(std::slice::from_ref(b));
            }
            assert_eq!(r.next_message().unwrap(), Some(m));
            assert_eq!(r.next_message().unwrap(), None);
        }
    }

    #[test]
    fn oversized_header_rejected_before_payload() {
        let mut h = Vec::new();
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&VERSION_MAX.to_le_bytes());
        h.extend_from_slice(&(MsgType::Put as u16).to_le_bytes());
        h.extend_from_slice(&u32::MAX.to_le_bytes());
        let mut r = FrameReader::new();
        r.push(&h);
        assert!(matches!(
            r.next_message(),
            Err(ProtocolError::TooLarge { .. })
        ));
    }

    #[test]
    fn bad_magic_and_version_rejected() {
        let mut b = Message::StatusQuery(StatusQuery {}).encode().unwrap();
        b[4] = 99;
        assert!(matches!(
            decode_frame(&b),
            Err(ProtocolError::UnsupportedVersion { got: 99 })
        ));
        b[0] = b'X';
        assert!(matches!(decode_frame(&b), Err(ProtocolError::BadMagic(_))));
    }

    /// Small deterministic generator so the fuzz loop needs no extra crate and is reproducible.
    struct XorShift(u64);
    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn decoder_never_panics_on_random_or_mutated_frames() {
        let samples: Vec<Vec<u8>> = samples().iter().map(|m| m.encode().unwrap()).collect();
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for i in 0..200_000u32 {
            let bytes: Vec<u8> = if i % 2 == 0 {
                // Mutated valid frame: flip, insert, truncate; length fixed up half the time
                // so the payload decoder (not just the header check) sees the damage.
                let mut b = samples[(rng.next() as usize) % samples.len()].clone();
                for _ in 0..1 + rng.next() % 4 {
                    let pos = (rng.next() as usize) % b.len();
                    match rng.next() % 3 {
                        0 => b[pos] ^= 1 << (rng.next() % 8),
                        1 => b.insert(pos, rng.next() as u8),
                        _ => b.truncate(pos.max(1)),
                    }
                }
                if rng.next().is_multiple_of(2) && b.len() >= HEADER_LEN {
                    let len = (b.len() - HEADER_LEN) as u32;
                    b[8..12].copy_from_slice(&len.to_le_bytes());
                }
                b
            } else {
                // Random payload behind a valid header of a random known type.
                let types = [
                    1u16, 2, 3, 4, 5, 16, 17, 18, 19, 20, 21, 22, 32, 33, 34, 35, 36,
                ];
                let n = (rng.next() % 64) as usize;
                let mut b = Vec::with_capacity(HEADER_LEN + n);
                b.extend_from_slice(&MAGIC);
                b.extend_from_slice(&VERSION_MAX.to_le_bytes());
                let t = types[(rng.next() as usize) % types.len()];
                b.extend_from_slice(&t.to_le_bytes());
                b.extend_from_slice(&(n as u32).to_le_bytes());
                for _ in 0..n {
                    b.push(rng.next() as u8);
                }
                b
            };
            let _ = decode_frame(&bytes);
            let mut r = FrameReader::new();
            r.push(&bytes);
            while let Ok(Some(_)) = r.next_message() {}
        }
    }
}
