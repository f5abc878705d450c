//! The connection table: reads, framing, buffered output, closing, timers, the parent
//! link, and the handshake of each connection ([`crate::handshake`] decides, this module
//! sends its answers).

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use mio::net::{TcpStream, UnixStream};
use mio::{Interest, Registry, Token};

use super::{FIRST_CONN, Server, ServerError, UPSTREAM};
use crate::addr::PeerAddr;
use crate::auth;
use crate::client::{self, AgentOptions, Link};
use crate::engine::Event;
use crate::handshake::{Blame, Handshake, Step, Verifier};
use crate::kv::ConnId;
use crate::protocol::{FrameReader, Intent, Message, Refused, Role};
use crate::sys;
use crate::throttle::Noise;

/// Unauthenticated peers may not make us buffer more than this.
const PREAUTH_LIMIT: usize = 4096;
/// Size of the one reusable read buffer.
const READ_BUF_LEN: usize = 64 * 1024;
/// How long a refused peer has to read the reason before we hang up.
const REFUSE_LINGER: Duration = Duration::from_secs(2);
/// How long a sub-coordinator keeps trying to reach its parent at startup.
const PARENT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// The I/O layer's reason for a peer that hung up cleanly (not worth a log line before
/// authentication).
const CLOSED_BY_PEER: &str = "connection closed";
/// The reason given when the handshake timer runs out.
const HANDSHAKE_TIMED_OUT: &str = "handshake timed out";

/// Where a connection is in its life.
enum ConnState {
    /// Not authenticated yet.
    Handshake(Handshake),
    /// Authenticated: its messages go to the engine.
    Ready,
    /// Refused: we wait for the peer to read our reason and hang up.
    Closing,
}

/// One connection's socket: TCP, or a Unix stream socket from a local agent.
pub(super) type Stream = crate::addr::Stream<TcpStream, UnixStream>;

impl Stream {
    pub(super) fn shutdown_write(&self) -> std::io::Result<()> {
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

/// The credentials of a Unix peer as its address; `None` if the kernel cannot say (the
/// connection is then dropped).
pub(super) fn unix_peer(s: &impl AsRawFd) -> Option<PeerAddr> {
    sys::peer_cred(s.as_raw_fd())
        .ok()
        .map(|(pid, uid)| PeerAddr::Unix { pid, uid })
}

/// One connection and its buffers.
pub(super) struct Conn {
    pub(super) id: ConnId,
    pub(super) stream: Stream,
    pub(super) addr: PeerAddr,
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
    pub(super) fn new(id: ConnId, stream: Stream, addr: PeerAddr, reader: FrameReader) -> Conn {
        Conn {
            id,
            stream,
            addr,
            reader,
            out: Vec::new(),
            out_pos: 0,
            dirty: false,
            write_armed: false,
            state: ConnState::Handshake(Handshake::AwaitHello),
        }
    }
}

/// Bytes moved and peers refused, for status answers.
#[derive(Debug, Default)]
pub(super) struct Traffic {
    pub(super) bytes_in: u64,
    pub(super) bytes_out: u64,
    pub(super) refused: u64,
}

/// A connection to act on once `at` has passed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timer {
    at: Instant,
    conn: ConnId,
}

impl Server {
    /// Connects to the parent (with backoff), authenticates, and moves the socket into the
    /// poll loop.
    pub(super) fn connect_upstream(&mut self, parent: &str) -> Result<(), ServerError> {
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

    pub(super) fn alloc_token(&mut self) -> usize {
        self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1 + FIRST_CONN
        })
    }

    pub(super) fn slot(&mut self, token: usize) -> Option<&mut Conn> {
        if token == UPSTREAM.0 {
            return self.upstream.as_mut();
        }
        self.conns
            .get_mut(token.checked_sub(FIRST_CONN)?)
            .and_then(|c| c.as_mut())
    }

    pub(super) fn conn(&mut self, id: ConnId) -> Option<&mut Conn> {
        self.slot(id.token).filter(|c| c.id == id)
    }

    pub(super) fn read_conn(&mut self, token: usize, to_eof: bool) {
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

    pub(super) fn flush_conn(&mut self, token: usize) {
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

    pub(super) fn flush_dirty(&mut self) {
        let dirty = std::mem::take(&mut self.dirty);
        for t in dirty {
            self.flush_conn(t);
        }
    }

    pub(super) fn send(&mut self, id: ConnId, m: &Message) {
        let name = self.cfg.name.clone();
        let Some(conn) = self.conn(id) else {
            return;
        };
        if let Err(e) = m.encode_into(&mut conn.out) {
            // A bug, not the peer's doing: shown whatever `emit_log` says.
            log::error!(
                "coord[{name}]: cannot encode {:?} for {}: {e}",
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

    pub(super) fn broadcast(&mut self, to: &[ConnId], m: &Message) {
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

    pub(super) fn refuse(&mut self, id: ConnId, reason: &str) {
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
    pub(super) fn take_conn(&mut self, id: ConnId) -> Option<Conn> {
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
    pub(super) fn close(&mut self, id: ConnId, reason: &str) {
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
            ConnState::Handshake(_) => {
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

    /// One message on connection `id`: the engine's once authenticated, else the
    /// handshake's.
    fn handle(&mut self, id: ConnId, m: Message) {
        if id.token == UPSTREAM.0 {
            self.feed(Event::FromParent(m));
            return;
        }
        let Some(conn) = self.conn(id) else {
            return;
        };
        let addr = conn.addr;
        match conn.state {
            ConnState::Handshake(_) => {}
            ConnState::Ready => {
                self.feed(Event::Received { conn: id, msg: m });
                return;
            }
            ConnState::Closing => return,
        }
        // Whatever the step, this state is over; a refusal leaves the connection closing.
        let ConnState::Handshake(handshake) =
            std::mem::replace(&mut conn.state, ConnState::Closing)
        else {
            return;
        };
        let v = Verifier {
            job: &self.cfg.job,
            secret: &self.cfg.secret,
        };
        match handshake.receive(m, addr, v, auth::nonce) {
            Step::Challenge { reply, next } => {
                self.send(id, &Message::Challenge(reply));
                if let Some(conn) = self.conn(id) {
                    conn.state = ConnState::Handshake(next);
                }
            }
            Step::Refuse(r) => {
                match r.blame {
                    Blame::Peer => self.noise(Noise::Refused, r.line),
                    Blame::Coordinator => self.log_line(r.line),
                }
                self.refuse(id, r.reason);
            }
            Step::Joined(j) => {
                if let Some(conn) = self.conn(id) {
                    conn.state = ConnState::Ready;
                }
                // Authenticated: no longer subject to the caps or the handshake timer.
                self.admission.remove(id);
                // Whether the peer may register (and what that sets off) is the engine's.
                self.feed(Event::Joined {
                    conn: id,
                    addr,
                    role: j.role,
                    name: j.name,
                    intent: j.intent,
                });
            }
        }
    }

    /// The handshake and refusal timers, the log throttle, then the engine's tick.
    pub(super) fn timers(&mut self, now: Instant) {
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
        self.tick(now);
    }
}
