//! The coordinator's I/O layer: one `mio` poll loop holding every connection of one job.
//!
//! This module only moves bytes: it accepts connections, runs the handshake
//! ([`crate::auth`]), frames messages ([`crate::protocol`]), buffers output per connection
//! (flushed once per poll iteration), keeps the handshake and refusal timers, and talks to
//! the epoch store ([`crate::store`]). Everything a coordinator decides (registration,
//! rounds, barriers, aborts, the key/value exchange, relaying) is the engine's
//! (`engine.rs`, a state machine without I/O): the loop feeds it events with the current
//! time and carries out the actions it returns, answering the store actions (reserve an
//! epoch, commit) with the store's result before anything else. With a parent address the
//! same loop also holds the link to the parent and the engine runs the relay policy
//! (`relay.rs`) instead of the root's (`root.rs`).
//!
//! Besides its TCP listener it may listen on a Unix stream socket (`--listen-unix`, the
//! file made by [`crate::socket_file`]) for agents on its own node; a connection is
//! either kind ([`Stream`]) and is otherwise treated the same, caps and all.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use mio::{Events, Interest, Poll, Registry, Token, Waker};

use crate::action::{Action, Snapshot};
use crate::addr::PeerAddr;
use crate::admit::{Admission, Cap, ConnLimits, Source, Verdict};
use crate::auth::{self, Secret};
use crate::client::{self, AgentOptions, ClientError, Link};
use crate::engine::{Engine, Event};
use crate::kv::ConnId;
use crate::protocol::{
    Challenge, FrameReader, Hello, Intent, Message, Phase, Refused, Role, Status, VERSION_MAX,
    VERSION_MIN,
};
use crate::socket_file::SocketFile;
use crate::state::EngineConfig;
use crate::store::{EpochStore, GlobalManifest, NodeManifest, StoreError};
use crate::sys::{self, ReserveFd};
use crate::throttle::{LogThrottle, Noise};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
/// The link to the parent coordinator.
const UPSTREAM: Token = Token(2);
/// The Unix socket listener (`--listen-unix`).
const UNIX_LISTENER: Token = Token(3);
const FIRST_CONN: usize = 4;
/// Unauthenticated peers may not make us buffer more than this.
const PREAUTH_LIMIT: usize = 4096;
/// Log lines kept in memory for [`CoordHandle::log_lines`].
const LOG_KEEP: usize = 2000;
/// std's backlog of 128 drops SYNs when thousands of agents connect at once; the kernel
/// caps this at net.core.somaxconn.
const LISTEN_BACKLOG: i32 = 4096;
/// Size of the one reusable read buffer.
const READ_BUF_LEN: usize = 64 * 1024;
/// Events taken per poll call.
const EVENTS_CAPACITY: usize = 4096;
/// Longest poll wait: parked gets and timers are checked at least this often.
const MAX_POLL_WAIT: Duration = Duration::from_millis(100);
/// Shortest poll wait, so a deadline just passed does not spin the loop.
const MIN_POLL_WAIT: Duration = Duration::from_millis(1);
/// How long a refused peer has to read the reason before we hang up.
const REFUSE_LINGER: Duration = Duration::from_secs(2);
/// How long a sub-coordinator keeps trying to reach its parent at startup.
const PARENT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// The I/O layer's reason for a peer that hung up cleanly (not worth a log line before
/// authentication).
const CLOSED_BY_PEER: &str = "connection closed";
/// The reason given when the handshake timer runs out.
const HANDSHAKE_TIMED_OUT: &str = "handshake timed out";
/// Connections taken off the listen queue per loop iteration: a flood of connects must
/// not starve the connections already held (a control client's `status`, the handshake
/// timers); the rest are taken in the next iteration, which then does not wait in poll.
const ACCEPT_BATCH: usize = 256;
/// How long the loop leaves the listener alone when it is out of descriptors and cannot
/// shed (the reserve is gone): retrying at once would only spin.
const FD_EXHAUSTED_PAUSE: Duration = Duration::from_millis(50);
/// Each kind of externally caused log line (refusals, timeouts, out of descriptors) is
/// logged at most once per this interval, with a count of the rest.
const NOISE_INTERVAL: Duration = Duration::from_secs(1);
/// Descriptors the process needs besides connections: stdio, the poll instance, the
/// waker, the listener, the reserve, the epoch store's files during a commit, the parent
/// link, and whatever the embedding program holds.
const FD_OVERHEAD: u64 = 64;
/// Authenticated control clients planned for besides the `expect` agents when sizing the
/// unauthenticated cap to the descriptor limit.
const CONTROL_HEADROOM: u64 = 16;
/// The unauthenticated cap is never sized below this by the descriptor limit (with fewer,
/// agents could not get in at all); a limit this tight is logged as a warning.
const MIN_PENDING: usize = 8;

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
    /// Also print log lines on stderr.
    pub log_stderr: bool,
    /// Fault injection for tests.
    pub fault: Option<FaultPoint>,
}

impl CoordConfig {
    /// Defaults: 60 s phase deadline, 10 s handshake timeout, [`ConnLimits::default`],
    /// logs on stderr.
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
            log_stderr: true,
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

enum ConnState {
    Hello,
    Auth {
        hello: Box<Hello>,
        server_nonce: [u8; 32],
    },
    /// Authenticated: its messages go to the engine.
    Ready,
    /// Refused: we wait for the peer to read our reason and hang up.
    Closing,
}

/// One connection's socket: TCP, or a Unix stream socket from a local agent.
type Stream = crate::addr::Stream<TcpStream, UnixStream>;

impl Stream {
    fn shutdown_write(&self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Write),
        }
    }

    /// The socket as mio registers it. A trait object here only: registering is rare,
    /// reads and writes (the hot path) still go through the enum.
    fn socket(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
        }
    }
}

