//! Blocking client API for node agents (the dumper and restorer) and for control tools.
//!
//! An agent's checkpoint is a fixed sequence of calls, so the dumper reads top to bottom:
//!
//! ```no_run
//! # use ckpt_coord::client::{Agent, AgentOptions};
//! # use ckpt_coord::protocol::{Intent, Phase, PhaseInfo};
//! # use ckpt_coord::auth::Secret;
//! # fn main() -> Result<(), ckpt_coord::client::ClientError> {
//! let opts = AgentOptions::new("10.0.0.1:7000", "job42", Secret::from_bytes(b"s"), "node7")
//!     .intent(Intent::Checkpoint);
//! let mut agent = Agent::connect_with(&opts)?;
//! let step = agent.wait_phase(Phase::Freeze)?; // Err(Aborted) if another node failed
//! // ... freeze the local tree ...
//! agent.report_done(Phase::Freeze, PhaseInfo::None)?;
//! agent.wait_phase(Phase::Drain)?;
//! agent.report_done(Phase::Drain, PhaseInfo::None)?;
//! agent.wait_phase(Phase::Dump)?;
//! // ... write and fsync images ...
//! agent.report_done(Phase::Dump, PhaseInfo::Dump { image_dir: "/ckpt".into(), manifest_crc32c: 0 })?;
//! agent.wait_phase(Phase::Commit)?; // epoch step.epoch is now the valid checkpoint
//! agent.wait_phase(Phase::Resume)?;
//! agent.report_done(Phase::Resume, PhaseInfo::None)?;
//! # let _ = step; Ok(()) }
//! ```
//!
//! On `Err(ClientError::Aborted { .. })` or `Err(ClientError::CoordinatorLost { .. })` the
//! agent thaws its tree unharmed and discards the epoch's images (restart: kills the restored
//! tree); the previous committed epoch stays valid.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::addr::Endpoint;
use crate::auth::{self, AuthError, Secret};
use crate::protocol::{
    Arrive, Auth, Fail, FrameReader, Get, Hello, Intent, Message, NodeReport, Phase, PhaseInfo,
    ProtocolError, Put, Role, RoundKind, RoundOver, Status, StatusQuery, Trigger, VERSION_MAX,
    VERSION_MIN,
};

