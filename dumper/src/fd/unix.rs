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
//! connections not yet accepted whose clients are in the tree (and, in a
//! dump that kills the tree, the data they sent, see `unaccepted`); bound
//! sockets (a name unlinked since bind too), a bound datagram socket with
//! its queue, datagram sockets connected one way to one in the tree, and
//! datagram pairs whose ends are bound; the files queued messages carry
//! (SCM_RIGHTS, see `link_in_flight`) and their senders' credentials
//! (SO_PASSCRED); empty datagrams; sockets never bound nor connected.
//! Sockets in flight with files in flight themselves (nested SCM_RIGHTS)
//! are walked the same way, to any depth.
//! Refused by name: a peer outside the tree, data sent on a connection
//! not yet accepted by a dump leaving the tree running,
//! sockets in another network namespace, and the rarer shapes listed in
//! `link_tree`.

mod diag;
mod unaccepted;

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::unix::{
    MAX_QUEUE_BYTES, MAX_QUEUE_MESSAGES, UnixAncillary, UnixBoundFile, UnixCreds, UnixSocketFile,
};
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

/// SO_PASSPIDFD (Linux 6.5+; not in every libc): a pidfd with each message.
const SO_PASSPIDFD: i32 = 76;

/// First buffer for one peeked message; grown to a message's length.
const PEEK_CHUNK: usize = 64 << 10;

impl FileDumper for Unix {
    fn name(&self) -> &'static str {
        "unix"
    }

    fn description(&self) -> &'static str {
        "UNIX sockets (stream, datagram, seqpacket): pairs within the tree with the data queued both ways, the files in flight (SCM_RIGHTS) and senders' credentials (SO_PASSCRED) of queued messages, listeners on a path or abstract name with their pending connections (and, with --kill, the data sent on them), bound, one-way datagram and never connected sockets; shutdown state and options"
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
                ancillary: Vec::new(),
                files: Vec::new(),
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
            ancillary: queue.ancillary,
            // Taken once the whole tree is seen (link_tree).
            unaccepted_queue: Vec::new(),
        };
        // The files in flight are identified once the whole tree is seen.
        if image.has_files_in_flight() {
            blobs.keep_in_flight(file_id, queue.files);
        }
        if !queue.data.is_empty() {
            blobs.add(ckpt_image::unix_queue_name(file_id), queue.data);
        }
        Ok(Kind::Unix(image))
    }

    fn link_tree(&self, tree: &mut TreeFiles) -> Result<()> {
        link_in_flight(tree)?;
        // After: a socket held only in flight has a queue too.
        check_senders(tree)?;
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
        tree.unaccepted_listeners = links
            .values()
            .filter(|l| l.sent_before_accept)
            .map(|l| l.connect_to)
            .collect();
        Ok(())
    }
}

/// Takes the data clients of the tree sent on connections their listener
/// had not accepted (`TreeFiles::unaccepted_listeners`), by accepting
/// them: called once the whole tree is known to be saved, in the tree's
/// network namespace, since nothing gives those connections back.
pub fn take_unaccepted(tree: &mut TreeFiles) -> Result<()> {
    let listeners = std::mem::take(&mut tree.unaccepted_listeners);
    let holders = first_holders(tree);
    unaccepted::take(tree, &holders, &listeners)
}

/// Refuses a queued message whose sender's credentials (kept for a socket
/// with SO_PASSCRED) name a process outside the tree: restore names the
/// sender again by its pid, which only the tree's processes keep.
fn check_senders(tree: &TreeFiles) -> Result<()> {
    for (file_id, h) in first_holders(tree) {
        let Some(Kind::Unix(u)) = &tree.file(file_id).kind else {
            continue;
        };
        let outside = u
            .ancillary
            .iter()
            .filter_map(|a| a.creds.as_ref())
            .find(|c| !tree.tables.iter().any(|(pid, _)| *pid == c.pid));
        if let Some(c) = outside {
            return Err(refuse(
                &h,
                format!(
                    "unix socket with SO_PASSCRED has a message queued from pid {}, outside the dumped tree (its credentials could not be given back)",
                    c.pid
                ),
            ));
        }
    }
    Ok(())
}

