//! Private memory still shared copy-on-write since fork.
//!
//! After `fork`, parent and child map the same physical pages until one of
//! them writes. A forked worker pool that never touches its inherited data
//! holds one copy of it, however many workers there are; saving each
//! process's pages on its own would write that copy once per process and
//! restore it as that many private copies (a tree of 8 workers over 1 GiB
//! of inherited data would come back needing 9 GiB). So, as CRIU does, a
//! child's page that is the very same physical page as its parent's at the
//! same address is not saved with the child: its VMA is marked
//! `inherited`, the restorer forks the child from the parent once the
//! parent's memory is back, and the child keeps that mapping and writes
//! only the pages it has of its own. The same holds for the pages of a
//! private file mapping the parent wrote before the fork (its private
//! copies of the file's pages): the mapping must be of the same file at
//! the same offset, and a page the child still reads from the file is one
//! it drops back to the file's.
//!
//! Pages are compared by page frame number (or swap slot) from
//! `/proc/PID/pagemap`, which the kernel shows to a reader with
//! CAP_SYS_ADMIN only; without it every frame reads as 0 and nothing is
//! shared (the old behaviour, larger but correct).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use ckpt_image::PAGE_SIZE;
use ckpt_image::mm::{PageRange, PageSpan, Vma, VmaKind, vma_flags};

use crate::error::Result;
use crate::procfile;

/// pagemap: page present in RAM.
const PM_PRESENT: u64 = 1 << 63;
/// pagemap: page swapped out.
const PM_SWAPPED: u64 = 1 << 62;
/// pagemap: page is a file page or shared anonymous.
const PM_FILE: u64 = 1 << 61;
/// pagemap: page frame number (present) or swap type and offset (swapped).
const PM_FRAME: u64 = (1 << 55) - 1;
/// pagemap entries read per `pread` (256 KiB of entries, 128 MiB of memory).
const CHUNK_PAGES: u64 = 32 * 1024;

/// One process's address space as the sharing pass sees it.
pub struct ProcessVmas<'a> {
    /// The process.
    pub pid: i32,
    /// Its parent.
    pub ppid: i32,
    /// Its VMAs with the pages planned so far.
    pub vmas: &'a mut Vec<Vma>,
}

/// What the pass found, for the log and the statistics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Shared {
    /// Bytes of child pages left to their parent's copy.
    pub bytes: u64,
}

/// A VMA of a parent as planned before any sharing was taken out of it:
/// what the parent's restored memory will hold there.
struct ParentVma {
    start: u64,
    end: u64,
    prot: u32,
    flags: u32,
    pages: Vec<PageRange>,
    /// Whether it has guard pages.
    guarded: bool,
    /// Its kind, file and offset in it (a file mapping's).
    kind: i32,
    path: String,
    file_offset: u64,
}

