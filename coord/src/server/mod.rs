//! The coordinator's I/O layer: one `mio` poll loop holding every connection of one job.
//!
//! This layer only moves bytes and runs what the state machines decide:
//!
//! * `mod.rs` (here): the poll loop, its startup and its one log sink;
//! * `conn`: the connection table, reads, framing ([`crate::protocol`]), output buffered
//!   per connection and flushed once per poll iteration, closing, the parent link;
//! * `accept`: the listeners, and admission of new connections under the caps on
//!   unauthenticated ones (`admit.rs` decides, `accept` closes);
//! * `engine_io`: feeding the engine and carrying out its actions;
//! * `writer`: the epoch store's durable writes ([`crate::store`]), on their own thread.
//!
//! Everything a coordinator decides (registration, rounds, barriers, aborts, the
//! key/value exchange, relaying) is the engine's (`engine.rs`, a state machine without
//! I/O), and the handshake's (`handshake.rs`, the same for authentication and version
//! negotiation): the loop feeds them events with the current time and carries out what
//! they return. A store action the engine waits for (reserve an epoch, commit) goes to
//! the writer thread; until its answer is back the loop keeps serving sockets and
//! handshakes but holds every further engine event, then feeds the answer first and the
//! held events after it, so the engine sees events in the same order as if the write had
//! been done on the spot. With a parent address the same loop also holds the link to the
//! parent and the engine runs the relay policy (`relay.rs`) instead of the root's
//! (`root.rs`).
//!
//! Besides its TCP listener it may listen on a Unix stream socket (`--listen-unix`, the
//! file made by `socket_file.rs`) for agents on its own node; a connection is
//! either kind (`conn::Stream`) and is otherwise treated the same, caps and all.
//!
//! Log lines go to the `log` facade at info level (when [`CoordConfig::emit_log`]) and to
//! an in-memory tail ([`CoordHandle::log_lines`]).

mod accept;
mod config;
mod conn;
mod engine_io;
mod handle;
mod writer;

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, UnixListener};
use mio::{Events, Poll, Token, Waker};

use crate::admit::Admission;
use crate::engine::Engine;
use crate::socket_file::SocketFile;
use crate::state::EngineConfig;
use crate::store::EpochStore;
use crate::sys::ReserveFd;
use crate::throttle::LogThrottle;

pub use config::{CoordConfig, FaultPoint, ServerError};
pub use handle::{CoordHandle, Stopper, run, spawn};

use conn::{Conn, Timer, Traffic};
use engine_io::EngineGate;
use writer::StoreWriter;

const LISTENER: Token = Token(0);
/// Wakes the loop: a stop request, or a store write done.
const WAKER: Token = Token(1);
/// The link to the parent coordinator.
const UPSTREAM: Token = Token(2);
/// The Unix socket listener (`--listen-unix`).
const UNIX_LISTENER: Token = Token(3);
const FIRST_CONN: usize = 4;
/// Log lines kept in memory for [`CoordHandle::log_lines`].
const LOG_KEEP: usize = 2000;
/// Events taken per poll call.
const EVENTS_CAPACITY: usize = 4096;
/// Longest poll wait: parked gets and timers are checked at least this often.
const MAX_POLL_WAIT: Duration = Duration::from_millis(100);
/// Shortest poll wait, so a deadline just passed does not spin the loop.
const MIN_POLL_WAIT: Duration = Duration::from_millis(1);
/// Each kind of externally caused log line (refusals, timeouts, out of descriptors) is
/// logged at most once per this interval, with a count of the rest.
const NOISE_INTERVAL: Duration = Duration::from_secs(1);

type LogBuf = Arc<Mutex<VecDeque<String>>>;

struct Server {
    cfg: CoordConfig,
    poll: Poll,
    /// Shared with [`CoordHandle`] and the store writer: mio allows one per poll.
    waker: Arc<Waker>,
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
    /// Engine events held while it waits for the store.
    gate: EngineGate,
    /// The epoch store's writer thread (root only).
    writer: Option<StoreWriter>,
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
    read_buf: Vec<u8>,
}

/// The engine of `cfg`, with the epoch store a root commits to.
fn engine_and_store(cfg: &CoordConfig) -> Result<(Engine, Option<EpochStore>), ServerError> {
    let engine_cfg = EngineConfig {
        name: cfg.name.clone(),
        job: cfg.job.clone(),
        expect: cfg.expect,
        phase_deadline: cfg.phase_deadline,
    };
    if let Some(parent) = &cfg.parent {
        return Ok((Engine::relay(engine_cfg, parent), None));
    }
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
    Ok((Engine::root(engine_cfg, last), Some(store)))
}

impl Server {
    fn new(cfg: CoordConfig) -> Result<Server, ServerError> {
        let poll_err = |source| ServerError::Poll {
            name: cfg.name.clone(),
            source,
        };
        let poll = Poll::new().map_err(poll_err)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).map_err(poll_err)?);
        let (listener, unix) = accept::listeners(&cfg, &poll)?;
        let (engine, store) = engine_and_store(&cfg)?;
        let writer = store
            .map(|s| StoreWriter::start(s, waker.clone(), &cfg.name))
            .transpose()
            .map_err(|source| ServerError::StoreWriter {
                name: cfg.name.clone(),
                source,
            })?;
        let reserve = ReserveFd::open().map_err(|source| ServerError::Reserve {
            name: cfg.name.clone(),
            source,
        })?;
        let (admission, caps_note) = accept::admission_for(&cfg);
        Ok(Server {
            cfg,
            poll,
            waker,
            listener,
            unix,
            stop: Arc::new(AtomicBool::new(false)),
            conns: Vec::new(),
            free: Vec::new(),
            serial: 0,
            dirty: Vec::new(),
            upstream: None,
            engine,
            gate: EngineGate::default(),
            writer,
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
            read_buf: Vec::new(),
        })
    }

    /// The one sink of the coordinator's log lines: the `log` facade (the binary's logger
    /// times them and decides where they go) and the in-memory tail.
    fn log_line(&self, line: String) {
        if self.cfg.emit_log {
            log::info!("coord[{}]: {line}", self.cfg.name);
        }
        if let Ok(mut l) = self.logs.lock() {
            if l.len() >= LOG_KEEP {
                l.pop_front();
            }
            l.push_back(line);
        }
    }

    /// Logs a line caused from outside through the rate limit.
    fn noise(&mut self, kind: crate::throttle::Noise, line: String) {
        for l in self.throttle.note(kind, Instant::now(), line) {
            self.log_line(l);
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
            // Whatever the writer finished (it woke us, or this iteration just saw it).
            if !self.crashed {
                self.store_answers();
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
        // While the engine waits for the store it gets no ticks: its deadlines wait too,
        // and the writer wakes the loop when it is done.
        let deadline = self.engine.next_deadline().filter(|_| !self.gate.waiting());
        deadline
            .map_or(MAX_POLL_WAIT, |d| {
                MAX_POLL_WAIT.min(d.saturating_duration_since(now))
            })
            .max(MIN_POLL_WAIT)
    }
}
