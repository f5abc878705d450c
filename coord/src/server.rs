//! The coordinator: one `mio` poll loop holding every connection of one job.
//!
//! This module owns the sockets: accepting, the handshake ([`crate::auth`]), framing
//! ([`crate::protocol`]), per-connection output buffers flushed once per poll iteration,
//! timers (phase deadlines, handshake timeouts, parked gets) and the dispatch of messages.
//! The root's round state machine (`Registering → Freezing → Draining → Dumping →
//! Committed | Aborted`, and the restart phases) lives in `round.rs`; with a parent
//! address the same loop runs as a sub-coordinator (`tree.rs`). After DUMP the root
//! writes the global manifest atomically ([`crate::store`]) before telling anyone COMMIT,
//! so a crash leaves an epoch either fully committed or not at all.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use crate::auth::{self, Secret};
use crate::client::ClientError;
use crate::kv::{ConnId, KvStore};
use crate::protocol::{
    Arrive, Challenge, Fail, FrameReader, Get, Hello, Intent, Leave, Message, NodeReport, Phase,
    PhaseInfo, Put, Refused, Role, RoundKind, Status, VERSION_MAX, VERSION_MIN, Values, Welcome,
};
use crate::store::{EpochStore, StoreError};
use crate::tree::Upstream;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
pub(crate) const UPSTREAM: usize = 2;
const FIRST_CONN: usize = 3;
/// Unauthenticated peers may not make us buffer more than this.
const PREAUTH_LIMIT: usize = 4096;
/// Longest a get may be parked, whatever the client asks.
const MAX_GET_WAIT: Duration = Duration::from_secs(3600);
/// Log lines kept in memory for [`CoordHandle::log_lines`].
const LOG_KEEP: usize = 2000;

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
    /// Also print log lines on stderr.
    pub log_stderr: bool,
    /// Fault injection for tests.
    pub fault: Option<FaultPoint>,
}

