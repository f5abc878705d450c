//! Copying the saved pages into the rebuilt address space: raw pages go
//! straight from the mapped pages file, LZ4 blocks are decompressed into
//! place. The layout is checked first by [`Mm::page_copies`] (inside a
//! VMA, inside the file, blocks of bounded size, no overflow), so nothing
//! here allocates or indexes by an unchecked length.

use std::sync::atomic::{AtomicU64, Ordering};

use ckpt_image::ImageDir;
use ckpt_image::mm::{Mm, PageCopy, PageEncoding};
use ckpt_parasite::remote::Remote;
use ckpt_parasite::uffd::{self, Features, RegisterMode, Stop, Userfault};
use rayon::prelude::*;

use crate::error::{RestoreError, Result};

mod direct;
pub(crate) mod layout;

use direct::DirectPages;
pub use layout::plan;
use layout::{Split, cut_into_pieces};

/// Copies saved pages into place, verified against the sealed manifest
/// before anything runs (a mismatch fails the restore, the copied pages
/// with it). On disk, with the manifest's block digests, the file is read
/// with direct I/O and each block checked as it arrives ([`direct`]);
/// otherwise the copy reads the mapped file while other cores hash the
/// same bytes (one read of the file, hashing beside copying).
pub fn fill_pages(
    r: &Remote<'_>,
    mm: &Mm,
    images: &ImageDir,
    name: &str,
    pages: &[u8],
    progress: Option<&(dyn Fn(u64, u64) + Sync)>,
) -> Result<()> {
    // Private anonymous memory is filled with UFFDIO_COPY, which puts each
    // new page in place already holding its data: writing into the
    // process instead faults in a zeroed page first and then copies over
    // it, twice the work (1 GiB: 0.27–0.40 s against 0.54–0.76 s here).
    // The rest, and everything when the kernel refuses a userfaultfd, is
    // written as before.
    let split = layout::split(mm, plan(r.t.pid(), mm, pages.len() as u64)?);
    if let Some(d) = open_direct(images, name, &split, pages.len() as u64)? {
        log::debug!("{name}: read directly, each block checked as it arrives");
        return copy_pages(r, mm, split, pages, Some(&d), progress);
    }
    // The copy stays on this thread (the tracer's); the hashing runs on
    // the pool's threads meanwhile.
    std::thread::scope(|s| {
        let verifying = s.spawn(|| images.verify_bytes(name, pages));
        let copied = copy_pages(r, mm, split, pages, None, progress);
        let verified = verifying
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        verified?;
        copied
    })
}

/// The pages file `name` of `size` bytes opened for direct reads, when it
/// is on a disk, the manifest has its block digests, the pieces of `split`
/// lie in it one after the other, and few of their bytes are written from
/// the mapping before the fill (`split.eager`), which the direct reads
/// would read a second time (20,000 one-page VMAs are all first pages);
/// `None` otherwise.
fn open_direct(
    images: &ImageDir,
    name: &str,
    split: &Split,
    size: u64,
) -> Result<Option<DirectPages>> {
    let mut sorted: Vec<PageCopy> = split.eager.iter().chain(&split.lazy).copied().collect();
    sorted.sort_unstable_by_key(|c| c.file_offset);
    if !direct::in_file_order(&sorted) {
        return Ok(None);
    }
    let eager: u64 = split.eager.iter().map(|c| c.file_len).sum();
    if eager > size / MOSTLY_FILLED {
        return Ok(None);
    }
    let Some(file) = images.open_pages_direct(name)? else {
        return Ok(None);
    };
    // From here on the blocks are checked as they are read, not the file
    // as a whole.
    let Some(checks) = images.block_checks(name)? else {
        return Ok(None);
    };
    Ok(Some(DirectPages::new(file, checks, size)))
}

/// The direct path is taken when at most 1/MOSTLY_FILLED of a pages file
/// is written from its mapping before the fill.
const MOSTLY_FILLED: u64 = 8;