/// Gives every file queued in a socket of the tree (SCM_RIGHTS) its file
/// id: the file of the fd of the tree that shares its description, else a
/// file of its own, collected by its kind like any fd and opened at
/// restore by the receiving socket's process just to be sent again.
/// ckpt's copies of the files, kept from the peeks of `collect`, close
/// when this returns.
fn link_in_flight(tree: &mut TreeFiles) -> Result<()> {
    let mut carriers: std::collections::VecDeque<(u64, Holder)> = first_holders(tree)
        .into_iter()
        .filter(|(id, _)| {
            matches!(&tree.file(*id).kind, Some(Kind::Unix(u)) if u.has_files_in_flight())
        })
        .collect();
    if carriers.is_empty() {
        return Ok(());
    }
    let mut known = KnownFiles::of(tree)?;
    // A socket in flight with files in flight itself joins the carriers
    // (nested SCM_RIGHTS): its files are opened by the same process.
    while let Some((file_id, h)) = carriers.pop_front() {
        let Some(files) = tree.blobs.take_in_flight(file_id) else {
            continue;
        };
        let mut ids = Vec::with_capacity(files.len());
        for message in &files {
            let mut these = Vec::with_capacity(message.len());
            for f in message {
                these.push(known.identify(tree, &h, f.as_fd())?);
            }
            ids.push(these);
        }
        let carrier = tree.files.files.iter_mut().find(|f| f.id == file_id);
        let Some(Kind::Unix(u)) = carrier.and_then(|f| f.kind.as_mut()) else {
            unreachable!("carriers are unix sockets of the tree");
        };
        for (a, these) in u.ancillary.iter_mut().zip(ids) {
            a.file_ids = these;
        }
        carriers.extend(known.nested.drain(..));
    }
    Ok(())
}

/// The files of the tree by identity, to find a file in flight among
/// them, and those found only in flight.
struct KnownFiles {
    /// Every fd of the tree, by the inode of its file.
    by_inode: HashMap<(u64, u64), Vec<Holder>>,
    /// Files collected from ckpt's copy of a file in flight, with that
    /// copy (compared with `kcmp`).
    in_flight: Vec<(OwnedFd, u64)>,
    /// Sockets found in flight that carry files in flight themselves, not
    /// yet walked, with the fd their files arrive through.
    nested: Vec<(u64, Holder)>,
}

impl KnownFiles {
    fn of(tree: &TreeFiles) -> Result<KnownFiles> {
        let mut by_inode: HashMap<(u64, u64), Vec<Holder>> = HashMap::new();
        for h in tree.holders() {
            let path = procfile::path(h.pid, &format!("fd/{}", h.fd));
            let meta = std::fs::metadata(&path).map_err(|s| procfile::proc_err(h.pid, path, s))?;
            by_inode
                .entry((meta.dev(), meta.ino()))
                .or_default()
                .push(h);
        }
        Ok(KnownFiles {
            by_inode,
            in_flight: Vec::new(),
            nested: Vec::new(),
        })
    }

    /// The file id of `f`, a file in flight to the socket `to` holds:
    /// collected now if no fd of the tree shares its description.
    fn identify(&mut self, tree: &mut TreeFiles, to: &Holder, f: BorrowedFd<'_>) -> Result<u64> {
        let me = std::process::id() as i32;
        let raw = std::os::fd::AsRawFd::as_raw_fd(&f);
        let path = procfile::path(me, &format!("fd/{raw}"));
        let meta = std::fs::metadata(&path).map_err(|s| procfile::proc_err(me, path, s))?;
        let same = |pid: i32, fd: i32| {
            sys::same_file_description_of(me, raw, pid, fd).map_err(|source| DumpError::Proc {
                pid: to.pid,
                path: format!(
                    "kcmp of a file in flight to fd {} with pid {pid} fd {fd}",
                    to.fd
                )
                .into(),
                source,
            })
        };
        for h in self
            .by_inode
            .get(&(meta.dev(), meta.ino()))
            .into_iter()
            .flatten()
        {
            if same(h.pid, h.fd)? {
                return Ok(h.file_id);
            }
        }
        for (copy, id) in &self.in_flight {
            if same(me, std::os::fd::AsRawFd::as_raw_fd(copy))? {
                return Ok(*id);
            }
        }
        let p = super::params(me, raw, &[])?;
        let id = tree.files.files.len() as u64 + 1;
        let collected = match super::KINDS.iter().find(|k| k.claims(&p)) {
            Some(k) => k.collect(&p, id, &mut tree.blobs),
            None => Err(p.unsupported(&p.describe())),
        };
        let kind = collected.map_err(|e| in_flight_error(to, e))?;
        if let Kind::Unix(u) = &kind
            && u.has_files_in_flight()
        {
            self.nested.push((
                id,
                Holder {
                    pid: to.pid,
                    fd: to.fd,
                    file_id: id,
                },
            ));
        }
        let file = ckpt_image::fd::File {
            id,
            flags: p.flags & !(libc::O_CLOEXEC as u32),
            pos: p.pos,
            kind: Some(kind),
        };
        log::debug!(
            "pid {}: fd {}: {} {} in flight (open file {id})",
            to.pid,
            to.fd,
            file.kind_name(),
            p.link
        );
        tree.files.files.push(file);
        tree.add_in_flight(to.pid, id);
        let copy = f
            .try_clone_to_owned()
            .map_err(|e| os_err(&p, "dup of a file in flight", e))?;
        self.in_flight.push((copy, id));
        Ok(id)
    }
}