impl mio::event::Source for Stream {
    fn register(
        &mut self,
        registry: &Registry,
        token: Token,
        interests: Interest,
    ) -> std::io::Result<()> {
        self.socket().register(registry, token, interests)
    }

    fn reregister(
        &mut self,
        registry: &Registry,
        token: Token,
        interests: Interest,
    ) -> std::io::Result<()> {
        self.socket().reregister(registry, token, interests)
    }

    fn deregister(&mut self, registry: &Registry) -> std::io::Result<()> {
        self.socket().deregister(registry)
    }
}

/// Which listening socket a connection arrives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListenerKind {
    Tcp,
    Unix,
}

/// How a batch of accepts on one listener ended.
enum AcceptEnd {
    /// Nothing more queued.
    Drained,
    /// The batch is full; more may be queued.
    More,
    /// Out of descriptors or failing: leave the listeners alone for a while.
    Paused,
}

/// The credentials of a Unix peer as its address; `None` if the kernel cannot say (the
/// connection is then dropped).
fn unix_peer(s: &impl AsRawFd) -> Option<PeerAddr> {
    sys::peer_cred(s.as_raw_fd())
        .ok()
        .map(|(pid, uid)| PeerAddr::Unix { pid, uid })
}

struct Conn {
    id: ConnId,
    stream: Stream,
    addr: PeerAddr,
    reader: FrameReader,
    out: Vec<u8>,
    out_pos: usize,
    dirty: bool,
    /// Registered for writability too: a write found the socket full. Only then, since a
    /// Unix socket signals "writable" each time the peer reads (a wake-up per message
    /// for nothing; TCP only signals after a full buffer).
    write_armed: bool,
    state: ConnState,
}

impl Conn {
    fn new(id: ConnId, stream: Stream, addr: PeerAddr, reader: FrameReader) -> Conn {
        Conn {
            id,
            stream,
            addr,
            reader,
            out: Vec::new(),
            out_pos: 0,
            dirty: false,
            write_armed: false,
            state: ConnState::Hello,
        }
    }
}

/// Bytes moved and peers refused, for status answers.
#[derive(Debug, Default)]
struct Traffic {
    bytes_in: u64,
    bytes_out: u64,
    refused: u64,
}

/// What [`Server::make_room`] managed when out of descriptors.
enum Room {
    /// A descriptor was freed or a queued connection shed: accept again.
    Made,
    /// Nothing is queued any more.
    QueueEmpty,
    /// Neither: leave the listener alone for [`FD_EXHAUSTED_PAUSE`].
    Stuck,
}

/// A connection to act on once `at` has passed.
#[derive(Debug, Clone, Copy)]
struct Timer {
    at: Instant,
    conn: ConnId,
}

type LogBuf = Arc<Mutex<VecDeque<String>>>;

struct Server {
    cfg: CoordConfig,
    poll: Poll,
    listener: TcpListener,
    /// The Unix socket listener and its file (removed when the server is dropped).
    unix: Option<(UnixListener, SocketFile)>,
    stop: Arc<AtomicBool>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    serial: u64,
    dirty: Vec<usize>,
    upstream: Option<Conn>,
    engine: Engine,
    store: Option<EpochStore>,
    traffic: Traffic,
    /// Unauthenticated connections, oldest first: caps and handshake timeouts.
    admission: Admission,
    /// Why the caps are what they are, for the startup line.
    caps_note: String,
    throttle: LogThrottle,
    reserve: ReserveFd,
    /// Counts calls of `accept_batch`; connections of one batch never evict each other.
    accept_batch: u64,
    /// The listener may hold more connections than the last batch took.
    accept_more: bool,
    /// Out of descriptors: leave the listener alone until then.
    accept_paused_until: Option<Instant>,
    closing: VecDeque<Timer>,
    logs: LogBuf,
    crashed: bool,
    fatal: Option<ServerError>,
    started: Instant,
    read_buf: Vec<u8>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(LISTEN_BACKLOG)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// Sizes the caps on unauthenticated connections: the configured ones, with the total
/// lowered so that it, `expect` authenticated peers, some control clients and the
/// process's own descriptors fit under the descriptor limit (authenticated peers must
/// never be the ones left without a descriptor). Returns the caps and a line saying why.
fn admission_for(cfg: &CoordConfig) -> (Admission, String) {
    let l = cfg.limits;
    let (limit, origin) = match l.fd_limit {
        Some(n) => (Some(n), "configured"),
        None => (sys::nofile_soft_limit().ok().flatten(), "RLIMIT_NOFILE"),
    };
    let room =
        limit.map(|n| n.saturating_sub(FD_OVERHEAD + u64::from(cfg.expect) + CONTROL_HEADROOM));
    let total = match room {
        Some(r) => l
            .max_pending
            .min(usize::try_from(r).unwrap_or(usize::MAX).max(MIN_PENDING)),
        None => l.max_pending,
    };
    let admission = Admission::new(l.max_pending_per_source, total);
    let (per_source, total) = admission.caps();
    let mut note =
        format!("unauthenticated connections capped at {per_source} per source, {total} in total");
    if let Some(n) = limit {
        note.push_str(&format!(" (descriptor limit {n}, {origin})"));
    }
    if room.is_some_and(|r| r < MIN_PENDING as u64) {
        note.push_str(&format!(
            "; WARNING: the descriptor limit is too low for {} nodes, raise it (ulimit -n)",
            cfg.expect
        ));
    }
    (admission, note)
}

/// A coordinator running on its own thread.
#[derive(Debug)]
pub struct CoordHandle {
    addr: SocketAddr,
    name: String,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    logs: LogBuf,
    thread: Option<JoinHandle<Result<(), ServerError>>>,
}

impl CoordHandle {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Log lines so far (the most recent ones).
    pub fn log_lines(&self) -> Vec<String> {
        self.logs
            .lock()
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// True once the loop has exited (error, fault point or kill).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// A handle that stops the loop from another thread (a signal handler thread), as
    /// [`CoordHandle::kill`] does; [`CoordHandle::join`] then returns.
    pub fn stopper(&self) -> Stopper {
        Stopper {
            stop: self.stop.clone(),
            waker: self.waker.clone(),
        }
    }

    /// Stops the loop at once, dropping every socket without a word to anyone, as a
    /// killed process would.
    pub fn kill(mut self) -> Result<(), ServerError> {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        self.join_inner()
    }

    /// Waits for the loop to exit by itself.
    pub fn join(mut self) -> Result<(), ServerError> {
        self.join_inner()
    }

    fn join_inner(&mut self) -> Result<(), ServerError> {
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(ServerError::Panicked {
                    name: self.name.clone(),
                })
            }),
            None => Ok(()),
        }
    }
}

