//! Open files, dump side: walks each process's `/proc/PID/fd`, finds which
//! fds of the whole tree share one open file description (`kcmp`), and has
//! the kind's module describe each description once.
//!
//! Adding a kind of file: its image message (`image/src/fd/KIND.rs`), a
//! module here implementing [`FileDumper`], one line in [`KINDS`], and the
//! restore side's twin (`restorer/src/fd/KIND.rs`).

mod dev;
mod epoll;
mod eventfd;
mod external;
mod fanotify;
mod fifo;
mod ib;
pub(crate) mod inet;
mod inotify;
mod lock;
mod memfd;
mod netlink;
mod packet;
mod pidfd;
mod pipe;
mod proc;
mod pty;
mod reg;
mod signalfd;
mod sockdiag;
mod timerfd;
mod tty;
mod unix;

pub use pty::link_controlling_terminals;
pub use unix::take_unaccepted;

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::{Fd, FdTable, File, Files, file};

use crate::blockers::Blockers;
use crate::error::{DumpError, Result};
use crate::procfile;
use crate::sys;

/// Every kind of open file ckpt can save; the first that claims an fd
/// describes it. An fd no kind claims fails the dump, naming pid, fd and
/// what it is.
static KINDS: &[&dyn FileDumper] = &[
    // First: the user's word that an fd is external beats its kind.
    &external::External,
    // Before dev: a verbs device is a character device too.
    &ib::Ib,
    // Before reg: a /proc file is a regular file too.
    &proc::Proc,
    &reg::Reg,
    &dev::Dev,
    &tty::Tty,
    &pipe::Pipe,
    &eventfd::Eventfd,
    &timerfd::Timerfd,
    &signalfd::Signalfd,
    &fifo::Fifo,
    &epoll::Epoll,
    &pty::Pty,
    &inet::Inet,
    &inotify::Inotify,
    &fanotify::Fanotify,
    &pidfd::Pidfd,
    &memfd::Memfd,
    &unix::Unix,
    &netlink::Netlink,
    &packet::Packet,
];

/// What ckpt refuses by name (an fd of these fails the dump, naming pid and
/// fd): (name, why), for `ckpt check --kinds` and the README.
pub static REFUSED: &[(&str, &str)] = &[
    (
        "other sockets",
        "sockets of families other than UNIX, IPv4/IPv6, netlink and packet (vsock, bluetooth, ...), named by family; a netlink socket with a dump in progress; a packet socket with a ring (PACKET_RX_RING, PACKET_TX_RING), in a fanout group or with memberships",
    ),
    (
        "corked UDP with data pending",
        "a UDP or UDP-Lite socket holding back the start of a datagram (UDP_CORK set, or a send with MSG_MORE, with bytes pending), named \"corked UDP socket\" with its address; corked with nothing pending is saved",
    ),
    (
        "TCP in other states",
        "TCP connections in SYN_RECV (a TCP Fast Open server's accepted socket before the handshake is done), connections not accepted yet whose client is outside the tree or whose server end holds bytes of it, connections to a peer outside the tree without --tcp-established",
    ),
    (
        "unix socket to outside the tree",
        "a UNIX socket whose peer no process of the tree holds, unless declared with --external socket:[INO]",
    ),
    (
        "unix data before accept",
        "data a client sent on a UNIX connection its listener has not accepted, in a dump that leaves the tree running (the kernel shows it only by accepting; a dump with --kill takes it), or sent there with files or credentials; a pending connection from outside the tree",
    ),
    (
        "unix datagram connected one way",
        "a UNIX datagram socket connected one way to a socket without a name, or restored after it, or with datagrams queued for itself and no name of its own",
    ),
    (
        "unix nested fds in flight",
        "a file in flight (SCM_RIGHTS, also in a socket in flight) of a kind ckpt refuses (named with its kind); a message credited (SO_PASSCRED) to a process outside the tree, or in a tree with a PID namespace of its own",
    ),
    (
        "pipe to outside the tree",
        "a pipe whose other end no process of the tree holds, unless only fds 0-2 hold it (kept while the process outside holds it, else rebound to restore's stdio) or it is declared with --external",
    ),
    (
        "pty output in packet mode",
        "bytes a pty slave wrote that its master, in packet mode (TIOCPKT), has not read yet",
    ),
    (
        "unprivileged fanotify",
        "fanotify groups of a process without CAP_SYS_ADMIN, and marks whose inode no path names any more",
    ),
    (
        "hugetlb memfd",
        "memfds made with MFD_HUGETLB (fds and mappings)",
    ),
    (
        "other devices",
        "character and block devices other than the ones above",
    ),
    (
        "unlinked symbolic link",
        "an O_PATH|O_NOFOLLOW fd of a symbolic link removed since it was opened",
    ),
    (
        "file lease",
        "leases being broken or signalled to another process than their holder (F_SETOWN), delegations, mandatory locks of old kernels, and locks on files not reopened by path (the process is refused)",
    ),
];

