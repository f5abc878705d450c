//! UNIX domain sockets. What `/proc` does not tell is read from a copy of
//! the socket ckpt takes with `pidfd_getfd` (the same open file
//! description): type, address and options by `getsockopt`, and the
//! messages queued for it by `MSG_PEEK`, walking the queue with
//! `SO_PEEK_OFF` so nothing is consumed (the old offset is put back). The
//! kernel's `sock_diag` tells each socket's peer and shutdown state: one
//! dump of every UNIX socket per checkpoint, in `link_tree`, where peers
//! become file ids.
//!
//! Supported: sockets connected to each other inside the tree (socketpair,
//! or a client and the connection a server accepted), of every type, with
//! the data queued in both directions; sockets whose peer closed;
//! listeners (path or abstract name, unlinked or not) with the
//! connections not yet accepted whose clients are in the tree; bound
//! sockets, a bound datagram socket with its queue, and datagram sockets
//! connected one way to one in the tree. Refused by name: a peer outside
//! the tree, data sent on a connection not yet accepted, messages carrying
//! file descriptors, sockets in another network namespace, and the rarer
//! shapes listed in `link_tree`.

mod diag;

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::unix::{MAX_QUEUE_BYTES, MAX_QUEUE_MESSAGES, UnixBoundFile, UnixSocketFile};
use nix::sys::socket::MsgFlags;

use diag::UnixDiag;

use super::{Blobs, FdParams, FileDumper, Holder, TreeFiles};
use crate::error::{DumpError, Result};
use crate::procfile;
use crate::sys;

/// UNIX domain sockets (`socket:[ino]` whose protocol is `UNIX*`).
pub struct Unix;

/// sockfs's protocol names of UNIX sockets start with this (`UNIX`,
/// `UNIX-STREAM`).
const UNIX_PROTOCOL: &str = "UNIX";

/// `sizeof(struct cmsghdr)`: a control buffer of this size holds no
/// ancillary data at all.
const CMSGHDR_LEN: usize = std::mem::size_of::<libc::cmsghdr>();

/// `CMSG_SPACE(sizeof(struct ucred))`: room for SCM_CREDENTIALS only.
const CREDS_SPACE: usize = CMSGHDR_LEN + std::mem::size_of::<libc::ucred>().next_multiple_of(8);

/// SO_PASSPIDFD (Linux 6.5+; not in every libc): a pidfd with each message.
const SO_PASSPIDFD: i32 = 76;

/// First buffer for one peeked message; grown to a message's length.
const PEEK_CHUNK: usize = 64 << 10;