impl Drop for CoordHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        let _ = self.join_inner();
    }
}

/// Stops a coordinator's loop from another thread (see [`CoordHandle::stopper`]).
#[derive(Debug, Clone)]
pub struct Stopper {
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
}

impl Stopper {
    /// Makes the loop return at its next iteration; its sockets and its Unix socket file
    /// go with it.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
    }
}

/// Binds and starts a coordinator on a new thread.
pub fn spawn(cfg: CoordConfig) -> Result<CoordHandle, ServerError> {
    let server = Server::new(cfg)?;
    let addr = server
        .listener
        .local_addr()
        .map_err(|source| ServerError::Bind {
            name: server.cfg.name.clone(),
            job: server.cfg.job.clone(),
            addr: server.cfg.listen,
            source,
        })?;
    let waker = Arc::new(Waker::new(server.poll.registry(), WAKER).map_err(|source| {
        ServerError::Poll {
            name: server.cfg.name.clone(),
            source,
        }
    })?);
    let stop = server.stop.clone();
    let logs = server.logs.clone();
    let name = server.cfg.name.clone();
    let thread = std::thread::Builder::new()
        .name(format!("coord-{name}"))
        .spawn(move || server.run())
        .map_err(|source| ServerError::Poll {
            name: name.clone(),
            source,
        })?;
    Ok(CoordHandle {
        addr,
        name,
        stop,
        waker,
        logs,
        thread: Some(thread),
    })
}

/// Runs a coordinator on the calling thread until it fails.
pub fn run(cfg: CoordConfig) -> Result<(), ServerError> {
    Server::new(cfg)?.run()
}

impl Server {
    fn new(cfg: CoordConfig) -> Result<Server, ServerError> {
        let name = cfg.name.clone();
        let poll_err = |source| ServerError::Poll {
            name: name.clone(),
            source,
        };
        let std_listener = bind(cfg.listen).map_err(|source| ServerError::Bind {
            name: cfg.name.clone(),
            job: cfg.job.clone(),
            addr: cfg.listen,
            source,
        })?;
        let mut listener = TcpListener::from_std(std_listener);
        let poll = Poll::new().map_err(poll_err)?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(poll_err)?;
        let unix = match &cfg.listen_unix {
            Some(path) => {
                let (l, file) = SocketFile::bind(path, LISTEN_BACKLOG).map_err(|source| {
                    ServerError::BindUnix {
                        name: cfg.name.clone(),
                        job: cfg.job.clone(),
                        path: path.clone(),
                        source,
                    }
                })?;
                let mut l = UnixListener::from_std(l);
                poll.registry()
                    .register(&mut l, UNIX_LISTENER, Interest::READABLE)
                    .map_err(poll_err)?;
                Some((l, file))
            }
            None => None,
        };
        let engine_cfg = EngineConfig {
            name: cfg.name.clone(),
            job: cfg.job.clone(),
            expect: cfg.expect,
            phase_deadline: cfg.phase_deadline,
        };
        let (engine, store) = match &cfg.parent {
            Some(parent) => (Engine::relay(engine_cfg, parent), None),
            None => {
                let dir = cfg
                    .state_dir
                    .clone()
                    .ok_or_else(|| ServerError::NoStateDir {
                        name: cfg.name.clone(),
                        job: cfg.job.clone(),
                    })?;
                let store_err = |source| ServerError::Store {
                    name: cfg.name.clone(),
                    source,
                };
                let store = EpochStore::open(&dir, &cfg.job).map_err(store_err)?;
                let last = store.last_committed().map_err(store_err)?.map(|m| m.epoch);
                (Engine::root(engine_cfg, last), Some(store))
            }
        };
        let reserve = ReserveFd::open().map_err(|source| ServerError::Reserve {
            name: cfg.name.clone(),
            source,
        })?;
        let (admission, caps_note) = admission_for(&cfg);
        Ok(Server {
            cfg,
            poll,
            listener,
            unix,
            stop: Arc::new(AtomicBool::new(false)),
            conns: Vec::new(),
            free: Vec::new(),
            serial: 0,
            dirty: Vec::new(),
            upstream: None,
            engine,
            store,
            traffic: Traffic::default(),
            admission,
            caps_note,
            throttle: LogThrottle::new(NOISE_INTERVAL),
            reserve,
            accept_batch: 0,
            accept_more: false,
            accept_paused_until: None,
            closing: VecDeque::new(),
            logs: Arc::new(Mutex::new(VecDeque::new())),
            crashed: false,
            fatal: None,
            started: Instant::now(),
            read_buf: Vec::new(),
        })
    }