/// Every kind of open file ckpt can save: (name, one-line description),
/// in registry order.
pub fn supported_kinds() -> impl Iterator<Item = (&'static str, &'static str)> {
    KINDS.iter().map(|k| (k.name(), k.description()))
}

/// One kind of open file, dump side.
pub trait FileDumper: Sync {
    /// Short name, as `ckpt show` prints it (`File::kind_name`).
    fn name(&self) -> &'static str;
    /// What it covers, in one line for `ckpt check --kinds`.
    fn description(&self) -> &'static str;
    /// This kind describes the fd.
    fn claims(&self, p: &FdParams) -> bool;
    /// Describes the open file description behind `p` (its process is
    /// frozen). Contents that are not metadata (an unlinked file's bytes, a
    /// pipe's buffer) go to `blobs`.
    fn collect(&self, p: &FdParams, file_id: u64, blobs: &mut Blobs) -> Result<file::Kind>;
    /// Fills in what refers to other open files of the tree (an epoll's
    /// targets, by file id), once every fd is collected and before
    /// [`FileDumper::check_tree`].
    fn link_tree(&self, _tree: &mut TreeFiles) -> Result<()> {
        Ok(())
    }
    /// Checks what only the whole tree tells (e.g. both ends of a pipe are
    /// in it), once every fd is collected.
    fn check_tree(&self, _tree: &TreeFiles) -> Result<()> {
        Ok(())
    }
    /// Completes what only the whole tree tells (e.g. a stdio pipe whose
    /// other end is outside), once every kind's `check_tree` passed.
    fn finish_tree(&self, _tree: &mut TreeFiles) {}
}

/// What an fd's `/proc` entries say about it.
pub struct FdParams {
    /// The process.
    pub pid: i32,
    /// The fd number.
    pub fd: i32,
    /// `readlink /proc/PID/fd/N`.
    pub link: String,
    /// `stat /proc/PID/fd/N` (the open file itself).
    pub meta: std::fs::Metadata,
    /// `flags:` of fdinfo (octal open flags, O_CLOEXEC included).
    pub flags: u32,
    /// `pos:` of fdinfo.
    pub pos: i64,
    /// The whole fdinfo text, for kinds that report more fields there.
    pub info: String,
    /// The user declared this fd's file external (`--external`, matching
    /// [`FdParams::link`]).
    pub external: bool,
}

impl FdParams {
    /// An "unsupported" error for this fd.
    pub fn unsupported(&self, what: &str) -> DumpError {
        DumpError::Unsupported {
            pid: self.pid,
            what: format!("fd {}: {what}", self.fd),
        }
    }

    /// The address family of a socket fd (`SO_DOMAIN`, asked of ckpt's
    /// own copy), or `None` for another file or a socket ckpt cannot copy.
    pub fn socket_domain(&self) -> Option<i32> {
        use std::os::fd::AsFd;
        use std::os::unix::fs::MetadataExt;
        if self.meta.mode() & libc::S_IFMT != libc::S_IFSOCK {
            return None;
        }
        crate::sys::take_fd(self.pid, self.fd)
            .and_then(|s| crate::sys::getsockopt_int(s.as_fd(), libc::SOL_SOCKET, libc::SO_DOMAIN))
            .ok()
    }

