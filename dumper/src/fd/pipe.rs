//! Pipes whose both ends are in the dumped tree. The data buffered in a
//! pipe is copied without consuming it: ckpt opens another read end through
//! `/proc/PID/fd/N`, `tee`s the buffer into a pipe of its own and reads that.
//!
//! A pipe with one end in the tree whose other end no process holds at
//! all (closed everywhere: make's jobserver pipe once its writer exited, a
//! child's stdin after its parent closed its end) is saved like any other:
//! restore creates both ends, and the one nobody held closes when restore
//! ends, so the reader sees the buffered data then EOF, and the writer
//! EPIPE, as before.
//!
//! A pipe whose other end is held outside the tree is refused, except when
//! only fds 0, 1 and 2 hold it (a launcher's pipe): it is marked `outside`,
//! its data is not saved, and restore rebinds those fds to its own, as it
//! does for terminals.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::pipe::PipeFile;
use nix::fcntl::{FcntlArg, SpliceFFlags, fcntl, tee};

use super::{Blobs, FdParams, FileDumper, Holder, TreeFiles};
use crate::error::{DumpError, Result};
use crate::procfile;

/// Anonymous pipes (`pipe:[ino]`).
pub struct Pipe;

impl FileDumper for Pipe {
    fn name(&self) -> &'static str {
        "pipe"
    }

    fn description(&self) -> &'static str {
        "pipes with both ends in the tree (or the other end closed everywhere), with their buffered data; a pipe to outside held only as fd 0-2 is kept while the process outside holds it, else rebound to restore's own fd (data not saved)"
    }

    fn claims(&self, p: &FdParams) -> bool {
        p.meta.mode() & libc::S_IFMT == libc::S_IFIFO && p.link.starts_with("pipe:")
    }

    fn collect(&self, p: &FdParams, _file_id: u64, blobs: &mut Blobs) -> Result<Kind> {
        let pipe_id = p.meta.ino();
        let name = ckpt_image::pipe_data_name(pipe_id);
        let buffered = read_buffered(p)?;
        // Both ends see the same buffer: keep it once.
        if !blobs.has(&name) {
            blobs.add(name, buffered.data);
        }
        Ok(Kind::Pipe(PipeFile {
            pipe_id,
            capacity: buffered.capacity,
            // Known once the whole tree is seen (finish_tree).
            outside: false,
            peer_pid: 0,
            peer_start_time: 0,
        }))
    }

    fn check_tree(&self, tree: &TreeFiles) -> Result<()> {
        for (pipe_id, ends) in pipes_of(tree)? {
            let Some(h) = ends.refused() else {
                continue;
            };
            return Err(DumpError::Unsupported {
                pid: h.pid,
                what: format!(
                    "fd {}: pipe whose other end is outside the dumped tree (dump the process at the other end too, or declare it with --external pipe:[{pipe_id}])",
                    h.fd
                ),
            });
        }
        Ok(())
    }

    fn finish_tree(&self, tree: &mut TreeFiles) {
        // check_tree read the same host a moment ago; if the look fails
        // now, nothing is marked and the dump keeps every pipe's data.
        let outside: BTreeMap<u64, Option<Peer>> = pipes_of(tree)
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, e)| !e.both() && e.refused().is_none())
            .map(|(id, e)| (id, e.outside_holder.and_then(Peer::of)))
            .collect();
        for file in &mut tree.files.files {
            if let Some(Kind::Pipe(p)) = &mut file.kind
                && let Some(peer) = outside.get(&p.pipe_id)
            {
                p.outside = true;
                if let Some(peer) = peer {
                    p.peer_pid = peer.pid;
                    p.peer_start_time = peer.start_time;
                }
            }
        }
        // What sits in a launcher's pipe is the old launcher's to read (or
        // the process's again, on the same pipe).
        for id in outside.into_keys() {
            tree.blobs.remove(&ckpt_image::pipe_data_name(id));
        }
    }
}

/// The fds a launcher's pipe may hold: standard input, output and error,
/// which restore rebinds to its own (the terminal rule).
const STDIO: std::ops::RangeInclusive<i32> = 0..=2;

/// Which ends of one pipe the tree holds, and where.
#[derive(Default)]
struct Ends {
    read: bool,
    write: bool,
    /// The tree holds one end and no process outside it holds any: the
    /// other end is closed everywhere.
    other_closed: bool,
    /// Every fd of the tree holding an end, tree order.
    holders: Vec<Holder>,
    /// A process outside the tree that holds it.
    outside_holder: Option<i32>,
}

/// A process outside the tree by pid and start time.
struct Peer {
    pid: i32,
    start_time: u64,
}

impl Peer {
    /// `pid` with its start time, if it can still be read.
    fn of(pid: i32) -> Option<Peer> {
        let start_time = *procfile::stat_fields(pid)
            .ok()?
            .get(procfile::stat_index(22))?;
        Some(Peer { pid, start_time })
    }
}