/// An error about a file in flight, said of the socket it is queued in
/// (not of ckpt, which held it to look at it).
fn in_flight_error(to: &Holder, e: DumpError) -> DumpError {
    let what = match e {
        DumpError::Unsupported { what, .. } => what,
        other => other.to_string(),
    };
    DumpError::Unsupported {
        pid: to.pid,
        what: format!(
            "fd {}: unix socket has a file in flight that ckpt cannot save: {what}",
            to.fd
        ),
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
            link.sent_before_accept = me.wqueue != 0;
        } else if me.state == diag::TCP_ESTABLISHED && u.connected {
            // Its peer closed: the socket keeps its queue and shutdown.
            // (A datagram socket others connected to is ESTABLISHED
            // too, but has no peer of its own.)
            link.peer_closed = true;
        } else if !u.queue.is_empty() && (stream || u.name.is_empty()) {
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
        // A path unlinked since bind is reached again through the socket
        // file restore keeps open.
        let reachable = target.is_some_and(|t| !t.name.is_empty());
        if stream || !reachable {
            return Err(refuse(
                h,
                format!(
                    "unix datagram socket connected one way to socket:[{}], which has no name to connect to again,",
                    me.peer
                ),
            ));
        }
        // Its own queue is sent again to its name before it connects.
        if !u.queue.is_empty() && u.name.is_empty() {
            return Err(refuse(
                h,
                format!(
                    "unix datagram socket connected one way to {} with datagrams queued for it and no name of its own to send them to again",
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
        // The listener whose queue holds it: by the kernel's list, not by
        // name (a name unlinked may since name another listener).
        let listener = self.sockets.iter().find(|(_, l)| {
            l.listening
                && !l.name.is_empty()
                && self
                    .kernel
                    .get(&l.ino)
                    .is_some_and(|k| k.pending_clients.contains(&u.ino))
        });
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
        if me.wqueue != 0 && !self.tree.killed_after {
            return Err(refuse(
                h,
                format!(
                    "unix socket sent data on a connection to {} not yet accepted (the kernel shows it only by accepting, which a dump leaving the tree running must not do; dump with --kill)",
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
    /// A connection not yet accepted on which it sent data: its listener
    /// is drained by [`take_unaccepted`].
    sent_before_accept: bool,
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
    /// What each message carries besides its bytes (empty if none does);
    /// file ids are 0 until `link_tree` knows them.
    ancillary: Vec<UnixAncillary>,
    /// The files each message carries, installed in ckpt by the peek.
    files: Vec<Vec<OwnedFd>>,
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
    let walked = walk(p, fd, sock_type);
    let put_back = sys::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF, old)
        .map_err(|e| os_err(p, "SO_PEEK_OFF (put back)", e));
    let mut queue = walked?;
    put_back?;
    queue.peek_off = old;
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
        if queued != queue.data.len() as u64 {
            return Err(p.unsupported(&format!(
                "unix socket queue not readable whole ({} of {queued} bytes)",
                queue.data.len()
            )));
        }
    }
    Ok(queue)
}

/// Why a peek's ancillary data cannot be kept: options asking for data
/// ckpt does not restore, or more than its control buffer holds.
fn unkept_ancillary(fd: BorrowedFd<'_>) -> String {
    let on = |opt| sys::getsockopt_int(fd, libc::SOL_SOCKET, opt).is_ok_and(|v| v != 0);
    if on(SO_PASSPIDFD) || on(libc::SO_PASSSEC) {
        "unix socket with SO_PASSPIDFD or SO_PASSSEC and messages queued (ancillary data ckpt does not read)".into()
    } else {
        "unix socket with a queued message whose ancillary data does not fit ckpt's control buffer"
            .into()
    }
}

/// The socket is shut down for reading: a read of 0 bytes is its end,
/// not an empty message.
fn read_shut_down(fd: BorrowedFd<'_>) -> bool {
    sys::poll_now(fd, libc::POLLRDHUP).is_ok_and(|r| r & libc::POLLRDHUP != 0)
}

/// The peeks themselves: one message at a time for datagrams and
/// seqpackets, what comes for a stream (a chunk ends at a message
/// carrying files).
fn walk(p: &FdParams, fd: BorrowedFd<'_>, sock_type: i32) -> Result<Queue> {
    let stream = sock_type == libc::SOCK_STREAM;
    let mut q = Queue {
        lengths: Vec::new(),
        data: Vec::new(),
        ancillary: Vec::new(),
        files: Vec::new(),
        peek_off: 0,
    };
    let mut buf = vec![0u8; PEEK_CHUNK];
    let passcred = sys::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PASSCRED)
        .map_err(|e| os_err(p, "SO_PASSCRED", e))?
        != 0;
    let shut = read_shut_down(fd);
    loop {
        let peeked = match sys::peek_message(fd, &mut buf, !stream) {
            Ok(m) => m,
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => break,
            // A stream or seqpacket socket never connected has no queue
            // to read (EINVAL, ENOTCONN).
            Err(e)
                if q.lengths.is_empty()
                    && !stream_or_dgram_connected(fd, sock_type)
                    && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOTCONN)) =>
            {
                break;
            }
            Err(e) => return Err(os_err(p, "recvmsg(MSG_PEEK)", e)),
        };
        let len = peeked.len;
        if peeked.ctrunc || peeked.other.is_some() {
            return Err(p.unsupported(&unkept_ancillary(fd)));
        }
        if len == 0 && (stream || shut) && peeked.fds.is_empty() {
            // End of the queue: the peer shut down its sending side.
            break;
        }
        if len > buf.len() {
            // A datagram larger than the buffer: the peek offset moved by
            // what was copied; step back and peek it whole.
            let at = i32::try_from(q.data.len()).map_err(|_| too_large(p))?;
            sys::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF, at)
                .map_err(|e| os_err(p, "SO_PEEK_OFF", e))?;
            buf.resize(len, 0);
            continue;
        }
        if q.data.len() + len > MAX_QUEUE_BYTES || q.lengths.len() >= MAX_QUEUE_MESSAGES {
            return Err(too_large(p));
        }
        q.data.extend_from_slice(&buf[..len]);
        q.lengths.push(len as u32);
        q.ancillary.push(UnixAncillary {
            // Known once the whole tree is seen (link_tree).
            file_ids: vec![0; peeked.fds.len()],
            // pid 0: no credentials were attached when it was sent
            // (neither end had SO_PASSCRED); sent again the same way.
            creds: peeked
                .creds
                .filter(|c| passcred && c.pid != 0)
                .map(|c| UnixCreds {
                    pid: c.pid,
                    uid: c.uid,
                    gid: c.gid,
                }),
        });
        q.files.push(peeked.fds);
        // An empty datagram is marked peeked by the kernel and skipped by
        // the next peek, which goes on to the one after it.
    }
    if q.ancillary
        .iter()
        .all(|a| a.file_ids.is_empty() && a.creds.is_none())
    {
        q.ancillary.clear();
    }
    Ok(q)
}

/// A datagram socket, or a stream or seqpacket one that has a peer.
fn stream_or_dgram_connected(fd: BorrowedFd<'_>, sock_type: i32) -> bool {
    sock_type == libc::SOCK_DGRAM || sys::unix_peername(fd).is_some()
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