    /// A field of the fdinfo text, or an error naming it.
    pub fn info_field(&self, key: &str) -> Result<&str> {
        procfile::status_field(&self.info, key).ok_or_else(|| DumpError::Parse {
            pid: self.pid,
            path: format!("fdinfo/{}", self.fd),
            what: format!("no {key} field"),
        })
    }

    /// Whether the fd was opened `O_PATH`: it names a file without
    /// opening it, so it has no offset and reads nothing.
    pub fn is_o_path(&self) -> bool {
        self.info_field("flags")
            .ok()
            .and_then(|f| i64::from_str_radix(f, 8).ok())
            .is_some_and(|f| f & libc::O_PATH as i64 != 0)
    }

    /// `/proc/PID/fd/N`, through which ckpt can open the same object.
    pub fn proc_path(&self) -> std::path::PathBuf {
        procfile::path(self.pid, &format!("fd/{}", self.fd))
    }

    /// What the fd is, in words, for an error when no kind claims it.
    fn describe(&self) -> String {
        if let Some(kind) = self.link.strip_prefix("anon_inode:") {
            return kind.trim_matches(|c| c == '[' || c == ']').to_string();
        }
        match self.meta.mode() & libc::S_IFMT {
            libc::S_IFREG if self.link.starts_with("/memfd:") => "memfd".into(),
            libc::S_IFIFO if self.link.starts_with("pipe:") => "pipe".into(),
            libc::S_IFIFO => "named pipe (FIFO)".into(),
            libc::S_IFSOCK => match sys::socket_protocol(&self.proc_path()) {
                Ok(proto) => format!("{} socket", socket_family(&proto)),
                Err(_) => "socket".into(),
            },
            libc::S_IFBLK => "block device".into(),
            libc::S_IFLNK => format!("unlinked symbolic link {}", self.link),
            libc::S_IFCHR => {
                let rdev = self.meta.rdev();
                format!(
                    "character device {} ({}:{})",
                    self.link,
                    libc::major(rdev),
                    libc::minor(rdev)
                )
            }
            _ => format!("file type of {}", self.link),
        }
    }
}

/// The family a socket's sockfs protocol name (`NETLINK`, `TCPv6`, ...)
/// belongs to, in the words a user knows.
fn socket_family(proto: &str) -> String {
    match proto {
        "TCP" | "UDP" | "MPTCP" | "SCTP" => "inet".into(),
        "TCPv6" | "UDPv6" | "MPTCPv6" | "SCTPv6" => "inet6".into(),
        "RAW" | "RAWv6" => "raw inet".into(),
        "PING" | "PINGv6" => "ping".into(),
        "UDP-Lite" | "UDPLITEv6" => "UDP-Lite".into(),
        other => other.to_lowercase(),
    }
}

/// Raw image files produced while collecting (written beside the
/// metadata, checksummed like it), and the files a collected UNIX socket
/// has in flight, held until the whole tree is seen.
#[derive(Default)]
pub struct Blobs(Vec<Blob>, HashMap<u64, FilesInFlight>);

/// The files each queued message of one socket carries (SCM_RIGHTS), as
/// ckpt's own fds: a message may be seen by one peek only (an empty
/// datagram is skipped once peeked), so they are kept from that peek.
pub type FilesInFlight = Vec<Vec<std::os::fd::OwnedFd>>;

/// One raw image file.
pub struct Blob {
    /// Image file name.
    pub name: String,
    /// Its bytes.
    pub data: Vec<u8>,
}

impl Blobs {
    /// Adds a raw image.
    pub fn add(&mut self, name: String, data: Vec<u8>) {
        self.0.push(Blob { name, data });
    }

    /// Appends to the raw image of this name (added first if missing).
    pub fn append(&mut self, name: &str, data: &[u8]) {
        match self.0.iter_mut().find(|b| b.name == name) {
            Some(b) => b.data.extend_from_slice(data),
            None => self.add(name.to_string(), data.to_vec()),
        }
    }

    /// Drops the raw image of this name, if any (contents that turned out
    /// not to be saved once the whole tree was seen).
    pub fn remove(&mut self, name: &str) {
        self.0.retain(|b| b.name != name);
    }

    /// A raw image of this name was already added.
    pub fn has(&self, name: &str) -> bool {
        self.0.iter().any(|b| b.name == name)
    }

