//! Clients of a listener of the tree that had not accepted them yet.
//!
//! The server end of such a connection waited in the listener's accept
//! queue, holding none of the client's bytes (the dump made sure), and
//! repair mode cannot put a socket into an accept queue. So the client is
//! bound to its address again and, once the whole tree is rebuilt (its
//! listener listening, in whichever process), connected anew: the
//! handshake puts a new server end into the accept queue. Then the bytes
//! the client had queued are sent and its FIN if it had shut down
//! writing; the program accepts the connection and reads the same
//! stream.
//!
//! A socket whose connect was under way (SYN_SENT) is bound and connected
//! anew the same way, after those (a listener of the tree whose accept
//! queue they fill drops its SYN, as it did): its connect completes
//! when the peer answers.

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::error::{RestoreError, Result};
use crate::sys;

/// `TCP_ESTABLISHED` and `TCP_SYN_SENT` of include/net/tcp_states.h.
const TCP_ESTABLISHED: u8 = 1;
const TCP_SYN_SENT: u8 = 2;
/// How long a connect to the restored listener may take: one host, so a
/// SYN and its answer, microseconds.
const CONNECT_WAIT: Duration = Duration::from_secs(2);

/// A client bound to its address, waiting for the tree to be rebuilt.
pub(super) struct Reconnect {
    pub pid: i32,
    pub fd: i32,
    /// The restorer's copy of the process's socket.
    pub sock: OwnedFd,
    /// The listener's address it connects to.
    pub peer: SocketAddr,
    /// What it had queued, sent or not: none of it had reached the server
    /// end.
    pub queued: Vec<u8>,
    /// It had shut down writing.
    pub fin_sent: bool,
    /// SO_SNDBUF as dumped.
    pub sndbuf: u32,
    /// SO_BUF_LOCK as dumped.
    pub buf_lock: u32,
    /// SO_REUSEADDR as the process had it.
    pub reuseaddr: bool,
    /// Its connect was under way (SYN_SENT): it is started again and not
    /// waited for; the program sees it complete when the peer answers.
    pub in_progress: bool,
}

/// Binds `sock` (fd `fd` of `pid`) to `local`, allowing address reuse for
/// now (a connection rebuilt on the same port may hold it).
pub(super) fn bind(
    pid: i32,
    fd: i32,
    sock: std::os::fd::BorrowedFd<'_>,
    local: SocketAddr,
) -> Result<()> {
    let os = |what: String| move |e| RestoreError::os(pid, format!("fd {fd}: TCP: {what}"), e);
    sys::setsockopt_int(sock, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)
        .map_err(os("SO_REUSEADDR".into()))?;
    sys::bind(sock, &local).map_err(os(format!("bind {local}")))
}

impl Reconnect {
    /// Connects to the restored listener, sends what was queued, then the
    /// FIN if there was one.
    pub(super) fn connect(&self) -> Result<()> {
        let (pid, fd, peer) = (self.pid, self.fd, self.peer);
        let os = |what: String| {
            move |e: std::io::Error| {
                RestoreError::os(
                    pid,
                    format!("fd {fd}: TCP connection not accepted yet: {what}"),
                    e,
                )
            }
        };
        let s = self.sock.as_fd();
        if self.in_progress {
            sys::connect_nonblocking(s, &peer).map_err(os(format!("connect {peer}")))?;
            log::debug!("pid {pid} fd {fd}: TCP: connect to {peer} under way again");
            return Ok(());
        }
        match sys::connect(s, &peer) {
            Ok(()) => {}
            // The process's socket may be non-blocking.
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
                let until = Instant::now() + CONNECT_WAIT;
                loop {
                    let state = sys::tcp_state(s).map_err(os("TCP_INFO".into()))?;
                    if state == TCP_ESTABLISHED {
                        break;
                    }
                    if state != TCP_SYN_SENT || Instant::now() >= until {
                        let err = sys::getsockopt_int(s, libc::SOL_SOCKET, libc::SO_ERROR)
                            .map(std::io::Error::from_raw_os_error)
                            .unwrap_or_else(|e| e);
                        return Err(os(format!("connect {peer} (state {state})"))(err));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            Err(e) => return Err(os(format!("connect {peer}"))(e)),
        }
        let room = super::refill_room(self.sndbuf, self.queued.len());
        super::force_buffer(s, libc::SO_SNDBUFFORCE, room).map_err(os("SO_SNDBUFFORCE".into()))?;
        sys::send_all(s, &self.queued)
            .map_err(os(format!("send the {} bytes queued", self.queued.len())))?;
        super::force_buffer(s, libc::SO_SNDBUFFORCE, self.sndbuf.max(1))
            .map_err(os("SO_SNDBUFFORCE".into()))?;
        super::options::lock_buffers(s, self.buf_lock).map_err(os("SO_BUF_LOCK".into()))?;
        sys::setsockopt_int(
            s,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            i32::from(self.reuseaddr),
        )
        .map_err(os("SO_REUSEADDR".into()))?;
        if self.fin_sent {
            sys::shutdown_write(s).map_err(os("shutdown (send FIN)".into()))?;
        }
        log::debug!(
            "pid {pid} fd {fd}: TCP: connected anew to {peer}, {} bytes queued",
            self.queued.len()
        );
        Ok(())
    }
}
