//! Copying the saved pages into the rebuilt address space: raw pages go
//! straight from the mapped pages file, LZ4 blocks are decompressed into
//! place. The layout is checked first by [`Mm::page_copies`] (inside a
//! VMA, inside the file, blocks of bounded size, no overflow), so nothing
//! here allocates or indexes by an unchecked length.

use std::sync::atomic::{AtomicU64, Ordering};

use ckpt_image::ImageDir;
use ckpt_image::mm::{Mm, PageCopy, PageEncoding};
use ckpt_parasite::TaskMemory;
use ckpt_parasite::remote::Remote;
use ckpt_parasite::uffd::{self, Features, RegisterMode, Stop, Userfault};
use rayon::prelude::*;

use crate::error::{RestoreError, Result};

mod direct;
pub(crate) mod layout;

use direct::DirectPages;
pub use direct::ReadBuffers;
pub use layout::plan;
use layout::{Split, cut_into_pieces};

/// A process's pages, ready to be copied into it, verified against the
/// sealed manifest before anything runs (a mismatch fails the restore,
/// the copied pages with it). What needs the tracer
/// is done (the pages written before a userfaultfd may be registered, the
/// userfaultfd); the copy ([`PageFill::run`]) needs neither the tracer
/// nor its thread, so a tree's processes are filled beside each other
/// while the tracer rebuilds the next one. The process must stay stopped
/// and its mappings unchanged until the copy has run.
pub struct PageFill<'a> {
    copier: Copier<'a>,
    /// The pieces left to copy.
    pieces: Vec<PageCopy>,
    source: Source<'a>,
    /// Where the pieces are placed with `UFFDIO_COPY`; closed (its ranges
    /// unregistered) once they all are.
    uffd: Option<Userfault>,
}

/// Copies pieces of a mapped pages file into a process's memory.
struct Copier<'a> {
    memory: TaskMemory,
    /// The mapped pages file.
    pages: &'a [u8],
    /// Bytes of the whole fill, for `progress`.
    total: u64,
    progress: Option<&'a (dyn Fn(u64, u64) + Sync)>,
    /// Bytes copied so far.
    done: AtomicU64,
}

/// Where a fill reads its pieces from, and how the file is verified.
enum Source<'a> {
    /// Read again with direct I/O, each block checked as it arrives
    /// ([`direct`]).
    Direct(DirectPages<'a>),
    /// Copied from the mapping while other cores hash the same bytes (one
    /// read of the file, hashing beside copying).
    Mapped { images: &'a ImageDir, name: String },
}

/// Plans the copy of the pages of `mm` from `pages` (the mapped file
/// `name` of `images`) and does what of it needs the tracer `r`. On disk,
/// with the manifest's block digests, the file is to be read with direct
/// I/O into `buffers`; otherwise from the mapping.
pub fn prepare_fill<'a>(
    r: &Remote<'_>,
    mm: &Mm,
    images: &'a ImageDir,
    name: String,
    pages: &'a [u8],
    buffers: &'a ReadBuffers,
    progress: Option<&'a (dyn Fn(u64, u64) + Sync)>,
) -> Result<PageFill<'a>> {
    // Private anonymous memory is filled with UFFDIO_COPY, which puts each
    // new page in place already holding its data: writing into the
    // process instead faults in a zeroed page first and then copies over
    // it, twice the work (1 GiB: 0.27–0.40 s against 0.54–0.76 s here).
    // The rest, and everything when the kernel refuses a userfaultfd, is
    // written as before.
    let split = layout::split(mm, plan(r.t.pid(), mm, pages.len() as u64)?);
    let source = match open_direct(images, &name, &split, pages.len() as u64, buffers)? {
        Some(d) => {
            log::debug!("{name}: read directly, each block checked as it arrives");
            Source::Direct(d)
        }
        None => Source::Mapped { images, name },
    };
    let copier = Copier {
        memory: r.t.memory()?,
        pages,
        total: mm.pages_bytes,
        progress,
        done: AtomicU64::new(0),
    };
    // First, while nothing is registered: a write into a registered range
    // would wait for a fill that never comes.
    copier.copy_each(split.eager, Placing::Write)?;
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
    Ok(PageFill {
        copier,
        pieces: split.lazy,
        source,
        uffd,
    })
}

