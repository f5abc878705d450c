//! Page data files as they are written, and their checksums.
//!
//! Two ways in, both through [`PagesWriter::write_at`] from any number of
//! threads:
//!
//! - **Positional** ([`crate::ImageWriter::pages`]): raw pages land at
//!   offsets planned in advance, in any order. They go through the page
//!   cache; each write starts its writeback at once, and the BLAKE3 digest
//!   is taken from the page cache when the file is complete, before the
//!   fsync waits for the disk.
//! - **Streamed** ([`crate::ImageWriter::pages_streamed`]): data appended
//!   roughly in order, as LZ4 blocks are. Bytes are gathered into aligned
//!   [`digest::BLOCK`]-sized buffers; each full buffer is hashed where it
//!   is and written with `O_DIRECT` by a small pool of flusher threads, so
//!   the data is copied once (into the buffer) instead of twice (into the
//!   page cache, and back out to hash it), several writes keep the disk
//!   busy, and hashing overlaps compression. A file system that refuses
//!   `O_DIRECT` gets the same buffers through the page cache.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::digest::{self, BLOCK};
use crate::error::ImageError;
use crate::manifest::FileDigest;
use crate::sys;

/// `O_DIRECT` writes must start, end and sit in memory on this boundary
/// (the page size covers every logical block size in use).
const DIRECT_ALIGN: usize = 4096;

/// Threads that hash and write full blocks of streamed files: enough to
/// keep a few writes in flight while the cores compress.
const FLUSHERS: usize = 3;

/// Full blocks queued for the flushers at most; the writers wait beyond
/// that, which bounds memory.
const QUEUED_BLOCKS: usize = FLUSHERS * 2;

/// A page-data file being written.
pub struct PagesWriter {
    name: String,
    path: PathBuf,
    way: Way,
}

enum Way {
    Positional(Positional),
    Streamed(Arc<Streamed>),
}

impl PagesWriter {
    pub(crate) fn positional(name: String, path: PathBuf, file: File) -> Self {
        PagesWriter {
            name,
            path,
            way: Way::Positional(Positional {
                file,
                chunks: Mutex::new(Vec::new()),
            }),
        }
    }

    pub(crate) fn streamed(name: String, path: PathBuf, file: File, flusher: &Flusher) -> Self {
        let direct = match sys::set_direct_io(file.as_fd()) {
            Ok(()) => true,
            Err(e) => {
                log::debug!(
                    "{}: no O_DIRECT ({e}): through the page cache",
                    path.display()
                );
                false
            }
        };
        let s = Streamed {
            path: path.clone(),
            file,
            direct: AtomicBool::new(direct),
            state: Mutex::new(StreamState::default()),
            idle: Condvar::new(),
            queue: flusher.queue.clone(),
            spare: Arc::clone(&flusher.spare),
        };
        PagesWriter {
            name,
            path,
            way: Way::Streamed(Arc::new(s)),
        }
    }

    /// Path of the file being written (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes written into it so far.
    pub fn written(&self) -> u64 {
        match &self.way {
            Way::Positional(p) => lock(&p.chunks).iter().map(|c| c.len).sum(),
            Way::Streamed(s) => lock(&s.state).pieces.iter().map(|p| p.len).sum(),
        }
    }

    /// Writes `data` at `offset`. Pieces must not overlap and must end up
    /// covering the file from 0 without holes.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), ImageError> {
        match &self.way {
            Way::Positional(p) => p.write_at(&self.path, offset, data),
            Way::Streamed(s) => s.write_at(offset, data),
        }
    }

    /// No more writes: writes out what is still buffered (a streamed
    /// file's short last block), so that a file waiting for its fsync
    /// holds no buffer. [`PagesWriter::finish`] does it if not done.
    pub fn complete(&self) -> Result<(), ImageError> {
        match &self.way {
            Way::Positional(_) => Ok(()),
            Way::Streamed(s) => s.complete(),
        }
    }

    /// Completes the file (durable on return) and returns its checksums.
    pub(crate) fn finish(self) -> Result<FileDigest, ImageError> {
        let (size, crc32c, blake3, blocks) = match self.way {
            Way::Positional(p) => p.finish(&self.path)?,
            Way::Streamed(s) => s.finish()?,
        };
        Ok(FileDigest {
            name: self.name,
            size,
            crc32c,
            blake3: blake3.to_vec(),
            block_blake3: blocks,
        })
    }
}

/// What a finished file adds up to: size, CRC32C, digest, block digests.
type Finished = (u64, u32, digest::Digest, Vec<u8>);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One write: where it went, and (positional files) its CRC.
#[derive(Clone, Copy)]
struct Piece {
    offset: u64,
    len: u64,
    crc: u32,
}