    fn log_line(&self, line: String) {
        if self.cfg.log_stderr {
            let t = self.started.elapsed().as_secs_f64();
            eprintln!("ckpt-coord[{}] +{t:.3}s: {line}", self.cfg.name);
        }
        if let Ok(mut l) = self.logs.lock() {
            if l.len() >= LOG_KEEP {
                l.pop_front();
            }
            l.push_back(line);
        }
    }

    fn run(mut self) -> Result<(), ServerError> {
        if let Some(parent) = self.cfg.parent.clone() {
            self.connect_upstream(&parent)?;
        }
        log!(
            self,
            "job {}: listening on {:?}{}, expecting {} nodes{}; last committed epoch {:?}",
            self.cfg.job,
            self.listener.local_addr().ok(),
            self.cfg
                .listen_unix
                .as_ref()
                .map(|p| format!(" and unix:{}", p.display()))
                .unwrap_or_default(),
            self.cfg.expect,
            self.cfg
                .parent
                .as_ref()
                .map(|p| format!(", parent {p}"))
                .unwrap_or_default(),
            self.engine.last_committed()
        );
        log!(self, "{}", self.caps_note);
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let timeout = self.poll_timeout();
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Err(ServerError::Poll {
                    name: self.cfg.name.clone(),
                    source: e,
                });
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER | UNIX_LISTENER => self.accept_batch(Instant::now()),
                    WAKER => {}
                    Token(t) => {
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            self.read_conn(t, ev.is_read_closed() || ev.is_error());
                        }
                        if ev.is_writable() {
                            self.flush_conn(t);
                        }
                    }
                }
                if self.crashed {
                    break;
                }
            }
            // The listener had more than one batch, or a pause just ended: mio only
            // reports new connections, not ones still queued.
            let now = Instant::now();
            if self.accept_more && !self.crashed && self.fatal.is_none() {
                self.accept_batch(now);
            }
            if !self.crashed {
                self.timers(now);
            }
            if self.crashed {
                log!(self, "fault point reached: stopping dead");
                return Ok(());
            }
            self.flush_dirty();
            if let Some(e) = self.fatal.take() {
                return Err(e);
            }
        }
    }

    fn poll_timeout(&self) -> Duration {
        let now = Instant::now();
        if self.accept_more {
            return match self.accept_paused_until {
                Some(t) => t.saturating_duration_since(now).min(MAX_POLL_WAIT),
                None => Duration::ZERO,
            };
        }
        self.engine
            .next_deadline()
            .map_or(MAX_POLL_WAIT, |d| {
                MAX_POLL_WAIT.min(d.saturating_duration_since(now))
            })
            .max(MIN_POLL_WAIT)
    }

    // ---------------------------------------------------------------- engine

    /// Feeds one event to the engine and carries out what it returns.
    fn feed(&mut self, event: Event) {
        let actions = self.engine.handle(Instant::now(), event);
        self.execute(actions);
    }

    fn execute(&mut self, actions: Vec<Action>) {
        for a in actions {
            if self.crashed {
                return;
            }
            match a {
                Action::Send { to, msg } => self.send(to, &msg),
                Action::Broadcast { to, msg } => self.broadcast(&to, &msg),
                Action::SendUp(msg) => {
                    if let Some(id) = self.upstream.as_ref().map(|c| c.id) {
                        self.send(id, &msg);
                    }
                }
                Action::SendStatus { to, snapshot } => {
                    let status = self.status(snapshot);
                    self.send(to, &Message::Status(status));
                }
                Action::Refuse { conn, reason } => self.refuse(conn, &reason),
                Action::Expel { conn, reason } => {
                    self.traffic.refused += 1;
                    if let Some(c) = self.take_conn(conn) {
                        log!(self, "closed {}: {reason}", c.addr);
                    }
                }
                Action::Log(line) => self.log_line(line),
                Action::ReserveEpoch { last_committed } => self.reserve_epoch(last_committed),
                Action::Commit { epoch, nodes } => self.commit(epoch, nodes),
                Action::RecordAbort {
                    epoch,
                    phase,
                    node,
                    reason,
                } => self.record_abort(epoch, phase, &node, &reason),
            }
        }
    }

    fn status(&self, s: Snapshot) -> Status {
        Status {
            registered: s.registered,
            expect: s.expect,
            last_committed: s.last_committed,
            running: s.running.map(|r| (r.epoch, r.phase)),
            bytes_in: self.traffic.bytes_in,
            bytes_out: self.traffic.bytes_out,
            refused: self.traffic.refused,
        }
    }

    fn reserve_epoch(&mut self, last_committed: Option<u64>) {
        let event = match self.store.as_ref().map(|s| s.next_epoch(last_committed)) {
            Some(Ok(epoch)) => Event::EpochReserved { epoch },
            Some(Err(e)) => Event::EpochUnavailable {
                error: e.to_string(),
            },
            None => Event::EpochUnavailable {
                error: format!("coordinator {} has no epoch store", self.cfg.name),
            },
        };
        self.feed(event);
    }

    fn commit(&mut self, epoch: u64, nodes: Vec<NodeManifest>) {
        if self.cfg.fault == Some(FaultPoint::CrashAfterDump) {
            self.crashed = true;
            return;
        }
        let manifest = GlobalManifest {
            job: self.cfg.job.clone(),
            epoch,
            committed_unix_ms: now_ms(),
            nodes,
        };
        let t = Instant::now();
        let res = match &self.store {
            Some(s) => s.commit(&manifest).map_err(|e| e.to_string()),
            None => Err(format!("coordinator {} has no epoch store", self.cfg.name)),
        };
        let event = match res {
            Ok(()) => {
                log!(
                    self,
                    "epoch {epoch}: record of {} nodes written in {:.1} ms",
                    manifest.nodes.len(),
                    t.elapsed().as_secs_f64() * 1e3
                );
                Event::CommitWritten { epoch }
            }
            Err(error) => Event::CommitFailed { epoch, error },
        };
        self.feed(event);
    }

    fn record_abort(&mut self, epoch: u64, phase: Phase, node: &str, reason: &str) {
        if let Some(s) = &self.store
            && let Err(e) = s.record_abort(epoch, phase, node, reason)
        {
            log!(self, "cannot record the abort of epoch {epoch}: {e}");
        }
    }

    // ---------------------------------------------------------------- connections

    /// Connects to the parent (with backoff), authenticates, and moves the socket into the
    /// poll loop.
    fn connect_upstream(&mut self, parent: &str) -> Result<(), ServerError> {
        let mut opts = AgentOptions::new(
            parent,
            &self.cfg.job,
            self.cfg.secret.clone(),
            &self.cfg.name,
        );
        opts.role = Role::SubCoordinator;
        opts.intent = Intent::Standby;
        opts.expect = self.cfg.expect;
        opts.connect_timeout = PARENT_CONNECT_TIMEOUT;
        let link = Link::open(&opts).map_err(|source| ServerError::Upstream {
            name: self.cfg.name.clone(),
            parent: parent.to_string(),
            source: Box::new(source),
        })?;
        let (stream, reader, _) = link.into_parts();
        let poll_err = |source| ServerError::Poll {
            name: self.cfg.name.clone(),
            source,
        };
        let (mut stream, addr) = match stream {
            client::Stream::Tcp(s) => {
                let addr = s.peer_addr().map_err(poll_err)?;
                s.set_nonblocking(true).map_err(poll_err)?;
                (Stream::Tcp(TcpStream::from_std(s)), PeerAddr::Tcp(addr))
            }
            client::Stream::Unix(s) => {
                let addr =
                    unix_peer(&s).ok_or_else(|| poll_err(std::io::Error::last_os_error()))?;
                s.set_nonblocking(true).map_err(poll_err)?;
                (Stream::Unix(UnixStream::from_std(s)), addr)
            }
        };
        self.poll
            .registry()
            .register(&mut stream, UPSTREAM, Interest::READABLE)
            .map_err(poll_err)?;
        self.serial += 1;
        let id = ConnId {
            token: UPSTREAM.0,
            serial: self.serial,
        };
        let mut conn = Conn::new(id, stream, addr, reader);
        conn.state = ConnState::Ready;
        self.upstream = Some(conn);
        Ok(())
    }

    fn alloc_token(&mut self) -> usize {
        self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1 + FIRST_CONN
        })
    }

    fn slot(&mut self, token: usize) -> Option<&mut Conn> {
        if token == UPSTREAM.0 {
            return self.upstream.as_mut();
        }
        self.conns
            .get_mut(token.checked_sub(FIRST_CONN)?)
            .and_then(|c| c.as_mut())
    }

    fn conn(&mut self, id: ConnId) -> Option<&mut Conn> {
        self.slot(id.token).filter(|c| c.id == id)
    }

    /// Takes up to [`ACCEPT_BATCH`] connections off each listen queue (TCP, then the
    /// Unix socket), admitting each, evicting an older unauthenticated one for it, or
    /// closing it at once.
    fn accept_batch(&mut self, now: Instant) {
        if self.accept_paused_until.is_some_and(|t| now < t) {
            self.accept_more = true;
            return;
        }
        self.accept_paused_until = None;
        self.accept_more = false;
        self.accept_batch += 1;
        for which in [ListenerKind::Tcp, ListenerKind::Unix] {
            match self.accept_some(which, now) {
                AcceptEnd::Drained => {}
                AcceptEnd::More => self.accept_more = true,
                AcceptEnd::Paused => {
                    self.accept_more = true;
                    return;
                }
            }
        }
    }

    /// One connection off `which`'s queue.
    fn accept_one(&mut self, which: ListenerKind) -> std::io::Result<(Stream, PeerAddr)> {
        match which {
            ListenerKind::Tcp => self
                .listener
                .accept()
                .map(|(s, a)| (Stream::Tcp(s), PeerAddr::Tcp(a))),
            ListenerKind::Unix => {
                let Some((l, _)) = &self.unix else {
                    return Err(ErrorKind::WouldBlock.into());
                };
                let (s, _) = l.accept()?;
                // Without credentials the peer cannot be counted against a source: treat
                // it like a peer that gave up while queued.
                let addr = unix_peer(&s).ok_or(ErrorKind::ConnectionAborted)?;
                Ok((Stream::Unix(s), addr))
            }
        }
    }

    fn accept_some(&mut self, which: ListenerKind, now: Instant) -> AcceptEnd {
        let mut taken = 0;
        while taken < ACCEPT_BATCH {
            match self.accept_one(which) {
                Ok((stream, addr)) => {
                    taken += 1;
                    self.admit(stream, addr, now);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return AcceptEnd::Drained,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // The peer gave up while queued: nothing to do.
                Err(e) if e.kind() == ErrorKind::ConnectionAborted => taken += 1,
                Err(e) if sys::is_fd_exhaustion(&e) => {
                    taken += 1;
                    match self.make_room(which, &e) {
                        Room::Made => {}
                        Room::QueueEmpty => return AcceptEnd::Drained,
                        Room::Stuck => {
                            self.accept_paused_until = Some(now + FD_EXHAUSTED_PAUSE);
                            return AcceptEnd::Paused;
                        }
                    }
                }
                Err(e) => {
                    self.noise(Noise::AcceptFailed, format!("accept failed: {e}"));
                    self.accept_paused_until = Some(now + FD_EXHAUSTED_PAUSE);
                    return AcceptEnd::Paused;
                }
            }
        }
        AcceptEnd::More
    }

    /// A connection just accepted: through the caps first, before any buffer exists. A
    /// Unix peer goes through the same caps as a TCP one (all peers of one uid are one
    /// source).
    fn admit(&mut self, mut stream: Stream, addr: PeerAddr, now: Instant) {
        let source = Source::from(addr);
        match self.admission.check(source, self.accept_batch) {
            Verdict::Admit => {}
            Verdict::Evict { victim, cap } => {
                let why = self.cap_reason(cap, addr);
                self.traffic.refused += 1;
                self.admission.remove(victim);
                if let Some(old) = self.take_conn(victim) {
                    self.noise(
                        Noise::OverCap,
                        format!("closed unauthenticated {} for {addr}: {why}", old.addr),
                    );
                }
            }
            Verdict::Shed(cap) => {
                let why = self.cap_reason(cap, addr);
                self.traffic.refused += 1;
                drop(stream);
                self.noise(Noise::OverCap, format!("closed {addr} at once: {why}"));
                return;
            }
        }
        if let Stream::Tcp(s) = &stream {
            let _ = s.set_nodelay(true);
        }
        let token = self.alloc_token();
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut stream, Token(token), Interest::READABLE)
        {
            self.noise(
                Noise::AcceptFailed,
                format!("cannot register connection from {addr}: {e}"),
            );
            self.free.push(token);
            return;
        }
        self.serial += 1;
        let id = ConnId {
            token,
            serial: self.serial,
        };
        self.conns[token - FIRST_CONN] = Some(Conn::new(id, stream, addr, FrameReader::new()));
        self.admission.insert(id, source, now, self.accept_batch);
    }

    fn cap_reason(&self, cap: Cap, addr: PeerAddr) -> String {
        let (per_source, total) = self.admission.caps();
        match cap {
            Cap::Source => format!(
                "too many unauthenticated connections from {} (cap {per_source})",
                Source::from(addr)
            ),
            Cap::Total => format!("too many unauthenticated connections (cap {total})"),
        }
    }

    /// `accept` failed for want of descriptors. Frees one by closing the oldest
    /// unauthenticated connection if there is one from an earlier batch (it had its
    /// chance; authenticated peers are never closed for this); otherwise spends the
    /// reserve descriptor to take the next queued connection and close it, so the queue
    /// drains and clients hear at once instead of hanging. False when neither is
    /// possible.
    fn make_room(&mut self, which: ListenerKind, e: &std::io::Error) -> Room {
        if let Some(victim) = self.admission.evictable(self.accept_batch) {
            self.traffic.refused += 1;
            self.admission.remove(victim);
            if let Some(old) = self.take_conn(victim) {
                self.noise(
                    Noise::FdExhausted,
                    format!(
                        "accept: {e}: closed unauthenticated {} to make room",
                        old.addr
                    ),
                );
            }
            return Room::Made;
        }
        if !self.reserve.release() {
            if let Err(again) = self.reserve.reacquire() {
                self.noise(
                    Noise::FdExhausted,
                    format!("accept: {e}; no reserve descriptor either ({again}): pausing"),
                );
                return Room::Stuck;
            }
            // The reserve is back: the next failure can spend it.
            return Room::Made;
        }
        let shed = self.accept_one(which);
        let reopened = self.reserve.reacquire();
        match shed {
            Ok((stream, addr)) => {
                drop(stream);
                self.traffic.refused += 1;
                self.noise(
                    Noise::FdExhausted,
                    format!("accept: {e}: closed {addr} at once (reserve descriptor)"),
                );
            }
            Err(again) if again.kind() == ErrorKind::WouldBlock => return Room::QueueEmpty,
            // Another failure: pause rather than spin.
            Err(_) => return Room::Stuck,
        }
        if let Err(again) = reopened {
            self.noise(
                Noise::FdExhausted,
                format!("cannot reopen the reserve descriptor: {again}"),
            );
            return Room::Stuck;
        }
        Room::Made
    }

    /// Logs a line caused from outside through the rate limit.
    fn noise(&mut self, kind: Noise, line: String) {
        for l in self.throttle.note(kind, Instant::now(), line) {
            self.log_line(l);
        }
    }

    fn read_conn(&mut self, token: usize, to_eof: bool) {
        // One reusable buffer: zeroing 64 KiB on every readable event cost more than the
        // read itself at 16K connections.
        let mut buf = std::mem::take(&mut self.read_buf);
        if buf.is_empty() {
            buf = vec![0u8; READ_BUF_LEN];
        }
        let mut msgs = Vec::new();
        let mut close: Option<String> = None;
        let mut violation = false;
        let Some(conn) = self.slot(token) else {
            self.read_buf = buf;
            return;
        };
        let id = conn.id;
        let mut got = 0u64;
        loop {
            match conn.stream.read(&mut buf) {
                Ok(0) => {
                    close = Some(CLOSED_BY_PEER.into());
                    break;
                }
                Ok(n) => {
                    got += n as u64;
                    conn.reader.push(&buf[..n]);
                    let preauth = !matches!(conn.state, ConnState::Ready);
                    if preauth && conn.reader.pending() > PREAUTH_LIMIT {
                        close = Some("too much data before authentication".into());
                        violation = true;
                        break;
                    }
                    // A short read drained the socket; new data raises a new edge, so
                    // the extra read that would return EAGAIN is a wasted syscall. Not so
                    // once the peer hung up: that edge is already spent, read to EOF.
                    if n < buf.len() && !to_eof {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    close = Some(format!("connection error: {e}"));
                    break;
                }
            }
        }
        if !violation && !matches!(conn.state, ConnState::Closing) {
            loop {
                match conn.reader.next_message() {
                    Ok(Some(m)) => msgs.push(m),
                    Ok(None) => break,
                    Err(e) => {
                        close = Some(format!("protocol error: {e}"));
                        violation = true;
                        break;
                    }
                }
            }
        }
        self.traffic.bytes_in += got;
        self.read_buf = buf;
        for m in msgs {
            if self.conn(id).is_none() || self.crashed {
                return;
            }
            self.handle(id, m);
        }
        if let Some(reason) = close {
            if violation {
                self.traffic.refused += 1;
            }
            self.close(id, &reason);
        }
    }

    fn flush_conn(&mut self, token: usize) {
        let mut err = None;
        let mut sent = 0u64;
        // Fields borrowed apart: the connection and the poll registry at once.
        let registry = self.poll.registry();
        let conn = if token == UPSTREAM.0 {
            self.upstream.as_mut()
        } else {
            token
                .checked_sub(FIRST_CONN)
                .and_then(|i| self.conns.get_mut(i))
                .and_then(|c| c.as_mut())
        };
        let Some(conn) = conn else {
            return;
        };
        let id = conn.id;
        conn.dirty = false;
        while conn.out_pos < conn.out.len() {
            match conn.stream.write(&conn.out[conn.out_pos..]) {
                Ok(0) => {
                    err = Some("peer stopped reading".to_string());
                    break;
                }
                Ok(n) => {
                    conn.out_pos += n;
                    sent += n as u64;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    err = Some(format!("write error: {e}"));
                    break;
                }
            }
        }
        let drained = conn.out_pos == conn.out.len();
        if drained {
            conn.out.clear();
            conn.out_pos = 0;
        }
        // Ask for writability only while output waits for room (see `write_armed`);
        // re-registering re-checks readiness, so no edge is lost.
        if err.is_none() && drained == conn.write_armed {
            let interest = if drained {
                Interest::READABLE
            } else {
                Interest::READABLE | Interest::WRITABLE
            };
            match registry.reregister(&mut conn.stream, Token(token), interest) {
                Ok(()) => conn.write_armed = !drained,
                Err(e) => err = Some(format!("cannot wait for the socket to drain: {e}")),
            }
        }
        self.traffic.bytes_out += sent;
        if let Some(e) = err {
            self.close(id, &e);
        }
    }

    fn flush_dirty(&mut self) {
        let dirty = std::mem::take(&mut self.dirty);
        for t in dirty {
            self.flush_conn(t);
        }
    }

    fn send(&mut self, id: ConnId, m: &Message) {
        let name = self.cfg.name.clone();
        let Some(conn) = self.conn(id) else {
            return;
        };
        if let Err(e) = m.encode_into(&mut conn.out) {
            eprintln!(
                "ckpt-coord[{name}]: cannot encode {:?} for {}: {e}",
                m.msg_type(),
                conn.addr
            );
            return;
        }
        if !conn.dirty {
            conn.dirty = true;
            self.dirty.push(id.token);
        }
    }

    fn broadcast(&mut self, to: &[ConnId], m: &Message) {
        let bytes = match m.encode() {
            Ok(b) => b,
            Err(e) => {
                log!(
                    self,
                    "cannot encode {:?} for {} connections: {e}",
                    m.msg_type(),
                    to.len()
                );
                return;
            }
        };
        for id in to {
            if let Some(conn) = self.conn(*id) {
                conn.out.extend_from_slice(&bytes);
                if !conn.dirty {
                    conn.dirty = true;
                    self.dirty.push(id.token);
                }
            }
        }
    }

    fn refuse(&mut self, id: ConnId, reason: &str) {
        self.traffic.refused += 1;
        self.send(
            id,
            &Message::Refused(Refused {
                reason: reason.to_string(),
            }),
        );
        self.flush_conn(id.token);
        if let Some(conn) = self.conn(id) {
            let _ = conn.stream.shutdown_write();
            conn.state = ConnState::Closing;
            self.closing.push_back(Timer {
                at: Instant::now() + REFUSE_LINGER,
                conn: id,
            });
        }
    }

    /// Removes a connection from the loop; the caller decides who hears of it.
    fn take_conn(&mut self, id: ConnId) -> Option<Conn> {
        let mut conn = if id.token == UPSTREAM.0 {
            self.upstream.take_if(|c| c.id == id)
        } else {
            match id
                .token
                .checked_sub(FIRST_CONN)
                .and_then(|i| self.conns.get_mut(i))
            {
                Some(slot) if slot.as_ref().is_some_and(|c| c.id == id) => {
                    self.free.push(id.token);
                    slot.take()
                }
                _ => None,
            }
        }?;
        self.admission.remove(id);
        let _ = self.poll.registry().deregister(&mut conn.stream);
        Some(conn)
    }

    /// Closes a connection for a reason the I/O layer saw (EOF, error, timeout), and tells
    /// the engine if it knew the peer.
    fn close(&mut self, id: ConnId, reason: &str) {
        let Some(conn) = self.take_conn(id) else {
            return;
        };
        if id.token == UPSTREAM.0 {
            self.upstream_lost(reason);
            return;
        }
        match conn.state {
            ConnState::Ready => self.feed(Event::Disconnected {
                conn: id,
                reason: reason.to_string(),
            }),
            ConnState::Hello | ConnState::Auth { .. } => {
                let kind = match reason {
                    CLOSED_BY_PEER => return,
                    HANDSHAKE_TIMED_OUT => Noise::HandshakeTimeout,
                    _ => Noise::Dropped,
                };
                self.noise(
                    kind,
                    format!("dropped unauthenticated {}: {reason}", conn.addr),
                );
            }
            ConnState::Closing => {}
        }
    }

    /// The parent is gone: the engine aborts the local agents, they are told at once, and
    /// the loop stops.
    fn upstream_lost(&mut self, reason: &str) {
        self.feed(Event::ParentLost {
            reason: reason.to_string(),
        });
        self.flush_dirty();
        self.fatal = Some(ServerError::UpstreamLost {
            name: self.cfg.name.clone(),
            parent: self.cfg.parent.clone().unwrap_or_default(),
            reason: reason.to_string(),
        });
    }

    fn timers(&mut self, now: Instant) {
        // Every unauthenticated connection is in `admission`, oldest first, so this is the
        // handshake timer of each of them, checked every iteration however busy the loop.
        while let Some((id, since)) = self.admission.oldest() {
            if since + self.cfg.handshake_timeout > now {
                break;
            }
            self.admission.remove(id);
            self.traffic.refused += 1;
            self.close(id, HANDSHAKE_TIMED_OUT);
        }
        for line in self.throttle.flush(now) {
            self.log_line(line);
        }
        while let Some(t) = self.closing.front().copied() {
            if t.at > now {
                break;
            }
            self.closing.pop_front();
            self.close(t.conn, "refused");
        }
        let actions = self.engine.handle(now, Event::Tick);
        self.execute(actions);
    }

    // ---------------------------------------------------------------- handshake

    fn handle(&mut self, id: ConnId, m: Message) {
        if id.token == UPSTREAM.0 {
            self.feed(Event::FromParent(m));
            return;
        }
        let Some(conn) = self.conn(id) else {
            return;
        };
        let addr = conn.addr;
        match (&conn.state, m) {
            (ConnState::Hello, Message::Hello(h)) => self.on_hello(id, addr, h),
            (ConnState::Auth { .. }, Message::Auth(a)) => self.on_auth(id, addr, a.proof),
            (ConnState::Ready, msg) => self.feed(Event::Received { conn: id, msg }),
            (ConnState::Closing, _) => {}
            (_, m) => {
                self.noise(
                    Noise::Refused,
                    format!(
                        "refused {addr}: {:?} before the handshake completed",
                        m.msg_type()
                    ),
                );
                self.refuse(id, "protocol violation: handshake expected");
            }
        }
    }

    fn on_hello(&mut self, id: ConnId, addr: PeerAddr, h: Hello) {
        if h.job != self.cfg.job {
            self.noise(
                Noise::Refused,
                format!(
                    "refused {addr} (node {:?}): job {:?} is not this coordinator's job",
                    h.node, h.job
                ),
            );
            self.refuse(id, "unknown job");
            return;
        }
        let version = VERSION_MAX.min(h.max_version);
        if version < VERSION_MIN.max(h.min_version) {
            self.noise(
                Noise::Refused,
                format!(
                    "refused {addr} (node {:?}): no common protocol version ({}..={})",
                    h.node, h.min_version, h.max_version
                ),
            );
            self.refuse(id, "no common protocol version");
            return;
        }
        let server_nonce = match auth::nonce() {
            Ok(n) => n,
            Err(e) => {
                log!(self, "cannot make a nonce for {addr}: {e}");
                self.refuse(id, "internal error");
                return;
            }
        };
        let server_proof =
            self.cfg
                .secret
                .server_proof(&self.cfg.job, &h.client_nonce, &server_nonce);
        self.send(
            id,
            &Message::Challenge(Challenge {
                version,
                server_nonce,
                server_proof,
            }),
        );
        if let Some(conn) = self.conn(id) {
            conn.state = ConnState::Auth {
                hello: Box::new(h),
                server_nonce,
            };
        }
    }

    fn on_auth(&mut self, id: ConnId, addr: PeerAddr, proof: [u8; 32]) {
        let Some(conn) = self.conn(id) else {
            return;
        };
        let ConnState::Auth {
            hello,
            server_nonce,
        } = std::mem::replace(&mut conn.state, ConnState::Closing)
        else {
            return;
        };
        let ok = self.cfg.secret.verify_client(
            &self.cfg.job,
            &hello.node,
            hello.role,
            &server_nonce,
            &hello.client_nonce,
            &proof,
        );
        if !ok {
            self.noise(
                Noise::Refused,
                format!(
                "refused {addr} (node {:?}, {:?}): authentication failed: wrong or missing job secret",
                hello.node,
                hello.role
                ),
            );
            self.refuse(id, "authentication failed");
            return;
        }
        if let Some(conn) = self.conn(id) {
            conn.state = ConnState::Ready;
        }
        // Authenticated: no longer subject to the caps or the handshake timer.
        self.admission.remove(id);
        // Whether the peer may register (and what that sets off) is the engine's call.
        self.feed(Event::Joined {
            conn: id,
            addr,
            role: hello.role,
            name: hello.node,
            intent: hello.intent,
        });
    }
}