    /// Keeps the files in flight on the socket of file `file_id`.
    pub fn keep_in_flight(&mut self, file_id: u64, files: FilesInFlight) {
        self.1.insert(file_id, files);
    }

    /// Takes the files in flight kept for file `file_id`.
    pub fn take_in_flight(&mut self, file_id: u64) -> Option<FilesInFlight> {
        self.1.remove(&file_id)
    }

    /// The raw images, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = &Blob> {
        self.0.iter()
    }
}

/// One fd of the tree, pointing at its file.
pub struct Holder {
    /// The process.
    pub pid: i32,
    /// The fd number.
    pub fd: i32,
    /// The open file description.
    pub file_id: u64,
}

/// Every fd and open file of the tree, as collected.
pub struct TreeFiles {
    /// Per process (tree order): its fd table.
    pub tables: Vec<(i32, FdTable)>,
    /// Every open file description, sorted by id.
    pub files: Files,
    /// Raw images (ghost contents, pipe buffers).
    pub blobs: Blobs,
    /// The tree is killed once this dump commits: a kind may take what it
    /// cannot give back (a UNIX connection's data before accept).
    pub killed_after: bool,
    /// UNIX listeners (file ids) whose pending connections carry data the
    /// dump takes by accepting them ([`take_unaccepted`]), once nothing
    /// refuses the dump.
    pub unaccepted_listeners: BTreeSet<u64>,
}

impl TreeFiles {
    /// Every fd of the tree with its process, tree order, then the files
    /// only in flight (`FdTable::in_flight`, numbers no fd has).
    pub fn holders(&self) -> impl Iterator<Item = Holder> + '_ {
        let fds = self.tables.iter().flat_map(|(pid, t)| {
            t.fds.iter().map(|f| Holder {
                pid: *pid,
                fd: f.fd,
                file_id: f.file_id,
            })
        });
        let in_flight = self.tables.iter().flat_map(|(pid, t)| {
            t.in_flight.iter().map(|f| Holder {
                pid: *pid,
                fd: f.fd,
                file_id: f.file_id,
            })
        });
        fds.chain(in_flight)
    }

    /// Records file `file_id`, queued in a socket process `pid` holds and
    /// held by no fd of the tree, in that process's table: restore opens
    /// it there at a number above its fds, sends it and closes it.
    pub fn add_in_flight(&mut self, pid: i32, file_id: u64) {
        let Some((_, table)) = self.tables.iter_mut().find(|(p, _)| *p == pid) else {
            return;
        };
        let above = table
            .fds
            .iter()
            .chain(&table.in_flight)
            .map(|f| f.fd)
            .max()
            .unwrap_or(-1);
        table.in_flight.push(Fd {
            fd: above + 1,
            cloexec: true,
            file_id,
        });
    }

    /// The file with this id (ids come from this collection).
    pub fn file(&self, id: u64) -> &File {
        self.files
            .get(id)
            .expect("ids are assigned by collect_tree")
    }
}

/// The identity `stat` gives an open file; descriptions of one object
/// share it, so only those need a `kcmp`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Inode {
    dev: u64,
    ino: u64,
}

