//! Copying saved pages from the frozen process into the pages file.
//!
//! The page ranges of all VMAs are cut into chunks of at most
//! [`CHUNK_BYTES`]; rayon copies chunks in parallel, each with one read of
//! the process's memory ([`Memory`]) and one write: at the chunk's
//! precomputed offset (raw pages), or appended as an LZ4 block. Memory use
//! is bounded by chunk size × threads, whatever the process size.

use std::fs::File;
use std::io::IoSliceMut;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use ckpt_image::PAGE_SIZE;
use ckpt_image::digest::BLOCK;
use ckpt_image::mm::{PageChunk, PageRange, Vma};
use ckpt_image::{PageStream, PagesWriter};
use ckpt_parasite::{ParasiteError, Tracee};
use nix::sys::uio::{RemoteIoVec, process_vm_readv};
use nix::unistd::Pid;
use rayon::prelude::*;

use crate::error::{DumpError, Result};
use crate::sys;
use crate::{HeldBuf, HeldMemory};

/// A process's memory as ckpt reads it. Mostly with `process_vm_readv`,
/// one copy straight from the process's pages; `/proc/PID/mem` (opened
/// while the process was traced, so it stays readable once the tree runs
/// again, as a background dump reads it) copies each page twice, through a
/// kernel buffer, and is kept for the pages `process_vm_readv` refuses
/// (`PROT_NONE`).
pub struct Memory {
    pid: i32,
    file: File,
    /// The process itself, whatever later takes its pid: a read by pid
    /// counts only if the process still held the pid after it.
    pidfd: OwnedFd,
}

impl Memory {
    /// The memory of traced task `t`.
    pub fn of(t: &Tracee) -> Result<Memory> {
        let file = t.mem()?.try_clone().map_err(|source| ParasiteError::Mem {
            pid: t.pid(),
            op: "reopen",
            addr: 0,
            len: 0,
            source,
        })?;
        let pidfd = sys::pidfd_open(t.pid()).map_err(|source| ParasiteError::Mem {
            pid: t.pid(),
            op: "pidfd_open",
            addr: 0,
            len: 0,
            source,
        })?;
        Ok(Memory {
            pid: t.pid(),
            file,
            pidfd,
        })
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Reads `buf.len()` bytes at `addr` (any mapped page, even PROT_NONE).
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let direct = self.read_direct(addr, buf);
        let rest = &mut buf[direct..];
        if rest.is_empty() {
            return Ok(());
        }
        let addr = addr + direct as u64;
        self.file.read_exact_at(rest, addr).map_err(|source| {
            ParasiteError::Mem {
                pid: self.pid,
                op: "read",
                addr,
                len: buf.len(),
                source,
            }
            .into()
        })
    }
}

impl Memory {
    /// Reads the ranges `pieces` (start, end), back to back, into `buf`
    /// (exactly as long as all of them): many ranges per
    /// `process_vm_readv`, where one call per page cost more than the copy
    /// for pages written here and there.
    pub fn read_pieces(&self, pieces: &[(u64, u64)], buf: &mut [u8]) -> Result<()> {
        /// The kernel's limit on iovecs per call (`UIO_MAXIOV`).
        const MAX_IOVECS: usize = 1024;
        let mut at = 0usize;
        for batch in pieces.chunks(MAX_IOVECS) {
            let len: usize = batch.iter().map(|&(s, e)| (e - s) as usize).sum();
            let out = &mut buf[at..at + len];
            let remote: Vec<RemoteIoVec> = batch
                .iter()
                .map(|&(s, e)| RemoteIoVec {
                    base: s as usize,
                    len: (e - s) as usize,
                })
                .collect();
            let n = process_vm_readv(
                Pid::from_raw(self.pid),
                &mut [IoSliceMut::new(out)],
                &remote,
            )
            .unwrap_or(0);
            // Short (a page process_vm_readv refuses, or the pid is no
            // longer this process's): each piece of the batch on its own.
            if n != len || !sys::pidfd_holds_pid(self.pidfd.as_fd()) {
                let mut off = 0usize;
                for &(s, e) in batch {
                    let l = (e - s) as usize;
                    self.read(s, &mut out[off..off + l])?;
                    off += l;
                }
            }
            at += len;
        }
        Ok(())
    }

