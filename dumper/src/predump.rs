//! Incremental dumps: `ckpt dump --pre-dump`, and `--prev` to save only
//! what was written since.
//!
//! A pre-dump freezes the tree just long enough to leave a userfaultfd in
//! every process (kept at a high fd) that write-protects its private memory
//! in the kernel's asynchronous mode: a write simply clears the page's
//! protection, nobody waits. The memory is then copied while the tree runs.
//! The next dump given the pre-dump with `--prev` asks `PAGEMAP_SCAN`
//! which pages lost their protection (written since), and takes every
//! chunk that holds none of them from the pre-dump's pages file instead of
//! the process: LZ4 blocks are reused as stored. (This kernel has no
//! soft-dirty bits; CRIU's pre-dumps use those.) A page is taken from the
//! pre-dump only when all of these hold: its VMA is still tracked (the
//! scan refuses untracked VMAs: new, remapped, or the process closed the
//! userfaultfd), it was not written, and its chunk covers exactly the same
//! pages as then. Anything else is read from the process, so the result is
//! always the memory of the final freeze.
//!
//! The new checkpoint holds every page it needs, one copy each, and does
//! not refer to the pre-dump, which can be removed once it is committed:
//! storage stays bounded however many increments are taken, as in the
//! DejaVu paper ("DejaVu: Transparent User-Level Checkpointing, Migration,
//! and Recovery for Distributed Systems") where increments are merged into
//! one image. The pre-dump is opened (seal and checksums verified) before
//! the freeze.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use ckpt_image::mm::{Mm, PageEncoding, PageRange, Vma, VmaKind, WriteTracking};
use ckpt_image::{ImageDir, ImageError, ImageKey, ImageKind};
use ckpt_parasite::uffd::{Applied, Features, RegisterMode, Userfault};
use rayon::prelude::*;

use crate::error::{DumpError, Result};
use crate::pages::{self, CHUNK_BYTES, Memory, Sink};
use crate::{HeldBuf, HeldMemory, procfile, sys};

/// A pre-dump given with `--prev`, verified.
pub struct Previous {
    images: ImageDir,
    procs: HashMap<i32, PrevProcess>,
}

/// One process of a pre-dump.
pub struct PrevProcess {
    /// How its writes are tracked.
    pub tracking: Option<WriteTracking>,
    compressed: bool,
    pages_name: String,
    /// Where each saved chunk is, by (address, bytes).
    stored: HashMap<(u64, u64), Stored>,
}

impl PrevProcess {
    /// [`Previous::frozen_read_estimate`] of process `pid`.
    fn frozen_read_estimate(&self, pid: i32) -> u64 {
        let Ok(pagemap) = File::open(procfile::path(pid, "pagemap")) else {
            return 0;
        };
        let mut chunks: Vec<(u64, u64)> = self.stored.keys().copied().collect();
        chunks.sort_unstable();
        // One scan per stretch of adjacent chunks, not one per chunk.
        let mut stretches: Vec<(u64, u64)> = Vec::new();
        for &(addr, len) in &chunks {
            match stretches.last_mut() {
                Some(last) if last.1 == addr => last.1 = addr + len,
                _ => stretches.push((addr, addr + len)),
            }
        }
        let mut regions = Vec::new();
        for (start, end) in stretches {
            let scanned = sys::pagemap_scan_with(
                &pagemap,
                start,
                end,
                sys::page_is::WRITTEN,
                sys::page_is::WRITTEN,
                0,
                &mut regions,
            );
            if scanned.is_err() {
                return 0;
            }
        }
        let written = Written {
            ranges: regions.iter().map(|r| (r.start, r.end)).collect(),
        };
        chunks
            .iter()
            .map(|&(addr, len)| {
                let w = Written::bytes(&written.within(addr, addr + len));
                if patchable(w, len) { w } else { len }
            })
            .sum()
    }
}

/// Whether a stored chunk of `len` bytes with `written` bytes written
/// since is patched (only those read while frozen) rather than read whole.
fn patchable(written: u64, len: u64) -> bool {
    written <= len / 2
}

/// One chunk as a pre-dump stored it.
#[derive(Debug, Clone, Copy)]
struct Stored {
    file_offset: u64,
    file_len: u64,
    /// Raw page bytes (an uncompressed pages file, or a block LZ4 did not
    /// shrink).
    raw: bool,
}

