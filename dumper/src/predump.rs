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
use crate::{procfile, sys};

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

/// The userfaultfd a pre-dump left in `pid`, if it is still there: same
/// process, same file at the recorded fd.
pub fn adopt(pid: i32, t: &WriteTracking) -> Result<Option<Userfault>> {
    if start_time(pid)? != t.start_time {
        return Ok(None);
    }
    let link = std::fs::read_link(procfile::path(pid, &format!("fd/{}", t.fd)));
    if !link.is_ok_and(|l| l.as_os_str() == "anon_inode:[userfaultfd]") {
        return Ok(None);
    }
    let uffd = ckpt_parasite::uffd::adopt(pid, t.fd)?;
    Ok((uffd.inode()? == t.inode).then_some(uffd))
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

/// Arms tracking of the planned pages of `vmas` (the tree is frozen):
/// every private VMA registered, its planned pages write-protected. `new`
/// for a userfaultfd that was just made.
pub fn arm(uffd: &Userfault, new: bool, vmas: &[Vma]) -> Result<()> {
    if new {
        uffd.enable(Features::PAGEFAULT_FLAG_WP.with(Features::WP_ASYNC))?;
    }
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
    prev: &'p Previous,
    before: &'p PrevProcess,
}

impl<'p> Sources<'p> {
    /// Splits the planned pages of `vmas`: a chunk comes from the pre-dump
    /// when it holds exactly the same pages there, stored the same way
    /// (`compressed`), and none of them was written since.
    pub fn split(
        vmas: &[Vma],
        prev: &'p Previous,
        before: &'p PrevProcess,
        written: &Written,
        compressed: bool,
    ) -> Sources<'p> {
        let mut fresh = Vec::new();
        let mut reused = Vec::new();
        for c in pages::split(vmas.iter().flat_map(|v| v.pages.iter())) {
            let old = before.stored.get(&(c.addr, c.len())).filter(|s| {
                before.compressed == compressed
                    && s.file_len <= ckpt_image::mm::lz4_bound(CHUNK_BYTES)
                    && !written.touches(c.addr, c.addr + c.len())
            });
            match old {
                Some(s) => reused.push((c, *s)),
                None => fresh.push(c),
            }
        }
        Sources {
            fresh,
            reused,
            prev,
            before,
        }
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
