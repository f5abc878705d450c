//! UNIX domain sockets. A connected pair is created with `socketpair`
//! inside the process that holds the first end (with its filesystem
//! identity, so the socket inodes are its user's); the restorer takes both
//! ends with `pidfd_getfd`, sends each end's queued messages from the
//! other end (one `send` per dumped message, so datagram and seqpacket
//! boundaries come back), then sets sizes, timeouts, options and shutdown
//! state. It keeps the second end until the process holding it takes it
//! (`pidfd_getfd` run inside that process), as for pipes. A socket whose
//! peer had closed is made the same way, its other end closed after
//! sending its queue.
//!
//! Other sockets are made with `socket` inside their process, bound to
//! their name (a path under the rules of [`bind`]: the process's own
//! rights, a parent not reached through a link, only a stale socket of
//! the recorded owner replaced, the recorded owner and mode set last), listening with their backlog, a bound
//! datagram socket refilled from a socket connected to its name
//! ([`refill_by_name`]). Connections not yet accepted and datagram
//! sockets connected one way connect again by name in the last pass
//! ([`UnixConnect`]); a client sends again what it had sent before its
//! connection was accepted.
//!
//! Queued messages carry their senders' credentials again when dumped
//! (SO_PASSCRED; the restorer names them, for pids of the checkpoint
//! only). A queue whose messages carry files (SCM_RIGHTS) is sent last,
//! once every process has its fds ([`send_deferred`]): each file is taken
//! from the fd holding it in the tree, or is one the receiving process
//! opened with its own rights only to hand over ([`hold_in_flight`]).
//!
//! Not restored: SO_PEERCRED (the process
//! that made the pair), the names of an accepted connection's ends when
//! the process making it does not hold its listener ([`through_listener`]),
//! and the senders' addresses of a bound datagram socket's queue.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use ckpt_image::fd::File;
use ckpt_image::fd::file::Kind;
use ckpt_image::fd::unix::{UnixAncillary, UnixSocketFile};
use nix::sys::socket::{Shutdown, shutdown};

mod names;

use names::{UnlinkedNames, bind, connect_again};

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
        cx: &mut Context<'_, '_>,
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
        let got = if image.peer_file_id != 0 {
            pair(cx, r, file, image, sock_type, fd)?
        } else if image.peer_closed {
            orphan(cx, r, file, image, sock_type, fd)?
        } else {
            if !image.queue.is_empty()
                && (image.sock_type != libc::SOCK_DGRAM as u32 || image.name.is_empty())
            {
                return Err(
                    cx.invalid(fd, "unix socket with a queue but neither a peer nor a name")
                );
            }
            let s = new_socket(r, sock_type, 0)?;
            let file_of_name = if image.name.is_empty() {
                None
            } else {
                bind(cx, r, s, image)?
            };
            if image.listening {
                r.call(
                    "listen",
                    libc::SYS_listen,
                    [s as u64, u64::from(image.backlog), 0, 0, 0, 0],
                )?;
            }
            let here = take_socket(pid, s)?;
            if !image.queue.is_empty() {
                let to = Receiver {
                    socket: here.as_fd(),
                    file_of_name: file_of_name.as_ref(),
                };
                refill_by_name(cx, r, to, file.id, image, fd)?;
            }
            if let Some(f) = file_of_name {
                cx.state::<UnlinkedNames>().0.insert(file.id, f);
            }
            configure(pid, here.as_fd(), image)?;
            s
        };
        set_status_flags(r, got, file.flags)?;
        Ok(got)
    }
}

/// A socket connected again by name in the last pass: a connection that
/// was waiting to be accepted (to its listener), or a datagram socket
/// connected one way (to the bound socket it sends to). What it connects
/// to is restored before it (earlier in the tree, or in the first pass of
/// its own process).
pub struct UnixConnect;