    /// How many bytes from `addr` `process_vm_readv` read into `buf` (0 if
    /// it could not, or if the pid may no longer be this process's).
    fn read_direct(&self, addr: u64, buf: &mut [u8]) -> usize {
        let remote = [RemoteIoVec {
            base: addr as usize,
            len: buf.len(),
        }];
        let n = process_vm_readv(
            Pid::from_raw(self.pid),
            &mut [IoSliceMut::new(buf)],
            &remote,
        )
        .unwrap_or(0);
        // Still holding its pid now, it held it during the read.
        if n > 0 && sys::pidfd_holds_pid(self.pidfd.as_fd()) {
            n
        } else {
            0
        }
    }
}

/// Largest unit of work: big enough for sequential I/O, small enough to
/// spread a process over all cores.
pub const CHUNK_BYTES: u64 = 1 << 20;

fn chunks(vmas: &[Vma]) -> Vec<PageRange> {
    split(vmas.iter().flat_map(|v| v.pages.iter()))
}

/// `ranges` cut into chunks of at most [`CHUNK_BYTES`], in order.
pub fn split<'r>(ranges: impl IntoIterator<Item = &'r PageRange>) -> Vec<PageRange> {
    let per = CHUNK_BYTES / PAGE_SIZE;
    let mut out = Vec::new();
    for r in ranges {
        let mut done = 0;
        while done < r.nr_pages {
            let n = per.min(r.nr_pages - done);
            out.push(PageRange {
                addr: r.addr + done * PAGE_SIZE,
                nr_pages: n,
                offset: r.offset + done * PAGE_SIZE,
            });
            done += n;
        }
    }
    out
}

/// Copies every planned page range; `progress` is called with bytes done.
/// Each task fills one 4 MiB block of the file (the unit of its digest)
/// from the process and writes it hashed, so the file is never read back.
pub fn copy_pages(
    t: &Memory,
    vmas: &[Vma],
    out: &PagesWriter,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    let done = AtomicU64::new(0);
    file_blocks(vmas).par_iter().enumerate().try_for_each_init(
        || vec![0u8; BLOCK as usize],
        |buf, (index, ranges)| -> Result<()> {
            let start = index as u64 * BLOCK;
            let mut len = 0;
            for r in ranges {
                let at = (r.offset - start) as usize;
                t.read(r.addr, &mut buf[at..at + r.len() as usize])?;
                len = at + r.len() as usize;
            }
            out.write_block(index as u64, &buf[..len])?;
            let bytes = len as u64;
            progress(done.fetch_add(bytes, Ordering::Relaxed) + bytes);
            Ok(())
        },
    )
}

/// The planned ranges of a raw pages file, cut where its 4 MiB blocks
/// begin, grouped by block (the ranges tile the file from offset 0).
fn file_blocks(vmas: &[Vma]) -> Vec<Vec<PageRange>> {
    let mut ranges: Vec<&PageRange> = vmas.iter().flat_map(|v| v.pages.iter()).collect();
    ranges.sort_unstable_by_key(|r| r.offset);
    let per_block = BLOCK / PAGE_SIZE;
    let mut blocks: Vec<Vec<PageRange>> = Vec::new();
    for r in ranges {
        let mut done = 0;
        while done < r.nr_pages {
            let offset = r.offset + done * PAGE_SIZE;
            let index = (offset / BLOCK) as usize;
            let room = per_block - (offset % BLOCK) / PAGE_SIZE;
            let n = room.min(r.nr_pages - done);
            if blocks.len() <= index {
                blocks.resize_with(index + 1, Vec::new);
            }
            blocks[index].push(PageRange {
                addr: r.addr + done * PAGE_SIZE,
                nr_pages: n,
                offset,
            });
            done += n;
        }
    }
    blocks
}