impl Ends {
    /// Both ends are in the tree, or the one missing is closed everywhere:
    /// the pipe is saved whole.
    fn both(&self) -> bool {
        (self.read && self.write) || self.other_closed
    }

    /// The first fd that makes this pipe unsaveable: one end is outside
    /// and an fd other than 0, 1 or 2 holds it.
    fn refused(&self) -> Option<&Holder> {
        if self.both() {
            return None;
        }
        self.holders.iter().find(|h| !STDIO.contains(&h.fd))
    }
}

/// Every pipe of the tree by pipe id, with its ends.
fn pipes_of(tree: &TreeFiles) -> Result<BTreeMap<u64, Ends>> {
    let mut pipes: BTreeMap<u64, Ends> = BTreeMap::new();
    for h in tree.holders() {
        let file = tree.file(h.file_id);
        let Some(Kind::Pipe(p)) = &file.kind else {
            continue;
        };
        let ends = pipes.entry(p.pipe_id).or_default();
        ends.read |= file.readable();
        ends.write |= file.writable();
        ends.holders.push(h);
    }
    let half: Vec<u64> = pipes
        .iter()
        .filter(|(_, e)| !(e.read && e.write))
        .map(|(id, _)| *id)
        .collect();
    if !half.is_empty() {
        let tree_pids: Vec<i32> = tree.tables.iter().map(|(pid, _)| *pid).collect();
        let held = held_outside(&tree_pids, &half)?;
        for id in half {
            if let Some(e) = pipes.get_mut(&id) {
                e.outside_holder = held.get(&id).copied().flatten();
                e.other_closed = !held.contains_key(&id);
            }
        }
    }
    Ok(pipes)
}

/// Which of the pipes `ids` a process outside the tree (`tree_pids`) holds
/// an fd of, with the first such process seen. A process whose fds cannot
/// be read counts as holding every one (with no process named): a pipe is
/// taken as closed everywhere only when that is seen.
fn held_outside(tree_pids: &[i32], ids: &[u64]) -> Result<BTreeMap<u64, Option<i32>>> {
    let names: BTreeMap<String, u64> = ids.iter().map(|id| (format!("pipe:[{id}]"), *id)).collect();
    let mut held = BTreeMap::new();
    let proc = std::fs::read_dir("/proc").map_err(|source| DumpError::Proc {
        pid: 0,
        path: "/proc".into(),
        source,
    })?;
    for entry in proc.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if tree_pids.contains(&pid) {
            continue;
        }
        let fds = match std::fs::read_dir(entry.path().join("fd")) {
            Ok(d) => d,
            // Gone meanwhile: it holds nothing now.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(_) => return Ok(ids.iter().map(|id| (*id, None)).collect()),
        };
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path())
                && let Some(id) = link.to_str().and_then(|l| names.get(l))
            {
                held.entry(*id).or_insert(Some(pid));
            }
        }
    }
    Ok(held)
}

/// A pipe's buffer and capacity.
pub(super) struct Buffered {
    /// The bytes buffered in it, still there.
    pub data: Vec<u8>,
    /// F_GETPIPE_SZ.
    pub capacity: u32,
}

/// Copies what is buffered in the pipe or FIFO behind `p` without
/// consuming it (`tee` from a read end reopened through `/proc`).
pub(super) fn read_buffered(p: &FdParams) -> Result<Buffered> {
    let link = p.proc_path();
    let err = |what: &str, e: std::io::Error| DumpError::Proc {
        pid: p.pid,
        path: format!("{} ({what})", link.display()).into(),
        source: e,
    };
    let src = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&link)
        .map_err(|e| err("reopen pipe", e))?;
    let size =
        fcntl(src.as_fd(), FcntlArg::F_GETPIPE_SZ).map_err(|e| err("F_GETPIPE_SZ", e.into()))?;
    let (mut rd, wr) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
            .map_err(|e| err("pipe2", e.into()))
            .map(|(r, w)| (std::fs::File::from(r), w))?;
    fcntl(wr.as_fd(), FcntlArg::F_SETPIPE_SZ(size)).map_err(|e| err("F_SETPIPE_SZ", e.into()))?;
    let copied = match tee(
        src.as_fd(),
        wr.as_fd(),
        size as usize,
        SpliceFFlags::SPLICE_F_NONBLOCK,
    ) {
        Ok(n) => n,
        // Nothing buffered.
        Err(nix::errno::Errno::EAGAIN) => 0,
        Err(e) => return Err(err("tee", e.into())),
    };
    drop(wr);
    let mut data = Vec::with_capacity(copied);
    rd.read_to_end(&mut data).map_err(|e| err("read copy", e))?;
    Ok(Buffered {
        data,
        capacity: size as u32,
    })
}
