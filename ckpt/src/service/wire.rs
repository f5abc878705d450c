//! The service's socket and its messages: the one place the CLI passes fds
//! between processes (raw socket calls, through nix where it has them).
//!
//! A `SOCK_SEQPACKET` Unix socket keeps message boundaries, so every
//! message is one `sendmsg`:
//! - client → service, first: [`REQUEST_MAGIC`], the number of arguments
//!   (4 bytes, little-endian), the arguments after `ckpt` and then the
//!   client's environment (`KEY=VALUE`), each ending in NUL; with it, as
//!   `SCM_RIGHTS`, the client's working directory and its fds 0, 1 and 2;
//! - client → service, later: [`SIGNAL_TAG`] and a signal number (4 bytes,
//!   little-endian) to pass on to the worker;
//! - service → client, last: [`EXIT_TAG`] and the exit code (1 byte), or
//!   [`BUSY`] alone for a request it did not take.

// The crate denies unsafe code; this module is its one thin layer of raw
// socket calls (fds received from the kernel, `SO_PEERGROUPS`) and the
// worker's pidfd.
#![allow(unsafe_code)]

use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use nix::sys::socket::{
    self, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    UnixAddr,
};

/// Starts every request (and names the protocol's version).
pub const REQUEST_MAGIC: &[u8] = b"CKPT-SERVICE-2\0";
/// Starts a signal message.
pub const SIGNAL_TAG: &[u8] = b"SIG\0";
/// Starts the exit message.
pub const EXIT_TAG: &[u8] = b"EXIT";
/// The whole message of a service too busy to take the request.
pub const BUSY: &[u8] = b"BUSY";
/// Largest request: arguments are paths and flags, never data, and the
/// environment a job is started with (`ckpt run`); within what a
/// `SOCK_SEQPACKET` message may hold by default.
pub const MAX_REQUEST: usize = 128 * 1024;
/// Most arguments and environment entries a request may carry.
pub const MAX_ARGS: usize = 4096;
/// The fds a request carries: cwd, stdin, stdout, stderr.
const REQUEST_FDS: usize = 4;

/// What went wrong on the socket.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A socket call failed.
    #[error("{call}: {source}")]
    Os {
        /// The call.
        call: &'static str,
        /// Its error.
        #[source]
        source: nix::Error,
    },
    /// The peer sent something that is not a message of this protocol.
    #[error("malformed message: {0}")]
    Malformed(&'static str),
    /// The peer closed the connection.
    #[error("connection closed")]
    Closed,
}

fn os(call: &'static str) -> impl FnOnce(nix::Error) -> WireError {
    move |source| WireError::Os { call, source }
}

/// A request as the service received it.
pub struct Request {
    /// The arguments after `ckpt`.
    pub args: Vec<OsString>,
    /// The client's environment, `KEY=VALUE` (for the job `ckpt run`
    /// starts; never the worker's own).
    pub env: Vec<OsString>,
    /// The client's working directory.
    pub cwd: OwnedFd,
    /// The client's fds 0, 1 and 2.
    pub stdio: [OwnedFd; 3],
}

/// A message the client sends while its request runs.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientMessage {
    /// Pass this signal on to the worker.
    Signal(i32),
}

/// The ids of the peer of a connected socket, from the kernel.
pub struct PeerIds {
    /// Its pid (at connect time).
    pub pid: i32,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
    /// A pidfd of it (`SO_PEERPIDFD`, Linux 6.5+): what is read about it
    /// by pid is checked to still be about it.
    pub pidfd: Option<OwnedFd>,
}

impl PeerIds {
    /// Whether the process that connected is still alive (then its pid is
    /// still its own); without a pidfd, taken as yes.
    pub fn still_alive(&self) -> bool {
        let Some(fd) = &self.pidfd else {
            return true;
        };
        // SAFETY: pidfd_send_signal with signal 0 only checks the target;
        // the fd is a live pidfd owned by `self`.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                0,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        r == 0
    }
}

/// `SO_PEERPIDFD` (Linux 6.5), which the libc crate does not export for
/// this target.
const SO_PEERPIDFD: libc::c_int = 77;