impl FileDumper for Unix {
    fn name(&self) -> &'static str {
        "unix"
    }

    fn description(&self) -> &'static str {
        "UNIX sockets (stream, datagram, seqpacket): pairs within the tree with the data queued both ways, listeners on a path or abstract name with their pending connections, bound and one-way datagram sockets; shutdown state and options"
    }

    fn claims(&self, p: &FdParams) -> bool {
        p.meta.mode() & libc::S_IFMT == libc::S_IFSOCK
            && sys::socket_protocol(&p.proc_path()).is_ok_and(|n| n.starts_with(UNIX_PROTOCOL))
    }

    fn collect(&self, p: &FdParams, file_id: u64, blobs: &mut Blobs) -> Result<Kind> {
        let sock = sys::take_fd(p.pid, p.fd).map_err(|e| os_err(p, "pidfd_getfd", e))?;
        let fd = sock.as_fd();
        let opt = |name: &str, opt: i32| -> Result<i32> {
            sys::getsockopt_int(fd, libc::SOL_SOCKET, opt).map_err(|e| os_err(p, name, e))
        };
        let timeout = |name: &str, opt: i32| -> Result<u64> {
            let tv = sys::getsockopt_raw::<Timeval>(fd, libc::SOL_SOCKET, opt)
                .map(|(tv, _)| tv)
                .map_err(|e| os_err(p, name, e))?;
            Ok(tv.micros())
        };
        let listening = opt("SO_ACCEPTCONN", libc::SO_ACCEPTCONN)? != 0;
        let sock_type = opt("SO_TYPE", libc::SO_TYPE)?;
        // A listening socket's queue holds connections, not data.
        let queue = if listening {
            Queue {
                lengths: Vec::new(),
                data: Vec::new(),
                peek_off: opt("SO_PEEK_OFF", libc::SO_PEEK_OFF)?,
            }
        } else {
            peek_queue(p, fd, sock_type)?
        };
        let name = sys::unix_sockname(fd).map_err(|e| os_err(p, "getsockname", e))?;
        let bound = if name.first().is_some_and(|&c| c != 0) {
            Some(bound_file(p, fd, &name)?)
        } else {
            None
        };
        let peer_name = sys::unix_peername(fd);
        let image = UnixSocketFile {
            ino: p.meta.ino(),
            sock_type: sock_type as u32,
            name,
            connected: peer_name.is_some(),
            peer_name: peer_name.unwrap_or_default(),
            passcred: opt("SO_PASSCRED", libc::SO_PASSCRED)? != 0,
            sndbuf: opt("SO_SNDBUF", libc::SO_SNDBUF)? as u32,
            rcvbuf: opt("SO_RCVBUF", libc::SO_RCVBUF)? as u32,
            sndtimeo_us: timeout("SO_SNDTIMEO", libc::SO_SNDTIMEO)?,
            rcvtimeo_us: timeout("SO_RCVTIMEO", libc::SO_RCVTIMEO)?,
            peek_off: queue.peek_off,
            listening,
            bound,
            queue: queue.lengths,
            // Known once the whole tree is seen (link_tree).
            peer_file_id: 0,
            peer_ino: 0,
            shutdown: 0,
            backlog: 0,
            connect_to_file_id: 0,
            peer_closed: false,
        };
        if !queue.data.is_empty() {
            blobs.add(ckpt_image::unix_queue_name(file_id), queue.data);
        }
        Ok(Kind::Unix(image))
    }

    fn link_tree(&self, tree: &mut TreeFiles) -> Result<()> {
        let holders = first_holders(tree);
        if holders.is_empty() {
            return Ok(());
        }
        let kernel = diag::all().map_err(|source| DumpError::Proc {
            pid: std::process::id() as i32,
            path: "sock_diag (NETLINK_SOCK_DIAG, unix)".into(),
            source,
        })?;
        let links = Linker::new(tree, &holders, &kernel).links()?;
        apply_links(tree, &links);
        Ok(())
    }
}

/// Every UNIX socket of the tree with the kernel's view of it, linked to
/// its peer or listener by file id (`link_tree`).
struct Linker<'t> {
    tree: &'t TreeFiles,
    /// The first fd holding each socket, for messages and tree order.
    holders: &'t BTreeMap<u64, Holder>,
    /// The kernel's view of every UNIX socket, by inode.
    kernel: &'t HashMap<u64, UnixDiag>,
    /// Every UNIX socket of the tree, with its file id.
    sockets: Vec<(u64, UnixSocketFile)>,
    /// File id of each socket of the tree, by inode.
    by_ino: HashMap<u64, u64>,
    /// Position of each process in tree order: a pending connection is
    /// restored by connecting, so its listener must be restored first.
    order: HashMap<i32, usize>,
}