impl FileRestorer for UnixConnect {
    type Image = UnixSocketFile;
    const AFTER_OTHERS: bool = true;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &UnixSocketFile,
        fd: i32,
    ) -> Result<i32> {
        let pid = r.t.pid();
        let sock_type = checked_type(cx, image, fd)?;
        let unlinked = match cx
            .shared
            .files
            .get(image.connect_to_file_id)
            .and_then(|f| f.kind.as_ref())
        {
            Some(Kind::Unix(t))
                if t.name == image.peer_name
                    && (t.listening || t.sock_type == libc::SOCK_DGRAM as u32) =>
            {
                t.bound.as_ref().is_some_and(|b| b.unlinked)
            }
            _ => {
                return Err(cx.invalid(
                    fd,
                    "unix socket connects to a file that is not a listener or datagram socket of its peer's name",
                ));
            }
        };
        // Never block on a full backlog; the dumped flags come after.
        let s = new_socket(r, sock_type, libc::SOCK_NONBLOCK)?;
        let here = take_socket(pid, s)?;
        // Its own name first, and the datagrams queued for it sent to
        // that name while it is not connected yet (once connected, it
        // takes datagrams from its peer only).
        let file_of_name = if image.name.is_empty() {
            None
        } else {
            bind(cx, r, s, image)?
        };
        if !image.queue.is_empty() {
            if image.name.is_empty() || sock_type != libc::SOCK_DGRAM as u64 {
                return Err(cx.invalid(
                    fd,
                    "unix socket connected one way with a queue but no name to refill it by",
                ));
            }
            let to = Receiver {
                socket: here.as_fd(),
                file_of_name: file_of_name.as_ref(),
            };
            refill_by_name(cx, r, to, file.id, image, fd)?;
        }
        if let Some(f) = file_of_name {
            cx.state::<UnlinkedNames>().0.insert(file.id, f);
        }
        connect_again(cx, r, s, image, unlinked, fd)?;
        if !image.unaccepted_queue.is_empty() {
            send_unaccepted(cx, pid, here.as_fd(), file.id, image, fd)?;
        }
        configure(pid, here.as_fd(), image)?;
        set_status_flags(r, s, file.flags)?;
        Ok(s)
    }
}

/// Sends again what a client had sent on a connection its listener had
/// not accepted, now that it is connected again: the listener's next
/// accept finds it queued, as it was.
fn send_unaccepted(
    cx: &Context<'_, '_>,
    pid: i32,
    client: BorrowedFd<'_>,
    file_id: u64,
    image: &UnixSocketFile,
    fd: i32,
) -> Result<()> {
    if image.sock_type == libc::SOCK_DGRAM as u32 {
        return Err(cx.invalid(
            fd,
            "unix datagram socket with messages sent before accept (only a connection has them)",
        ));
    }
    let name = ckpt_image::unix_unaccepted_name(file_id);
    let data = cx.shared.images.read_raw(&name)?;
    let messages = image
        .unaccepted_messages(&data)
        .map_err(|e| cx.invalid(fd, &format!("{name}: {e}")))?;
    force_refill_sndbuf(pid, client)?;
    let stream = image.sock_type == libc::SOCK_STREAM as u32;
    for m in messages {
        send_message(pid, client, &name, m, &[], None, stream)?;
    }
    Ok(())
}

/// Sends the datagrams queued for a bound, unconnected socket back to it
/// from a socket its process connects to its name (with its own rights);
/// the restorer sends through a copy of that socket, which is closed
/// after. Their senders' addresses are not kept.
fn refill_by_name(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    to: Receiver<'_>,
    file_id: u64,
    image: &UnixSocketFile,
    fd: i32,
) -> Result<()> {
    let pid = r.t.pid();
    let sender = new_socket(r, u64::from(image.sock_type), libc::SOCK_NONBLOCK)?;
    // A name unlinked again is reached through its socket file, lent to
    // the process for the connect.
    let lent = to
        .file_of_name
        .map(|f| take_from(r, std::process::id() as i32, f.as_raw_fd()))
        .transpose()?;
    let name = match lent {
        Some(n) => format!("/proc/self/fd/{n}").into_bytes(),
        None => image.name.clone(),
    };
    let addr = sockaddr(cx, fd, &name)?;
    let at = r.put(ADDR_SLOT, &addr)?;
    let connected = r.call(
        "connect (refilling a bound socket)",
        libc::SYS_connect,
        [sender as u64, at, addr.len() as u64, 0, 0, 0],
    );
    if let Some(n) = lent {
        r.close(n)?;
    }
    // Taken before the close, checked after it: the process's copy is
    // closed whatever connect and pidfd_getfd did.
    let here = take_socket(pid, sender);
    r.close(sender)?;
    connected?;
    let here = here?;
    force_refill_sndbuf(pid, here.as_fd())?;
    let ends = Ends {
        sender: here.as_fd(),
        receiver: to.socket,
    };
    refill(cx, pid, ends, file_id, image, false, fd)
}