/// Saves `chunks` into `sink` on every core, in any order; `progress` gets
/// the bytes saved so far.
pub fn save_chunks(
    mem: &Memory,
    chunks: &[PageRange],
    sink: &Sink<'_>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    let done = AtomicU64::new(0);
    chunks.par_iter().try_for_each_init(
        || vec![0u8; CHUNK_BYTES as usize],
        |buf, c| {
            let b = &mut buf[..c.len() as usize];
            mem.read(c.addr, b)?;
            sink.put(c, b)?;
            progress(done.fetch_add(c.len(), Ordering::Relaxed) + c.len());
            Ok(())
        },
    )
}

/// Chunks read from the process and held in memory (to be saved once it
/// runs again).
pub struct ReadChunks<'m>(Vec<(PageRange, HeldBuf<'m>)>);

/// Reads `chunks` into memory (taken from `held`) on every core.
pub fn read_chunks<'m>(
    mem: &Memory,
    chunks: &[PageRange],
    held: &'m HeldMemory,
) -> Result<ReadChunks<'m>> {
    chunks
        .par_iter()
        .map(|c| {
            let mut bytes = held.take(c.len() as usize);
            mem.read(c.addr, &mut bytes)?;
            Ok((*c, bytes))
        })
        .collect::<Result<_>>()
        .map(ReadChunks)
}

/// Saves chunks [`read_chunks`] held into `sink` on every core; `progress`
/// gets the bytes saved so far.
pub fn put_read(
    chunks: ReadChunks<'_>,
    sink: &Sink<'_>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    let done = AtomicU64::new(0);
    chunks.0.par_iter().try_for_each(|(c, bytes)| {
        sink.put(c, bytes)?;
        progress(done.fetch_add(c.len(), Ordering::Relaxed) + c.len());
        Ok(())
    })
}

/// Buffers of LZ4's worst-case output for a chunk (more than a raw chunk), reused from
/// chunk to chunk. A fresh allocation per chunk came from the kernel each
/// time (glibc gives large freed blocks back), so every 4 KiB dumped cost
/// a page fault and a zeroed page, a fifth of a dump's CPU time.
#[derive(Default)]
pub struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// Length of every buffer.
    fn len() -> usize {
        lz4_flex::block::get_maximum_output_size(CHUNK_BYTES as usize)
    }

    /// A buffer of [`BufferPool::len`] bytes (contents left over).
    fn take(&self) -> Vec<u8> {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .unwrap_or_else(|| vec![0u8; Self::len()])
    }

    /// Returns a buffer for reuse.
    fn give(&self, buf: Vec<u8>) {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(buf);
    }
}