impl<'t> Linker<'t> {
    fn new(
        tree: &'t TreeFiles,
        holders: &'t BTreeMap<u64, Holder>,
        kernel: &'t HashMap<u64, UnixDiag>,
    ) -> Linker<'t> {
        let sockets: Vec<(u64, UnixSocketFile)> = tree
            .files
            .files
            .iter()
            .filter_map(|f| match &f.kind {
                Some(Kind::Unix(u)) => Some((f.id, u.clone())),
                _ => None,
            })
            .collect();
        let by_ino = sockets.iter().map(|(id, u)| (u.ino, *id)).collect();
        let order = tree
            .tables
            .iter()
            .enumerate()
            .map(|(i, (pid, _))| (*pid, i))
            .collect();
        Linker {
            tree,
            holders,
            kernel,
            sockets,
            by_ino,
            order,
        }
    }

    /// What every socket links to, by file id, once every listener is
    /// checked to have no unaccepted connection from outside the tree.
    fn links(&self) -> Result<HashMap<u64, Link>> {
        let mut links = HashMap::new();
        let mut pending_per_listener: HashMap<u64, usize> = HashMap::new();
        for (file_id, u) in &self.sockets {
            if let Some(link) = self.link(*file_id, u, &mut pending_per_listener)? {
                links.insert(*file_id, link);
            }
        }
        self.check_listeners(&pending_per_listener)?;
        Ok(links)
    }

    /// What socket `u` (file `file_id`) links to, counting in `pending`
    /// the connections a listener of the tree has not accepted; `None`
    /// when its peer's holder was refused (that refusal says why).
    fn link(
        &self,
        file_id: u64,
        u: &UnixSocketFile,
        pending: &mut HashMap<u64, usize>,
    ) -> Result<Option<Link>> {
        let h = &self.holders[&file_id];
        let Some(me) = self.kernel.get(&u.ino) else {
            return Err(refuse(
                h,
                format!(
                    "unix socket socket:[{}] in another network namespace (not visible to ckpt's sock_diag)",
                    u.ino
                ),
            ));
        };
        let mut link = Link {
            shutdown: me.shutdown,
            backlog: me.wqueue,
            ..Link::default()
        };
        let stream = u.sock_type != libc::SOCK_DGRAM as u32;
        if me.state == diag::TCP_LISTEN {
            // Checked by `check_listeners`, once every pending client is
            // matched.
        } else if me.peer != 0 {
            return self.connected(h, u, me, link);
        } else if me.state == diag::TCP_ESTABLISHED && stream && me.shutdown == 0 {
            let listener = self.unaccepted(h, u, me)?;
            *pending.entry(listener).or_default() += 1;
            link.connect_to = listener;
        } else if me.state == diag::TCP_ESTABLISHED && u.connected {
            // Its peer closed: the socket keeps its queue and shutdown.
            // (A datagram socket others connected to is ESTABLISHED
            // too, but has no peer of its own.)
            link.peer_closed = true;
        } else if !u.queue.is_empty()
            && (stream || u.name.is_empty() || u.bound.as_ref().is_some_and(|b| b.unlinked))
        {
            return Err(refuse(
                h,
                "unix socket with data queued, not connected and no name to send it to again"
                    .into(),
            ));
        }
        Ok(Some(link))
    }

    /// A socket connected to `me.peer`: linked to its peer's file, or (a
    /// datagram socket connected one way) to the socket it connects to.
    fn connected(
        &self,
        h: &Holder,
        u: &UnixSocketFile,
        me: &UnixDiag,
        mut link: Link,
    ) -> Result<Option<Link>> {
        let stream = u.sock_type != libc::SOCK_DGRAM as u32;
        let Some(&peer_file) = self.by_ino.get(&me.peer) else {
            if held_in_tree(self.tree, me.peer) {
                // Its holder's fd was refused: that line says why.
                return Ok(None);
            }
            return Err(refuse(
                h,
                format!(
                    "unix socket connected to socket:[{}] outside the dumped tree (dump its holder too, or declare this one with --external socket:[{}])",
                    me.peer, u.ino
                ),
            ));
        };
        if self.kernel.get(&me.peer).map(|d| d.peer) != Some(u.ino) {
            link.connect_to = self.one_way(h, u, me, peer_file, stream)?;
            return Ok(Some(link));
        }
        if !stream && !u.name.is_empty() {
            return Err(refuse(
                h,
                format!(
                    "unix datagram socket bound to {} and connected both ways",
                    printable(&u.name)
                ),
            ));
        }
        link.peer = Some((peer_file, me.peer));
        Ok(Some(link))
    }

    /// A datagram socket connected to one that is not connected back (a
    /// client of a bound server): restore connects it again by the
    /// server's name. Returns the server's file id.
    fn one_way(
        &self,
        h: &Holder,
        u: &UnixSocketFile,
        me: &UnixDiag,
        peer_file: u64,
        stream: bool,
    ) -> Result<u64> {
        let target = self
            .sockets
            .iter()
            .find(|(id, _)| *id == peer_file)
            .map(|(_, t)| t);
        let reachable = target
            .is_some_and(|t| !t.name.is_empty() && !t.bound.as_ref().is_some_and(|b| b.unlinked));
        if stream || !reachable {
            return Err(refuse(
                h,
                format!(
                    "unix datagram socket connected one way to socket:[{}], which has no name to connect to again,",
                    me.peer
                ),
            ));
        }
        if !u.queue.is_empty() {
            return Err(refuse(
                h,
                format!(
                    "unix datagram socket connected one way to {} with datagrams queued for it",
                    printable(&u.peer_name)
                ),
            ));
        }
        let th = &self.holders[&peer_file];
        if self.order[&th.pid] > self.order[&h.pid] {
            return Err(refuse(
                h,
                format!(
                    "unix datagram socket connected to pid {} fd {} (a process restored after it)",
                    th.pid, th.fd
                ),
            ));
        }
        Ok(peer_file)
    }

    /// A stream socket connected to a connection its listener has not
    /// accepted: returns the listener's file id.
    fn unaccepted(&self, h: &Holder, u: &UnixSocketFile, me: &UnixDiag) -> Result<u64> {
        let listener = self
            .sockets
            .iter()
            .find(|(_, l)| l.listening && !l.name.is_empty() && l.name == u.peer_name);
        let Some((listener_id, _)) = listener else {
            return Err(refuse(
                h,
                format!(
                    "unix socket with a connection to {} not yet accepted by a listener outside the dumped tree",
                    printable(&u.peer_name)
                ),
            ));
        };
        let lh = &self.holders[listener_id];
        if self.order[&lh.pid] > self.order[&h.pid] {
            return Err(refuse(
                h,
                format!(
                    "unix socket with a connection not yet accepted by pid {} fd {} (a process restored after it)",
                    lh.pid, lh.fd
                ),
            ));
        }
        if me.wqueue != 0 {
            return Err(refuse(
                h,
                format!(
                    "unix socket sent data on a connection to {} not yet accepted (the kernel cannot show it without accepting)",
                    printable(&u.peer_name)
                ),
            ));
        }
        if let Some(Kind::Unix(l)) = &self.tree.file(*listener_id).kind
            && l.bound.as_ref().is_some_and(|b| b.unlinked)
        {
            return Err(refuse(
                h,
                format!(
                    "unix socket with a connection not yet accepted by {} (whose name was unlinked)",
                    printable(&u.peer_name)
                ),
            ));
        }
        Ok(*listener_id)
    }

    /// Refuses a listener with connections not yet accepted from outside
    /// the tree (`in_tree`: those from inside, by listener file id).
    fn check_listeners(&self, in_tree: &HashMap<u64, usize>) -> Result<()> {
        for (file_id, u) in &self.sockets {
            let Some(me) = self.kernel.get(&u.ino) else {
                continue;
            };
            let inside = in_tree.get(file_id).copied().unwrap_or(0);
            if u.listening && me.pending > inside {
                let h = &self.holders[file_id];
                return Err(DumpError::Unsupported {
                    pid: h.pid,
                    what: format!(
                        "fd {}: listening unix socket {} has {} connections not yet accepted from outside the dumped tree",
                        h.fd,
                        printable(&u.name),
                        me.pending - inside
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Refuses the socket `h` holds, saying `what`.
fn refuse(h: &Holder, what: String) -> DumpError {
    DumpError::Unsupported {
        pid: h.pid,
        what: format!("fd {}: {what}", h.fd),
    }
}

/// Records in every socket's image what `links` found.
fn apply_links(tree: &mut TreeFiles, links: &HashMap<u64, Link>) {
    for file in &mut tree.files.files {
        let (Some(Kind::Unix(u)), Some(link)) = (&mut file.kind, links.get(&file.id)) else {
            continue;
        };
        u.shutdown = u32::from(link.shutdown);
        if let Some((peer_file, peer_ino)) = link.peer {
            u.peer_file_id = peer_file;
            u.peer_ino = peer_ino;
        }
        if u.listening {
            u.backlog = link.backlog;
        }
        u.connect_to_file_id = link.connect_to;
        u.peer_closed = link.peer_closed;
    }
}

/// Some fd of the tree holds socket `ino`, even one refused (not in the
/// collected files).
fn held_in_tree(tree: &TreeFiles, ino: u64) -> bool {
    let link = format!("socket:[{ino}]");
    tree.tables.iter().any(|(pid, _)| {
        procfile::numbered_entries(*pid, "fd").is_ok_and(|fds| {
            fds.into_iter()
                .any(|fd| procfile::readlink(*pid, &format!("fd/{fd}")).is_ok_and(|l| l == link))
        })
    })
}

/// What `link_tree` learns of one socket.
#[derive(Default)]
struct Link {
    shutdown: u8,
    /// Listening: the backlog.
    backlog: u32,
    /// (file id, inode) of its peer.
    peer: Option<(u64, u64)>,
    /// File id of the listener its unaccepted connection waits on.
    connect_to: u64,
    /// Its peer has closed.
    peer_closed: bool,
}

/// The socket file of a path-bound socket: owner, mode, and whether the
/// name still leads to it.
fn bound_file(p: &FdParams, fd: BorrowedFd<'_>, name: &[u8]) -> Result<UnixBoundFile> {
    let file = sys::unix_bound_file(fd).map_err(|e| os_err(p, "SIOCUNIXFILE", e))?;
    let meta = file
        .metadata()
        .map_err(|e| os_err(p, "stat of the bound file", e))?;
    // The name in the process's root, as the process sees it.
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(name));
    let seen = procfile::path(p.pid, "root").join(path.strip_prefix("/").unwrap_or(path));
    let linked = std::fs::symlink_metadata(seen)
        .is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino());
    Ok(UnixBoundFile {
        unlinked: !linked,
        mode: meta.mode() & PERMISSION_BITS,
        uid: meta.uid(),
        gid: meta.gid(),
    })
}

/// Permission bits of a file mode (setuid, setgid, sticky, rwx).
const PERMISSION_BITS: u32 = 0o7777;

/// The first fd of the tree holding each unix socket, by file id.
fn first_holders(tree: &TreeFiles) -> BTreeMap<u64, Holder> {
    let mut out = BTreeMap::new();
    for h in tree.holders() {
        if matches!(tree.file(h.file_id).kind, Some(Kind::Unix(_))) {
            out.entry(h.file_id).or_insert(h);
        }
    }
    out
}

/// A socket name for messages: a path as is, an abstract name as `@name`.
pub(super) fn printable(name: &[u8]) -> String {
    match name.split_first() {
        Some((0, rest)) => format!("@{}", String::from_utf8_lossy(rest)),
        _ => String::from_utf8_lossy(name).into_owned(),
    }
}

/// `struct timeval` as getsockopt returns SO_*TIMEO.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Timeval {
    sec: i64,
    usec: i64,
}

impl Timeval {
    fn micros(self) -> u64 {
        (self.sec.max(0) as u64)
            .saturating_mul(1_000_000)
            .saturating_add(self.usec.max(0) as u64)
    }
}

/// The queue of one socket, copied without consuming it.
struct Queue {
    lengths: Vec<u32>,
    data: Vec<u8>,
    /// SO_PEEK_OFF as the process had it.
    peek_off: i32,
}

/// Copies the messages queued for `fd` to read, walking them with
/// `SO_PEEK_OFF` and putting the process's own peek offset back after.
fn peek_queue(p: &FdParams, fd: BorrowedFd<'_>, sock_type: i32) -> Result<Queue> {
    let old = sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF)
        .map_err(|e| os_err(p, "SO_PEEK_OFF", e))?;
    sys::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF, 0)
        .map_err(|e| os_err(p, "SO_PEEK_OFF", e))?;
    let walked = walk(p, fd, sock_type == libc::SOCK_STREAM);
    let put_back = sys::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF, old)
        .map_err(|e| os_err(p, "SO_PEEK_OFF (put back)", e));
    let (lengths, data) = walked?;
    put_back?;
    // A stream's out-of-band byte (MSG_OOB) is peeked inline, and sending
    // it back inline would hand the reader a byte it never reads.
    if sock_type == libc::SOCK_STREAM {
        let mut byte = [0u8; 1];
        let oob = nix::sys::socket::recv(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &mut byte,
            MsgFlags::MSG_OOB | MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        );
        if oob.is_ok() {
            return Err(p.unsupported("unix socket with out-of-band data queued (MSG_OOB)"));
        }
    }
    // What the peeks saw must be the whole queue.
    if sock_type != libc::SOCK_DGRAM {
        let queued = sys::socket_inq(fd).map_err(|e| os_err(p, "SIOCINQ", e))?;
        if queued != data.len() as u64 {
            return Err(p.unsupported(&format!(
                "unix socket queue not readable whole ({} of {queued} bytes)",
                data.len()
            )));
        }
    }
    Ok(Queue {
        lengths,
        data,
        peek_off: old,
    })
}