/// A bound socket whose queue is refilled by name: the restorer's copy,
/// and its socket file when the name was unlinked again.
#[derive(Clone, Copy)]
struct Receiver<'f> {
    socket: BorrowedFd<'f>,
    file_of_name: Option<&'f std::fs::File>,
}

/// Argument slot of the scratch area for socket addresses (slot 0 holds
/// paths for `open`).
const ADDR_SLOT: u64 = 1;

/// Runs syscall `nr(s, addr, len)` (`bind` or `connect`) inside the
/// process, with `addr` put in the scratch area's [`ADDR_SLOT`].
fn call_with_addr(
    r: &Remote<'_>,
    what: &'static str,
    nr: i64,
    s: i32,
    addr: &[u8],
) -> std::result::Result<u64, ckpt_parasite::ParasiteError> {
    let at = r.put(ADDR_SLOT, addr)?;
    r.call(what, nr, [s as u64, at, addr.len() as u64, 0, 0, 0])
}

/// A new non-blocking socket of the process, connected to `name`; `what`
/// names the connect in errors.
fn connected_socket(
    cx: &Context<'_, '_>,
    r: &Remote<'_>,
    sock_type: u64,
    fd: i32,
    name: &[u8],
    what: &'static str,
) -> Result<i32> {
    let s = new_socket(r, sock_type, libc::SOCK_NONBLOCK)?;
    let addr = sockaddr(cx, fd, name)?;
    call_with_addr(r, what, libc::SYS_connect, s, &addr)?;
    Ok(s)
}

/// The restorer's copy of the process's socket `s`.
fn take_socket(pid: i32, s: i32) -> Result<OwnedFd> {
    sys::take_fd(pid, s).map_err(|e| RestoreError::os(pid, "pidfd_getfd (socket)", e))
}

/// Sets the [`REFILL_SNDBUF`] sender's buffer on `s` before its queue is
/// refilled.
fn force_refill_sndbuf(pid: i32, s: BorrowedFd<'_>) -> Result<()> {
    set_opt(s, libc::SO_SNDBUFFORCE, REFILL_SNDBUF)
        .map_err(|e| RestoreError::os(pid, "SO_SNDBUFFORCE (refill)", e))
}

/// The restorer's copies of the two ends `first` and `second` of a pair
/// made inside the process, ready to be refilled; the process's fd of
/// `second` is closed (its holder takes it later). `what` names the
/// pidfd_getfd in errors.
fn take_pair(
    r: &Remote<'_>,
    first: i32,
    second: i32,
    what: &'static str,
) -> Result<(OwnedFd, OwnedFd)> {
    let pid = r.t.pid();
    let take = |n| sys::take_fd(pid, n).map_err(|e| RestoreError::os(pid, what, e));
    let (mine, theirs) = (take(first)?, take(second)?);
    r.close(second)?;
    for s in [&mine, &theirs] {
        force_refill_sndbuf(pid, s.as_fd())?;
    }
    Ok((mine, theirs))
}

/// `socket(AF_UNIX, type | flags | SOCK_CLOEXEC)` inside the process.
fn new_socket(r: &Remote<'_>, sock_type: u64, flags: i32) -> Result<i32> {
    Ok(r.call(
        "socket(AF_UNIX)",
        libc::SYS_socket,
        [
            libc::AF_UNIX as u64,
            sock_type | (libc::SOCK_CLOEXEC | flags) as u64,
            0,
            0,
            0,
            0,
        ],
    )? as i32)
}