/// Like [`copy_pages`], but every chunk becomes one LZ4 block (stored raw
/// when it does not shrink), appended to `out` as one stream
/// ([`PagesWriter::stream`]) in the order the chunks are ready. Every core
/// reads and compresses chunks while a writer thread appends them, so the
/// disk is kept busy from the first chunk on: rayon's halves of the chunk
/// list mix a region that compresses to nothing with one that is stored
/// as is, where windows in address order left the disk idle through the
/// compressible ones. Returns the block list for the mm image, by address.
pub fn copy_pages_compressed(
    t: &Memory,
    vmas: &[Vma],
    out: &PagesWriter,
    pool: &BufferPool,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Vec<PageChunk>> {
    let all = &chunks(vmas);
    let mut blocks = std::thread::scope(|s| -> Result<Vec<PageChunk>> {
        let (to_writer, packed) = std::sync::mpsc::sync_channel::<Packed>(QUEUED_CHUNKS);
        let writer = s.spawn(move || -> Result<Vec<PageChunk>> {
            // A block is stored raw when LZ4 does not shrink it.
            let at_most = all.iter().map(|c| c.len()).sum();
            out.stream(at_most, |stream| -> Result<Vec<PageChunk>> {
                let mut blocks = Vec::with_capacity(all.len());
                let (mut file_offset, mut done) = (0u64, 0u64);
                for p in packed {
                    let mut at = 0;
                    for b in &p.blocks {
                        stream.push(&p.buf[at..at + b.len])?;
                        let mut file_len = b.len as u64;
                        if let Some(tail) = b.tail {
                            stream.push_with(tail.len as usize, |into: &mut [u8], off| {
                                t.read(tail.addr + off as u64, into)
                            })?;
                            file_len += tail.len;
                        }
                        blocks.push(PageChunk {
                            addr: b.range.addr,
                            raw_len: b.range.len(),
                            file_offset,
                            file_len,
                            stored_raw: b.stored_raw,
                        });
                        at += b.len;
                        file_offset += file_len;
                        done += b.range.len();
                    }
                    progress(done);
                    pool.give(p.buf);
                }
                Ok(blocks)
            })
        });
        // `Err(None)`: the writer stopped, on an error it reports.
        let packed = batches(all).par_iter().try_for_each(
            |batch| -> std::result::Result<(), Option<DumpError>> {
                let p = pack(t, batch, pool).map_err(Some)?;
                to_writer.send(p).map_err(|_| None)
            },
        );
        drop(to_writer);
        let written = writer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        match packed {
            Err(Some(e)) => Err(e),
            Ok(()) | Err(None) => written,
        }
    })?;
    blocks.sort_unstable_by_key(|b| b.addr);
    Ok(blocks)
}

/// Chunks read and compressed ahead of the writer: bounds memory to a few
/// chunks per thread while keeping every core busy.
const QUEUED_CHUNKS: usize = 8;

/// Consecutive chunks handled as one: small ones (a process of many small
/// VMAs has one per VMA) are read with one `process_vm_readv` and sent to
/// the writer in one message, up to [`CHUNK_BYTES`] of them; a full chunk
/// goes alone. One message and one read per 4 KiB chunk cost more than
/// the data (20,000 one-page VMAs).
fn batches(all: &[PageRange]) -> Vec<&[PageRange]> {
    let mut out = Vec::new();
    let (mut first, mut bytes) = (0, 0);
    for (i, c) in all.iter().enumerate() {
        if i > first && bytes + c.len() > CHUNK_BYTES {
            out.push(&all[first..i]);
            (first, bytes) = (i, 0);
        }
        bytes += c.len();
    }
    if first < all.len() {
        out.push(&all[first..]);
    }
    out
}

/// A batch of chunks as they go into the pages file.
struct Packed {
    /// Each chunk, in order.
    blocks: Vec<PackedBlock>,
    /// A pool buffer holding their stored blocks back to back.
    buf: Vec<u8>,
}

/// One chunk of a [`Packed`] batch.
struct PackedBlock {
    range: PageRange,
    /// Stored as is: LZ4 did not shrink it.
    stored_raw: bool,
    /// Its bytes in the batch's buffer.
    len: usize,
    /// The rest of a chunk stored as is, not read yet: the writer reads it
    /// from the process straight into the file's buffers
    /// ([`ckpt_image::PageStream::push_with`]), so random data, half of a
    /// typical job's memory, crosses memory once rather than twice.
    tail: Option<Unread>,
}

/// Bytes of the process's memory left for the writer to read.
#[derive(Clone, Copy)]
struct Unread {
    addr: u64,
    len: u64,
}

/// Which of [`pack`]'s two buffers holds the stored bytes.
enum Kept {
    /// The one read into: stored as is.
    Raw,
    /// The one compressed into.
    Lz4,
}

/// Reads the chunks of `batch` (at most [`CHUNK_BYTES`] together) and
/// compresses each (kept raw when LZ4 does not shrink it), in buffers
/// from `pool`.
fn pack(t: &Memory, batch: &[PageRange], pool: &BufferPool) -> Result<Packed> {
    let (mut raw, mut z) = (pool.take(), pool.take());
    let packed = match batch {
        [c] => pack_one(t, *c, &mut raw, &mut z),
        _ => pack_many(t, batch, &mut raw, &mut z),
    };
    match packed {
        Ok((blocks, kept)) => {
            // The batch keeps whichever buffer holds its stored bytes: no
            // copy of a chunk stored raw.
            let (buf, spare) = match kept {
                Kept::Raw => (raw, z),
                Kept::Lz4 => (z, raw),
            };
            pool.give(spare);
            Ok(Packed { blocks, buf })
        }
        Err(e) => {
            pool.give(raw);
            pool.give(z);
            Err(e)
        }
    }
}

/// A lone chunk (a full one, most often). When its first
/// [`PROBE_BYTES`] do not compress, only they are read here; the writer
/// reads the rest into the file's buffers.
fn pack_one(
    t: &Memory,
    c: PageRange,
    raw: &mut [u8],
    z: &mut [u8],
) -> Result<(Vec<PackedBlock>, Kept)> {
    let len = c.len() as usize;
    let probed = len > 2 * PROBE_BYTES;
    let first = if probed { PROBE_BYTES } else { len };
    t.read(c.addr, &mut raw[..first])?;
    let block = |stored_raw, len, tail| PackedBlock {
        range: c,
        stored_raw,
        len,
        tail,
    };
    if probed && !probe_shrinks(&raw[..first], z) {
        let tail = Unread {
            addr: c.addr + first as u64,
            len: (len - first) as u64,
        };
        return Ok((vec![block(true, first, Some(tail))], Kept::Raw));
    }
    if first < len {
        t.read(c.addr + first as u64, &mut raw[first..len])?;
    }
    Ok(match lz4_whole(&raw[..len], z) {
        Some(n) => (vec![block(false, n, None)], Kept::Lz4),
        None => (vec![block(true, len, None)], Kept::Raw),
    })
}

/// Several small chunks, read with one `process_vm_readv` and stored back
/// to back in `z`.
fn pack_many(
    t: &Memory,
    batch: &[PageRange],
    raw: &mut [u8],
    z: &mut [u8],
) -> Result<(Vec<PackedBlock>, Kept)> {
    let total: usize = batch.iter().map(|c| c.len() as usize).sum();
    let pieces: Vec<(u64, u64)> = batch.iter().map(|c| (c.addr, c.addr + c.len())).collect();
    t.read_pieces(&pieces, &mut raw[..total])?;
    // A block never takes more than its raw bytes, so what is left of `z`
    // (at least a chunk's worst case) always has room for the next one.
    let (mut from, mut at) = (0usize, 0usize);
    let mut blocks = Vec::with_capacity(batch.len());
    for c in batch {
        let data = &raw[from..from + c.len() as usize];
        let (stored_raw, len) = match lz4_into(data, &mut z[at..]) {
            Some(n) => (false, n),
            None => {
                z[at..at + data.len()].copy_from_slice(data);
                (true, data.len())
            }
        };
        blocks.push(PackedBlock {
            range: *c,
            stored_raw,
            len,
            tail: None,
        });
        from += data.len();
        at += len;
    }
    Ok((blocks, Kept::Lz4))
}

/// LZ4 of `raw` into `z` (a [`BufferPool`] buffer, large enough for a
/// chunk's worst case): its length, or `None` when LZ4 does not shrink it
/// and the chunk is stored raw.
fn lz4_into(raw: &[u8], z: &mut [u8]) -> Option<usize> {
    if raw.len() > 2 * PROBE_BYTES && !probe_shrinks(&raw[..PROBE_BYTES], z) {
        return None;
    }
    lz4_whole(raw, z)
}

/// Whether LZ4 shrinks a chunk's first [`PROBE_BYTES`] (`probe`) by a
/// sixteenth, compressing them into `z`.
fn probe_shrinks(probe: &[u8], z: &mut [u8]) -> bool {
    lz4_flex::block::compress_into(probe, z).is_ok_and(|n| n <= PROBE_BYTES - PROBE_BYTES / 16)
}

/// LZ4 of all of `raw` into `z`: its length, or `None` when it does not
/// shrink.
fn lz4_whole(raw: &[u8], z: &mut [u8]) -> Option<usize> {
    lz4_flex::block::compress_into(raw, z)
        .ok()
        .filter(|&n| n < raw.len())
}

/// How much of a chunk LZ4 tries first: when that does not shrink by a
/// sixteenth, the chunk is stored raw without compressing the rest.
/// Random or already compressed data (half of a typical job's memory,
/// arrays of doubles) then costs a sixteenth of a full attempt, which on
/// two cores was a tenth of a dump's CPU; a chunk that only compresses
/// past its first 64 KiB is stored raw, which is still correct.
const PROBE_BYTES: usize = 64 << 10;

/// Where chunks go when they are saved one by one in any order (a
/// background dump saves them as the job writes to them): at their planned
/// offsets, or as LZ4 blocks appended in the order they come.
pub enum Sink<'w> {
    /// Raw pages at the offsets the plan gave them.
    Raw(&'w PagesWriter),
    /// LZ4 blocks appended to the file as one stream.
    Lz4 {
        /// The stream, and every block so far.
        appended: Mutex<Appended<'w>>,
        /// Buffers LZ4 writes into, reused.
        pool: BufferPool,
    },
}

/// The blocks a [`Sink::Lz4`] appended so far, and the stream they went
/// into. Appending through the stream (direct writes from buffers hashed
/// in memory), not with a `pwrite` each: on this project's VM, a
/// background dump of 4 GiB spent two thirds of its cycles copying into
/// fresh page cache pages.
pub struct Appended<'w> {
    stream: PageStream<'w>,
    blocks: Vec<PageChunk>,
}