/// Errors seen by agents and control clients. Each names the node and, where there is one,
/// the epoch and phase or key.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The coordinator address does not resolve.
    #[error("node {node}: cannot resolve coordinator address {addr}: {source}")]
    Resolve {
        /// Our node name.
        node: String,
        /// Address as given.
        addr: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Could not connect before the connect timeout, despite retries.
    #[error(
        "node {node}: cannot connect to coordinator {addr} after {attempts} attempts: {source}"
    )]
    Connect {
        /// Our node name.
        node: String,
        /// Coordinator.
        addr: Endpoint,
        /// Attempts made.
        attempts: u32,
        /// Last error.
        #[source]
        source: std::io::Error,
    },
    /// Socket error after connecting.
    #[error("node {node}: connection to coordinator {addr}: {source}")]
    Io {
        /// Our node name.
        node: String,
        /// Coordinator.
        addr: Endpoint,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The coordinator closed the connection (it died or shut down).
    #[error("node {node}: coordinator {addr} closed the connection")]
    CoordinatorLost {
        /// Our node name.
        node: String,
        /// Coordinator.
        addr: Endpoint,
    },
    /// The coordinator sent something undecodable.
    #[error("node {node}: bad message from coordinator {addr}: {source}")]
    Protocol {
        /// Our node name.
        node: String,
        /// Coordinator.
        addr: Endpoint,
        /// Cause.
        #[source]
        source: ProtocolError,
    },
    /// A call of the phase backend itself failed (e.g. a PMIx call).
    #[error("node {node}: {call} failed: {status}")]
    Backend {
        /// Our node name.
        node: String,
        /// The failing call.
        call: &'static str,
        /// What it returned.
        status: String,
    },
    /// The coordinator sent a message that makes no sense at this point.
    #[error("node {node}: unexpected {got} from coordinator while {during}")]
    Unexpected {
        /// Our node name.
        node: String,
        /// What we were doing.
        during: &'static str,
        /// What came.
        got: String,
    },
    /// The coordinator refused us (wrong secret, wrong job, duplicate node, job full).
    #[error("node {node}: coordinator {addr} refused the connection: {reason}")]
    Refused {
        /// Our node name.
        node: String,
        /// Coordinator.
        addr: Endpoint,
        /// Its reason.
        reason: String,
    },
    /// The peer failed to prove it holds the job secret: not our coordinator.
    #[error("node {node}: coordinator {addr} failed to prove it holds job {job}'s secret")]
    ServerAuth {
        /// Our node name.
        node: String,
        /// Peer.
        addr: Endpoint,
        /// Job.
        job: String,
    },
    /// No protocol version in common.
    #[error(
        "node {node}: coordinator {addr} chose protocol version {version}, we speak {VERSION_MIN}..={VERSION_MAX}"
    )]
    Version {
        /// Our node name.
        node: String,
        /// Coordinator.
        addr: Endpoint,
        /// Version it chose.
        version: u16,
    },
    /// The round was aborted: thaw, discard the epoch's images.
    #[error("epoch {epoch} aborted in {phase}: node {node} failed: {reason}")]
    Aborted {
        /// Aborted epoch.
        epoch: u64,
        /// Phase that was running.
        phase: Phase,
        /// Node held responsible.
        node: String,
        /// Why.
        reason: String,
    },
    /// The coordinator told us to enter a different phase than the one we waited for.
    #[error("node {node}: epoch {epoch}: waited for {expected}, coordinator started {got}")]
    UnexpectedPhase {
        /// Our node name.
        node: String,
        /// Epoch.
        epoch: u64,
        /// Phase waited for.
        expected: Phase,
        /// Phase announced.
        got: Phase,
    },
    /// Nothing arrived in time.
    #[error("node {node}: timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// Our node name.
        node: String,
        /// What we waited for.
        what: String,
        /// How long.
        timeout: Duration,
    },
    /// A key was not published before the timeout.
    #[error("node {node}: key {key:?} was not published within {timeout:?}")]
    KeyTimeout {
        /// Our node name.
        node: String,
        /// Key.
        key: String,
        /// How long we waited.
        timeout: Duration,
    },
    /// Nonce generation failed.
    #[error("node {node}: {source}")]
    Auth {
        /// Our node name.
        node: String,
        /// Cause.
        #[source]
        source: AuthError,
    },
}

/// Connection settings for an agent, a sub-coordinator's upstream link or a control client.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Coordinator address: `host:port`, or `unix:PATH` for a coordinator's Unix socket on
    /// this node.
    pub addr: String,
    /// Job id.
    pub job: String,
    /// Job secret.
    pub secret: Secret,
    /// Our node name, unique within the job.
    pub node: String,
    /// What we come for.
    pub intent: Intent,
    /// Role announced (agents leave this as [`Role::Agent`]).
    pub role: Role,
    /// Agents represented (sub-coordinators only).
    pub expect: u32,
    /// Give up connecting after this long.
    pub connect_timeout: Duration,
}

impl AgentOptions {
    /// Options for an agent with intent `Standby` and a 30 s connect timeout.
    pub fn new(addr: &str, job: &str, secret: Secret, node: &str) -> AgentOptions {
        AgentOptions {
            addr: addr.to_string(),
            job: job.to_string(),
            secret,
            node: node.to_string(),
            intent: Intent::Standby,
            role: Role::Agent,
            expect: 1,
            connect_timeout: Duration::from_secs(30),
        }
    }

    /// Sets the intent.
    pub fn intent(mut self, intent: Intent) -> AgentOptions {
        self.intent = intent;
        self
    }

    /// Sets the connect timeout.
    pub fn connect_timeout(mut self, t: Duration) -> AgentOptions {
        self.connect_timeout = t;
        self
    }
}

/// What the coordinator told an agent to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Directive {
    /// Enter a phase.
    Phase(Step),
    /// The round is aborted.
    Abort {
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

/// A phase to enter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Epoch of the round.
    pub epoch: u64,
    /// Phase.
    pub phase: Phase,
    /// Kind of round.
    pub kind: RoundKind,
    /// How long the coordinator waits for our report.
    pub deadline: Duration,
    /// Last committed epoch: the one to restore in a restart round.
    pub last_committed: Option<u64>,
}

/// Small jitter source so thousands of clients started together spread their retries.
fn jitter_fraction() -> f64 {
    let mut b = [0u8; 2];
    let _ = getrandom::fill(&mut b);
    f64::from(u16::from_le_bytes(b)) / f64::from(u16::MAX)
}