/// Both ends of a connected pair: made with `socketpair` inside the process
/// holding the first, the second kept by the restorer for its holder.
fn pair(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    file: &File,
    image: &UnixSocketFile,
    sock_type: u64,
    fd: i32,
) -> Result<i32> {
    let pid = r.t.pid();
    let peer = peer_of(cx, file, image, fd)?;
    let (a, mine, theirs) = match accepted_via(cx, image, &peer) {
        Some(via) => through_listener(cx, r, via, sock_type, fd)?,
        None => socketpair(r, sock_type)?,
    };
    if sock_type == libc::SOCK_DGRAM as u64 {
        bind_pair(cx, r, file.id, image, a, &peer, theirs.as_fd())?;
    }
    let stream = sock_type == libc::SOCK_STREAM as u64;
    let to_mine = Ends {
        sender: theirs.as_fd(),
        receiver: mine.as_fd(),
    };
    let to_theirs = Ends {
        sender: mine.as_fd(),
        receiver: theirs.as_fd(),
    };
    refill(cx, pid, to_mine, file.id, image, stream, fd)?;
    refill(cx, pid, to_theirs, image.peer_file_id, &peer, stream, fd)?;
    configure(pid, mine.as_fd(), image)?;
    configure(pid, theirs.as_fd(), &peer)?;
    cx.state::<Unclaimed>().0.insert(image.peer_file_id, theirs);
    Ok(a)
}

/// Binds the ends of a datagram pair that were bound, in the process
/// making the pair, with its rights (the second end lent to it for the
/// bind): a socketpair's sockets take a name like any other, and each
/// end's getpeername then reports the other's.
fn bind_pair(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    file_id: u64,
    image: &UnixSocketFile,
    first: i32,
    peer: &UnixSocketFile,
    second: BorrowedFd<'_>,
) -> Result<()> {
    if !image.name.is_empty()
        && let Some(f) = bind(cx, r, first, image)?
    {
        cx.state::<UnlinkedNames>().0.insert(file_id, f);
    }
    if peer.name.is_empty() {
        return Ok(());
    }
    let lent = take_from(r, std::process::id() as i32, second.as_raw_fd())?;
    let bound = bind(cx, r, lent, peer);
    r.close(lent)?;
    if let Some(f) = bound? {
        cx.state::<UnlinkedNames>().0.insert(image.peer_file_id, f);
    }
    Ok(())
}

/// The listener a connected pair was made through (one end accepted by
/// it, the other connected to its name), when this process already holds
/// it again and its name can still be connected to.
struct Via {
    /// The process's fd of the listener.
    listener: i32,
    /// Its name.
    name: Vec<u8>,
    /// The end being opened is the accepted one (else the client).
    accepted_here: bool,
}

fn accepted_via(
    cx: &Context<'_, '_>,
    image: &UnixSocketFile,
    peer: &UnixSocketFile,
) -> Option<Via> {
    let (server, client, accepted_here) = if !image.name.is_empty() && image.name == peer.peer_name
    {
        (image, peer, true)
    } else if !peer.name.is_empty() && peer.name == image.peer_name {
        (peer, image, false)
    } else {
        return None;
    };
    if server.listening || client.listening {
        return None;
    }
    cx.shared.files.files.iter().find_map(|f| match &f.kind {
        Some(Kind::Unix(l))
            if l.listening
                && l.name == server.name
                && !l.bound.as_ref().is_some_and(|b| b.unlinked) =>
        {
            cx.fd_here(f.id, -1).map(|listener| Via {
                listener,
                name: l.name.clone(),
                accepted_here,
            })
        }
        _ => None,
    })
}