impl CoordConfig {
    /// Defaults: 60 s phase deadline, 10 s handshake timeout, logs on stderr.
    pub fn new(listen: SocketAddr, job: &str, expect: u32, secret: Secret) -> CoordConfig {
        CoordConfig {
            listen,
            job: job.to_string(),
            name: "coord".to_string(),
            expect,
            parent: None,
            state_dir: None,
            secret,
            phase_deadline: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(10),
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
    /// The poll loop failed.
    #[error("coordinator {name}: poll: {source}")]
    Poll {
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

pub(crate) enum State {
    Hello,
    Auth {
        hello: Box<Hello>,
        server_nonce: [u8; 32],
    },
    Ready(Peer),
    /// Refused: we wait for the peer to read our reason and hang up.
    Closing,
}

pub(crate) struct Peer {
    pub(crate) role: Role,
    pub(crate) name: String,
    pub(crate) nodes: Vec<String>,
}

pub(crate) struct Conn {
    pub(crate) id: ConnId,
    pub(crate) stream: TcpStream,
    pub(crate) addr: SocketAddr,
    pub(crate) reader: FrameReader,
    pub(crate) out: Vec<u8>,
    pub(crate) out_pos: usize,
    pub(crate) dirty: bool,
    pub(crate) state: State,
}

/// A running round, at the root or mirrored at a sub-coordinator.
pub(crate) struct Round {
    pub(crate) epoch: u64,
    pub(crate) kind: RoundKind,
    pub(crate) idx: usize,
    pub(crate) phase: Phase,
    pub(crate) deadline_ms: u32,
    pub(crate) deadline: Instant,
    pub(crate) arrived: u32,
    pub(crate) need: u32,
    pub(crate) per_conn: HashMap<ConnId, u32>,
    pub(crate) members: HashMap<ConnId, u32>,
    pub(crate) reports: Vec<NodeReport>,
    pub(crate) committed: bool,
    pub(crate) sent_up: bool,
    /// The root's one-time extension while a late sub-coordinator names the late agent.
    pub(crate) grace_used: bool,
}

pub(crate) struct Stats {
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    pub(crate) refused: u64,
}

/// A key and its value, `None` when the wait timed out.
type ValueEntry = (String, Option<Vec<u8>>);

type LogBuf = Arc<Mutex<VecDeque<String>>>;

pub(crate) struct Server {
    pub(crate) cfg: CoordConfig,
    pub(crate) poll: Poll,
    pub(crate) listener: TcpListener,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) conns: Vec<Option<Conn>>,
    pub(crate) free: Vec<usize>,
    pub(crate) serial: u64,
    pub(crate) dirty: Vec<usize>,
    pub(crate) nodes: HashMap<String, (ConnId, Intent)>,
    pub(crate) round: Option<Round>,
    pub(crate) trigger: Option<RoundKind>,
    pub(crate) waiting_controls: Vec<ConnId>,
    pub(crate) kv: KvStore,
    pub(crate) value_out: HashMap<ConnId, Vec<ValueEntry>>,
    pub(crate) store: Option<EpochStore>,
    pub(crate) last_committed: Option<u64>,
    pub(crate) upstream: Option<Upstream>,
    pub(crate) stats: Stats,
    pub(crate) handshakes: VecDeque<(Instant, ConnId)>,
    pub(crate) closing: VecDeque<(Instant, ConnId)>,
    pub(crate) logs: LogBuf,
    pub(crate) crashed: bool,
    pub(crate) fatal: Option<ServerError>,
    pub(crate) started: Instant,
    pub(crate) read_buf: Vec<u8>,
}

/// The peer has fully arrived in the round's last phase: leaving now is a normal exit.
pub(crate) fn finished_in(r: &Round, id: ConnId) -> bool {
    r.kind.phases().last() == Some(&r.phase)
        && r.per_conn.get(&id).copied().unwrap_or(0) >= r.members.get(&id).copied().unwrap_or(1)
}

pub(crate) fn r_is_last(r: Option<&Round>) -> bool {
    r.is_some_and(|r| r.kind.phases().last() == Some(&r.phase))
}

pub(crate) fn now_ms() -> u64 {
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
    // std's backlog of 128 drops SYNs when thousands of agents connect at once; the kernel
    // caps this at net.core.somaxconn.
    s.listen(4096)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
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

    pub(crate) fn join_inner(&mut self) -> Result<(), ServerError> {
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
    pub(crate) fn new(cfg: CoordConfig) -> Result<Server, ServerError> {
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
        let (store, last_committed) = if cfg.parent.is_none() {
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
            (Some(store), last)
        } else {
            (None, None)
        };
        Ok(Server {
            cfg,
            poll,
            listener,
            stop: Arc::new(AtomicBool::new(false)),
            conns: Vec::new(),
            free: Vec::new(),
            serial: 0,
            dirty: Vec::new(),
            nodes: HashMap::new(),
            round: None,
            trigger: None,
            waiting_controls: Vec::new(),
            kv: KvStore::new(),
            value_out: HashMap::new(),
            store,
            last_committed,
            upstream: None,
            stats: Stats {
                bytes_in: 0,
                bytes_out: 0,
                refused: 0,
            },
            handshakes: VecDeque::new(),
            closing: VecDeque::new(),
            logs: Arc::new(Mutex::new(VecDeque::new())),
            crashed: false,
            fatal: None,
            started: Instant::now(),
            read_buf: Vec::new(),
        })
    }

    pub(crate) fn log_line(&self, line: String) {
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

    pub(crate) fn run(mut self) -> Result<(), ServerError> {
        if self.cfg.parent.is_some() {
            self.connect_upstream()?;
        }
        log!(
            self,
            "job {}: listening on {:?}, expecting {} nodes{}; last committed epoch {:?}",
            self.cfg.job,
            self.listener.local_addr().ok(),
            self.cfg.expect,
            self.cfg
                .parent
                .as_ref()
                .map(|p| format!(", parent {p}"))
                .unwrap_or_default(),
            self.last_committed
        );
        let mut events = Events::with_capacity(4096);
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
                    LISTENER => self.accept_all(),
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
            if !self.crashed {
                self.timers(Instant::now());
            }
            if self.crashed {
                log!(self, "fault point reached: stopping dead");
                return Ok(());
            }
            self.flush_batches();
            self.flush_dirty();
            if let Some(e) = self.fatal.take() {
                return Err(e);
            }
        }
    }

    pub(crate) fn poll_timeout(&self) -> Duration {
        let mut t = Duration::from_millis(100);
        let now = Instant::now();
        if let Some(r) = &self.round {
            t = t.min(r.deadline.saturating_duration_since(now));
        }
        t.max(Duration::from_millis(1))
    }

    // ---------------------------------------------------------------- connections

    pub(crate) fn alloc_token(&mut self) -> usize {
        self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1 + FIRST_CONN
        })
    }

    pub(crate) fn slot(&mut self, token: usize) -> Option<&mut Conn> {
        if token == UPSTREAM {
            return self.upstream.as_mut().and_then(|u| u.conn.as_mut());
        }
        self.conns
            .get_mut(token.checked_sub(FIRST_CONN)?)
            .and_then(|c| c.as_mut())
    }

    pub(crate) fn conn(&mut self, id: ConnId) -> Option<&mut Conn> {
        self.slot(id.token).filter(|c| c.id == id)
    }

    pub(crate) fn install_upstream(
        &mut self,
        std: std::net::TcpStream,
        reader: FrameReader,
        addr: SocketAddr,
    ) -> std::io::Result<ConnId> {
        std.set_nonblocking(true)?;
        let mut stream = TcpStream::from_std(std);
        self.poll.registry().register(
            &mut stream,
            Token(UPSTREAM),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        self.serial += 1;
        let id = ConnId {
            token: UPSTREAM,
            serial: self.serial,
        };
        if let Some(u) = self.upstream.as_mut() {
            u.conn = Some(Conn {
                id,
                stream,
                addr,
                reader,
                out: Vec::new(),
                out_pos: 0,
                dirty: false,
                state: State::Ready(Peer {
                    role: Role::SubCoordinator,
                    name: "parent".into(),
                    nodes: Vec::new(),
                }),
            });
        }
        Ok(id)
    }

    pub(crate) fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    let token = self.alloc_token();
                    if let Err(e) = self.poll.registry().register(
                        &mut stream,
                        Token(token),
                        Interest::READABLE | Interest::WRITABLE,
                    ) {
                        log!(self, "cannot register connection from {addr}: {e}");
                        self.free.push(token);
                        continue;
                    }
                    self.serial += 1;
                    let id = ConnId {
                        token,
                        serial: self.serial,
                    };
                    self.conns[token - FIRST_CONN] = Some(Conn {
                        id,
                        stream,
                        addr,
                        reader: FrameReader::new(),
                        out: Vec::new(),
                        out_pos: 0,
                        dirty: false,
                        state: State::Hello,
                    });
                    self.handshakes
                        .push_back((Instant::now() + self.cfg.handshake_timeout, id));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE and friends: the listener stays registered, and the next
                    // connection attempt wakes us again.
                    log!(self, "accept failed: {e}");
                    break;
                }
            }
        }
    }

    pub(crate) fn read_conn(&mut self, token: usize, to_eof: bool) {
        // One reusable buffer: zeroing 64 KiB on every readable event cost more than the
        // read itself at 16K connections.
        let mut buf = std::mem::take(&mut self.read_buf);
        if buf.is_empty() {
            buf = vec![0u8; 64 * 1024];
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
                    close = Some("connection closed".into());
                    break;
                }
                Ok(n) => {
                    got += n as u64;
                    conn.reader.push(&buf[..n]);
                    let preauth = !matches!(conn.state, State::Ready(_));
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
        if !violation && !matches!(conn.state, State::Closing) {
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
        self.stats.bytes_in += got;
        self.read_buf = buf;
        for m in msgs {
            if self.conn(id).is_none() {
                return;
            }
            self.handle(id, m);
        }
        if let Some(reason) = close {
            if violation {
                self.stats.refused += 1;
            }
            self.close(id, &reason);
        }
    }

    pub(crate) fn flush_conn(&mut self, token: usize) {
        let mut err = None;
        let mut sent = 0u64;
        let Some(conn) = self.slot(token) else {
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
        if conn.out_pos == conn.out.len() {
            conn.out.clear();
            conn.out_pos = 0;
        }
        self.stats.bytes_out += sent;
        if let Some(e) = err {
            self.close(id, &e);
        }
    }

    pub(crate) fn flush_dirty(&mut self) {
        let dirty = std::mem::take(&mut self.dirty);
        for t in dirty {
            self.flush_conn(t);
        }
    }

    pub(crate) fn send(&mut self, id: ConnId, m: &Message) {
        let name = self.cfg.name.clone();
        let Some(conn) = self.conn(id) else {
            return;
        };
        if let Err(e) = m.encode_into(&mut conn.out) {
            eprintln!("ckpt-coord[{name}]: cannot encode {:?}: {e}", m.msg_type());
            return;
        }
        if !conn.dirty {
            conn.dirty = true;
            self.dirty.push(id.token);
        }
    }

    pub(crate) fn broadcast(&mut self, to: &[ConnId], m: &Message) {
        let bytes = match m.encode() {
            Ok(b) => b,
            Err(e) => {
                log!(self, "cannot encode {:?}: {e}", m.msg_type());
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

    pub(crate) fn refuse(&mut self, id: ConnId, reason: &str) {
        self.stats.refused += 1;
        self.send(
            id,
            &Message::Refused(Refused {
                reason: reason.to_string(),
            }),
        );
        self.flush_conn(id.token);
        if let Some(conn) = self.conn(id) {
            let _ = conn.stream.shutdown(std::net::Shutdown::Write);
            conn.state = State::Closing;
            self.closing
                .push_back((Instant::now() + Duration::from_secs(2), id));
        }
    }

    pub(crate) fn close(&mut self, id: ConnId, reason: &str) {
        let conn = if id.token == UPSTREAM {
            match self.upstream.as_mut() {
                Some(u) if u.conn.as_ref().is_some_and(|c| c.id == id) => u.conn.take(),
                _ => None,
            }
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
        };
        let Some(mut conn) = conn else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut conn.stream);
        if id.token == UPSTREAM {
            self.upstream_lost(reason);
            return;
        }
        match conn.state {
            State::Ready(peer) => self.peer_gone(id, conn.addr, peer, reason),
            State::Hello | State::Auth { .. } => {
                if reason != "connection closed" {
                    log!(self, "dropped unauthenticated {}: {reason}", conn.addr);
                }
            }
            State::Closing => {}
        }
    }

    // ---------------------------------------------------------------- messages

    pub(crate) fn handle(&mut self, id: ConnId, m: Message) {
        if id.token == UPSTREAM {
            self.on_upstream_message(m);
            return;
        }
        let Some(conn) = self.conn(id) else {
            return;
        };
        let addr = conn.addr;
        match (&conn.state, m) {
            (State::Hello, Message::Hello(h)) => self.on_hello(id, addr, h),
            (State::Auth { .. }, Message::Auth(a)) => self.on_auth(id, addr, a.proof),
            (State::Ready(p), m) => {
                let role = p.role;
                self.on_peer_message(id, role, m);
            }
            (State::Closing, _) => {}
            (_, m) => {
                log!(
                    self,
                    "refused {addr}: {:?} before the handshake completed",
                    m.msg_type()
                );
                self.refuse(id, "protocol violation: handshake expected");
            }
        }
    }

    pub(crate) fn on_hello(&mut self, id: ConnId, addr: SocketAddr, h: Hello) {
        if h.job != self.cfg.job {
            log!(
                self,
                "refused {addr} (node {:?}): job {:?} is not this coordinator's job",
                h.node,
                h.job
            );
            self.refuse(id, "unknown job");
            return;
        }
        let version = VERSION_MAX.min(h.max_version);
        if version < VERSION_MIN.max(h.min_version) {
            log!(
                self,
                "refused {addr} (node {:?}): no common protocol version ({}..={})",
                h.node,
                h.min_version,
                h.max_version
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
            conn.state = State::Auth {
                hello: Box::new(h),
                server_nonce,
            };
        }
    }

    pub(crate) fn on_auth(&mut self, id: ConnId, addr: SocketAddr, proof: [u8; 32]) {
        let Some(conn) = self.conn(id) else {
            return;
        };
        let State::Auth {
            hello,
            server_nonce,
        } = std::mem::replace(&mut conn.state, State::Closing)
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
            log!(
                self,
                "refused {addr} (node {:?}, {:?}): authentication failed: wrong or missing job secret",
                hello.node,
                hello.role
            );
            self.refuse(id, "authentication failed");
            return;
        }
        let mut nodes = Vec::new();
        if hello.role == Role::Agent {
            if let Err(why) = self.can_register(&hello.node) {
                log!(self, "refused {addr} (node {:?}): {why}", hello.node);
                self.refuse(id, &why);
                return;
            }
            nodes.push(hello.node.clone());
        }
        if let Some(conn) = self.conn(id) {
            conn.state = State::Ready(Peer {
                role: hello.role,
                name: hello.node.clone(),
                nodes: nodes.clone(),
            });
        }
        self.send(
            id,
            &Message::Welcome(Welcome {
                last_committed: self.last_committed,
            }),
        );
        if hello.role == Role::Agent {
            let report = NodeReport {
                node: hello.node.clone(),
                info: PhaseInfo::Register {
                    intent: hello.intent,
                },
            };
            self.nodes.insert(hello.node, (id, hello.intent));
            self.registered(vec![report]);
        }
    }

    pub(crate) fn can_register(&self, node: &str) -> Result<(), String> {
        if self.nodes.contains_key(node) {
            return Err(format!("node {node} is already registered"));
        }
        if self.nodes.len() >= self.cfg.expect as usize {
            return Err(format!(
                "job {} already has all {} nodes registered",
                self.cfg.job, self.cfg.expect
            ));
        }
        if let Some(r) = &self.round {
            return Err(format!(
                "epoch {} is in {}; registration is closed",
                r.epoch, r.phase
            ));
        }
        Ok(())
    }

    /// New nodes registered here (directly or through a sub-coordinator).
    pub(crate) fn registered(&mut self, reports: Vec<NodeReport>) {
        if let Some(up) = self.upstream.as_mut() {
            up.pending_register.extend(reports);
        } else {
            if self.nodes.len() == self.cfg.expect as usize {
                log!(self, "all {} nodes registered", self.cfg.expect);
            }
            self.maybe_start_round();
        }
    }

    pub(crate) fn on_peer_message(&mut self, id: ConnId, role: Role, m: Message) {
        match (role, m) {
            (Role::Agent, Message::Arrive(a)) if a.phase != Phase::Register => {
                self.on_arrive(id, a)
            }
            (Role::SubCoordinator, Message::Arrive(a)) => self.on_arrive(id, a),
            (Role::Agent | Role::SubCoordinator, Message::Fail(mut f)) => {
                // A peer may only speak for nodes it stands for: a failure naming someone
                // else is pinned on the sender.
                if let Some(State::Ready(p)) = self.conn(id).map(|c| &c.state)
                    && !p.nodes.contains(&f.node)
                {
                    f.node = p.nodes.first().cloned().unwrap_or_else(|| p.name.clone());
                }
                self.on_fail(f)
            }
            (Role::SubCoordinator, Message::Leave(l)) => self.on_leave(id, l),
            (Role::Agent | Role::SubCoordinator, Message::Put(p)) => self.on_put(p),
            (Role::Agent | Role::SubCoordinator, Message::Get(g)) => self.on_get(id, g),
            (Role::Control, Message::Trigger(t)) => self.on_trigger(id, t.kind),
            (_, Message::StatusQuery(_)) => {
                let s = self.status();
                self.send(id, &Message::Status(s));
            }
            (role, m) => {
                let addr = self.conn(id).map(|c| c.addr);
                log!(
                    self,
                    "closing {addr:?} ({role:?}): unexpected {:?}",
                    m.msg_type()
                );
                self.stats.refused += 1;
                self.close(id, "protocol violation");
            }
        }
    }

    pub(crate) fn status(&self) -> Status {
        Status {
            registered: self.nodes.len() as u32,
            expect: self.cfg.expect,
            last_committed: self.last_committed,
            running: self.round.as_ref().map(|r| (r.epoch, r.phase)),
            bytes_in: self.stats.bytes_in,
            bytes_out: self.stats.bytes_out,
            refused: self.stats.refused,
        }
    }

    pub(crate) fn on_arrive(&mut self, id: ConnId, a: Arrive) {
        if a.phase == Phase::Register {
            let mut fresh = Vec::new();
            for r in a.reports {
                let intent = match r.info {
                    PhaseInfo::Register { intent } => intent,
                    _ => Intent::Standby,
                };
                if let Err(why) = self.can_register(&r.node) {
                    log!(
                        self,
                        "ignoring registration of {} from downstream: {why}",
                        r.node
                    );
                    continue;
                }
                self.nodes.insert(r.node.clone(), (id, intent));
                if let Some(State::Ready(p)) = self.conn(id).map(|c| &mut c.state) {
                    p.nodes.push(r.node.clone());
                }
                fresh.push(r);
            }
            self.registered(fresh);
            return;
        }
        let Some(r) = self.round.as_mut() else {
            return;
        };
        if a.epoch != r.epoch || a.phase != r.phase {
            return;
        }
        // Arrivals are bounded by the nodes the peer stands for, and reports must name
        // them: one peer must not be able to complete a barrier for others.
        let allowed = r.members.get(&id).copied().unwrap_or(0);
        let already = r.per_conn.get(&id).copied().unwrap_or(0);
        let foreign = a
            .reports
            .iter()
            .any(|rep| self.nodes.get(&rep.node).is_none_or(|(c, _)| *c != id));
        if already.saturating_add(a.count) > allowed || foreign {
            let addr = self.conn(id).map(|c| c.addr);
            log!(
                self,
                "closing {addr:?}: arrival for {} nodes in {} (it stands for {allowed}, {already} arrived) or for foreign nodes",
                a.count,
                a.phase
            );
            self.stats.refused += 1;
            self.close(id, "protocol violation: bogus arrival");
            return;
        }
        let Some(r) = self.round.as_mut() else {
            return;
        };
        r.arrived += a.count;
        *r.per_conn.entry(id).or_default() += a.count;
        r.reports.extend(a.reports);
        if r.arrived < r.need {
            return;
        }
        if self.upstream.is_some() {
            if !r.sent_up {
                r.sent_up = true;
                let up = Arrive {
                    epoch: r.epoch,
                    phase: r.phase,
                    count: r.arrived,
                    reports: std::mem::take(&mut r.reports),
                };
                self.send_up(Message::Arrive(up));
                // The last phase ends the round here; the root confirms nothing more.
                if r_is_last(self.round.as_ref()) {
                    self.round = None;
                }
            }
        } else {
            self.advance();
        }
    }

    pub(crate) fn on_fail(&mut self, f: Fail) {
        if self.upstream.is_some() {
            self.send_up(Message::Fail(f));
            return;
        }
        match &self.round {
            Some(r) if r.epoch == f.epoch => {
                let phase = r.phase;
                self.fail_round(phase, &f.node, &format!("reported failure: {}", f.reason));
            }
            _ => log!(
                self,
                "ignoring failure report from node {} for epoch {} ({}): no such round running",
                f.node,
                f.epoch,
                f.reason
            ),
        }
    }

    pub(crate) fn on_leave(&mut self, id: ConnId, l: Leave) {
        for n in &l.nodes {
            if self.nodes.get(n).is_some_and(|(c, _)| *c == id) {
                self.nodes.remove(n);
            }
        }
        if let Some(State::Ready(p)) = self.conn(id).map(|c| &mut c.state) {
            p.nodes.retain(|n| !l.nodes.contains(n));
        }
        if let Some(up) = self.upstream.as_mut() {
            up.pending_leave.extend(l.nodes);
        } else if let Some(r) = self.round.as_ref().filter(|r| !finished_in(r, id)) {
            let phase = r.phase;
            if let Some(n) = l.nodes.first() {
                self.fail_round(phase, n, "left during the round");
            }
        }
    }

    pub(crate) fn on_put(&mut self, p: Put) {
        for (k, v) in p.entries {
            if let Some(up) = self.upstream.as_mut() {
                up.pending_puts.push((k.clone(), v.clone()));
            }
            for (conn, key, val) in self.kv.put(k, v) {
                self.value_out
                    .entry(conn)
                    .or_default()
                    .push((key, Some(val)));
            }
        }
    }

    pub(crate) fn on_get(&mut self, id: ConnId, g: Get) {
        let wait = Duration::from_millis(u64::from(g.timeout_ms)).min(MAX_GET_WAIT);
        let deadline = Instant::now() + wait;
        for k in g.keys {
            match self.kv.get(id, &k, deadline) {
                Some(v) => self.value_out.entry(id).or_default().push((k, Some(v))),
                None => {
                    if let Some(up) = self.upstream.as_mut() {
                        up.want(k, deadline);
                    }
                }
            }
        }
    }

    pub(crate) fn on_trigger(&mut self, id: ConnId, kind: RoundKind) {
        if self.upstream.is_some() {
            log!(
                self,
                "refusing a trigger: sub-coordinators take no triggers"
            );
            self.refuse(id, "send triggers to the root coordinator");
            return;
        }
        match self.trigger {
            Some(k) if k != kind => {
                log!(self, "trigger {kind:?} ignored: {k:?} already pending");
            }
            _ => self.trigger = Some(kind),
        }
        self.waiting_controls.push(id);
        log!(
            self,
            "trigger {kind:?}: {} of {} nodes registered",
            self.nodes.len(),
            self.cfg.expect
        );
        self.maybe_start_round();
    }

    pub(crate) fn peer_gone(&mut self, id: ConnId, addr: SocketAddr, peer: Peer, reason: &str) {
        for n in &peer.nodes {
            if self.nodes.get(n).is_some_and(|(c, _)| *c == id) {
                self.nodes.remove(n);
            }
        }
        if peer.nodes.is_empty() {
            return;
        }
        let who = match peer.role {
            Role::SubCoordinator => format!("sub-coordinator {}", peer.name),
            _ => peer.name.clone(),
        };
        let member = self
            .round
            .as_ref()
            .is_some_and(|r| r.members.contains_key(&id) && !finished_in(r, id));
        if member {
            let (epoch, phase) = self
                .round
                .as_ref()
                .map(|r| (r.epoch, r.phase))
                .unwrap_or((0, Phase::Register));
            let why = format!("{who} ({addr}) disconnected: {reason}");
            if self.upstream.is_some() {
                self.send_up(Message::Fail(Fail {
                    epoch,
                    phase,
                    node: peer.nodes[0].clone(),
                    reason: why,
                }));
            } else {
                self.fail_round(phase, &peer.nodes[0], &why);
            }
        } else {
            log!(self, "{who} ({addr}) left: {reason}");
            if let Some(up) = self.upstream.as_mut() {
                up.pending_leave.extend(peer.nodes);
            }
        }
    }

    // ---------------------------------------------------------------- timers, batches

    pub(crate) fn timers(&mut self, now: Instant) {
        while let Some((d, id)) = self.handshakes.front().copied() {
            if d > now {
                break;
            }
            self.handshakes.pop_front();
            let pending = self
                .conn(id)
                .is_some_and(|c| matches!(c.state, State::Hello | State::Auth { .. }));
            if pending {
                self.stats.refused += 1;
                self.close(id, "handshake timed out");
            }
        }
        while let Some((d, id)) = self.closing.front().copied() {
            if d > now {
                break;
            }
            self.closing.pop_front();
            self.close(id, "refused");
        }
        for (conn, key) in self.kv.expire(now) {
            self.value_out.entry(conn).or_default().push((key, None));
        }
        let Some(r) = &self.round else {
            return;
        };
        if now < r.deadline || r.phase == Phase::Commit || (self.upstream.is_some() && r.sent_up) {
            return;
        }
        let mut late: Vec<String> = Vec::new();
        let members: Vec<(ConnId, u32)> = r.members.iter().map(|(c, n)| (*c, *n)).collect();
        let per_conn = r.per_conn.clone();
        let (epoch, phase) = (r.epoch, r.phase);
        let secs = f64::from(r.deadline_ms) / 1e3;
        let grace_used = r.grace_used;
        let mut first_node = None;
        let mut late_sub = false;
        for (c, n) in members {
            let got = per_conn.get(&c).copied().unwrap_or(0);
            if got >= n {
                continue;
            }
            if let Some(State::Ready(p)) = self.conn(c).map(|c| &c.state) {
                first_node.get_or_insert_with(|| p.nodes.first().cloned().unwrap_or_default());
                late_sub |= p.role == Role::SubCoordinator;
                late.push(match p.role {
                    Role::SubCoordinator => {
                        format!("sub-coordinator {} ({} of {n} nodes late)", p.name, n - got)
                    }
                    _ => p.name.clone(),
                });
            }
        }
        // A late sub-coordinator fires its own, slightly earlier deadline and reports the
        // late agent by name; give its report a moment to arrive before blaming the relay.
        if late_sub && !grace_used && self.upstream.is_none() {
            let extra = (self.cfg.phase_deadline / 10)
                .clamp(Duration::from_millis(250), Duration::from_secs(2));
            if let Some(r) = self.round.as_mut() {
                r.grace_used = true;
                r.deadline = now + extra;
            }
            return;
        }
        late.sort();
        let shown = late.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        let more = late.len().saturating_sub(5);
        let reason = format!(
            "missed the {phase} deadline ({secs:.1} s){}",
            if more > 0 {
                format!(" with {more} more")
            } else {
                String::new()
            }
        );
        let node = if self.upstream.is_some() {
            first_node.unwrap_or_default()
        } else if shown.is_empty() {
            "(unknown)".to_string()
        } else {
            shown
        };
        if self.upstream.is_some() {
            if let Some(r) = self.round.as_mut() {
                r.sent_up = true;
            }
            self.send_up(Message::Fail(Fail {
                epoch,
                phase,
                node,
                reason,
            }));
        } else {
            self.fail_round(phase, &node, &reason);
        }
    }

    pub(crate) fn flush_batches(&mut self) {
        let out = std::mem::take(&mut self.value_out);
        for (id, entries) in out {
            self.send(id, &Message::Values(Values { entries }));
        }
        let Some(up) = self.upstream.as_mut() else {
            return;
        };
        let reg = std::mem::take(&mut up.pending_register);
        // Agents that finish the last phase may hang up before their neighbours arrive;
        // their Leave must follow the aggregated arrival, or the root would see a node
        // vanish mid-round.
        let leave = if self.round.is_none() {
            std::mem::take(&mut up.pending_leave)
        } else {
            Vec::new()
        };
        let gets = up.take_gets();
        let puts = !up.pending_puts.is_empty();
        if !reg.is_empty() {
            self.send_up(Message::Arrive(Arrive {
                epoch: 0,
                phase: Phase::Register,
                count: reg.len() as u32,
                reports: reg,
            }));
        }
        if !leave.is_empty() {
            self.send_up(Message::Leave(Leave { nodes: leave }));
        }
        if let Some(g) = gets {
            self.send_up(Message::Get(g));
        } else if puts {
            // send_up flushes pending puts ahead of the message; a Status query is the
            // cheapest harmless carrier, but an empty Put is clearer.
            self.send_up(Message::Put(Put {
                entries: Vec::new(),
            }));
        }
    }
}
