//! The layout of a process's page data: the checked pieces of its pages
//! file, cut into pieces of bounded size, and split between what is
//! copied before the process runs and what a lazy restore serves on
//! demand (`crate::lazy`).

use ckpt_image::PAGE_SIZE;
use ckpt_image::mm::{Mm, PageCopy, PageEncoding, Vma, VmaKind, prot};

use crate::error::{RestoreError, Result};

/// The checked layout of `pid`'s page data in a pages file of `file_len`
/// bytes, or an error naming its mm image.
pub fn plan(pid: i32, mm: &Mm, file_len: u64) -> Result<Vec<PageCopy>> {
    mm.page_copies(file_len).map_err(|e| {
        RestoreError::Image(ckpt_image::ImageError::Invalid {
            path: ckpt_image::mm_name(pid).into(),
            what: e.to_string(),
        })
    })
}

/// Largest piece of raw page data one fault or one background step copies
/// (LZ4 blocks are one piece whatever their size).
const SERVED_PIECE_BYTES: u64 = 1 << 20;

/// True for a VMA whose saved pages are served on demand: private
/// anonymous, writable, not shared with the parent since fork. Read-only
/// and inaccessible memory is small and stays eager.
pub(crate) fn serves(v: &Vma) -> bool {
    v.kind == VmaKind::Anon as i32
        && !v.inherited
        && v.shmem_owner.is_none()
        && v.prot & prot::WRITE != 0
}

/// A process's page data split between what is copied now and what is
/// served later.
pub(crate) struct Split {
    /// Copied into place before the process runs.
    pub eager: Vec<PageCopy>,
    /// Served by the page server (raw ranges cut into pieces).
    pub lazy: Vec<PageCopy>,
    /// The VMAs to register, `(start, end)`.
    pub ranges: Vec<(u64, u64)>,
}

/// Splits `copies` (checked by `plan`) of `mm`. A piece holding a VMA's
/// first page is eager: the rebuild may have made that page present
/// already (a VMA given an anon_vma of its own), and a present page can
/// only be written, never filled.
pub(crate) fn split(mm: &Mm, copies: Vec<PageCopy>) -> Split {
    let mut vmas: Vec<&Vma> = mm.vmas.iter().filter(|v| serves(v)).collect();
    vmas.sort_unstable_by_key(|v| v.start);
    let vma_of = |addr: u64| {
        let i = vmas.partition_point(|v| v.start <= addr);
        (i > 0 && addr < vmas[i - 1].end).then(|| vmas[i - 1])
    };
    let mut out = Split {
        eager: Vec::new(),
        lazy: Vec::new(),
        ranges: Vec::new(),
    };
    for c in copies {
        let Some(v) = vma_of(c.addr) else {
            out.eager.push(c);
            continue;
        };
        let c = if c.addr != v.start {
            c
        } else if c.encoding == PageEncoding::Raw && c.raw_len > PAGE_SIZE {
            // Raw data is cut after the first page.
            out.eager.push(raw_part(&c, 0, PAGE_SIZE));
            raw_part(&c, PAGE_SIZE, c.raw_len - PAGE_SIZE)
        } else {
            out.eager.push(c);
            continue;
        };
        if out.ranges.last() != Some(&(v.start, v.end)) {
            out.ranges.push((v.start, v.end));
        }
        cut_into_pieces(c, SERVED_PIECE_BYTES, &mut out.lazy);
    }
    out.ranges.sort_unstable();
    out.ranges.dedup();
    out
}

/// `c` into `out`, raw data cut into pieces of at most `piece` bytes (an
/// LZ4 block is one unit).
pub(crate) fn cut_into_pieces(c: PageCopy, piece: u64, out: &mut Vec<PageCopy>) {
    if c.encoding != PageEncoding::Raw {
        out.push(c);
        return;
    }
    let mut at = 0;
    while at < c.raw_len {
        let len = piece.min(c.raw_len - at);
        out.push(raw_part(&c, at, len));
        at += len;
    }
}

/// The `len` bytes of raw piece `c` from `at` on, as a piece of its own
/// (raw data goes to memory in file order, byte for byte).
pub(crate) fn raw_part(c: &PageCopy, at: u64, len: u64) -> PageCopy {
    PageCopy {
        addr: c.addr + at,
        file_offset: c.file_offset + at,
        file_len: len,
        raw_len: len,
        encoding: PageEncoding::Raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_writable_private_anonymous_memory_is_lazy_and_first_pages_are_eager() {
        let vma = |start, end, kind: VmaKind, prot| Vma {
            start,
            end,
            kind: kind as i32,
            prot,
            ..Default::default()
        };
        let rw = prot::READ | prot::WRITE;
        let mm = Mm {
            vmas: vec![
                vma(0x10000, 0x20000, VmaKind::Anon, rw),
                vma(0x20000, 0x30000, VmaKind::Anon, prot::READ),
                vma(0x30000, 0x40000, VmaKind::FilePrivate, rw),
            ],
            ..Default::default()
        };
        let copy = |addr, len| PageCopy {
            addr,
            file_offset: 0,
            file_len: len,
            raw_len: len,
            encoding: PageEncoding::Raw,
        };
        let s = split(
            &mm,
            vec![
                copy(0x10000, 0x1000),
                copy(0x11000, 0x2000),
                copy(0x21000, 0x1000),
                copy(0x31000, 0x1000),
            ],
        );
        assert_eq!(s.ranges, vec![(0x10000, 0x20000)]);
        assert_eq!(s.lazy, vec![copy(0x11000, 0x2000)]);
        assert_eq!(s.eager.len(), 3);
        // A raw range from a VMA's start: its first page only is eager.
        let s = split(&mm, vec![copy(0x10000, 0x3000)]);
        assert_eq!(s.eager, vec![copy(0x10000, 0x1000)]);
        let mut rest = copy(0x11000, 0x2000);
        rest.file_offset = 0x1000;
        assert_eq!(s.lazy, vec![rest]);
    }
}