/// A pair made the way it was first made: a client connects to the
/// listener's name and the listener accepts it, inside the process, so
/// getsockname and getpeername report the listener's name again. Returns
/// what [`socketpair`] does, the end being opened first.
fn through_listener(
    cx: &Context<'_, '_>,
    r: &Remote<'_>,
    via: Via,
    sock_type: u64,
    fd: i32,
) -> Result<(i32, OwnedFd, OwnedFd)> {
    // Never block; the dumped flags are set on each end when installed.
    let client = connected_socket(
        cx,
        r,
        sock_type,
        fd,
        &via.name,
        "connect (accepted unix connection)",
    )?;
    let server = r.call(
        "accept4 (accepted unix connection)",
        libc::SYS_accept4,
        [
            via.listener as u64,
            0,
            0,
            (libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) as u64,
            0,
            0,
        ],
    )? as i32;
    let (first, second) = if via.accepted_here {
        (server, client)
    } else {
        (client, server)
    };
    let (mine, theirs) = take_pair(r, first, second, "pidfd_getfd (accept)")?;
    Ok((first, mine, theirs))
}

/// A socket whose peer had closed: made as a pair whose other end sends
/// its queue and is closed, which leaves it as the kernel left it (for a
/// stream, shut down both ways with its data still readable).
fn orphan(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    file: &File,
    image: &UnixSocketFile,
    sock_type: u64,
    fd: i32,
) -> Result<i32> {
    let pid = r.t.pid();
    let (a, mine, theirs) = socketpair(r, sock_type)?;
    let stream = sock_type == libc::SOCK_STREAM as u64;
    let ends = Ends {
        sender: theirs.as_fd(),
        receiver: mine.as_fd(),
    };
    refill(cx, pid, ends, file.id, image, stream, fd)?;
    drop(theirs);
    configure(pid, mine.as_fd(), image)?;
    Ok(a)
}

/// `socketpair` inside the process: its fd of the first end, and the
/// restorer's copies of both (the process's fd of the second is closed).
fn socketpair(r: &Remote<'_>, sock_type: u64) -> Result<(i32, OwnedFd, OwnedFd)> {
    let out = r.put(ADDR_SLOT, &[0u8; 8])?;
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
    let (mine, theirs) = take_pair(r, a, b, "pidfd_getfd (socketpair)")?;
    Ok((a, mine, theirs))
}

/// `struct sockaddr_un` bytes for `name` (a path, or an abstract name with
/// its leading NUL).
fn sockaddr(cx: &Context<'_, '_>, fd: i32, name: &[u8]) -> Result<Vec<u8>> {
    // sun_path of struct sockaddr_un.
    const SUN_PATH_LEN: usize = 108;
    let abstract_name = name.first() == Some(&0);
    if name.is_empty() || name.len() + usize::from(!abstract_name) > SUN_PATH_LEN {
        return Err(cx.invalid(fd, "unix socket name empty or too long"));
    }
    let mut addr = (libc::AF_UNIX as u16).to_ne_bytes().to_vec();
    addr.extend_from_slice(name);
    if !abstract_name {
        addr.push(0);
    }
    Ok(addr)
}

/// The socket type, if it is one ckpt makes.
fn checked_type(cx: &Context<'_, '_>, image: &UnixSocketFile, fd: i32) -> Result<u64> {
    match image.sock_type as i32 {
        libc::SOCK_STREAM | libc::SOCK_DGRAM | libc::SOCK_SEQPACKET => {
            Ok(u64::from(image.sock_type))
        }
        other => Err(cx.invalid(fd, &format!("unix socket of unknown type {other}"))),
    }
}

/// The peer's image: a unix socket of the same type whose peer is `file`.
fn peer_of(
    cx: &Context<'_, '_>,
    file: &File,
    image: &UnixSocketFile,
    fd: i32,
) -> Result<UnixSocketFile> {
    match cx
        .shared
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

/// The restorer's copies of the socket a queue is refilled for and of the
/// one that sends it.
#[derive(Clone, Copy)]
struct Ends<'f> {
    sender: BorrowedFd<'f>,
    receiver: BorrowedFd<'f>,
}