impl<'w> Sink<'w> {
    /// A sink writing into `out`, compressed or not; `at_most` bounds what
    /// it will hold (the raw bytes of the pages saved through it).
    pub fn new(out: &'w PagesWriter, compress: bool, at_most: u64) -> Result<Self> {
        Ok(if compress {
            Sink::Lz4 {
                appended: Mutex::new(Appended {
                    stream: out.open_stream(at_most)?,
                    blocks: Vec::new(),
                }),
                pool: BufferPool::default(),
            }
        } else {
            Sink::Raw(out)
        })
    }

    /// Whether chunks become LZ4 blocks.
    pub fn compressed(&self) -> bool {
        matches!(self, Sink::Lz4 { .. })
    }

    /// Saves chunk `c`, whose bytes are `raw`.
    pub fn put(&self, c: &PageRange, raw: &[u8]) -> Result<()> {
        match self {
            Sink::Raw(out) => out.write_at(c.offset, raw).map_err(DumpError::from),
            Sink::Lz4 { pool, .. } => {
                let mut z = pool.take();
                let put = match lz4_into(raw, &mut z) {
                    Some(n) => self.put_stored(c, &z[..n], false),
                    None => self.put_stored(c, raw, true),
                };
                pool.give(z);
                put
            }
        }
    }