/// First retry delay of a connect.
const BACKOFF_FIRST: Duration = Duration::from_millis(5);
/// Longest retry delay: a coordinator back after a restart is found within a second.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Sleeps `delay` ±50 % (never past `start + timeout`) and returns the next delay.
fn backoff_sleep(delay: Duration, start: Instant, timeout: Duration) -> Duration {
    let sleep = delay.mul_f64(0.5 + jitter_fraction());
    std::thread::sleep(sleep.min(timeout.saturating_sub(start.elapsed())));
    (delay * 2).min(BACKOFF_MAX)
}

/// A connection to a coordinator: TCP (`TCP_NODELAY` set), or its Unix socket on this
/// node.
pub type Stream = crate::addr::Stream<TcpStream, UnixStream>;

impl Stream {
    /// Connects once, waiting at most `timeout` (TCP; a Unix connect does not wait).
    fn connect(addr: &Endpoint, timeout: Duration) -> std::io::Result<Stream> {
        match addr {
            Endpoint::Tcp(a) => TcpStream::connect_timeout(a, timeout).map(Stream::Tcp),
            Endpoint::Unix(p) => UnixStream::connect(p).map(Stream::Unix),
        }
    }

    /// Sets the timeout of blocking reads (`None`: wait forever).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }
}

/// Connects with exponential backoff and jitter: thousands of simultaneous connects fail
/// without it ("System-level Scalable Checkpoint-Restart for Petascale Computing", Cao,
/// Arya, Garg, Matott, Panda, Subramoni, Vienne, Cooperman).
fn connect_backoff(node: &str, addr: &Endpoint, timeout: Duration) -> Result<Stream, ClientError> {
    let start = Instant::now();
    let mut delay = BACKOFF_FIRST;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let left = timeout
            .saturating_sub(start.elapsed())
            .max(Duration::from_millis(1));
        match Stream::connect(addr, left.min(Duration::from_secs(5))) {
            Ok(s) => return Ok(s),
            Err(e) => {
                if start.elapsed() >= timeout {
                    return Err(ClientError::Connect {
                        node: node.to_string(),
                        addr: addr.clone(),
                        attempts,
                        source: e,
                    });
                }
                delay = backoff_sleep(delay, start, timeout);
            }
        }
    }
}

/// How a handshake failed.
enum Handshake {
    /// The connection was closed or reset before the challenge: shed by a busy
    /// coordinator, worth retrying.
    Shed(ClientError),
    /// Anything else (refused, wrong secret, timeout): final.
    Failed(ClientError),
}

impl Handshake {
    fn before_challenge(e: ClientError) -> Handshake {
        let shed = match &e {
            ClientError::CoordinatorLost { .. } => true,
            ClientError::Io { source, .. } => matches!(
                source.kind(),
                ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::ConnectionAborted
            ),
            _ => false,
        };
        if shed {
            Handshake::Shed(e)
        } else {
            Handshake::Failed(e)
        }
    }
}

impl From<ClientError> for Handshake {
    fn from(e: ClientError) -> Handshake {
        Handshake::Failed(e)
    }
}

/// A framed, authenticated, blocking connection to a coordinator.
pub struct Link {
    stream: Stream,
    reader: FrameReader,
    node: String,
    addr: Endpoint,
    last_committed: Option<u64>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("node", &self.node)
            .field("addr", &self.addr)
            .finish()
    }
}

impl Link {
    /// Connects (with backoff), sets TCP_NODELAY and runs the mutual handshake.
    pub fn open(opts: &AgentOptions) -> Result<Link, ClientError> {
        let node = opts.node.clone();
        let addr = Endpoint::resolve(&opts.addr).map_err(|source| ClientError::Resolve {
            node: node.clone(),
            addr: opts.addr.clone(),
            source,
        })?;
        let start = Instant::now();
        let mut delay = BACKOFF_FIRST;
        loop {
            let left = opts.connect_timeout.saturating_sub(start.elapsed());
            let stream = connect_backoff(&node, &addr, left)?;
            let mut link = Link {
                stream,
                reader: FrameReader::new(),
                node: node.clone(),
                addr: addr.clone(),
                last_committed: None,
            };
            // Barrier messages are tiny and latency-bound: never let Nagle hold them back.
            if let Stream::Tcp(s) = &link.stream {
                s.set_nodelay(true).map_err(|e| link.io(e))?;
            }
            match link.handshake(opts) {
                Ok(()) => return Ok(link),
                // Closed before the coordinator said anything: it shed the connection
                // (too many handshakes in flight, out of descriptors). Like a refused
                // connect, that passes: try again with the same backoff.
                Err(Handshake::Shed(_)) if start.elapsed() < opts.connect_timeout => {
                    delay = backoff_sleep(delay, start, opts.connect_timeout);
                }
                Err(Handshake::Shed(e) | Handshake::Failed(e)) => return Err(e),
            }
        }
    }