/// Sends the messages dumped as queued for file `file_id` (`image`) from
/// the other end of its pair, one send per message. A queue carrying
/// files waits for [`send_deferred`], once every file of the tree is
/// open; the restorer keeps copies of both ends until then.
fn refill(
    cx: &mut Context<'_, '_>,
    pid: i32,
    ends: Ends<'_>,
    file_id: u64,
    image: &UnixSocketFile,
    stream: bool,
    fd: i32,
) -> Result<()> {
    if image.queue.is_empty() {
        return Ok(());
    }
    if image.has_files_in_flight() {
        let keep = |f: BorrowedFd<'_>| {
            f.try_clone_to_owned()
                .map_err(|e| RestoreError::os(pid, "dup (unix socket with files in flight)", e))
        };
        let (sender, receiver) = (keep(ends.sender)?, keep(ends.receiver)?);
        cx.state::<Deferred>().0.push(DeferredQueue {
            pid,
            fd,
            file_id,
            image: image.clone(),
            stream,
            sender,
            receiver,
        });
        return Ok(());
    }
    let name = ckpt_image::unix_queue_name(file_id);
    if let Some(what) = unknown_sender(cx.shared, image) {
        return Err(cx.invalid(fd, &what));
    }
    let data = cx.shared.images.read_raw(&name)?;
    let messages = image
        .messages(&data)
        .map_err(|e| cx.invalid(fd, &format!("{name}: {e}")))?;
    for (i, m) in messages.into_iter().enumerate() {
        send_message(
            pid,
            ends.sender,
            &name,
            m,
            &[],
            image.ancillary_of(i),
            stream,
        )?;
    }
    Ok(())
}

/// Queues whose messages carry files, sent once the whole tree's files
/// are open ([`send_deferred`]).
#[derive(Default)]
struct Deferred(Vec<DeferredQueue>);

/// One such queue: what [`refill`] would have sent, and from where.
struct DeferredQueue {
    /// The process holding the socket the queue is for, and its fd.
    pid: i32,
    fd: i32,
    file_id: u64,
    image: UnixSocketFile,
    stream: bool,
    /// The restorer's copy of the end that sends it.
    sender: OwnedFd,
    /// And of the socket it is for.
    receiver: OwnedFd,
}

/// The restorer's copies of files the tree held only in flight, by file
/// id: opened in the receiving socket's process, then closed there.
#[derive(Default)]
struct InFlightFiles(HashMap<u64, OwnedFd>);

/// Moves the files process `r` opened only to send them (`in_flight`)
/// to the restorer, closing them in the process.
pub(super) fn hold_in_flight(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    in_flight: &[ckpt_image::fd::Fd],
) -> Result<()> {
    let pid = r.t.pid();
    for f in in_flight {
        let copy = sys::take_fd(pid, f.fd)
            .map_err(|e| RestoreError::os(pid, "pidfd_getfd (file in flight)", e))?;
        r.close(f.fd)?;
        cx.here.remove(&f.fd);
        cx.tables.installed.remove(&f.file_id);
        cx.state::<InFlightFiles>().0.insert(f.file_id, copy);
    }
    Ok(())
}

/// Sends the queues that carry files, in order, each message with its
/// files attached again: every process's fds are open by now, and the
/// files held only in flight are the restorer's. The processes have not
/// resumed, so none reads before its queue is whole.
pub(super) fn send_deferred(
    shared: &crate::context::RestoreContext<'_>,
    tables: &mut super::Tables,
) -> Result<()> {
    let deferred = std::mem::take(&mut tables_state::<Deferred>(tables).0);
    let held = std::mem::take(&mut tables_state::<InFlightFiles>(tables).0);
    for q in deferred {
        let ends = Ends {
            sender: q.sender.as_fd(),
            receiver: q.receiver.as_fd(),
        };
        // Both ends have their dumped options by now; a message dumped
        // without credentials must go without, as the other queues did
        // before SO_PASSCRED was set.
        let quiet = PasscredOff::on(q.pid, ends)?;
        let sent = send_queue(shared, &tables.installed, &held, &q);
        quiet.put_back()?;
        sent?;
    }
    Ok(())
}