/// Why a peek's ancillary data did not fit: fds in flight, unless the
/// socket also asks for data ckpt does not read.
fn in_flight(fd: BorrowedFd<'_>) -> String {
    let on = |opt| sys::getsockopt_int(fd, libc::SOL_SOCKET, opt).is_ok_and(|v| v != 0);
    if on(SO_PASSPIDFD) || on(libc::SO_PASSSEC) {
        "unix socket with SO_PASSPIDFD or SO_PASSSEC and messages queued (ancillary data ckpt does not read)".into()
    } else {
        "unix socket has file descriptors in flight (SCM_RIGHTS)".into()
    }
}

/// The peeks themselves: one message at a time for datagrams and
/// seqpackets, what comes for a stream.
fn walk(p: &FdParams, fd: BorrowedFd<'_>, stream: bool) -> Result<(Vec<u32>, Vec<u8>)> {
    let mut lengths = Vec::new();
    let mut data = Vec::new();
    let mut buf = vec![0u8; PEEK_CHUNK];
    // Room for the credentials SO_PASSCRED attaches and nothing more: fds
    // in flight then show as MSG_CTRUNC instead of landing in ckpt.
    let passcred = sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PASSCRED)
        .map_err(|e| os_err(p, "SO_PASSCRED", e))?
        != 0;
    let control_len = if passcred { CREDS_SPACE } else { CMSGHDR_LEN };
    loop {
        let peeked = match sys::peek_message(fd, &mut buf, !stream, control_len) {
            Ok(m) => m,
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => break,
            Err(e) => return Err(os_err(p, "recvmsg(MSG_PEEK)", e)),
        };
        let len = peeked.len;
        if peeked.ctrunc {
            return Err(p.unsupported(&in_flight(fd)));
        }
        if stream && len == 0 {
            // End of stream: the peer shut down its sending side.
            break;
        }
        if len > buf.len() {
            // A datagram larger than the buffer: the peek offset moved by
            // what was copied; step back and peek it whole.
            let at = i32::try_from(data.len()).map_err(|_| too_large(p))?;
            sys::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF, at)
                .map_err(|e| os_err(p, "SO_PEEK_OFF", e))?;
            buf.resize(len, 0);
            continue;
        }
        if data.len() + len > MAX_QUEUE_BYTES || lengths.len() >= MAX_QUEUE_MESSAGES {
            return Err(too_large(p));
        }
        data.extend_from_slice(&buf[..len]);
        lengths.push(len as u32);
        if !stream && len == 0 {
            // A zero-length datagram does not move the peek offset: the
            // next peek would return it again.
            return Err(p.unsupported("unix socket with an empty datagram queued"));
        }
    }
    Ok((lengths, data))
}

fn too_large(p: &FdParams) -> DumpError {
    p.unsupported(&format!(
        "unix socket with more than {MAX_QUEUE_BYTES} bytes or {MAX_QUEUE_MESSAGES} messages queued"
    ))
}

/// An OS error on the socket copy of `p`, naming pid, fd and the call.
fn os_err(p: &FdParams, what: &str, source: std::io::Error) -> DumpError {
    DumpError::Proc {
        pid: p.pid,
        path: format!("fd {} (unix socket: {what})", p.fd).into(),
        source,
    }
}