/// Copies `split` into place from `pages` (the mapped file), or, with
/// `direct`, all but the eager pieces (a few pages) from its reads, which
/// also verify the whole file.
/// Below this many bytes of private anonymous pages a process's memory is
/// written, not placed with UFFDIO_COPY: creating, registering and closing
/// the userfaultfd takes some ten ptrace stops, about what placing
/// instead of writing saves on 2 MiB (0.27 s a GiB), and most processes of
/// a large tree hold less than that.
const UFFD_MIN_BYTES: u64 = 4 << 20;

fn copy_pages(
    r: &Remote<'_>,
    mm: &Mm,
    split: Split,
    pages: &[u8],
    direct: Option<&DirectPages>,
    progress: Option<&(dyn Fn(u64, u64) + Sync)>,
) -> Result<()> {
    let done = AtomicU64::new(0);
    let total = mm.pages_bytes;
    // First, while nothing is registered: a write into a registered range
    // would wait for a fill that never comes.
    copy_each(
        r,
        split.eager,
        pages,
        total,
        progress,
        &done,
        Placing::Write,
    )?;
    let placed_bytes: u64 = split.lazy.iter().map(|c| c.raw_len).sum();
    let uffd = if placed_bytes < UFFD_MIN_BYTES {
        None
    } else {
        match uffd::create_in(r).and_then(|u| {
            u.enable(Features::default())?;
            for &(start, end) in &split.ranges {
                u.register(start, end - start, RegisterMode::Missing)?;
            }
            Ok(u)
        }) {
            Ok(u) => Some(u),
            // Dropped on the way: nothing stays registered.
            Err(e) => {
                log::debug!("pid {}: pages written, not placed: {e}", r.t.pid());
                None
            }
        }
    };
    let how = match &uffd {
        Some(u) => Placing::Fill(u),
        None => Placing::Write,
    };
    match direct {
        None => copy_each(r, split.lazy, pages, total, progress, &done, how)?,
        Some(d) => {
            let mut rest = pieces(split.lazy);
            rest.sort_unstable_by_key(|c| c.file_offset);
            let rest = direct::cut_at_windows(rest);
            d.stream(&rest, |c, stored| {
                DECOMPRESSED.with_borrow_mut(|buf| place_piece(r, c, stored, buf, how))?;
                report(c, total, progress, &done);
                Ok(())
            })?;
        }
    }
    // Closing the userfaultfd unregisters its ranges.
    drop(uffd);
    Ok(())
}