/// The pieces, sorted, must tile `[0, size)`; returns `size`.
fn check_tiling(path: &Path, pieces: &mut [Piece]) -> Result<u64, ImageError> {
    pieces.sort_by_key(|c| c.offset);
    let mut size = 0u64;
    for c in pieces.iter() {
        if c.offset != size {
            return Err(ImageError::Invalid {
                path: path.into(),
                what: format!("page data has a hole or overlap at offset {size}"),
            });
        }
        size += c.len;
    }
    Ok(size)
}

struct Positional {
    file: File,
    chunks: Mutex<Vec<Piece>>,
}

impl Positional {
    fn write_at(&self, path: &Path, offset: u64, data: &[u8]) -> Result<(), ImageError> {
        self.file
            .write_all_at(data, offset)
            .map_err(|e| ImageError::io(path, "write", e))?;
        // Only a hint to start the disk now: the fsync in `finish` is what
        // makes the data durable and reports any error.
        if let Err(e) = sys::start_writeback(self.file.as_fd(), offset, data.len() as u64) {
            log::debug!("{}: early writeback not started: {e}", path.display());
        }
        let crc = crc32c::crc32c(data);
        lock(&self.chunks).push(Piece {
            offset,
            len: data.len() as u64,
            crc,
        });
        Ok(())
    }

    fn finish(self, path: &Path) -> Result<Finished, ImageError> {
        let mut chunks = self.chunks.into_inner().unwrap_or_else(|p| p.into_inner());
        let size = check_tiling(path, &mut chunks)?;
        let mut crc = 0u32;
        let mut at = 0u64;
        for c in &chunks {
            crc = if at == 0 {
                c.crc
            } else {
                digest::crc32c_combine(crc, c.crc, c.len)
            };
            at += c.len;
        }
        // The CRC was combined from the pieces as they were written; the
        // BLAKE3 digest needs whole blocks, hashed from the page cache
        // before the fsync, so that hashing overlaps the writeback the
        // writes started.
        let (blake3, blocks) = digest::blake3_of_own_file(&self.file, size, path)?;
        self.file
            .sync_all()
            .map_err(|e| ImageError::io(path, "fsync", e))?;
        Ok((size, crc, blake3, blocks))
    }
}

/// A [`BLOCK`]-sized buffer aligned for `O_DIRECT` (an anonymous mapping).
struct BlockBuf(memmap2::MmapMut);

impl BlockBuf {
    fn new(path: &Path) -> Result<Self, ImageError> {
        memmap2::MmapMut::map_anon(BLOCK as usize)
            .map(BlockBuf)
            .map_err(|e| ImageError::io(path, "allocate a write buffer for", e))
    }
}

/// A streamed file, shared with the flushers.
struct Streamed {
    path: PathBuf,
    file: File,
    /// Writes bypass the page cache (until the file system refuses one).
    direct: AtomicBool,
    state: Mutex<StreamState>,
    /// Signalled when a flusher is done with a block.
    idle: Condvar,
    queue: SyncSender<Flush>,
    /// Buffers to reuse, shared by the checkpoint's streamed files.
    spare: Arc<Mutex<Vec<BlockBuf>>>,
}

#[derive(Default)]
struct StreamState {
    /// Blocks being filled, by index.
    filling: BTreeMap<u64, Filling>,
    /// Every write, to check at the end that they tile the file.
    pieces: Vec<Piece>,
    /// Checksums of the blocks written so far, by index.
    done: BTreeMap<u64, BlockSums>,
    /// Blocks handed to the flushers and not done yet.
    in_flight: usize,
    /// The first failure of a flusher.
    failed: Option<std::io::Error>,
}

struct Filling {
    buf: BlockBuf,
    filled: usize,
}

#[derive(Clone, Copy)]
struct BlockSums {
    crc32c: u32,
    len: usize,
    blake3: digest::Digest,
}

/// A full block for a flusher.
struct Flush {
    file: Arc<Streamed>,
    index: u64,
    buf: BlockBuf,
}

impl Streamed {
    fn write_at(self: &Arc<Self>, offset: u64, data: &[u8]) -> Result<(), ImageError> {
        let mut full = Vec::new();
        {
            let mut st = lock(&self.state);
            if let Some(e) = &st.failed {
                return Err(self.flush_error(e));
            }
            let mut at = offset;
            let mut rest = data;
            while !rest.is_empty() {
                let index = at / BLOCK;
                let within = (at % BLOCK) as usize;
                let n = rest.len().min(BLOCK as usize - within);
                let f = match st.filling.entry(index) {
                    Entry::Occupied(e) => e.into_mut(),
                    Entry::Vacant(e) => {
                        let buf = match lock(&self.spare).pop() {
                            Some(b) => b,
                            None => BlockBuf::new(&self.path)?,
                        };
                        e.insert(Filling { buf, filled: 0 })
                    }
                };
                f.buf.0[within..within + n].copy_from_slice(&rest[..n]);
                f.filled += n;
                if f.filled >= BLOCK as usize
                    && let Some(f) = st.filling.remove(&index)
                {
                    full.push((index, f.buf));
                }
                at += n as u64;
                rest = &rest[n..];
            }
            st.pieces.push(Piece {
                offset,
                len: data.len() as u64,
                crc: 0,
            });
            st.in_flight += full.len();
        }
        for (index, buf) in full {
            let job = Flush {
                file: Arc::clone(self),
                index,
                buf,
            };
            if let Err(std::sync::mpsc::SendError(job)) = self.queue.send(job) {
                // The flushers are gone (the writer is being dropped):
                // write it here.
                flush(job);
            }
        }
        Ok(())
    }