/// SO_PASSCRED cleared on both ends of a queue while it is sent (with it
/// on either, the kernel credits every message to the restorer), and the
/// values it had put back after.
struct PasscredOff<'f> {
    pid: i32,
    ends: Ends<'f>,
    had: [i32; 2],
}

impl<'f> PasscredOff<'f> {
    fn on(pid: i32, ends: Ends<'f>) -> Result<PasscredOff<'f>> {
        let err = |e| RestoreError::os(pid, "unix socket: SO_PASSCRED (files in flight)", e);
        let mut had = [0; 2];
        for (f, h) in [ends.sender, ends.receiver].into_iter().zip(&mut had) {
            *h = sys::getsockopt_int(f, libc::SOL_SOCKET, libc::SO_PASSCRED).map_err(err)?;
            set_opt(f, libc::SO_PASSCRED, 0).map_err(err)?;
        }
        Ok(PasscredOff { pid, ends, had })
    }

    fn put_back(self) -> Result<()> {
        let err = |e| RestoreError::os(self.pid, "unix socket: SO_PASSCRED (put back)", e);
        for (f, h) in [self.ends.sender, self.ends.receiver]
            .into_iter()
            .zip(self.had)
        {
            set_opt(f, libc::SO_PASSCRED, h).map_err(err)?;
        }
        Ok(())
    }
}

/// Sends one deferred queue, each message with its files: taken from the
/// fd holding them in the tree (`installed`), or the restorer's copies of
/// those held only in flight (`held`).
fn send_queue(
    shared: &crate::context::RestoreContext<'_>,
    installed: &HashMap<u64, super::Installed>,
    held: &HashMap<u64, OwnedFd>,
    q: &DeferredQueue,
) -> Result<()> {
    let name = ckpt_image::unix_queue_name(q.file_id);
    let invalid = |what: String| {
        RestoreError::Image(ckpt_image::ImageError::Invalid {
            path: shared.images.path().join(ckpt_image::fds_name(q.pid)),
            what: format!("fd {}: {name}: {what}", q.fd),
        })
    };
    if let Some(what) = unknown_sender(shared, &q.image) {
        return Err(invalid(what));
    }
    let data = shared.images.read_raw(&name)?;
    let messages = q
        .image
        .messages(&data)
        .map_err(|e| invalid(e.to_string()))?;
    for (i, m) in messages.into_iter().enumerate() {
        let ancillary = q.image.ancillary_of(i);
        let ids = ancillary.map(|a| a.file_ids.as_slice()).unwrap_or_default();
        let mut taken = Vec::new();
        for id in ids {
            if held.contains_key(id) {
                continue;
            }
            let at = installed
                .get(id)
                .ok_or_else(|| invalid(format!("file {id} in flight is not open anywhere")))?;
            let copy = sys::take_fd(at.pid, at.fd)
                .map_err(|e| RestoreError::os(at.pid, "pidfd_getfd (file in flight)", e))?;
            taken.push((*id, copy));
        }
        let files: Vec<BorrowedFd<'_>> = ids
            .iter()
            .map(|id| {
                held.get(id)
                    .map(AsFd::as_fd)
                    .or_else(|| taken.iter().find(|(t, _)| t == id).map(|(_, f)| f.as_fd()))
                    .expect("every id was found above")
            })
            .collect();
        send_message(
            q.pid,
            q.sender.as_fd(),
            &name,
            m,
            &files,
            ancillary,
            q.stream,
        )?;
    }
    Ok(())
}

/// Why the senders' credentials listed for `image`'s queue cannot be given
/// back: one names a pid that is no process of the checkpoint, or a user
/// or group that process did not have (real, effective or saved, as the
/// kernel asks of a sender without privilege). The restorer may name any;
/// it names only what the tree's own processes could.
fn unknown_sender(
    shared: &crate::context::RestoreContext<'_>,
    image: &UnixSocketFile,
) -> Option<String> {
    /// Real, effective and saved ids of a manifest entry's four.
    const SENDER_IDS: usize = 3;
    let processes = &shared.images.manifest().processes;
    image
        .ancillary
        .iter()
        .filter_map(|a| a.creds.as_ref())
        .find_map(|c| {
            let Some(p) = processes.iter().find(|p| p.pid == c.pid) else {
                return Some(format!(
                    "queued message credited to pid {}, not a process of this checkpoint",
                    c.pid
                ));
            };
            let has = |ids: &[u32], id| ids.iter().take(SENDER_IDS).any(|&x| x == id);
            (!has(&p.uids, c.uid) || !has(&p.gids, c.gid)).then(|| {
                format!(
                    "queued message credited to pid {} as uid {} gid {}, which that process did not have",
                    c.pid, c.uid, c.gid
                )
            })
        })
}

/// A kind's state of `tables` outside a process's [`Context`].
fn tables_state<T: Default + 'static>(tables: &mut super::Tables) -> &mut T {
    tables
        .states
        .entry(std::any::TypeId::of::<T>())
        .or_insert_with(|| Box::new(T::default()))
        .downcast_mut()
        .expect("keyed by its own TypeId")
}