impl Previous {
    /// Opens and verifies `dir`: a pre-dump, or a checkpoint that left
    /// write tracking behind (`dump --track`).
    pub fn open(dir: &Path, key: &ImageKey) -> Result<Previous> {
        let images = ImageDir::open(dir, key)?;
        let mut procs = HashMap::new();
        for e in images.manifest().processes.iter() {
            let name = ckpt_image::mm_name(e.pid);
            let mm: Mm = images.read_meta(&name, ImageKind::Mm)?;
            let pages_name = ckpt_image::pages_name(e.pid);
            let file_len = images.digest(&pages_name)?.size;
            let copies = mm
                .page_copies(file_len)
                .map_err(|err| ImageError::Invalid {
                    path: dir.join(&name),
                    what: err.to_string(),
                })?;
            let mut stored = HashMap::new();
            for c in copies {
                match c.encoding {
                    PageEncoding::Lz4 => {
                        stored.insert(
                            (c.addr, c.raw_len),
                            Stored {
                                file_offset: c.file_offset,
                                file_len: c.file_len,
                                raw: false,
                            },
                        );
                    }
                    // Raw ranges in the chunks a dump cuts them into
                    // (`pages::split`), or stored-raw blocks.
                    PageEncoding::Raw => {
                        let mut at = 0;
                        while at < c.raw_len {
                            let len = if mm.compressed {
                                c.raw_len
                            } else {
                                CHUNK_BYTES.min(c.raw_len - at)
                            };
                            stored.insert(
                                (c.addr + at, len),
                                Stored {
                                    file_offset: c.file_offset + at,
                                    file_len: len,
                                    raw: true,
                                },
                            );
                            at += len;
                        }
                    }
                }
            }
            procs.insert(
                e.pid,
                PrevProcess {
                    tracking: mm.tracking,
                    compressed: mm.compressed,
                    pages_name,
                    stored,
                },
            );
        }
        if !images.manifest().pre_dump && procs.values().all(|p| p.tracking.is_none()) {
            return Err(ImageError::Invalid {
                path: dir.into(),
                what: "neither a pre-dump (--pre-dump) nor a checkpoint made with --track: --prev takes one of those".into(),
            }
            .into());
        }
        Ok(Previous { images, procs })
    }

    /// About how many bytes a dump continuing this pre-dump would read
    /// while frozen, were it to freeze now: the written pages of each chunk
    /// the pre-dump stored, the whole chunk when more than half of it was
    /// written (as [`Sources::split`] patches). Read from the running
    /// processes' page tables; pages written later, and memory mapped
    /// since the pre-dump, are not counted. Used to reserve memory before
    /// the freeze ([`crate::HeldMemory`]), so any failure counts nothing.
    pub fn frozen_read_estimate(&self) -> u64 {
        self.procs
            .iter()
            .map(|(&pid, p)| {
                let tracked = p
                    .tracking
                    .as_ref()
                    .is_some_and(|t| start_time(pid).ok() == Some(t.start_time));
                if tracked {
                    p.frozen_read_estimate(pid)
                } else {
                    0
                }
            })
            .sum()
    }

    /// The pre-dump's record of process `pid`.
    pub fn process(&self, pid: i32) -> Option<&PrevProcess> {
        self.procs.get(&pid)
    }

    /// The pre-dump's directory.
    pub fn path(&self) -> &Path {
        self.images.path()
    }

    fn pages(&self, p: &PrevProcess) -> Result<File> {
        Ok(self.images.open_pages(&p.pages_name)?)
    }
}

/// The process's start time (clock ticks after boot), which tells a
/// process from a later one with the same pid.
pub fn start_time(pid: i32) -> Result<u64> {
    let fields = procfile::stat_fields(pid)?;
    fields
        .get(procfile::stat_index(22))
        .copied()
        .ok_or_else(|| DumpError::Parse {
            pid,
            path: "stat".into(),
            what: "no start time".into(),
        })
}

/// The userfaultfd a pre-dump left in `pid` (whose start time is now
/// `start`), if it is still there: same process, same file at the
/// recorded fd.
fn adopt(pid: i32, start: u64, t: &WriteTracking) -> Result<Option<Userfault>> {
    if start != t.start_time {
        return Ok(None);
    }
    let link = std::fs::read_link(procfile::path(pid, &format!("fd/{}", t.fd)));
    if !link.is_ok_and(|l| l.as_os_str() == "anon_inode:[userfaultfd]") {
        return Ok(None);
    }
    let uffd = ckpt_parasite::uffd::adopt(pid, t.fd)?;
    Ok((uffd.inode()? == t.inode).then_some(uffd))
}

