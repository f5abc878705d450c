//! Private memory still shared copy-on-write since fork, restore side.
//!
//! A VMA the dumper marked `inherited` is the parent's private anonymous
//! mapping at the same address, or its private mapping of the same file,
//! whose pages the child had not written.
//! The tree builder forks a child only after its parent's memory is back
//! (`rebuild/build.rs`, `build_tree`), so the child starts with that mapping and its
//! pages shared with the parent, exactly as after the original fork. Here
//! the child keeps those mappings while everything else it inherited is
//! unmapped, drops the pages it never had, and then gets its own pages
//! written over the shared ones (each write copies one page, as in the
//! original process).

use ckpt_image::PAGE_SIZE;
use ckpt_image::mm::{Mm, Vma, VmaKind, vma_flags};
use ckpt_parasite::batch;
use ckpt_parasite::remote::Remote;

use crate::error::{RestoreError, Result};

/// Checks a process's inherited VMAs against its parent's image before any
/// process is created: each must be a private anonymous mapping, or a
/// private mapping of the same file at the same offset, the parent has at
/// the same place with the same protection and passes on over fork,
/// and its dropped pages must lie inside it, in order.
pub fn check(pid: i32, mm: &Mm, parent: Option<&Mm>) -> Result<()> {
    for v in mm.vmas.iter().filter(|v| v.inherited) {
        let private = v.kind == VmaKind::Anon as i32 || v.kind == VmaKind::FilePrivate as i32;
        if !private || v.shmem_owner.is_some() {
            return Err(RestoreError::vma(
                pid,
                v,
                "only private anonymous memory and private file mappings are inherited",
            ));
        }
        let from_parent = parent.is_some_and(|p| {
            p.vmas.iter().any(|pv| {
                pv.kind == v.kind
                    && (pv.start, pv.end, pv.prot) == (v.start, v.end, v.prot)
                    && (pv.path.as_str(), pv.file_offset) == (v.path.as_str(), v.file_offset)
                    && pv.flags & vma_flags::DONTFORK == 0
            })
        });
        if !from_parent {
            return Err(RestoreError::vma(
                pid,
                v,
                "marked inherited, but the parent has no such mapping to pass on",
            ));
        }
        let mut next = v.start;
        for s in &v.dropped {
            let end = s
                .nr_pages
                .checked_mul(PAGE_SIZE)
                .and_then(|len| s.addr.checked_add(len));
            match end {
                Some(end) if s.addr % PAGE_SIZE == 0 && s.addr >= next && end <= v.end => {
                    next = end
                }
                _ => {
                    return Err(RestoreError::vma(
                        pid,
                        v,
                        "dropped pages outside the mapping or unordered",
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The address ranges a freshly forked process keeps from its parent.
pub fn kept(mm: &Mm) -> impl Iterator<Item = &Vma> {
    mm.vmas.iter().filter(|v| v.inherited)
}

/// The `munmap`s that remove what the process inherited in `start..end`,
/// except the parts of inherited VMAs: run by the caller, in one batch
/// with the other ranges'.
pub fn unmaps_except_inherited(mm: &Mm, start: u64, end: u64) -> Vec<batch::Call> {
    let mut at = start;
    let mut keep: Vec<(u64, u64)> = kept(mm)
        .filter(|v| v.start < end && v.end > start)
        .map(|v| (v.start.max(start), v.end.min(end)))
        .collect();
    keep.sort_unstable();
    let mut calls = Vec::new();
    for (ks, ke) in keep.into_iter().chain(std::iter::once((end, end))) {
        if ks > at {
            calls.push(batch::Call {
                name: "munmap (inherited)",
                nr: libc::SYS_munmap,
                args: [at, ks - at, 0, 0, 0, 0],
            });
        }
        at = at.max(ke);
    }
    calls
}

/// Drops the pages of inherited VMAs the process did not have: private
/// anonymous pages read as zeros again after `MADV_DONTNEED`, a private
/// file mapping's as the file's again.
pub fn drop_pages(r: &Remote<'_>, mm: &Mm) -> Result<()> {
    let calls: Vec<batch::Call> = kept(mm)
        .flat_map(|v| v.dropped.iter())
        .map(|s| batch::Call {
            name: "madvise (drop inherited pages)",
            nr: libc::SYS_madvise,
            args: [
                s.addr,
                s.nr_pages * PAGE_SIZE,
                libc::MADV_DONTNEED as u64,
                0,
                0,
                0,
            ],
        })
        .collect();
    r.call_many(&calls)?;
    Ok(())
}