    fn io(&self, source: std::io::Error) -> ClientError {
        ClientError::Io {
            node: self.node.clone(),
            addr: self.addr.clone(),
            source,
        }
    }

    fn handshake(&mut self, opts: &AgentOptions) -> Result<(), Handshake> {
        let client_nonce = auth::nonce().map_err(|source| ClientError::Auth {
            node: self.node.clone(),
            source,
        })?;
        let hello = self.send(&Message::Hello(Hello {
            min_version: VERSION_MIN,
            max_version: VERSION_MAX,
            job: opts.job.clone(),
            node: opts.node.clone(),
            role: opts.role,
            intent: opts.intent,
            expect: opts.expect,
            client_nonce,
        }));
        let hs = Some(Duration::from_secs(30));
        let first = hello.and_then(|()| self.recv(hs, "waiting for the challenge"));
        let ch = match first.map_err(Handshake::before_challenge)? {
            Message::Challenge(c) => c,
            Message::Refused(r) => return Err(self.refused(r.reason).into()),
            m => return Err(self.unexpected("waiting for the challenge", &m).into()),
        };
        if !(VERSION_MIN..=VERSION_MAX).contains(&ch.version) {
            return Err(ClientError::Version {
                node: self.node.clone(),
                addr: self.addr.clone(),
                version: ch.version,
            }
            .into());
        }
        if !opts
            .secret
            .verify_server(&opts.job, &client_nonce, &ch.server_nonce, &ch.server_proof)
        {
            // Answer anyway, so a genuine coordinator (and we hold the wrong secret) logs
            // the refusal on its side too; the proof reveals nothing about our secret.
            let proof = opts.secret.client_proof(
                &opts.job,
                &opts.node,
                opts.role,
                &ch.server_nonce,
                &client_nonce,
            );
            let _ = self.send(&Message::Auth(Auth { proof }));
            return Err(ClientError::ServerAuth {
                node: self.node.clone(),
                addr: self.addr.clone(),
                job: opts.job.clone(),
            }
            .into());
        }
        let proof = opts.secret.client_proof(
            &opts.job,
            &opts.node,
            opts.role,
            &ch.server_nonce,
            &client_nonce,
        );
        self.send(&Message::Auth(Auth { proof }))?;
        match self.recv(hs, "waiting for the welcome")? {
            Message::Welcome(w) => {
                self.last_committed = w.last_committed;
                Ok(())
            }
            Message::Refused(r) => Err(self.refused(r.reason).into()),
            m => Err(self.unexpected("waiting for the welcome", &m).into()),
        }
    }

    fn refused(&self, reason: String) -> ClientError {
        ClientError::Refused {
            node: self.node.clone(),
            addr: self.addr.clone(),
            reason,
        }
    }

    fn unexpected(&self, during: &'static str, m: &Message) -> ClientError {
        ClientError::Unexpected {
            node: self.node.clone(),
            during,
            got: format!("{:?}", m.msg_type()),
        }
    }

    /// Sends one message.
    pub fn send(&mut self, m: &Message) -> Result<(), ClientError> {
        let bytes = m.encode().map_err(|source| ClientError::Protocol {
            node: self.node.clone(),
            addr: self.addr.clone(),
            source,
        })?;
        self.stream.write_all(&bytes).map_err(|e| self.io(e))
    }