    fn flush_error(&self, e: &std::io::Error) -> ImageError {
        ImageError::io(
            &self.path,
            "write",
            std::io::Error::new(e.kind(), e.to_string()),
        )
    }

    /// Hashes and writes block `index` of `len` bytes from `buf`.
    fn write_block(
        &self,
        index: u64,
        buf: &mut BlockBuf,
        len: usize,
    ) -> Result<BlockSums, std::io::Error> {
        let data = &buf.0[..len];
        let sums = BlockSums {
            crc32c: crc32c::crc32c(data),
            len,
            blake3: digest::block_digest(data),
        };
        let offset = index * BLOCK;
        if self.direct.load(Ordering::Relaxed) {
            // A short last block goes out padded to the alignment; the
            // file is cut back to its size at the end.
            let padded = len.next_multiple_of(DIRECT_ALIGN);
            buf.0[len..padded].fill(0);
            match self.file.write_all_at(&buf.0[..padded], offset) {
                Ok(()) => return Ok(sums),
                // Alignment the file system does not take after all.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    log::debug!("{}: O_DIRECT write refused: {e}", self.path.display());
                    self.direct.store(false, Ordering::Relaxed);
                    sys::clear_direct_io(self.file.as_fd())?;
                }
                Err(e) => return Err(e),
            }
        }
        self.file.write_all_at(&buf.0[..len], offset)?;
        if let Err(e) = sys::start_writeback(self.file.as_fd(), offset, len as u64) {
            log::debug!("{}: early writeback not started: {e}", self.path.display());
        }
        Ok(sums)
    }

    /// Waits for the flushers to be done with this file's blocks.
    fn wait_idle(&self) -> Result<MutexGuard<'_, StreamState>, ImageError> {
        let mut st = lock(&self.state);
        while st.in_flight > 0 {
            st = self.idle.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        match &st.failed {
            Some(e) => Err(self.flush_error(e)),
            None => Ok(st),
        }
    }

    fn complete(&self) -> Result<(), ImageError> {
        let mut st = self.wait_idle()?;
        if st.filling.is_empty() {
            return Ok(());
        }
        let size = check_tiling(&self.path, &mut st.pieces)?;
        let blocks = size.div_ceil(BLOCK);
        // What is left can only be the short last block.
        let tail = std::mem::take(&mut st.filling);
        for (index, mut f) in tail {
            let expected = size - index * BLOCK;
            let written = (index + 1 == blocks && f.filled as u64 == expected)
                .then(|| self.write_block(index, &mut f.buf, f.filled));
            lock(&self.spare).push(f.buf);
            match written {
                Some(Ok(sums)) => {
                    st.done.insert(index, sums);
                }
                Some(Err(e)) => return Err(ImageError::io(&self.path, "write", e)),
                None => {
                    return Err(ImageError::Invalid {
                        path: self.path.clone(),
                        what: format!("page data block {index} is incomplete"),
                    });
                }
            }
        }
        Ok(())
    }

    fn finish(self: Arc<Self>) -> Result<Finished, ImageError> {
        self.complete()?;
        let mut st = self.wait_idle()?;
        let size = check_tiling(&self.path, &mut st.pieces)?;
        let blocks = size.div_ceil(BLOCK);
        let mut crc = 0u32;
        let mut list = Vec::with_capacity(blocks as usize * digest::DIGEST_LEN);
        for index in 0..blocks {
            let Some(b) = st.done.get(&index) else {
                return Err(ImageError::Invalid {
                    path: self.path.clone(),
                    what: format!("page data block {index} was never written"),
                });
            };
            crc = if index == 0 {
                b.crc32c
            } else {
                digest::crc32c_combine(crc, b.crc32c, b.len as u64)
            };
            list.extend_from_slice(&b.blake3);
        }
        drop(st);
        // The last block may have gone out padded.
        self.file
            .set_len(size)
            .map_err(|e| ImageError::io(&self.path, "truncate", e))?;
        self.file
            .sync_all()
            .map_err(|e| ImageError::io(&self.path, "fsync", e))?;
        Ok((size, crc, digest::digest_of_block_list(&list), list))
    }
}