/// Ends every tracking of `pid` that ckpt left in it, before anything is
/// saved: the tracker `before` names (a pre-dump this dump continues) and
/// whatever tracker the host's record says a dump left there (one that
/// failed, or was killed, after arming). The process's fds are closed; the
/// copy of `before`'s tracker is returned, which keeps its record of
/// written pages until the caller's scan; the caller drops it before
/// arming a new one, or else after the thaw (closing it walks all the
/// memory it tracked).
///
/// A continued tracker is never re-armed in place: re-protecting its
/// pages would erase what was written since `before` while `before` still
/// names it, and a dump that failed after that would leave a later
/// `--prev before` trusting pages it never saw written. Closed, it no
/// longer matches `before`, whose next use reads everything.
pub fn retire(
    inf: &ckpt_parasite::Infection<'_>,
    pid: i32,
    before: Option<&WriteTracking>,
) -> Result<Option<Userfault>> {
    let close = |fd: i32| -> Result<()> {
        inf.syscall("close", libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0])?;
        Ok(())
    };
    let start = start_time(pid)?;
    let mut continued = None;
    if let Some(t) = before
        && let Some(u) = adopt(pid, start, t)?
    {
        close(t.fd)?;
        continued = Some(u);
    }
    if let Some(left) = registry::lookup(pid, start) {
        // The continued tracker's fd is closed by now: only another one
        // can still be there.
        if holds_tracker(pid, left.fd, left.inode) {
            log::info!(
                "pid {pid}: closing the write tracking an earlier dump left at fd {}",
                left.fd
            );
            close(left.fd)?;
        }
        registry::forget(pid, start);
    }
    Ok(continued)
}

/// Whether `pid` holds the userfaultfd with inode `inode` at `fd`.
fn holds_tracker(pid: i32, fd: i32, inode: u64) -> bool {
    let path = procfile::path(pid, &format!("fd/{fd}"));
    let link = std::fs::read_link(&path);
    link.is_ok_and(|l| l.as_os_str() == "anon_inode:[userfaultfd]")
        && std::fs::metadata(&path).is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            m.ino() == inode
        })
}

/// Records on the host that `pid` now holds the tracker `t`, so a dump
/// that finds it later without a pre-dump naming it (this one failed or
/// was killed before its images were committed) knows it is ckpt's.
pub fn record(pid: i32, t: &WriteTracking) {
    registry::record(pid, t);
}

/// The host's record of the trackers ckpt left in processes: one small
/// file per process (`PID-STARTTIME`, holding "FD INODE") in a directory
/// only root writes, so neither a job nor its user can make ckpt close a
/// file of their choosing. Best effort: without it (ckpt not root, no
/// `/run`), a tracker left by a failed dump stays until its process
/// closes it, and a dump of that process refuses the unknown userfaultfd.
mod registry {
    use std::io::{Read, Write};
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
    use std::path::PathBuf;

    use ckpt_image::mm::WriteTracking;

    /// Where the records live (a tmpfs: they die with the host's processes).
    const DIR: &str = "/run/ckpt/trackers";
    /// A record is two numbers; anything longer is not one.
    const MAX_RECORD_BYTES: u64 = 64;

    /// One tracker left in a process.
    pub struct Left {
        pub fd: i32,
        pub inode: u64,
    }