/// Sends one queued message `m` from `sender` with its files and, if
/// dumped, its sender's credentials; a stream may take it in parts (the
/// files go with the first).
fn send_message(
    pid: i32,
    sender: BorrowedFd<'_>,
    name: &str,
    m: &[u8],
    files: &[BorrowedFd<'_>],
    ancillary: Option<&UnixAncillary>,
    stream: bool,
) -> Result<()> {
    let creds = ancillary
        .and_then(|a| a.creds.as_ref())
        .map(|c| libc::ucred {
            pid: c.pid,
            uid: c.uid,
            gid: c.gid,
        });
    let err = |e: std::io::Error| {
        let what = match creds {
            Some(c) if e.raw_os_error() == Some(libc::ESRCH) => format!(
                "unix socket: refilling {name}: the sender of a queued message (pid {}) no longer exists to be named in its credentials",
                c.pid
            ),
            _ => format!("unix socket: refilling {name}"),
        };
        RestoreError::os(pid, what, e)
    };
    let mut rest = m;
    let mut files = files;
    loop {
        let n = sys::send_unix_message(sender, rest, files, creds).map_err(err)?;
        rest = &rest[n..];
        files = &[];
        // A datagram goes whole or not at all; a stream may take part.
        if rest.is_empty() || !stream {
            break;
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
        set_opt(s, libc::SO_SNDBUFFORCE, (image.sndbuf / 2) as i32)
            .map_err(err("SO_SNDBUFFORCE"))?;
    }
    if image.rcvbuf > 0 {
        set_opt(s, libc::SO_RCVBUFFORCE, (image.rcvbuf / 2) as i32)
            .map_err(err("SO_RCVBUFFORCE"))?;
    }
    set_opt(s, libc::SO_SNDTIMEO, timeval(image.sndtimeo_us)).map_err(err("SO_SNDTIMEO"))?;
    set_opt(s, libc::SO_RCVTIMEO, timeval(image.rcvtimeo_us)).map_err(err("SO_RCVTIMEO"))?;
    set_opt(s, libc::SO_PASSCRED, i32::from(image.passcred)).map_err(err("SO_PASSCRED"))?;
    if image.peek_off != PEEK_OFF_DISABLED {
        set_opt(s, libc::SO_PEEK_OFF, image.peek_off).map_err(err("SO_PEEK_OFF"))?;
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

/// `setsockopt(s, SOL_SOCKET, opt)` with one value (an int or a timeval).
fn set_opt<T: Copy>(s: BorrowedFd<'_>, opt: i32, v: T) -> std::io::Result<()> {
    sys::setsockopt_raw(s, libc::SOL_SOCKET, opt, &[v])
}

fn timeval(us: u64) -> libc::timeval {
    const MICROS: u64 = 1_000_000;
    libc::timeval {
        tv_sec: i64::try_from(us / MICROS).unwrap_or(i64::MAX),
        tv_usec: (us % MICROS) as i64,
    }
}