    /// Sends messages already framed (several in one write).
    pub fn send_encoded(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes).map_err(|e| self.io(e))
    }

    /// Receives one message, waiting at most `timeout` (forever if `None`).
    pub fn recv(&mut self, timeout: Option<Duration>, what: &str) -> Result<Message, ClientError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut buf = [0u8; 16 * 1024];
        loop {
            match self.reader.next_message() {
                Ok(Some(m)) => return Ok(m),
                Ok(None) => {}
                Err(source) => {
                    return Err(ClientError::Protocol {
                        node: self.node.clone(),
                        addr: self.addr.clone(),
                        source,
                    });
                }
            }
            let left = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(ClientError::Timeout {
                            node: self.node.clone(),
                            what: what.to_string(),
                            timeout: timeout.unwrap_or_default(),
                        });
                    }
                    Some(left)
                }
                None => None,
            };
            self.stream.set_read_timeout(left).map_err(|e| self.io(e))?;
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    return Err(ClientError::CoordinatorLost {
                        node: self.node.clone(),
                        addr: self.addr.clone(),
                    });
                }
                Ok(n) => self.reader.push(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                    return Err(ClientError::CoordinatorLost {
                        node: self.node.clone(),
                        addr: self.addr.clone(),
                    });
                }
                Err(e) => return Err(self.io(e)),
            }
        }
    }

    /// Hands the socket over (a sub-coordinator moves it into its poll loop).
    pub fn into_parts(self) -> (Stream, FrameReader, Option<u64>) {
        (self.stream, self.reader, self.last_committed)
    }
}

/// The phase API a checkpoint agent needs. [`Agent`] carries it over the TCP coordinator;
/// with the `pmix` cargo feature, `pmix::PmixBackend` carries it over PMIx
/// Put/Commit/Fence/Get (under Slurm's `--mpi=pmix` or Open MPI's `mpirun`).
pub trait PhaseBackend {
    /// Blocks until the coordinator starts `expected`.
    fn wait_phase(&mut self, expected: Phase) -> Result<Step, ClientError>;
    /// Reports this node finished `phase`.
    fn report_done(&mut self, phase: Phase, info: PhaseInfo) -> Result<(), ClientError>;
    /// Reports this node failed `phase`; the round aborts.
    fn report_failed(&mut self, phase: Phase, reason: &str) -> Result<(), ClientError>;
    /// Publishes a key/value pair (restart PUBLISH phase).
    fn put(&mut self, key: &str, value: &[u8]) -> Result<(), ClientError>;
    /// Fetches a key, blocking until it exists or `timeout` passes.
    fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>, ClientError>;
}

/// One node's agent connection.
#[derive(Debug)]
pub struct Agent {
    link: Link,
    queued: VecDeque<Directive>,
    values: HashMap<String, Option<Vec<u8>>>,
    current: Option<Step>,
    /// A phase of this epoch already acknowledged ahead ([`Agent::report_done_ahead`]).
    done_ahead: Option<(u64, Phase)>,
}

impl Agent {
    /// Registers as `node` of `job` with intent `Standby`.
    pub fn connect(
        addr: &str,
        job: &str,
        secret: Secret,
        node: &str,
    ) -> Result<Agent, ClientError> {
        Agent::connect_with(&AgentOptions::new(addr, job, secret, node))
    }

    /// Registers with explicit options.
    pub fn connect_with(opts: &AgentOptions) -> Result<Agent, ClientError> {
        Ok(Agent {
            link: Link::open(opts)?,
            queued: VecDeque::new(),
            values: HashMap::new(),
            current: None,
            done_ahead: None,
        })
    }

    /// Our node name.
    pub fn node(&self) -> &str {
        &self.link.node
    }

    /// Last committed epoch as of registration.
    pub fn last_committed(&self) -> Option<u64> {
        self.link.last_committed
    }

    /// Reads messages until `done` says stop; values are cached, directives queued.
    fn pump(&mut self, timeout: Option<Duration>, what: &str) -> Result<(), ClientError> {
        match self.link.recv(timeout, what)? {
            Message::PhaseCmd(p) => self.queued.push_back(Directive::Phase(Step {
                epoch: p.epoch,
                phase: p.phase,
                kind: p.kind,
                deadline: Duration::from_millis(u64::from(p.deadline_ms)),
                last_committed: p.last_committed,
            })),
            Message::Abort(a) => self.queued.push_back(Directive::Abort {
                epoch: a.epoch,
                phase: a.phase,
                node: a.node,
                reason: a.reason,
            }),
            Message::Values(v) => {
                for (k, val) in v.entries {
                    self.values.insert(k, val);
                }
            }
            m => return Err(self.link.unexpected("waiting for the coordinator", &m)),
        }
        Ok(())
    }

