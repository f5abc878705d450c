//! UNIX domain sockets. A connected pair is created with `socketpair`
//! inside the process that holds the first end (with its filesystem
//! identity, so the socket inodes are its user's); the restorer takes both
//! ends with `pidfd_getfd`, sends each end's queued messages from the
//! other end (one `send` per dumped message, so datagram and seqpacket
//! boundaries come back), then sets sizes, timeouts, options and shutdown
//! state. It keeps the second end until the process holding it takes it
//! (`pidfd_getfd` run inside that process), as for pipes. A socket that
//! was neither bound nor connected is made with `socket` inside its
//! process.
//!
//! Not restored: the credentials of queued messages (they are the
//! restorer's, for a receiver with SO_PASSCRED), SO_PEERCRED (the process
//! that made the pair), and the names of an accepted connection's ends.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use ckpt_image::fd::File;
use ckpt_image::fd::file::Kind;
use ckpt_image::fd::unix::UnixSocketFile;
use nix::sys::socket::{MsgFlags, Shutdown, send, shutdown};

use super::{Context, FileRestorer, set_status_flags, take_from};
use crate::error::{RestoreError, Result};
use crate::sys;
use ckpt_parasite::remote::Remote;

/// UNIX sockets.
pub struct Unix;

/// Second ends of pairs made for an earlier fd, kept by the restorer until
/// their process takes them, by file id.
#[derive(Default)]
struct Unclaimed(HashMap<u64, OwnedFd>);

/// SO_PEEK_OFF when peeking is not by offset (the default).
const PEEK_OFF_DISABLED: i32 = -1;

/// The sender's buffer while the queues are refilled: queued messages are
/// charged to the sender until read, and the dumped sender may have queued
/// them under sizes set since. Its dumped size is set afterwards.
const REFILL_SNDBUF: i32 = i32::MAX / 2;

/// sk_shutdown bits (include/net/sock.h).
const RCV_SHUTDOWN: u32 = 1;
const SEND_SHUTDOWN: u32 = 2;

impl FileRestorer for Unix {
    type Image = UnixSocketFile;

    fn open(
        &self,
        cx: &mut Context<'_>,
        r: &Remote<'_>,
        file: &File,
        image: &UnixSocketFile,
        fd: i32,
    ) -> Result<i32> {
        let pid = r.t.pid();
        if let Some(mine) = cx.state::<Unclaimed>().0.remove(&file.id) {
            let got = take_from(r, std::process::id() as i32, mine.as_raw_fd())?;
            set_status_flags(r, got, file.flags)?;
            return Ok(got);
        }
        let sock_type = checked_type(cx, image, fd)?;
        let got = if image.peer_file_id == 0 {
            if !image.queue.is_empty() {
                return Err(cx.invalid(fd, "unix socket with a queue but no peer"));
            }
            let s = r.call(
                "socket(AF_UNIX)",
                libc::SYS_socket,
                [
                    libc::AF_UNIX as u64,
                    sock_type | libc::SOCK_CLOEXEC as u64,
                    0,
                    0,
                    0,
                    0,
                ],
            )? as i32;
            let here = sys::take_fd(pid, s)
                .map_err(|e| RestoreError::os(pid, "pidfd_getfd (socket)", e))?;
            configure(pid, here.as_fd(), image)?;
            s
        } else {
            let peer = peer_of(cx, file, image, fd)?;
            let out = r.put(0, &[0u8; 8])?;
            r.call(
                "socketpair(AF_UNIX)",
                libc::SYS_socketpair,
                [
                    libc::AF_UNIX as u64,
                    sock_type | libc::SOCK_CLOEXEC as u64,
                    0,
                    out,
                    0,
                    0,
                ],
            )?;
            let mut fds = [0u8; 8];
            r.t.read_mem(out, &mut fds)?;
            let a = i32::from_ne_bytes([fds[0], fds[1], fds[2], fds[3]]);
            let b = i32::from_ne_bytes([fds[4], fds[5], fds[6], fds[7]]);
            let take = |n| {
                sys::take_fd(pid, n)
                    .map_err(|e| RestoreError::os(pid, "pidfd_getfd (socketpair)", e))
            };
            let (mine, theirs) = (take(a)?, take(b)?);
            r.close(b)?;
            let stream = sock_type == libc::SOCK_STREAM as u64;
            for s in [&mine, &theirs] {
                sys::setsockopt(s.as_fd(), libc::SO_SNDBUFFORCE, REFILL_SNDBUF)
                    .map_err(|e| RestoreError::os(pid, "SO_SNDBUFFORCE (refill)", e))?;
            }
            refill(cx, pid, theirs.as_fd(), file.id, image, stream, fd)?;
            refill(cx, pid, mine.as_fd(), image.peer_file_id, &peer, stream, fd)?;
            configure(pid, mine.as_fd(), image)?;
            configure(pid, theirs.as_fd(), &peer)?;
            cx.state::<Unclaimed>().0.insert(image.peer_file_id, theirs);
            a
        };
        set_status_flags(r, got, file.flags)?;
        Ok(got)
    }
}