/// Collects the fd tables of a frozen tree (`pids` in tree order, parents
/// first) and every open file description behind them, once; fds for
/// which `ckpts_own(pid, fd)` holds (write tracking ckpt left there) are
/// not the job's and are left out; `killed_after`: see
/// [`TreeFiles::killed_after`].
pub fn collect_tree(
    pids: &[i32],
    externals: &[String],
    ckpts_own: &dyn Fn(i32, i32) -> bool,
    killed_after: bool,
    blockers: &mut Blockers,
) -> Result<TreeFiles> {
    let mut out = TreeFiles {
        tables: Vec::new(),
        files: Files::default(),
        blobs: Blobs::default(),
        killed_after,
        unaccepted_listeners: BTreeSet::new(),
    };
    let mut seen: HashMap<Inode, Vec<Holder>> = HashMap::new();
    let mut seen_locks = lock::SeenLocks::default();
    for &pid in pids {
        let mut table = FdTable::default();
        seen_locks.next_process();
        for fd in procfile::numbered_entries(pid, "fd")? {
            if ckpts_own(pid, fd) {
                log::debug!("pid {pid}: fd {fd}: ckpt's write tracking, not saved");
                continue;
            }
            let p = params(pid, fd, externals)?;
            let inode = Inode {
                dev: p.meta.dev(),
                ino: p.meta.ino(),
            };
            let file_id = match same_description(&p, seen.get(&inode).map(Vec::as_slice))? {
                Some(id) => {
                    log::debug!("pid {pid}: fd {fd}: shares open file {id}");
                    id
                }
                None => {
                    let id = out.files.files.len() as u64 + 1;
                    let collected = match KINDS.iter().find(|k| k.claims(&p)) {
                        Some(k) => k.collect(&p, id, &mut out.blobs),
                        None => Err(p.unsupported(&p.describe())),
                    };
                    let Some(kind) = blockers.absorb(collected)? else {
                        continue;
                    };
                    let file = File {
                        id,
                        flags: p.flags & !(libc::O_CLOEXEC as u32),
                        pos: p.pos,
                        kind: Some(kind),
                    };
                    log::debug!(
                        "pid {pid}: fd {fd}: {} {} (open file {id})",
                        file.kind_name(),
                        p.link
                    );
                    out.files.files.push(file);
                    id
                }
            };
            let file = out.file(file_id);
            if let Some(locks) = blockers.absorb(lock::locks_of(&p, file, &mut seen_locks))? {
                table.locks.extend(locks);
            }
            seen.entry(inode)
                .or_default()
                .push(Holder { pid, fd, file_id });
            table.fds.push(Fd {
                fd,
                cloexec: p.flags & libc::O_CLOEXEC as u32 != 0,
                file_id,
            });
        }
        out.tables.push((pid, table));
    }
    for k in KINDS {
        blockers.absorb(k.link_tree(&mut out))?;
    }
    for k in KINDS {
        blockers.absorb(k.check_tree(&out))?;
    }
    for k in KINDS {
        k.finish_tree(&mut out);
    }
    Ok(out)
}

/// The id of an already collected description `p` shares, if any.
fn same_description(p: &FdParams, candidates: Option<&[Holder]>) -> Result<Option<u64>> {
    let mut checked: Vec<u64> = Vec::new();
    for h in candidates.unwrap_or_default() {
        if checked.contains(&h.file_id) {
            continue;
        }
        checked.push(h.file_id);
        let same = sys::same_file_description_of(h.pid, h.fd, p.pid, p.fd).map_err(|source| {
            DumpError::Proc {
                pid: p.pid,
                path: format!("kcmp pid {} fd {} / fd {}", h.pid, h.fd, p.fd).into(),
                source,
            }
        })?;
        if same {
            return Ok(Some(h.file_id));
        }
    }
    Ok(None)
}

fn params(pid: i32, fd: i32, externals: &[String]) -> Result<FdParams> {
    let link = procfile::readlink(pid, &format!("fd/{fd}"))?;
    let lp = procfile::path(pid, &format!("fd/{fd}"));
    let meta = std::fs::metadata(&lp).map_err(|s| procfile::proc_err(pid, lp, s))?;
    let info = procfile::read(pid, &format!("fdinfo/{fd}"))?;
    let bad = |what: &str| DumpError::Parse {
        pid,
        path: format!("fdinfo/{fd}"),
        what: what.into(),
    };
    let field = |k: &str| procfile::status_field(&info, k).unwrap_or("0");
    Ok(FdParams {
        pid,
        fd,
        external: externals.contains(&link),
        link,
        meta,
        flags: u32::from_str_radix(field("flags"), 8).map_err(|_| bad("flags"))?,
        pos: field("pos").parse().map_err(|_| bad("pos"))?,
        info,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registry and the image's list of kinds name the same kinds: a
    /// kind added to the schema without a dumper (or the other way round)
    /// fails here.
    #[test]
    fn every_kind_of_the_image_has_one_dumper() {
        let mut dumped: Vec<&str> = KINDS.iter().map(|k| k.name()).collect();
        dumped.sort_unstable();
        let mut listed = ckpt_image::fd::KIND_NAMES.to_vec();
        listed.sort_unstable();
        assert_eq!(dumped, listed);
    }
}