thread_local! {
    /// Each thread's buffer for decompressing LZ4 blocks read directly,
    /// kept between blocks: a new one each time would be fresh memory.
    static DECOMPRESSED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// How page data gets into the process.
#[derive(Clone, Copy)]
enum Placing<'u> {
    /// Written into its memory (`process_vm_writev`), faulting pages in.
    Write,
    /// New pages placed with their data (`UFFDIO_COPY`) in ranges
    /// registered with this userfaultfd, none of them present yet.
    Fill(&'u Userfault),
}

/// Copies `copies` (checked by [`plan`]) from `pages` into place, without
/// verifying `pages` (the caller does); `total` is for `progress`.
pub fn copy_listed(
    r: &Remote<'_>,
    copies: Vec<PageCopy>,
    pages: &[u8],
    total: u64,
    progress: Option<&(dyn Fn(u64, u64) + Sync)>,
) -> Result<()> {
    let done = AtomicU64::new(0);
    copy_each(r, copies, pages, total, progress, &done, Placing::Write)
}

/// [`copy_listed`], placing the data as `how` says, adding to `done`.
fn copy_each(
    r: &Remote<'_>,
    copies: Vec<PageCopy>,
    pages: &[u8],
    total: u64,
    progress: Option<&(dyn Fn(u64, u64) + Sync)>,
    done: &AtomicU64,
    how: Placing<'_>,
) -> Result<()> {
    let pid = r.t.pid();
    // In file order: each core then reads its own stretch of the file
    // front to back (a dump appends LZ4 blocks in the order they were
    // ready, not by address), which the kernel's read-ahead follows.
    let mut pieces = pieces(copies);
    pieces.sort_unstable_by_key(|c| c.file_offset);
    pieces.par_iter().try_for_each_init(Vec::new, |buf, c| {
        // In range by `plan`; `get` keeps that a checked fact here too.
        let stored = usize::try_from(c.file_offset)
            .ok()
            .zip(usize::try_from(c.file_len).ok())
            .and_then(|(off, len)| pages.get(off..off.checked_add(len)?))
            .ok_or_else(|| bad_piece(pid, c, "outside the pages file".into()))?;
        place_piece(r, c, stored, buf, how)?;
        report(c, total, progress, done);
        Ok(())
    })
}

/// An error naming `pid`'s pages file and the piece `c` in it.
fn bad_piece(pid: i32, c: &PageCopy, what: String) -> RestoreError {
    RestoreError::Image(ckpt_image::ImageError::Invalid {
        path: ckpt_image::pages_name(pid).into(),
        what: format!(
            "data for {:#x} at {:#x} ({} bytes): {what}",
            c.addr, c.file_offset, c.file_len
        ),
    })
}

/// Puts piece `c`, whose stored bytes are `stored`, in place as `how`
/// says, decompressing through `buf`.
fn place_piece(
    r: &Remote<'_>,
    c: &PageCopy,
    stored: &[u8],
    buf: &mut Vec<u8>,
    how: Placing<'_>,
) -> Result<()> {
    let pid = r.t.pid();
    let data = match c.encoding {
        PageEncoding::Raw => stored,
        PageEncoding::Lz4 => {
            // raw_len is at most MAX_BLOCK_RAW_LEN (checked by `plan`).
            buf.resize(c.raw_len as usize, 0);
            let n = lz4_flex::block::decompress_into(stored, buf)
                .map_err(|e| bad_piece(pid, c, format!("cannot decompress: {e}")))?;
            if n as u64 != c.raw_len {
                return Err(bad_piece(pid, c, "decompressed to the wrong length".into()));
            }
            &buf[..]
        }
    };
    match how {
        Placing::Write => Ok(r.t.write_mem_fast(c.addr, data)?),
        Placing::Fill(u) => fill(r, u, c.addr, data),
    }
}

/// Adds `c` to `done` and tells `progress`.
fn report(
    c: &PageCopy,
    total: u64,
    progress: Option<&(dyn Fn(u64, u64) + Sync)>,
    done: &AtomicU64,
) {
    let now = done.fetch_add(c.raw_len, Ordering::Relaxed) + c.raw_len;
    if let Some(p) = progress {
        p(now, total);
    }
}

/// Places `data` at `addr` with `UFFDIO_COPY`. The process is stopped
/// and its map settled, so the copy can stop only on a page already
/// present, which the rebuild makes at most at a VMA's first page (the
/// split keeps those written): that one is written over instead.
fn fill(r: &Remote<'_>, u: &Userfault, addr: u64, data: &[u8]) -> Result<()> {
    let mut at = 0usize;
    while at < data.len() {
        let f = u.copy_step(addr + at as u64, &data[at..])?;
        at += f.filled as usize;
        match f.stop {
            None | Some(Stop::Changing) => {}
            Some(Stop::Present) => {
                let end = (at + PAGE_BYTES).min(data.len());
                r.t.write_mem_fast(addr + at as u64, &data[at..end])?;
                at = end;
            }
            Some(stop @ (Stop::Unmapped | Stop::Exited)) => {
                return Err(RestoreError::Host {
                    pid: u.pid(),
                    what: format!("placing pages at {:#x}: {stop:?}", addr + at as u64),
                });
            }
        }
    }
    Ok(())
}

/// Size of a page.
const PAGE_BYTES: usize = 4096;

/// Largest piece of raw page data one thread copies at once: a large
/// range is spread over every core (LZ4 blocks are bounded already).
const PIECE_BYTES: u64 = 4 << 20;

/// `copies` with raw ones cut into [`PIECE_BYTES`] pieces.
fn pieces(copies: Vec<PageCopy>) -> Vec<PageCopy> {
    let mut out = Vec::with_capacity(copies.len());
    for c in copies {
        cut_into_pieces(c, PIECE_BYTES, &mut out);
    }
    out
}