/// The socket type, if it is one ckpt makes.
fn checked_type(cx: &Context<'_>, image: &UnixSocketFile, fd: i32) -> Result<u64> {
    match image.sock_type as i32 {
        libc::SOCK_STREAM | libc::SOCK_DGRAM | libc::SOCK_SEQPACKET => {
            Ok(u64::from(image.sock_type))
        }
        other => Err(cx.invalid(fd, &format!("unix socket of unknown type {other}"))),
    }
}

/// The peer's image: a unix socket of the same type whose peer is `file`.
fn peer_of(
    cx: &Context<'_>,
    file: &File,
    image: &UnixSocketFile,
    fd: i32,
) -> Result<UnixSocketFile> {
    match cx
        .files
        .get(image.peer_file_id)
        .and_then(|f| f.kind.as_ref())
    {
        Some(Kind::Unix(p)) if p.peer_file_id == file.id && p.sock_type == image.sock_type => {
            Ok(p.clone())
        }
        _ => Err(cx.invalid(
            fd,
            &format!(
                "unix socket's peer (file {}) is not a socket of its type connected back to it",
                image.peer_file_id
            ),
        )),
    }
}

/// Sends the messages dumped as queued for file `file_id` (`image`) from
/// `sender`, the other end of its pair, one send per message.
fn refill(
    cx: &Context<'_>,
    pid: i32,
    sender: BorrowedFd<'_>,
    file_id: u64,
    image: &UnixSocketFile,
    stream: bool,
    fd: i32,
) -> Result<()> {
    if image.queue.is_empty() {
        return Ok(());
    }
    let name = ckpt_image::unix_queue_name(file_id);
    let data = cx.images.read_raw(&name)?;
    let messages = image
        .messages(&data)
        .map_err(|e| cx.invalid(fd, &format!("{name}: {e}")))?;
    for m in messages {
        let mut rest = m;
        loop {
            let n = send(
                sender.as_raw_fd(),
                rest,
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            )
            .map_err(|e| {
                RestoreError::os(pid, format!("unix socket: refilling {name}"), e.into())
            })?;
            rest = &rest[n..];
            // A datagram goes whole or not at all; a stream may take part.
            if rest.is_empty() || !stream {
                break;
            }
        }
    }
    Ok(())
}

/// Sets the dumped options and shutdown state of one socket.
fn configure(pid: i32, s: BorrowedFd<'_>, image: &UnixSocketFile) -> Result<()> {
    let err = |what: &'static str| {
        move |e: std::io::Error| RestoreError::os(pid, format!("unix socket: {what}"), e)
    };
    // getsockopt reported the doubled value the kernel keeps; setting
    // doubles again.
    if image.sndbuf > 0 {
        sys::setsockopt(s, libc::SO_SNDBUFFORCE, (image.sndbuf / 2) as i32)
            .map_err(err("SO_SNDBUFFORCE"))?;
    }
    if image.rcvbuf > 0 {
        sys::setsockopt(s, libc::SO_RCVBUFFORCE, (image.rcvbuf / 2) as i32)
            .map_err(err("SO_RCVBUFFORCE"))?;
    }
    sys::setsockopt(s, libc::SO_SNDTIMEO, timeval(image.sndtimeo_us))
        .map_err(err("SO_SNDTIMEO"))?;
    sys::setsockopt(s, libc::SO_RCVTIMEO, timeval(image.rcvtimeo_us))
        .map_err(err("SO_RCVTIMEO"))?;
    sys::setsockopt(s, libc::SO_PASSCRED, i32::from(image.passcred)).map_err(err("SO_PASSCRED"))?;
    if image.peek_off != PEEK_OFF_DISABLED {
        sys::setsockopt(s, libc::SO_PEEK_OFF, image.peek_off).map_err(err("SO_PEEK_OFF"))?;
    }
    let how = match (
        image.shutdown & RCV_SHUTDOWN != 0,
        image.shutdown & SEND_SHUTDOWN != 0,
    ) {
        (true, true) => Some(Shutdown::Both),
        (true, false) => Some(Shutdown::Read),
        (false, true) => Some(Shutdown::Write),
        (false, false) => None,
    };
    if let Some(how) = how {
        shutdown(s.as_raw_fd(), how).map_err(|e| err("shutdown")(e.into()))?;
    }
    Ok(())
}

fn timeval(us: u64) -> libc::timeval {
    const MICROS: u64 = 1_000_000;
    libc::timeval {
        tv_sec: i64::try_from(us / MICROS).unwrap_or(i64::MAX),
        tv_usec: (us % MICROS) as i64,
    }
}