    /// The directory, made if missing, when it and its parent are
    /// directories (not links) owned by ckpt's user that nobody else may
    /// write.
    fn dir() -> Option<PathBuf> {
        let dir = PathBuf::from(DIR);
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir);
        let euid = nix::unistd::geteuid().as_raw();
        let safe = |p: &std::path::Path| {
            std::fs::symlink_metadata(p)
                .is_ok_and(|m| m.file_type().is_dir() && m.uid() == euid && m.mode() & 0o022 == 0)
        };
        (safe(dir.parent()?) && safe(&dir)).then_some(dir)
    }

    fn name(pid: i32, start_time: u64) -> String {
        format!("{pid}-{start_time}")
    }

    pub fn record(pid: i32, t: &WriteTracking) {
        let Some(dir) = dir() else {
            log::debug!("pid {pid}: no record of its write tracking ({DIR} unusable)");
            return;
        };
        let final_path = dir.join(name(pid, t.start_time));
        let tmp = dir.join(format!("{}.tmp", name(pid, t.start_time)));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .and_then(|mut f| writeln!(f, "{} {}", t.fd, t.inode))
            .and_then(|()| std::fs::rename(&tmp, &final_path));
        if let Err(e) = written {
            log::warn!(
                "pid {pid}: cannot record its write tracking in {}: {e}",
                final_path.display()
            );
        }
        sweep(&dir);
    }

    pub fn lookup(pid: i32, start_time: u64) -> Option<Left> {
        let path = dir()?.join(name(pid, start_time));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .ok()?;
        if !file.metadata().ok()?.file_type().is_file() {
            return None;
        }
        let mut text = String::new();
        file.take(MAX_RECORD_BYTES).read_to_string(&mut text).ok()?;
        let mut words = text.split_whitespace();
        let fd = words.next()?.parse().ok()?;
        let inode = words.next()?.parse().ok()?;
        Some(Left { fd, inode })
    }

    pub fn forget(pid: i32, start_time: u64) {
        if let Some(dir) = dir() {
            let _ = std::fs::remove_file(dir.join(name(pid, start_time)));
        }
    }

    /// Removes the records of processes that are gone (the pid is free or
    /// now another process's).
    fn sweep(dir: &std::path::Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let file_name = e.file_name();
            let Some((pid, start)) = file_name
                .to_str()
                .map(|n| n.trim_end_matches(".tmp"))
                .and_then(|n| n.split_once('-'))
                .and_then(|(p, s)| Some((p.parse::<i32>().ok()?, s.parse::<u64>().ok()?)))
            else {
                continue;
            };
            if super::start_time(pid).ok() != Some(start) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Where the kept userfaultfd goes in a process: out of the way of the fds
/// a program expects, below its fd limit.
pub fn kept_fd_floor(pid: i32) -> i32 {
    // "Max open files" soft limit; the floor leaves room above it.
    let soft = procfile::read(pid, "limits").ok().and_then(|l| {
        l.lines()
            .find(|line| line.starts_with("Max open files"))
            .and_then(|line| line.split_whitespace().nth(3)?.parse::<i64>().ok())
    });
    match soft {
        Some(n) if n > 64 => (n.min(1 << 20) - 32) as i32,
        _ => 10,
    }
}

/// A private mapping whose written pages are tracked.
fn tracked_kind(v: &Vma) -> bool {
    matches!(
        VmaKind::try_from(v.kind),
        Ok(VmaKind::Anon | VmaKind::FilePrivate | VmaKind::ShmemPrivate)
    )
}

/// Arms tracking of the planned pages of `vmas` with a userfaultfd just
/// made (the tree is frozen): every private VMA registered, its planned
/// pages write-protected.
pub fn arm(uffd: &Userfault, vmas: &[Vma]) -> Result<()> {
    uffd.enable(Features::PAGEFAULT_FLAG_WP.with(Features::WP_ASYNC))?;
    for v in vmas
        .iter()
        .filter(|v| tracked_kind(v) && !v.pages.is_empty())
    {
        if let Err(e) = uffd.register(v.start, v.end - v.start, RegisterMode::WriteProtect) {
            // Untracked: the next dump's scan refuses it and reads it all.
            log::debug!(
                "pid {}: VMA {:#x}-{:#x} not tracked: {e}",
                uffd.pid(),
                v.start,
                v.end
            );
            continue;
        }
        for r in &v.pages {
            if uffd.write_protect(r.addr, r.len(), true)? == Applied::Busy {
                log::debug!(
                    "pid {}: pages at {:#x} not protected (address space changing)",
                    uffd.pid(),
                    r.addr
                );
            }
        }
    }
    Ok(())
}

/// Ranges written since tracking was armed (or not tracked at all),
/// sorted and disjoint.
#[derive(Debug, Default)]
pub struct Written {
    ranges: Vec<(u64, u64)>,
}

impl Written {
    /// Whether any byte of `[start, end)` was written.
    fn touches(&self, start: u64, end: u64) -> bool {
        let i = self.ranges.partition_point(|&(_, e)| e <= start);
        self.ranges.get(i).is_some_and(|&(s, _)| s < end)
    }

    /// Bytes in `parts` (from [`Written::within`]).
    fn bytes(parts: &[(u64, u64)]) -> u64 {
        parts.iter().map(|(s, e)| e - s).sum()
    }

    /// The written parts of `[start, end)`, in order.
    fn within(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let i = self.ranges.partition_point(|&(_, e)| e <= start);
        self.ranges[i..]
            .iter()
            .take_while(|&&(s, _)| s < end)
            .map(|&(s, e)| (s.max(start), e.min(end)))
            .collect()
    }
}

/// Asks the kernel which planned pages of `vmas` were written since they
/// were protected (the tree is frozen).
pub fn written_since(pid: i32, vmas: &[Vma]) -> Result<Written> {
    let path = procfile::path(pid, "pagemap");
    let pagemap = File::open(&path).map_err(|s| procfile::proc_err(pid, path.clone(), s))?;
    let mut ranges = Vec::new();
    for v in vmas.iter().filter(|v| !v.pages.is_empty()) {
        let mut regions = Vec::new();
        let scanned = if tracked_kind(v) {
            sys::pagemap_scan_with(
                &pagemap,
                v.start,
                v.end,
                sys::page_is::WRITTEN,
                sys::page_is::WRITTEN,
                sys::PM_SCAN_CHECK_WPASYNC,
                &mut regions,
            )
        } else {
            Err(std::io::Error::from_raw_os_error(libc::EPERM))
        };
        match scanned {
            Ok(()) => ranges.extend(regions.iter().map(|r| (r.start, r.end))),
            // Not tracked (anymore): all of it counts as written.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => ranges.push((v.start, v.end)),
            Err(e) => return Err(procfile::proc_err(pid, path, e)),
        }
    }
    ranges.sort_unstable();
    Ok(Written { ranges })
}

/// What an incremental page copy did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Reuse {
    /// Bytes of pages taken from the pre-dump.
    pub reused: u64,
    /// Bytes read from the process.
    pub fresh: u64,
}