/// A pidfd of the peer, if the kernel gives one.
fn peer_pidfd(conn: BorrowedFd<'_>) -> Option<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` is a live c_int and `len` its size; the kernel writes
    // a new fd number into it.
    let r = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&raw mut fd).cast(),
            &mut len,
        )
    };
    // SAFETY: on success the kernel installed `fd` for this process only.
    (r == 0 && fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A new `SOCK_SEQPACKET` Unix socket.
fn seqpacket() -> Result<OwnedFd, WireError> {
    socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(os("socket"))
}

/// A listening socket bound at `path` (which must not exist).
pub fn listen(path: &Path) -> Result<OwnedFd, WireError> {
    let fd = seqpacket()?;
    let addr = UnixAddr::new(path).map_err(os("socket address"))?;
    socket::bind(fd.as_raw_fd(), &addr).map_err(os("bind"))?;
    socket::listen(&fd, socket::Backlog::new(64).map_err(os("listen"))?).map_err(os("listen"))?;
    Ok(fd)
}

/// The next connection on `listener`.
pub fn accept(listener: BorrowedFd<'_>) -> Result<OwnedFd, WireError> {
    let raw =
        socket::accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC).map_err(os("accept"))?;
    // SAFETY: accept4 just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// A connection to the service at `path`.
pub fn connect(path: &Path) -> Result<OwnedFd, WireError> {
    let fd = seqpacket()?;
    let addr = UnixAddr::new(path).map_err(os("socket address"))?;
    socket::connect(fd.as_raw_fd(), &addr).map_err(os("connect"))?;
    Ok(fd)
}

/// Who is at the other end of `conn`.
pub fn peer(conn: BorrowedFd<'_>) -> Result<PeerIds, WireError> {
    let cred =
        socket::getsockopt(&conn, socket::sockopt::PeerCredentials).map_err(os("SO_PEERCRED"))?;
    Ok(PeerIds {
        pid: cred.pid(),
        uid: cred.uid(),
        gid: cred.gid(),
        groups: peer_groups(conn)?,
        pidfd: peer_pidfd(conn),
    })
}

/// `SO_PEERGROUPS`, which nix does not wrap: the peer's supplementary
/// groups as they were when it connected.
fn peer_groups(conn: BorrowedFd<'_>) -> Result<Vec<u32>, WireError> {
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is a live buffer of `len` bytes that the kernel
        // fills; `len` tells it the size and comes back with what it wrote
        // (or, with ERANGE, what it needs).
        let r = unsafe {
            libc::getsockopt(
                conn.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if r == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let e = nix::errno::Errno::last();
        if e != nix::errno::Errno::ERANGE || n <= groups.len() || n > ckpt_image::caller::MAX_GROUPS
        {
            return Err(WireError::Os {
                call: "SO_PEERGROUPS",
                source: e,
            });
        }
        groups.resize(n, 0);
    }
}

/// A pidfd of child `pid`: readable once it exits, so the service can wait
/// for a worker and its client at once.
pub fn pidfd(pid: u32) -> Result<OwnedFd, WireError> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if r < 0 {
        return Err(WireError::Os {
            call: "pidfd_open",
            source: nix::errno::Errno::last(),
        });
    }
    // SAFETY: pidfd_open returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// Sends a request: `args`, `env` and the fds `cwd`, 0, 1, 2.
pub fn send_request(
    conn: BorrowedFd<'_>,
    args: &[OsString],
    env: &[OsString],
    fds: [BorrowedFd<'_>; REQUEST_FDS],
) -> Result<(), WireError> {
    let mut msg = REQUEST_MAGIC.to_vec();
    let count =
        u32::try_from(args.len()).map_err(|_| WireError::Malformed("too many arguments"))?;
    msg.extend_from_slice(&count.to_le_bytes());
    for a in args.iter().chain(env) {
        if a.as_bytes().contains(&0) {
            return Err(WireError::Malformed("an argument holds a NUL byte"));
        }
        msg.extend_from_slice(a.as_bytes());
        msg.push(0);
    }
    if msg.len() > MAX_REQUEST || args.len() + env.len() > MAX_ARGS {
        return Err(WireError::Malformed("too many or too long arguments"));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    socket::sendmsg::<()>(
        conn.as_raw_fd(),
        &[IoSlice::new(&msg)],
        &cmsg,
        MsgFlags::empty(),
        None,
    )
    .map_err(os("sendmsg"))?;
    Ok(())
}

/// Receives a request (the first message of a connection).
pub fn recv_request(conn: BorrowedFd<'_>) -> Result<Request, WireError> {
    let mut buf = vec![0u8; MAX_REQUEST + 1];
    let mut cmsg = nix::cmsg_space!([RawFd; REQUEST_FDS]);
    let (len, fds) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = socket::recvmsg::<()>(
            conn.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(os("recvmsg"))?;
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(os("recvmsg"))? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel installed these fds in this process
                // for this message; nothing else owns them.
                fds.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
            }
        }
        let truncated = msg
            .flags
            .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
        if truncated {
            return Err(WireError::Malformed("message or its fds truncated"));
        }
        (msg.bytes, fds)
    };
    if len == 0 {
        return Err(WireError::Closed);
    }
    let body = buf[..len]
        .strip_prefix(REQUEST_MAGIC)
        .ok_or(WireError::Malformed(
            "not a ckpt service request (or another version)",
        ))?;
    let Ok([cwd, stdin, stdout, stderr]) = <[OwnedFd; REQUEST_FDS]>::try_from(fds) else {
        return Err(WireError::Malformed("a request carries exactly 4 fds"));
    };
    let (count, body) = body
        .split_first_chunk::<4>()
        .ok_or(WireError::Malformed("no argument count"))?;
    let mut strings = parse_strings(body)?;
    let count = u32::from_le_bytes(*count) as usize;
    if count > strings.len() {
        return Err(WireError::Malformed("fewer arguments than counted"));
    }
    let env = strings.split_off(count);
    Ok(Request {
        args: strings,
        env,
        cwd,
        stdio: [stdin, stdout, stderr],
    })
}

fn parse_strings(body: &[u8]) -> Result<Vec<OsString>, WireError> {
    if body.is_empty() {
        return Ok(Vec::new());
    }
    let body = body
        .strip_suffix(&[0])
        .ok_or(WireError::Malformed("arguments do not end in NUL"))?;
    let args: Vec<OsString> = body
        .split(|&b| b == 0)
        .map(|a| OsString::from_vec(a.to_vec()))
        .collect();
    if args.len() > MAX_ARGS {
        return Err(WireError::Malformed("too many arguments"));
    }
    Ok(args)
}

/// Sends `signal` to be passed on to the worker.
pub fn send_signal(conn: BorrowedFd<'_>, signal: i32) -> Result<(), WireError> {
    let mut msg = SIGNAL_TAG.to_vec();
    msg.extend_from_slice(&signal.to_le_bytes());
    send(conn, &msg)
}

/// Receives the client's next message; `Closed` when it hung up.
pub fn recv_client_message(conn: BorrowedFd<'_>) -> Result<ClientMessage, WireError> {
    let mut buf = [0u8; 16];
    let n = recv(conn, &mut buf)?;
    let body = buf[..n]
        .strip_prefix(SIGNAL_TAG)
        .ok_or(WireError::Malformed("not a signal message"))?;
    let bytes: [u8; 4] = body
        .try_into()
        .map_err(|_| WireError::Malformed("signal number is not 4 bytes"))?;
    Ok(ClientMessage::Signal(i32::from_le_bytes(bytes)))
}

/// Sends the exit code.
pub fn send_exit(conn: BorrowedFd<'_>, code: u8) -> Result<(), WireError> {
    let mut msg = EXIT_TAG.to_vec();
    msg.push(code);
    send(conn, &msg)
}

/// Tells a client the service is too busy to take its request.
pub fn send_busy(conn: BorrowedFd<'_>) -> Result<(), WireError> {
    send(conn, BUSY)
}

/// The service's answer to a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// The command ended with this exit code.
    Exit(u8),
    /// The service did not take the request: too many are running.
    Busy,
}

/// Receives the service's answer.
pub fn recv_answer(conn: BorrowedFd<'_>) -> Result<Answer, WireError> {
    let mut buf = [0u8; 16];
    let n = recv(conn, &mut buf)?;
    if &buf[..n] == BUSY {
        return Ok(Answer::Busy);
    }
    match buf[..n].strip_prefix(EXIT_TAG) {
        Some([code]) => Ok(Answer::Exit(*code)),
        _ => Err(WireError::Malformed("not an exit message")),
    }
}

fn send(conn: BorrowedFd<'_>, msg: &[u8]) -> Result<(), WireError> {
    socket::send(conn.as_raw_fd(), msg, MsgFlags::MSG_NOSIGNAL).map_err(os("send"))?;
    Ok(())
}

fn recv(conn: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, WireError> {
    match socket::recv(conn.as_fd().as_raw_fd(), buf, MsgFlags::empty()).map_err(os("recv"))? {
        0 => Err(WireError::Closed),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_crosses_with_its_fds_and_signals_and_exit_follow() {
        let (a, b) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let cwd = std::fs::File::open(".").unwrap();
        let args: Vec<OsString> = ["dump", "--dir", "x y", ""]
            .iter()
            .map(Into::into)
            .collect();
        let fd = cwd.as_fd();
        let env: Vec<OsString> = ["HOME=/home/u", "EMPTY="].iter().map(Into::into).collect();
        send_request(a.as_fd(), &args, &env, [fd, fd, fd, fd]).unwrap();
        let req = recv_request(b.as_fd()).unwrap();
        assert_eq!((req.args, req.env), (args, env));
        send_signal(a.as_fd(), 15).unwrap();
        assert_eq!(
            recv_client_message(b.as_fd()).unwrap(),
            ClientMessage::Signal(15)
        );
        send_exit(b.as_fd(), 4).unwrap();
        assert_eq!(recv_answer(a.as_fd()).unwrap(), Answer::Exit(4));
        send_busy(b.as_fd()).unwrap();
        assert_eq!(recv_answer(a.as_fd()).unwrap(), Answer::Busy);
        drop(b);
        assert!(matches!(recv_answer(a.as_fd()), Err(WireError::Closed)));
    }

    #[test]
    fn requests_without_their_fds_or_magic_are_refused() {
        let (a, b) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        send(a.as_fd(), b"CKPT-SERVICE-2\0\x01\0\0\0dump\0").unwrap();
        assert!(matches!(
            recv_request(b.as_fd()),
            Err(WireError::Malformed(_))
        ));
        send(a.as_fd(), b"hello").unwrap();
        assert!(matches!(
            recv_request(b.as_fd()),
            Err(WireError::Malformed(_))
        ));
    }
}