impl PageFill<'_> {
    /// The process filled.
    pub fn pid(&self) -> i32 {
        self.copier.memory.pid()
    }

    /// Copies the pieces left, and has the whole file verified (a
    /// mismatch is an error, whatever was copied).
    pub fn run(self) -> Result<()> {
        let PageFill {
            copier,
            pieces: left,
            source,
            uffd,
        } = self;
        let how = match &uffd {
            Some(u) => Placing::Fill(u),
            None => Placing::Write,
        };
        match source {
            Source::Direct(d) => {
                let mut rest = pieces(left);
                rest.sort_unstable_by_key(|c| c.file_offset);
                let rest = direct::cut_at_windows(rest);
                d.stream(&rest, |c, stored| {
                    DECOMPRESSED
                        .with_borrow_mut(|buf| place_piece(&copier.memory, c, stored, buf, how))?;
                    copier.report(c);
                    Ok(())
                })?;
            }
            // The copy stays on this thread; the hashing runs on the
            // pool's threads meanwhile.
            Source::Mapped { images, name } => std::thread::scope(|s| {
                let verifying = s.spawn(|| images.verify_bytes(&name, copier.pages));
                let copied = copier.copy_each(left, how);
                let verified = verifying
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                verified?;
                copied
            })?,
        }
        // Closing the userfaultfd unregisters its ranges.
        drop(uffd);
        Ok(())
    }
}

impl Copier<'_> {
    /// Copies `copies` (checked by [`plan`]) from the mapped file into
    /// place as `how` says, without verifying the file.
    fn copy_each(&self, copies: Vec<PageCopy>, how: Placing<'_>) -> Result<()> {
        let pid = self.memory.pid();
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
                .and_then(|(off, len)| self.pages.get(off..off.checked_add(len)?))
                .ok_or_else(|| bad_piece(pid, c, "outside the pages file".into()))?;
            place_piece(&self.memory, c, stored, buf, how)?;
            self.report(c);
            Ok(())
        })
    }

    /// Adds `c` to the bytes done and tells `progress`.
    fn report(&self, c: &PageCopy) {
        let now = self.done.fetch_add(c.raw_len, Ordering::Relaxed) + c.raw_len;
        if let Some(p) = self.progress {
            p(now, self.total);
        }
    }
}

/// The pages file `name` of `size` bytes opened for direct reads, when it
/// is on a disk, the manifest has its block digests, the pieces of `split`
/// lie in it one after the other, and few of their bytes are written from
/// the mapping before the fill (`split.eager`), which the direct reads
/// would read a second time (20,000 one-page VMAs are all first pages);
/// `None` otherwise.
fn open_direct<'b>(
    images: &ImageDir,
    name: &str,
    split: &Split,
    size: u64,
    buffers: &'b ReadBuffers,
) -> Result<Option<DirectPages<'b>>> {
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
    Ok(Some(DirectPages::new(file, checks, size, buffers)))
}

/// The direct path is taken when at most 1/MOSTLY_FILLED of a pages file
/// is written from its mapping before the fill.
const MOSTLY_FILLED: u64 = 8;

/// Below this many bytes of private anonymous pages a process's memory is
/// written, not placed with UFFDIO_COPY: creating, registering and closing
/// the userfaultfd takes some ten ptrace stops, about what placing
/// instead of writing saves on 2 MiB (0.27 s a GiB), and most processes of
/// a large tree hold less than that.
const UFFD_MIN_BYTES: u64 = 4 << 20;

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
    let copier = Copier {
        memory: r.t.memory()?,
        pages,
        total,
        progress,
        done: AtomicU64::new(0),
    };
    copier.copy_each(copies, Placing::Write)
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
    memory: &TaskMemory,
    c: &PageCopy,
    stored: &[u8],
    buf: &mut Vec<u8>,
    how: Placing<'_>,
) -> Result<()> {
    let pid = memory.pid();
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
        Placing::Write => Ok(memory.write(c.addr, data)?),
        Placing::Fill(u) => fill(memory, u, c.addr, data),
    }
}

/// Places `data` at `addr` with `UFFDIO_COPY`. The process is stopped
/// and its map settled, so the copy can stop only on a page already
/// present, which the rebuild makes at most at a VMA's first page (the
/// split keeps those written): that one is written over instead.
fn fill(memory: &TaskMemory, u: &Userfault, addr: u64, data: &[u8]) -> Result<()> {
    let mut at = 0usize;
    while at < data.len() {
        let f = u.copy_step(addr + at as u64, &data[at..])?;
        at += f.filled as usize;
        match f.stop {
            None | Some(Stop::Changing) => {}
            Some(Stop::Present) => {
                let end = (at + PAGE_BYTES).min(data.len());
                memory.write(addr + at as u64, &data[at..end])?;
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