/// Hashes and writes one full block, and records the outcome.
fn flush(mut job: Flush) {
    let outcome = job
        .file
        .write_block(job.index, &mut job.buf, BLOCK as usize);
    let mut st = lock(&job.file.state);
    match outcome {
        Ok(sums) => {
            st.done.insert(job.index, sums);
        }
        Err(e) => {
            st.failed.get_or_insert(e);
        }
    }
    lock(&job.file.spare).push(job.buf);
    st.in_flight -= 1;
    drop(st);
    job.file.idle.notify_all();
}

/// The flusher threads of one checkpoint, shared by its streamed files,
/// and the block buffers they pass around. The threads end once the
/// checkpoint's writer and every file it made are gone.
pub(crate) struct Flusher {
    queue: SyncSender<Flush>,
    spare: Arc<Mutex<Vec<BlockBuf>>>,
}

impl Flusher {
    pub(crate) fn start() -> Result<Self, std::io::Error> {
        let (queue, jobs) = std::sync::mpsc::sync_channel::<Flush>(QUEUED_BLOCKS);
        let jobs = Arc::new(Mutex::new(jobs));
        for i in 0..FLUSHERS {
            let jobs: Arc<Mutex<Receiver<Flush>>> = Arc::clone(&jobs);
            std::thread::Builder::new()
                .name(format!("ckpt-flush-{i}"))
                .spawn(move || {
                    loop {
                        // The lock is held only to take one job.
                        let job = lock(&jobs).recv();
                        match job {
                            Ok(job) => flush(job),
                            Err(_) => break,
                        }
                    }
                })?;
        }
        Ok(Flusher {
            queue,
            spare: Arc::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ImageWriter;
    use crate::manifest::Manifest;
    use crate::seal::ImageKey;

    fn sample(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    }

    /// Writes `data` into a new page file in `pieces` (offset, len) and
    /// returns its digest entry, or the error.
    fn write(
        streamed: bool,
        data: &[u8],
        pieces: &[(usize, usize)],
    ) -> Result<FileDigest, ImageError> {
        let t = tempfile::tempdir().unwrap();
        let mut w = ImageWriter::create(&t.path().join("ck")).unwrap();
        let pw = if streamed {
            w.pages_streamed("pages-1.img").unwrap()
        } else {
            w.pages("pages-1.img").unwrap()
        };
        std::thread::scope(|s| {
            for chunk in pieces.chunks(pieces.len().div_ceil(3).max(1)) {
                let pw = &pw;
                s.spawn(move || {
                    for &(at, len) in chunk {
                        pw.write_at(at as u64, &data[at..at + len]).unwrap();
                    }
                });
            }
        });
        w.finish_pages(pw)?;
        let key = ImageKey::from_secret(Path::new("k"), [7; crate::seal::KEY_LEN]);
        let committed = w.commit(Manifest::default(), &key)?;
        let on_disk = std::fs::read(committed.path().join("pages-1.img")).unwrap();
        assert_eq!(on_disk, data, "file contents");
        let m = crate::ImageDir::open(committed.path(), &key).unwrap();
        Ok(m.manifest().files[0].clone())
    }

    /// Pieces of uneven sizes that cross block boundaries, tiling `len`.
    fn pieces(len: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut at = 0;
        let mut i = 0usize;
        while at < len {
            let n = (1 + (i * 7919) % (3 << 20)).min(len - at);
            out.push((at, n));
            at += n;
            i += 1;
        }
        out
    }

    #[test]
    fn streamed_and_positional_files_hold_the_same_bytes_and_sums() {
        for len in [0, 1, 4095, BLOCK as usize, BLOCK as usize * 3 + 12_345] {
            let data = sample(len);
            let p = pieces(len);
            let streamed = write(true, &data, &p).unwrap();
            let positional = write(false, &data, &p).unwrap();
            let expected = digest::of_bytes(&data);
            assert_eq!(streamed.size, len as u64);
            assert_eq!(streamed.crc32c, expected.crc32c, "len {len}");
            assert_eq!(streamed.blake3, expected.blake3.to_vec(), "len {len}");
            assert_eq!(streamed.block_blake3, positional.block_blake3, "len {len}");
            assert_eq!(streamed, positional, "len {len}");
        }
    }

    #[test]
    fn a_hole_in_a_streamed_file_is_refused() {
        let data = sample(BLOCK as usize * 2);
        let mut p = pieces(data.len());
        p.remove(1);
        let err = write(true, &data, &p).unwrap_err();
        assert!(
            err.to_string().contains("hole or overlap"),
            "unexpected error: {err}"
        );
    }
}