    /// Saves chunk `c` from bytes a previous dump stored for it: raw pages,
    /// or one LZ4 block (`raw` when it was stored uncompressed).
    pub fn put_stored(&self, c: &PageRange, stored: &[u8], raw: bool) -> Result<()> {
        match self {
            Sink::Raw(out) => out.write_at(c.offset, stored).map_err(DumpError::from),
            Sink::Lz4 { appended, .. } => {
                let mut a = appended.lock().unwrap_or_else(|p| p.into_inner());
                let file_offset = a.stream.len();
                a.stream.push(stored)?;
                a.blocks.push(PageChunk {
                    addr: c.addr,
                    raw_len: c.len(),
                    file_offset,
                    file_len: stored.len() as u64,
                    stored_raw: raw,
                });
                Ok(())
            }
        }
    }

    /// Ends the sink: the last of the stream written. Returns the block
    /// list for the mm image (empty for raw pages), in address order.
    pub fn finish(self) -> Result<Vec<PageChunk>> {
        match self {
            Sink::Raw(_) => Ok(Vec::new()),
            Sink::Lz4 { appended, .. } => {
                let Appended { stream, mut blocks } =
                    appended.into_inner().unwrap_or_else(|p| p.into_inner());
                stream.finish()?;
                blocks.sort_unstable_by_key(|b| b.addr);
                Ok(blocks)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_chunks_are_batched_up_to_a_chunk() {
        let range = |addr: u64, nr_pages: u64| PageRange {
            addr,
            nr_pages,
            offset: 0,
        };
        let per = CHUNK_BYTES / PAGE_SIZE;
        // 300 one-page chunks, then a full chunk, then one page.
        let mut all: Vec<PageRange> = (0..300).map(|i| range(0x10000 + i * 0x2000, 1)).collect();
        all.push(range(0x1000_0000, per));
        all.push(range(0x2000_0000, 1));
        let b = batches(&all);
        let lens: Vec<usize> = b.iter().map(|b| b.len()).collect();
        assert_eq!(lens, [per as usize, 300 - per as usize, 1, 1]);
        for batch in &b {
            assert!(batch.iter().map(PageRange::len).sum::<u64>() <= CHUNK_BYTES);
        }
        // Every chunk once, in order.
        let flat: Vec<PageRange> = b.concat();
        assert_eq!(flat.len(), all.len());
        assert!(flat.iter().zip(&all).all(|(x, y)| x.addr == y.addr));
        assert!(batches(&[]).is_empty());
    }

    #[test]
    fn chunks_split_and_keep_offsets() {
        let per = CHUNK_BYTES / PAGE_SIZE;
        let vma = Vma {
            pages: vec![PageRange {
                addr: 0x10000,
                nr_pages: per * 2 + 3,
                offset: 8192,
            }],
            ..Default::default()
        };
        let c = chunks(&[vma]);
        assert_eq!(c.len(), 3);
        assert_eq!(c[1].addr, 0x10000 + CHUNK_BYTES);
        assert_eq!(c[1].offset, 8192 + CHUNK_BYTES);
        assert_eq!(c[2].nr_pages, 3);
    }

    #[test]
    fn file_blocks_cut_at_block_starts_and_cover_the_file() {
        let per_block = BLOCK / PAGE_SIZE;
        // Two VMAs, listed out of file order; the first range crosses the
        // first block boundary, the second fills up to the third block.
        let a = Vma {
            pages: vec![PageRange {
                addr: 0x7000_0000,
                nr_pages: 5,
                offset: 0,
            }],
            ..Default::default()
        };
        let b = Vma {
            pages: vec![PageRange {
                addr: 0x1000_0000,
                nr_pages: per_block * 2 - 1,
                offset: 5 * PAGE_SIZE,
            }],
            ..Default::default()
        };
        let blocks = file_blocks(&[b, a]);
        assert_eq!(blocks.len(), 3);
        assert_eq!(blocks[0][0].addr, 0x7000_0000);
        assert_eq!(blocks[0][1].nr_pages, per_block - 5);
        assert_eq!(blocks[1][0].offset, BLOCK);
        assert_eq!(blocks[1][0].addr, 0x1000_0000 + (per_block - 5) * PAGE_SIZE);
        assert_eq!(blocks[2][0].nr_pages, 4);
        let pages: u64 = blocks.iter().flatten().map(|r| r.nr_pages).sum();
        assert_eq!(pages, per_block * 2 + 4);
        for (i, ranges) in blocks.iter().enumerate() {
            for r in ranges {
                assert_eq!(r.offset / BLOCK, i as u64, "{r:?} in block {i}");
                assert!((r.offset + r.len() - 1) / BLOCK == i as u64, "{r:?}");
            }
        }
    }
}