    /// Next directive, waiting at most `timeout` (forever if `None`).
    pub fn next_directive(&mut self, timeout: Option<Duration>) -> Result<Directive, ClientError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(d) = self.queued.pop_front() {
                if let Directive::Phase(s) = &d {
                    self.current = Some(*s);
                }
                return Ok(d);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            self.pump(left, "the next phase")?;
        }
    }

    /// Waits for `expected`; an abort becomes `Err(Aborted)`, another phase `Err(UnexpectedPhase)`.
    pub fn wait_phase_timeout(
        &mut self,
        expected: Phase,
        timeout: Option<Duration>,
    ) -> Result<Step, ClientError> {
        match self.next_directive(timeout)? {
            Directive::Phase(s) if s.phase == expected => Ok(s),
            Directive::Phase(s) => Err(ClientError::UnexpectedPhase {
                node: self.link.node.clone(),
                epoch: s.epoch,
                expected,
                got: s.phase,
            }),
            Directive::Abort {
                epoch,
                phase,
                node,
                reason,
            } => Err(ClientError::Aborted {
                epoch,
                phase,
                node,
                reason,
            }),
        }
    }

    fn epoch(&self) -> u64 {
        self.current.map(|s| s.epoch).unwrap_or(0)
    }

    /// Fetches several keys with one request; fails on the first key that times out.
    pub fn get_many(
        &mut self,
        keys: &[&str],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, ClientError> {
        let missing: Vec<String> = keys
            .iter()
            .filter(|k| !matches!(self.values.get(**k), Some(Some(_))))
            .map(|k| k.to_string())
            .collect();
        for k in &missing {
            self.values.remove(k);
        }
        if !missing.is_empty() {
            let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
            self.link.send(&Message::Get(Get {
                keys: missing,
                timeout_ms: ms,
            }))?;
        }
        // The coordinator answers every key (value or timeout); the local deadline only
        // guards against a coordinator that stops answering.
        let deadline = Instant::now() + timeout + Duration::from_secs(5);
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            loop {
                match self.values.get(*k) {
                    Some(Some(v)) => {
                        out.push(v.clone());
                        break;
                    }
                    Some(None) => {
                        self.values.remove(*k);
                        return Err(ClientError::KeyTimeout {
                            node: self.link.node.clone(),
                            key: k.to_string(),
                            timeout,
                        });
                    }
                    None => {}
                }
                if let Some(Directive::Abort {
                    epoch,
                    phase,
                    node,
                    reason,
                }) = self
                    .queued
                    .iter()
                    .find(|d| matches!(d, Directive::Abort { .. }))
                {
                    return Err(ClientError::Aborted {
                        epoch: *epoch,
                        phase: *phase,
                        node: node.clone(),
                        reason: reason.clone(),
                    });
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ClientError::KeyTimeout {
                        node: self.link.node.clone(),
                        key: k.to_string(),
                        timeout,
                    });
                }
                self.pump(Some(left), "key values")?;
            }
        }
        Ok(out)
    }

    /// Publishes many pairs in one message.
    pub fn put_many(&mut self, entries: Vec<(String, Vec<u8>)>) -> Result<(), ClientError> {
        self.link.send(&Message::Put(Put { entries }))
    }
}

impl Agent {
    /// Blocks until the coordinator starts `expected`; see [`PhaseBackend::wait_phase`].
    pub fn wait_phase(&mut self, expected: Phase) -> Result<Step, ClientError> {
        self.wait_phase_timeout(expected, None)
    }

    /// Reports this node finished `phase`, with its result.
    pub fn report_done(&mut self, phase: Phase, info: PhaseInfo) -> Result<(), ClientError> {
        let epoch = self.epoch();
        if self.done_ahead == Some((epoch, phase)) {
            // Already acknowledged with the phase before it.
            return Ok(());
        }
        let arrive = self.arrival(epoch, phase, info);
        self.link.send(&arrive)
    }