/// One process's chunks, split by where their data comes from.
pub struct Sources<'p> {
    /// Chunks read from the process.
    pub fresh: Vec<PageRange>,
    /// Chunks the pre-dump holds unchanged, and where.
    reused: Vec<(PageRange, Stored)>,
    /// Chunks the pre-dump holds with a few pages written since.
    pub patched: Vec<Patch>,
    prev: &'p Previous,
    before: &'p PrevProcess,
}

impl<'p> Sources<'p> {
    /// Splits the planned pages of `vmas`: a chunk comes from the pre-dump
    /// when it holds exactly the same pages there, stored the same way
    /// (`compressed`), and none of them was written since. With `patch`,
    /// such a chunk with at most half of it written since is rebuilt from
    /// the stored block and its written pages ([`Patch`]) instead of read
    /// whole from the process: only the written pages are read while the
    /// tree is frozen.
    pub fn split(
        vmas: &[Vma],
        prev: &'p Previous,
        before: &'p PrevProcess,
        written: &Written,
        compressed: bool,
        patch: bool,
    ) -> Sources<'p> {
        let mut fresh = Vec::new();
        let mut reused = Vec::new();
        let mut patched = Vec::new();
        for c in pages::split(vmas.iter().flat_map(|v| v.pages.iter())) {
            let end = c.addr + c.len();
            let old = before.stored.get(&(c.addr, c.len())).filter(|s| {
                before.compressed == compressed
                    && s.file_len <= ckpt_image::mm::lz4_bound(CHUNK_BYTES)
            });
            let Some(old) = old else {
                fresh.push(c);
                continue;
            };
            if !written.touches(c.addr, end) {
                reused.push((c, *old));
                continue;
            }
            let parts = written.within(c.addr, end);
            if patch && patchable(Written::bytes(&parts), c.len()) {
                patched.push(Patch {
                    chunk: c,
                    stored: *old,
                    written: parts,
                });
            } else {
                fresh.push(c);
            }
        }
        Sources {
            fresh,
            reused,
            patched,
            prev,
            before,
        }
    }

    /// Bytes of pages rebuilt from the pre-dump and pages written since.
    pub fn patched_bytes(&self) -> u64 {
        self.patched.iter().map(|p| p.chunk.len()).sum()
    }

    /// Reads the written pages of every patched chunk from the process
    /// (frozen), in the order of [`Sources::patched`].
    pub fn read_patches<'m>(&self, mem: &Memory, held: &'m HeldMemory) -> Result<Vec<HeldBuf<'m>>> {
        self.patched
            .par_iter()
            .map(|p| {
                let mut bytes = held.take(p.written_bytes() as usize);
                mem.read_pieces(&p.written, &mut bytes)?;
                Ok(bytes)
            })
            .collect()
    }

    /// Rebuilds every patched chunk from the pre-dump's block and its
    /// written pages (`read`, from [`Sources::read_patches`]) into `sink`;
    /// the process may run meanwhile.
    pub fn put_patches(
        &self,
        read: Vec<HeldBuf<'_>>,
        sink: &Sink<'_>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<()> {
        let file = self.prev.pages(self.before)?;
        let path = || self.prev.path().join(&self.before.pages_name);
        let done = AtomicU64::new(0);
        self.patched.par_iter().zip(read).try_for_each_init(
            || {
                (
                    vec![0u8; ckpt_image::mm::lz4_bound(CHUNK_BYTES) as usize],
                    vec![0u8; CHUNK_BYTES as usize],
                )
            },
            |(stored, raw), (p, written)| -> Result<()> {
                let len = p.chunk.len() as usize;
                // In bounds: `split` keeps blocks of at most this size.
                let b = &mut stored[..p.stored.file_len as usize];
                file.read_exact_at(b, p.stored.file_offset)
                    .map_err(|e| ImageError::io(path(), "read", e))?;
                let whole = &mut raw[..len];
                if p.stored.raw {
                    if b.len() != len {
                        return Err(ImageError::Invalid {
                            path: path(),
                            what: format!("block for {:#x} is not {len} bytes", p.chunk.addr),
                        }
                        .into());
                    }
                    whole.copy_from_slice(b);
                } else {
                    let n = lz4_flex::block::decompress_into(b, whole).map_err(|e| {
                        ImageError::Invalid {
                            path: path(),
                            what: format!("block for {:#x}: {e}", p.chunk.addr),
                        }
                    })?;
                    if n != len {
                        return Err(ImageError::Invalid {
                            path: path(),
                            what: format!("block for {:#x} is not {len} bytes", p.chunk.addr),
                        }
                        .into());
                    }
                }
                let mut at = 0usize;
                for &(s, e) in &p.written {
                    let n = (e - s) as usize;
                    let to = (s - p.chunk.addr) as usize;
                    whole[to..to + n].copy_from_slice(&written[at..at + n]);
                    at += n;
                }
                sink.put(&p.chunk, whole)?;
                progress(done.fetch_add(p.chunk.len(), Ordering::Relaxed) + p.chunk.len());
                Ok(())
            },
        )
    }

    /// Bytes of pages taken from the pre-dump.
    pub fn reused_bytes(&self) -> u64 {
        self.reused.iter().map(|(c, _)| c.len()).sum()
    }

    /// Copies the reused chunks from the pre-dump's pages file into `sink`
    /// (the process's state does not matter: it may run meanwhile).
    pub fn copy_reused(&self, sink: &Sink<'_>, progress: &(dyn Fn(u64) + Sync)) -> Result<()> {
        let file = self.prev.pages(self.before)?;
        let path = || self.prev.path().join(&self.before.pages_name);
        let done = AtomicU64::new(0);
        self.reused.par_iter().try_for_each_init(
            || vec![0u8; ckpt_image::mm::lz4_bound(CHUNK_BYTES) as usize],
            |buf, (c, s)| -> Result<()> {
                // In bounds: `split` keeps blocks of at most this size.
                let b = &mut buf[..s.file_len as usize];
                file.read_exact_at(b, s.file_offset)
                    .map_err(|e| ImageError::io(path(), "read", e))?;
                sink.put_stored(c, b, s.raw)?;
                progress(done.fetch_add(c.len(), Ordering::Relaxed) + c.len());
                Ok(())
            },
        )
    }
}

/// A chunk the pre-dump holds with the same pages, some of them written
/// since: the stored block with the written pages laid over it.
pub struct Patch {
    chunk: PageRange,
    stored: Stored,
    /// The written parts, `(start, end)`, in order.
    written: Vec<(u64, u64)>,
}

impl Patch {
    /// Bytes of pages written since the pre-dump.
    pub fn written_bytes(&self) -> u64 {
        Written::bytes(&self.written)
    }
}

/// Saves the planned pages of `vmas` into `sink`: chunks the pre-dump
/// holds unchanged come from its pages file, the rest from `mem`.
pub fn copy_pages(
    mem: &Memory,
    sources: &Sources<'_>,
    sink: &Sink<'_>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Reuse> {
    let fresh: u64 = sources.fresh.iter().map(|c| c.len()).sum();
    pages::save_chunks(mem, &sources.fresh, sink, progress)?;
    sources.copy_reused(sink, &|done| progress(fresh + done))?;
    Ok(Reuse {
        reused: sources.reused_bytes(),
        fresh,
    })
}
