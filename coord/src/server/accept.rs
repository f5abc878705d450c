//! The listeners, and admission of the connections they hand over.
//!
//! Connections are taken off each listen queue in batches, so a flood of connects cannot
//! starve the connections already held. Each one goes through the caps on
//! unauthenticated connections first ([`crate::admit`] decides who is admitted, evicted
//! or shed; this module closes), before any buffer exists. Out of descriptors, the loop
//! makes room by closing the oldest unauthenticated connection or, failing that, by
//! spending the reserve descriptor to take and close a queued one.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, UnixListener};
use mio::{Interest, Poll, Token};

use super::conn::{Conn, Stream, unix_peer};
use super::{CoordConfig, FIRST_CONN, LISTENER, Server, ServerError, UNIX_LISTENER};
use crate::addr::PeerAddr;
use crate::admit::{Admission, Cap, Source, Verdict};
use crate::kv::ConnId;
use crate::protocol::FrameReader;
use crate::socket_file::SocketFile;
use crate::sys;
use crate::throttle::Noise;

/// std's backlog of 128 drops SYNs when thousands of agents connect at once; the kernel
/// caps this at net.core.somaxconn.
const LISTEN_BACKLOG: i32 = 4096;
/// Connections taken off the listen queue per loop iteration: a flood of connects must
/// not starve the connections already held (a control client's `status`, the handshake
/// timers); the rest are taken in the next iteration, which then does not wait in poll.
const ACCEPT_BATCH: usize = 256;
/// How long the loop leaves the listener alone when it is out of descriptors and cannot
/// shed (the reserve is gone): retrying at once would only spin.
const FD_EXHAUSTED_PAUSE: Duration = Duration::from_millis(50);
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

/// The TCP listener and, with `--listen-unix`, the Unix one, registered with `poll`.
type Listeners = (TcpListener, Option<(UnixListener, SocketFile)>);

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

/// What [`Server::make_room`] managed when out of descriptors.
enum Room {
    /// A descriptor was freed or a queued connection shed: accept again.
    Made,
    /// Nothing is queued any more.
    QueueEmpty,
    /// Neither: leave the listener alone for [`FD_EXHAUSTED_PAUSE`].
    Stuck,
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

/// Binds the listeners of `cfg` and registers them with `poll`.
pub(super) fn listeners(cfg: &CoordConfig, poll: &Poll) -> Result<Listeners, ServerError> {
    let poll_err = |source| ServerError::Poll {
        name: cfg.name.clone(),
        source,
    };
    let std_listener = bind(cfg.listen).map_err(|source| ServerError::Bind {
        name: cfg.name.clone(),
        job: cfg.job.clone(),
        addr: cfg.listen,
        source,
    })?;
    let mut listener = TcpListener::from_std(std_listener);
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .map_err(poll_err)?;
    let Some(path) = &cfg.listen_unix else {
        return Ok((listener, None));
    };
    let (l, file) =
        SocketFile::bind(path, LISTEN_BACKLOG).map_err(|source| ServerError::BindUnix {
            name: cfg.name.clone(),
            job: cfg.job.clone(),
            path: path.clone(),
            source,
        })?;
    let mut l = UnixListener::from_std(l);
    poll.registry()
        .register(&mut l, UNIX_LISTENER, Interest::READABLE)
        .map_err(poll_err)?;
    Ok((listener, Some((l, file))))
}

/// Sizes the caps on unauthenticated connections: the configured ones, with the total
/// lowered so that it, `expect` authenticated peers, some control clients and the
/// process's own descriptors fit under the descriptor limit (authenticated peers must
/// never be the ones left without a descriptor). Returns the caps and a line saying why.
pub(super) fn admission_for(cfg: &CoordConfig) -> (Admission, String) {
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

impl Server {
    /// Takes up to [`ACCEPT_BATCH`] connections off each listen queue (TCP, then the
    /// Unix socket), admitting each, evicting an older unauthenticated one for it, or
    /// closing it at once.
    pub(super) fn accept_batch(&mut self, now: Instant) {
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
}