    /// Reports `phase` done and, in the same write, the phase after it (`ahead`), in
    /// which this node has nothing to do: DRAIN for a node without interconnect state to
    /// drain ([`Phase::may_arrive_ahead`]). The coordinator holds that arrival until
    /// `ahead` starts; when every node did this it sends `ahead`'s command and the next
    /// one together, saving a barrier round trip. The agent still waits for `ahead` with
    /// [`Agent::wait_phase`]; its [`Agent::report_done`] is then a no-op.
    pub fn report_done_ahead(
        &mut self,
        phase: Phase,
        info: PhaseInfo,
        ahead: Phase,
    ) -> Result<(), ClientError> {
        if !ahead.may_arrive_ahead() {
            return Err(ClientError::Unexpected {
                node: self.link.node.clone(),
                during: "reporting a phase ahead",
                got: format!("{ahead} may not be acknowledged ahead"),
            });
        }
        let epoch = self.epoch();
        let mut bytes = Vec::new();
        for m in [
            self.arrival(epoch, phase, info),
            self.arrival(epoch, ahead, PhaseInfo::None),
        ] {
            m.encode_into(&mut bytes)
                .map_err(|source| ClientError::Protocol {
                    node: self.link.node.clone(),
                    addr: self.link.addr.clone(),
                    source,
                })?;
        }
        self.done_ahead = Some((epoch, ahead));
        self.link.send_encoded(&bytes)
    }

    fn arrival(&self, epoch: u64, phase: Phase, info: PhaseInfo) -> Message {
        let reports = match info {
            PhaseInfo::None => Vec::new(),
            info => vec![NodeReport {
                node: self.link.node.clone(),
                info,
            }],
        };
        Message::Arrive(Arrive {
            epoch,
            phase,
            count: 1,
            reports,
        })
    }

    /// Reports this node failed `phase`; the coordinator aborts the epoch.
    pub fn report_failed(&mut self, phase: Phase, reason: &str) -> Result<(), ClientError> {
        let epoch = self.epoch();
        let node = self.link.node.clone();
        self.link.send(&Message::Fail(Fail {
            epoch,
            phase,
            node,
            reason: reason.to_string(),
        }))
    }

    /// Publishes a key/value pair (restart PUBLISH phase).
    pub fn put(&mut self, key: &str, value: &[u8]) -> Result<(), ClientError> {
        self.put_many(vec![(key.to_string(), value.to_vec())])
    }

    /// Fetches a key, blocking until it is published or `timeout` passes.
    pub fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>, ClientError> {
        Ok(self.get_many(&[key], timeout)?.remove(0))
    }
}

impl PhaseBackend for Agent {
    fn wait_phase(&mut self, expected: Phase) -> Result<Step, ClientError> {
        Agent::wait_phase(self, expected)
    }

    fn report_done(&mut self, phase: Phase, info: PhaseInfo) -> Result<(), ClientError> {
        Agent::report_done(self, phase, info)
    }

    fn report_failed(&mut self, phase: Phase, reason: &str) -> Result<(), ClientError> {
        Agent::report_failed(self, phase, reason)
    }

    fn put(&mut self, key: &str, value: &[u8]) -> Result<(), ClientError> {
        Agent::put(self, key, value)
    }

    fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>, ClientError> {
        Agent::get(self, key, timeout)
    }
}

/// An operator's connection: trigger rounds, read status.
#[derive(Debug)]
pub struct Control {
    link: Link,
}

impl Control {
    /// Connects as a control client named `name`.
    pub fn connect(
        addr: &str,
        job: &str,
        secret: Secret,
        name: &str,
    ) -> Result<Control, ClientError> {
        let mut o = AgentOptions::new(addr, job, secret, name);
        o.role = Role::Control;
        o.expect = 0;
        o.connect_timeout = Duration::from_secs(10);
        Ok(Control {
            link: Link::open(&o)?,
        })
    }

    /// Starts a round (as soon as every node is registered) and waits for its outcome.
    pub fn trigger(
        &mut self,
        kind: RoundKind,
        timeout: Option<Duration>,
    ) -> Result<RoundOver, ClientError> {
        self.link.send(&Message::Trigger(Trigger { kind }))?;
        match self.link.recv(timeout, "the round to end")? {
            Message::RoundOver(r) => Ok(r),
            m => Err(self.link.unexpected("waiting for the round to end", &m)),
        }
    }

    /// The coordinator's state.
    pub fn status(&mut self) -> Result<Status, ClientError> {
        self.link.send(&Message::StatusQuery(StatusQuery {}))?;
        match self.link.recv(Some(Duration::from_secs(10)), "status")? {
            Message::Status(s) => Ok(s),
            m => Err(self.link.unexpected("waiting for status", &m)),
        }
    }
}
