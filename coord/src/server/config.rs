//! A coordinator's settings, and the errors that stop it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::admit::ConnLimits;
use crate::auth::Secret;
use crate::client::ClientError;
use crate::store::StoreError;

/// Test hook: stop dead at a chosen point, as if the coordinator process were killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// After every node reported DUMP done, before the commit record is written.
    CrashAfterDump,
}

/// Coordinator settings.
#[derive(Debug, Clone)]
pub struct CoordConfig {
    /// Listen address (port 0 picks one).
    pub listen: SocketAddr,
    /// Also listen on a Unix stream socket at this path, for agents on this node (see
    /// `docs/coord.md`, "Security": created mode 0600 in a directory only we can write,
    /// removed on exit).
    pub listen_unix: Option<PathBuf>,
    /// Job id served.
    pub job: String,
    /// Name used in logs and, for a sub-coordinator, upstream.
    pub name: String,
    /// Nodes expected (at a sub-coordinator: its local agents).
    pub expect: u32,
    /// Parent coordinator: makes this a sub-coordinator.
    pub parent: Option<String>,
    /// Directory for epoch records (root only).
    pub state_dir: Option<PathBuf>,
    /// Job secret.
    pub secret: Secret,
    /// How long nodes have to finish each phase.
    pub phase_deadline: Duration,
    /// How long a peer has to complete the handshake.
    pub handshake_timeout: Duration,
    /// Caps on unauthenticated connections.
    pub limits: ConnLimits,
    /// Also pass log lines to the `log` facade, at info level (the program's logger
    /// decides where they go; `ckpt` prints them on stderr). They are kept for
    /// [`CoordHandle::log_lines`](super::CoordHandle::log_lines) either way.
    pub emit_log: bool,
    /// Fault injection for tests.
    pub fault: Option<FaultPoint>,
}

impl CoordConfig {
    /// Defaults: 60 s phase deadline, 10 s handshake timeout, [`ConnLimits::default`],
    /// log lines passed to the `log` facade.
    pub fn new(listen: SocketAddr, job: &str, expect: u32, secret: Secret) -> CoordConfig {
        CoordConfig {
            listen,
            listen_unix: None,
            job: job.to_string(),
            name: "coord".to_string(),
            expect,
            parent: None,
            state_dir: None,
            secret,
            phase_deadline: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(10),
            limits: ConnLimits::default(),
            emit_log: true,
            fault: None,
        }
    }
}

/// Errors that stop a coordinator.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Cannot listen.
    #[error("coordinator {name} for job {job}: cannot listen on {addr}: {source}")]
    Bind {
        /// Coordinator name.
        name: String,
        /// Job.
        job: String,
        /// Address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Cannot create or listen on the Unix socket.
    #[error("coordinator {name} for job {job}: cannot listen on unix:{}: {source}", path.display())]
    BindUnix {
        /// Coordinator name.
        name: String,
        /// Job.
        job: String,
        /// Socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The poll loop failed.
    #[error("coordinator {name}: poll: {source}")]
    Poll {
        /// Coordinator name.
        name: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Cannot start the thread that writes the epoch store.
    #[error("coordinator {name}: cannot start the epoch store's writer thread: {source}")]
    StoreWriter {
        /// Coordinator name.
        name: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Cannot open the reserve descriptor (see `docs/coord.md`).
    #[error("coordinator {name}: cannot open a reserve file descriptor: {source}")]
    Reserve {
        /// Coordinator name.
        name: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A root coordinator needs somewhere to commit epochs.
    #[error("coordinator {name} for job {job}: a root coordinator needs a state directory")]
    NoStateDir {
        /// Coordinator name.
        name: String,
        /// Job.
        job: String,
    },
    /// The epoch store failed at startup.
    #[error("coordinator {name}: {source}")]
    Store {
        /// Coordinator name.
        name: String,
        /// Cause.
        #[source]
        source: StoreError,
    },
    /// Cannot reach or authenticate with the parent.
    #[error("sub-coordinator {name}: parent {parent}: {source}")]
    Upstream {
        /// Coordinator name.
        name: String,
        /// Parent address.
        parent: String,
        /// Cause.
        #[source]
        source: Box<ClientError>,
    },
    /// The parent went away; local agents were told to abort.
    #[error("sub-coordinator {name}: lost parent {parent}: {reason}")]
    UpstreamLost {
        /// Coordinator name.
        name: String,
        /// Parent address.
        parent: String,
        /// Why.
        reason: String,
    },
    /// The coordinator thread panicked (a bug).
    #[error("coordinator {name}: thread panicked")]
    Panicked {
        /// Coordinator name.
        name: String,
    },
}