/// Marks every private anonymous or private file VMA of a child that still shares pages
/// with the same VMA of its parent, and drops those pages from the child's
/// plan. Returns the pids whose page layout changed, and the totals.
pub fn share_with_parents(procs: &mut [ProcessVmas<'_>]) -> Result<(Vec<i32>, Shared)> {
    // The parents' plans as they were before any child took pages out:
    // that is what each parent's memory will hold after restore.
    let parents: HashMap<i32, Vec<ParentVma>> = procs
        .iter()
        .map(|p| {
            let vmas = p
                .vmas
                .iter()
                .filter(|v| is_private(v))
                .map(|v| ParentVma {
                    start: v.start,
                    end: v.end,
                    prot: v.prot,
                    flags: v.flags,
                    pages: v.pages.clone(),
                    guarded: !v.guards.is_empty(),
                    kind: v.kind,
                    path: v.path.clone(),
                    file_offset: v.file_offset,
                })
                .collect();
            (p.pid, vmas)
        })
        .collect();
    // Each child against its parent's plan, on the pool's threads: the
    // pagemap reads are most of a tree of small processes' collect, and
    // no child's work touches another's.
    use rayon::prelude::*;
    let per_child: Vec<u64> = procs
        .par_iter_mut()
        .map(|child| match parents.get(&child.ppid) {
            Some(parent_vmas) => share_with_parent(child, parent_vmas),
            None => Ok(0),
        })
        .collect::<Result<_>>()?;
    let changed = procs
        .iter()
        .zip(&per_child)
        .filter(|(_, bytes)| **bytes > 0)
        .map(|(p, _)| p.pid)
        .collect();
    let total = Shared {
        bytes: per_child.iter().sum(),
    };
    Ok((changed, total))
}

/// Leaves the pages of `child` still shared with its parent to the
/// parent's plan (`parent_vmas`); returns the bytes left.
fn share_with_parent(child: &mut ProcessVmas<'_>, parent_vmas: &[ParentVma]) -> Result<u64> {
    let mut bytes = 0;
    let mut maps: Option<(File, File)> = None;
    for vma in child.vmas.iter_mut().filter(|v| is_private(v)) {
        // A mapping with guard pages is saved whole: which guards a
        // child shares with its parent over fork is not worth telling.
        let Some(pv) = parent_vmas.iter().find(|p| {
            (p.start, p.end, p.prot) == (vma.start, vma.end, vma.prot)
                && (p.kind, p.path.as_str(), p.file_offset)
                    == (vma.kind, vma.path.as_str(), vma.file_offset)
                && p.flags & vma_flags::DONTFORK == 0
                && !p.guarded
                && vma.guards.is_empty()
        }) else {
            continue;
        };
        if maps.is_none() {
            maps = Some((open_pagemap(child.pid)?, open_pagemap(child.ppid)?));
        }
        let (own, parents_map) = maps.as_ref().expect("opened above");
        let kept = own_pages(child.pid, own, child.ppid, parents_map, &vma.pages)?;
        let shared_pages = pages_in(&vma.pages) - pages_in(&kept);
        if shared_pages == 0 {
            continue;
        }
        vma.dropped = subtract(&pv.pages, &vma.pages);
        vma.pages = kept;
        vma.inherited = true;
        bytes += shared_pages * PAGE_SIZE;
    }
    Ok(bytes)
}

/// Private memory whose written pages are copies fork shares: anonymous
/// memory, or a private file mapping's.
fn is_private(v: &Vma) -> bool {
    v.kind == VmaKind::Anon as i32 || v.kind == VmaKind::FilePrivate as i32
}

fn open_pagemap(pid: i32) -> Result<File> {
    let p = procfile::path(pid, "pagemap");
    File::open(&p).map_err(|s| procfile::proc_err(pid, p, s))
}

fn pages_in(ranges: &[PageRange]) -> u64 {
    ranges.iter().map(|r| r.nr_pages).sum()
}

/// The page's frame (or swap slot) if it is a private anonymous page in
/// memory or swap whose frame the kernel showed.
fn frame(entry: u64) -> Option<u64> {
    let held = entry & (PM_PRESENT | PM_SWAPPED) != 0 && entry & PM_FILE == 0;
    let frame = entry & (PM_PRESENT | PM_SWAPPED | PM_FRAME);
    (held && entry & PM_FRAME != 0).then_some(frame)
}

/// The runs of `ranges` whose pages are not the parent's very page at the
/// same address (offsets are reassigned later).
fn own_pages(
    pid: i32,
    own: &File,
    ppid: i32,
    parents: &File,
    ranges: &[PageRange],
) -> Result<Vec<PageRange>> {
    let mut kept: Vec<PageRange> = Vec::new();
    // A small process (most of a large tree) needs small buffers: zeroing
    // two whole chunks' worth each time was a tenth of such a dump's CPU.
    let most = ranges.iter().map(|r| r.nr_pages).max().unwrap_or(0);
    let len = (CHUNK_PAGES.min(most) * 8) as usize;
    let mut mine = vec![0u8; len];
    let mut theirs = vec![0u8; len];
    for r in ranges {
        let mut addr = r.addr;
        let end = r.addr + r.nr_pages * PAGE_SIZE;
        while addr < end {
            let n = CHUNK_PAGES.min((end - addr) / PAGE_SIZE);
            let len = (n * 8) as usize;
            let at = addr / PAGE_SIZE * 8;
            own.read_exact_at(&mut mine[..len], at)
                .map_err(|s| procfile::proc_err(pid, procfile::path(pid, "pagemap"), s))?;
            parents
                .read_exact_at(&mut theirs[..len], at)
                .map_err(|s| procfile::proc_err(ppid, procfile::path(ppid, "pagemap"), s))?;
            for (i, (m, t)) in mine[..len]
                .chunks_exact(8)
                .zip(theirs[..len].chunks_exact(8))
                .enumerate()
            {
                let m = u64::from_le_bytes(m.try_into().expect("8 bytes"));
                let t = u64::from_le_bytes(t.try_into().expect("8 bytes"));
                let same = frame(m).is_some() && frame(m) == frame(t);
                if !same {
                    push(&mut kept, addr + i as u64 * PAGE_SIZE, 1);
                }
            }
            addr += n * PAGE_SIZE;
        }
    }
    Ok(kept)
}

fn push(runs: &mut Vec<PageRange>, addr: u64, nr_pages: u64) {
    match runs.last_mut() {
        Some(r) if r.addr + r.nr_pages * PAGE_SIZE == addr => r.nr_pages += nr_pages,
        _ => runs.push(PageRange {
            addr,
            nr_pages,
            offset: 0,
        }),
    }
}

/// The pages of `a` not in `b` (both sorted, non-overlapping runs).
fn subtract(a: &[PageRange], b: &[PageRange]) -> Vec<PageSpan> {
    let mut out: Vec<PageSpan> = Vec::new();
    let mut bi = 0;
    for r in a {
        let (mut s, e) = (r.addr, r.addr + r.nr_pages * PAGE_SIZE);
        while s < e {
            while bi < b.len() && b[bi].addr + b[bi].nr_pages * PAGE_SIZE <= s {
                bi += 1;
            }
            let next = b.get(bi).map(|x| (x.addr, x.addr + x.nr_pages * PAGE_SIZE));
            match next {
                Some((bs, be)) if bs <= s => s = be.min(e).max(s),
                Some((bs, _)) if bs < e => {
                    out.push(PageSpan {
                        addr: s,
                        nr_pages: (bs - s) / PAGE_SIZE,
                    });
                    s = bs;
                }
                _ => {
                    out.push(PageSpan {
                        addr: s,
                        nr_pages: (e - s) / PAGE_SIZE,
                    });
                    s = e;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(addr: u64, nr_pages: u64) -> PageRange {
        PageRange {
            addr: addr * PAGE_SIZE,
            nr_pages,
            offset: 0,
        }
    }

    fn spans(v: &[PageSpan]) -> Vec<(u64, u64)> {
        v.iter().map(|s| (s.addr / PAGE_SIZE, s.nr_pages)).collect()
    }

    #[test]
    fn subtract_leaves_what_only_the_parent_has() {
        let parent = [run(0, 10), run(20, 5)];
        let child = [run(2, 3), run(9, 13)];
        assert_eq!(spans(&subtract(&parent, &child)), [(0, 2), (5, 4), (22, 3)]);
        assert_eq!(spans(&subtract(&parent, &[])), [(0, 10), (20, 5)]);
        assert!(subtract(&[run(3, 2)], &[run(0, 10)]).is_empty());
    }

    #[test]
    fn frames_compare_only_private_pages_the_kernel_showed() {
        let page = PM_PRESENT | 0x1234;
        assert_eq!(frame(page), Some(page));
        // Hidden frame (no CAP_SYS_ADMIN): never "the same page".
        assert_eq!(frame(PM_PRESENT), None);
        assert_eq!(frame(PM_PRESENT | PM_FILE | 0x1234), None);
        assert_eq!(frame(0x1234), None);
        // A swapped page and a present page with equal bits differ.
        assert_ne!(frame(PM_SWAPPED | 0x1234), frame(page));
    }
}
