//! Page data files as they are written, and their digests.
//!
//! Two ways in:
//!
//! - **At planned offsets**, from any number of threads, through the page
//!   cache, each write starting its writeback at once: raw pages. A frozen
//!   dump's go a whole 4 MiB block at a time
//!   ([`PagesWriter::write_block`]), hashed in memory; pieces of other
//!   sizes ([`PagesWriter::write_at`]: raw chunks saved one by one as a
//!   background dump meets them) are hashed from the page cache once the
//!   file is complete, before the fsync waits for the disk, so hashing
//!   overlaps the writeback.
//! - **As one stream in file order** ([`PagesWriter::stream`], or
//!   [`PagesWriter::open_stream`] for a stream that lives as long as a
//!   background dump and is fed by several threads in turn): LZ4 blocks,
//!   appended as they come. The bytes are gathered into page-aligned
//!   [`digest::BLOCK`]-sized buffers, each hashed in memory and written
//!   with `O_DIRECT` by two flusher threads while the next one fills. No
//!   page cache page is allocated for the file and none is read back to
//!   hash it. On this project's VM that matters most: every fresh page
//!   cache page costs a host fault (free page reporting), which made
//!   buffered dumps of 1 GiB take anywhere between 0.45 and 1.5 s (with
//!   0.9–1.6 s of system time), where direct writes of the same bytes take
//!   a steady 0.22–0.27 s. A file in memory (tmpfs, ramfs) or on a
//!   filesystem without direct I/O gets buffered writes of the same
//!   blocks, still hashed in memory.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use memmap2::MmapMut;

use crate::PAGE_SIZE;
use crate::digest::{self, BLOCK};
use crate::error::ImageError;
use crate::manifest::FileDigest;
use crate::sys;

/// A page-data file being written.
pub struct PagesWriter {
    name: String,
    path: PathBuf,
    file: File,
    pieces: Mutex<Vec<Piece>>,
    /// Digests of whole blocks hashed in memory as they were written
    /// ([`PagesWriter::write_block`], [`PagesWriter::stream`]), by index:
    /// when they cover the file, it is not read back to hash it.
    hashed: Mutex<Vec<(u64, digest::Digest)>>,
}

impl PagesWriter {
    pub(crate) fn new(name: String, path: PathBuf, file: File) -> Self {
        PagesWriter {
            name,
            path,
            file,
            pieces: Mutex::new(Vec::new()),
            hashed: Mutex::new(Vec::new()),
        }
    }

    /// Path of the file being written (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes written into it so far.
    pub fn written(&self) -> u64 {
        lock(&self.pieces).iter().map(|c| c.len).sum()
    }

    /// Writes `data` at `offset`. Pieces must not overlap and must end up
    /// covering the file from 0 without holes.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), ImageError> {
        self.file
            .write_all_at(data, offset)
            .map_err(|e| ImageError::io(&self.path, "write", e))?;
        // Only a hint to start the disk now: the fsync in `finish` is what
        // makes the data durable and reports any error.
        if let Err(e) = sys::start_writeback(self.file.as_fd(), offset, data.len() as u64) {
            log::debug!("{}: early writeback not started: {e}", self.path.display());
        }
        lock(&self.pieces).push(Piece {
            offset,
            len: data.len() as u64,
        });
        Ok(())
    }

    /// Writes block `index` of the file (its bytes from `index` ×
    /// [`digest::BLOCK`] on; `data` is a whole block but for the file's
    /// last), hashing it in memory on the way.
    pub fn write_block(&self, index: u64, data: &[u8]) -> Result<(), ImageError> {
        let d = digest::block_digest(data);
        self.write_at(index * BLOCK, data)?;
        lock(&self.hashed).push((index, d));
        Ok(())
    }

    /// Completes the file (durable on return) and returns its checksums.
    pub(crate) fn finish(self) -> Result<FileDigest, ImageError> {
        let mut pieces = self.pieces.into_inner().unwrap_or_else(|p| p.into_inner());
        let size = check_tiling(&self.path, &mut pieces)?;
        let hashed = self.hashed.into_inner().unwrap_or_else(|p| p.into_inner());
        let (blake3, blocks) = match covering(hashed, size) {
            Some(list) => (digest::digest_of_block_list(&list), list),
            // The BLAKE3 digest needs whole blocks, hashed from the page
            // cache before the fsync, so that hashing overlaps the
            // writeback the writes started.
            None => digest::blake3_of_own_file(&self.file, size, &self.path)?,
        };
        self.file
            .sync_all()
            .map_err(|e| ImageError::io(&self.path, "fsync", e))?;
        Ok(FileDigest {
            name: self.name,
            size,
            blake3: blake3.to_vec(),
            block_blake3: blocks,
        })
    }
}

impl PagesWriter {
    /// Writes the whole file as one stream: `fill` pushes its bytes in
    /// order ([`PageStream::push`]). Nothing else may be written into the
    /// file. Returns what `fill` returns once every byte is written (not yet
    /// durable: [`crate::ImageWriter::finish_pages_all`] syncs).
    ///
    /// `at_most` is as for [`PagesWriter::open_stream`].
    pub fn stream<T, E: From<ImageError>>(
        &self,
        at_most: u64,
        fill: impl FnOnce(&mut PageStream<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut stream = self.open_stream(at_most)?;
        match fill(&mut stream) {
            Ok(value) => {
                stream.finish()?;
                Ok(value)
            }
            // A flusher's error is the cause of whatever `fill` then met.
            Err(e) => Err(stream.end().err().map_or(e, E::from)),
        }
    }

    /// Opens the file as one stream of bytes in file order
    /// ([`PageStream::push`]), to be ended with [`PageStream::finish`].
    /// Nothing else may be written into the file.
    ///
    /// `at_most` bounds the file's size: on a disk, the first flusher
    /// allocates that much before its first write, so the direct writes
    /// overwrite allocated blocks, which the filesystem lets run side by
    /// side (writes past the end of a file take its inode lock one at a
    /// time); the rest is cut off at the end.
    /// In memory (tmpfs), writes are buffered and nothing is preallocated.
    pub fn open_stream(&self, at_most: u64) -> Result<PageStream<'_>, ImageError> {
        let direct = !sys::in_memory(self.file.as_fd())
            && match sys::set_direct(self.file.as_fd(), true) {
                Ok(()) => true,
                Err(e) => {
                    log::debug!("{}: no direct I/O ({e}), buffered", self.path.display());
                    false
                }
            };
        // The flushers outlive no borrow: they write through a second
        // descriptor of the same open file (its O_DIRECT flag included).
        let file = self
            .file
            .try_clone()
            .map_err(|e| ImageError::io(&self.path, "dup", e))?;
        let (to_flush, jobs) = std::sync::mpsc::sync_channel::<Flush>(STREAM_BUFFERS);
        let (give_back, free) = std::sync::mpsc::channel::<MmapMut>();
        Ok(PageStream {
            writer: self,
            shared: Arc::new(Flushing {
                file,
                path: self.path.clone(),
                direct,
                preallocate: Mutex::new(direct.then_some(at_most)),
                failed: AtomicBool::new(false),
                error: Mutex::new(None),
                digests: Mutex::new(Vec::new()),
                write_turn: Mutex::new(()),
            }),
            jobs: Arc::new(Mutex::new(jobs)),
            to_flush: Some(to_flush),
            give_back,
            free,
            buffers: 0,
            flushers: Vec::new(),
            block: None,
            filled: 0,
            index: 0,
        })
    }
}

/// Buffers of a stream at most: one filling, the rest queued or being
/// written. Mapped as they are first needed, so a stream that stays small
/// (a process of little memory in a large tree) costs little.
const STREAM_BUFFERS: usize = 4;
/// Threads hashing and writing a stream's blocks (two writes in flight
/// keep the disk's queue from running dry while a block is hashed),
/// started at the stream's first full block.
const FLUSHERS: usize = 2;

/// A pages file written as one stream, in file order: the bytes are
/// gathered into page-aligned [`digest::BLOCK`]-sized buffers, each hashed
/// in memory and written by flusher threads while the next one fills (see
/// the module's documentation). Dropped without [`PageStream::finish`],
/// it stops its flushers and leaves the file incomplete.
pub struct PageStream<'w> {
    writer: &'w PagesWriter,
    shared: Arc<Flushing>,
    jobs: Arc<Mutex<Receiver<Flush>>>,
    /// `None` once the stream ends: the flushers then stop.
    to_flush: Option<SyncSender<Flush>>,
    give_back: Sender<MmapMut>,
    free: Receiver<MmapMut>,
    /// Buffers mapped so far.
    buffers: usize,
    flushers: Vec<JoinHandle<()>>,
    /// The block being filled, `filled` bytes so far.
    block: Option<MmapMut>,
    filled: usize,
    /// Its index in the file.
    index: u64,
}

impl PageStream<'_> {
    /// Bytes pushed so far: the file offset of the next byte.
    pub fn len(&self) -> u64 {
        self.index * BLOCK + self.filled as u64
    }

    /// True before the first byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `data` to the file.
    pub fn push(&mut self, data: &[u8]) -> Result<(), ImageError> {
        self.push_with(data.len(), |into: &mut [u8], at| {
            into.copy_from_slice(&data[at..at + into.len()]);
            Ok::<(), ImageError>(())
        })
    }

    /// Appends `len` bytes that `fill` writes straight into the stream's
    /// buffers: it is called with each stretch of buffer in turn and how
    /// far into the `len` bytes that stretch starts. Data read for the file
    /// only (pages read from a process and stored as they are) then goes
    /// into the file's buffer without passing through one of its own.
    pub fn push_with<E: From<ImageError>>(
        &mut self,
        len: usize,
        mut fill: impl FnMut(&mut [u8], usize) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut at = 0;
        while at < len {
            let block = match self.block.take() {
                Some(b) => b,
                None => self.buffer()?,
            };
            let block = self.block.insert(block);
            let n = (len - at).min(BLOCK as usize - self.filled);
            fill(&mut block[self.filled..self.filled + n], at)?;
            self.filled += n;
            at += n;
            if self.filled == BLOCK as usize {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// A free buffer: one the flushers gave back, a new one while fewer
    /// than [`STREAM_BUFFERS`] exist, else the next one given back.
    fn buffer(&mut self) -> Result<MmapMut, ImageError> {
        if let Ok(b) = self.free.try_recv() {
            return Ok(b);
        }
        if self.buffers < STREAM_BUFFERS {
            let b = MmapMut::map_anon(BLOCK as usize)
                .map_err(|e| ImageError::io(&self.shared.path, "map a write buffer", e))?;
            self.buffers += 1;
            return Ok(b);
        }
        self.free.recv().map_err(|_| self.shared.stopped())
    }

    /// Hands the block being filled (if any) to the flushers.
    fn flush(&mut self) -> Result<(), ImageError> {
        if self.shared.failed.load(Ordering::Relaxed) {
            return Err(self.shared.stopped());
        }
        let Some(block) = self.block.take() else {
            return Ok(());
        };
        while self.flushers.len() < FLUSHERS {
            let (shared, jobs, give_back) = (
                Arc::clone(&self.shared),
                Arc::clone(&self.jobs),
                self.give_back.clone(),
            );
            let flusher = std::thread::Builder::new()
                .name("ckpt-flush".into())
                .spawn(move || shared.run(&jobs, give_back))
                .map_err(|e| ImageError::io(&self.shared.path, "start a flusher", e))?;
            self.flushers.push(flusher);
        }
        let job = Flush {
            index: self.index,
            len: self.filled,
            block,
        };
        let to_flush = self
            .to_flush
            .as_ref()
            .ok_or_else(|| self.shared.stopped())?;
        to_flush.send(job).map_err(|_| self.shared.stopped())?;
        if self.filled == BLOCK as usize {
            self.index += 1;
            self.filled = 0;
        }
        Ok(())
    }

    /// Writes what is left and completes the file's bookkeeping (not yet
    /// durable: [`crate::ImageWriter::finish_pages_all`] syncs). Returns
    /// its size.
    pub fn finish(mut self) -> Result<u64, ImageError> {
        let last = if self.flushers.is_empty() {
            self.write_only_block()
        } else {
            self.flush()
        };
        // A flusher's error is the cause of the last flush's.
        self.end()?;
        last?;
        let size = self.len();
        let w = self.writer;
        // Past the end: the preallocation, and the last block's padding
        // to a whole page.
        sys::truncate(w.file.as_fd(), size).map_err(|e| ImageError::io(&w.path, "truncate", e))?;
        if self.shared.direct {
            sys::set_direct(w.file.as_fd(), false)
                .map_err(|e| ImageError::io(&w.path, "fcntl", e))?;
        }
        let digests = std::mem::take(&mut *lock(&self.shared.digests));
        lock(&w.pieces).push(Piece {
            offset: 0,
            len: size,
        });
        lock(&w.hashed).extend(digests);
        Ok(size)
    }

    /// Hashes and writes the block being filled on this thread: a stream
    /// that never filled a block (a small process's pages, most of a large
    /// tree's) needs no flusher threads for it.
    fn write_only_block(&mut self) -> Result<(), ImageError> {
        let Some(block) = self.block.take() else {
            return Ok(());
        };
        let mut job = Flush {
            index: self.index,
            len: self.filled,
            block,
        };
        self.shared.write(&mut job)
    }

    /// Stops the flushers once their queue is empty and waits for them;
    /// the first error any of them met.
    fn end(&mut self) -> Result<(), ImageError> {
        if let Err(panic) = self.stop() {
            std::panic::resume_unwind(panic);
        }
        match lock(&self.shared.error).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Ends the flushers' queue and joins them: the first panic, if any.
    fn stop(&mut self) -> std::thread::Result<()> {
        self.to_flush = None;
        let mut joined = Ok(());
        for flusher in self.flushers.drain(..) {
            let j = flusher.join();
            if joined.is_ok() {
                joined = j;
            }
        }
        joined
    }
}

impl Drop for PageStream<'_> {
    fn drop(&mut self) {
        // Unwinding already, or the stream was abandoned: its flushers
        // must not outlive it either way.
        let _ = self.stop();
    }
}

/// One block to hash and write.
struct Flush {
    index: u64,
    len: usize,
    block: MmapMut,
}

/// What a stream's flushers share.
struct Flushing {
    /// The pages file (a descriptor of its own).
    file: File,
    path: PathBuf,
    direct: bool,
    /// How much to allocate on disk, until the first flusher to start
    /// does it: off the caller's path, which for a background dump is the
    /// freeze (allocating a file's worth of blocks waits for the
    /// filesystem's journal, 2 s once here behind a large delete).
    preallocate: Mutex<Option<u64>>,
    failed: AtomicBool,
    /// The first write error.
    error: Mutex<Option<ImageError>>,
    /// Each block's digest, by index.
    digests: Mutex<Vec<(u64, digest::Digest)>>,
    /// Taken around a buffered write. Buffered writes into one file hold
    /// its inode lock one at a time anyway, and a writer waiting for it in
    /// the kernel spins while the holder copies: on two cores, a quarter
    /// of a dump to tmpfs went into that spinning, taken from the threads
    /// reading and compressing. Waiting here sleeps instead; the hashing
    /// still runs side by side.
    write_turn: Mutex<()>,
}

impl Flushing {
    /// A flusher: hashes and writes blocks until the stream ends, handing
    /// every buffer back (also after an error, so the stream never waits
    /// for one that will not come).
    fn run(&self, jobs: &Mutex<Receiver<Flush>>, give_back: Sender<MmapMut>) {
        let preallocate = lock(&self.preallocate).take();
        if let Some(len) = preallocate
            && let Err(e) = sys::preallocate(self.file.as_fd(), len)
        {
            log::debug!("{}: not preallocated ({e})", self.path.display());
        }
        loop {
            let job = lock(jobs).recv();
            let Ok(mut job) = job else {
                return;
            };
            if !self.failed.load(Ordering::Relaxed)
                && let Err(e) = self.write(&mut job)
            {
                self.failed.store(true, Ordering::Relaxed);
                lock(&self.error).get_or_insert(e);
            }
            let _ = give_back.send(job.block);
        }
    }

    fn write(&self, job: &mut Flush) -> Result<(), ImageError> {
        let d = digest::block_digest(&job.block[..job.len]);
        lock(&self.digests).push((job.index, d));
        // Direct I/O writes whole pages: the last block is padded with
        // zeros, cut off again once the stream ends.
        let len = if self.direct {
            let padded = job.len.next_multiple_of(PAGE_SIZE as usize);
            job.block[job.len..padded].fill(0);
            padded
        } else {
            job.len
        };
        let offset = job.index * BLOCK;
        let turn = (!self.direct).then(|| lock(&self.write_turn));
        self.file
            .write_all_at(&job.block[..len], offset)
            .map_err(|e| ImageError::io(&self.path, "write", e))?;
        drop(turn);
        if !self.direct
            && let Err(e) = sys::start_writeback(self.file.as_fd(), offset, len as u64)
        {
            log::debug!("{}: early writeback not started: {e}", self.path.display());
        }
        Ok(())
    }

    /// The error for a stream whose flushers stopped: it names the first
    /// error they met.
    fn stopped(&self) -> ImageError {
        let cause = lock(&self.error)
            .as_ref()
            .map_or_else(|| "no flusher left".to_string(), ToString::to_string);
        ImageError::Invalid {
            path: self.path.clone(),
            what: format!("writing stopped after an error: {cause}"),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The digests of blocks hashed in memory, concatenated in order, if
/// they are exactly the blocks of a file of `size` bytes.
fn covering(mut hashed: Vec<(u64, digest::Digest)>, size: u64) -> Option<Vec<u8>> {
    hashed.sort_unstable_by_key(|(index, _)| *index);
    let whole = hashed.len() as u64 == size.div_ceil(BLOCK)
        && hashed
            .iter()
            .enumerate()
            .all(|(i, (index, _))| i as u64 == *index);
    whole.then(|| hashed.iter().flat_map(|(_, d)| d.iter().copied()).collect())
}

/// One write: where it went.
#[derive(Clone, Copy)]
struct Piece {
    offset: u64,
    len: u64,
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
    fn write(data: &[u8], pieces: &[(usize, usize)]) -> Result<FileDigest, ImageError> {
        let t = tempfile::tempdir().unwrap();
        let mut w = ImageWriter::create(&t.path().join("ck")).unwrap();
        let pw = w.pages("pages-1.img").unwrap();
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
    fn pieces_from_many_threads_make_the_file_and_its_sums() {
        for len in [
            0,
            1,
            4095,
            digest::BLOCK as usize,
            digest::BLOCK as usize * 3 + 12_345,
        ] {
            let data = sample(len);
            let written = write(&data, &pieces(len)).unwrap();
            let expected = digest::of_bytes(&data);
            assert_eq!(written.size, len as u64);
            assert_eq!(written.blake3, expected.to_vec(), "len {len}");
            let (_, blocks) =
                digest::of_file_with_blocks(&tempfile_with(&data), len as u64, Path::new("x"))
                    .unwrap();
            assert_eq!(written.block_blake3, blocks, "len {len}");
        }
    }

    /// Like [`write`], through [`PagesWriter::stream`] in pushes of
    /// `pieces`' sizes, in a directory on `base` (a disk directory takes
    /// the direct writes).
    fn write_stream(base: &Path, data: &[u8], pieces: &[(usize, usize)]) -> FileDigest {
        let t = tempfile::tempdir_in(base).unwrap();
        let mut w = ImageWriter::create(&t.path().join("ck")).unwrap();
        let pw = w.pages("pages-1.img").unwrap();
        // Preallocated beyond the end, as a dump does for blocks that
        // shrank.
        pw.stream(
            data.len() as u64 * 2 + 8192,
            |s| -> Result<(), ImageError> {
                for &(at, len) in pieces {
                    s.push(&data[at..at + len])?;
                }
                Ok(())
            },
        )
        .unwrap();
        w.finish_pages(pw).unwrap();
        let key = ImageKey::from_secret(Path::new("k"), [7; crate::seal::KEY_LEN]);
        let committed = w.commit(Manifest::default(), &key).unwrap();
        let on_disk = std::fs::read(committed.path().join("pages-1.img")).unwrap();
        assert!(on_disk == data, "file contents, {} bytes", data.len());
        let m = crate::ImageDir::open(committed.path(), &key).unwrap();
        m.manifest().files[0].clone()
    }

    #[test]
    fn a_stream_makes_the_file_and_its_sums_in_memory() {
        // The temporary directory (often tmpfs) and the build's own
        // directory (a disk here: direct I/O).
        let bases = [
            std::env::temp_dir(),
            PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        ];
        for base in &bases {
            for len in [
                0,
                1,
                4095,
                digest::BLOCK as usize,
                digest::BLOCK as usize * 3 + 12_345,
            ] {
                let data = sample(len);
                let written = write_stream(base, &data, &pieces(len));
                assert_eq!(written.size, len as u64);
                assert_eq!(
                    written.blake3,
                    digest::of_bytes(&data).to_vec(),
                    "len {len} in {}",
                    base.display()
                );
                let (_, blocks) =
                    digest::of_file_with_blocks(&tempfile_with(&data), len as u64, Path::new("x"))
                        .unwrap();
                assert_eq!(written.block_blake3, blocks, "len {len}");
            }
        }
    }

    #[test]
    fn an_open_stream_takes_pushes_from_threads_in_turn() {
        // As a background dump's sink does: threads append whole pieces
        // under a lock, each at the offset the stream says is next.
        let len = digest::BLOCK as usize * 2 + 5_000;
        let data = sample(len);
        let t = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let mut w = ImageWriter::create(&t.path().join("ck")).unwrap();
        let pw = w.pages("pages-1.img").unwrap();
        let stream = Mutex::new(pw.open_stream(len as u64).unwrap());
        let placed = Mutex::new(Vec::new());
        let pieces: Vec<&[u8]> = data.chunks(300_001).collect();
        std::thread::scope(|s| {
            for part in pieces.chunks(pieces.len().div_ceil(3)) {
                let (stream, placed) = (&stream, &placed);
                s.spawn(move || {
                    for &p in part {
                        let mut st = lock(stream);
                        let at = st.len();
                        st.push(p).unwrap();
                        lock(placed).push((at, p));
                    }
                });
            }
        });
        let stream = stream.into_inner().unwrap();
        assert_eq!(stream.len(), len as u64);
        assert_eq!(stream.finish().unwrap(), len as u64);
        w.finish_pages(pw).unwrap();
        let key = ImageKey::from_secret(Path::new("k"), [7; crate::seal::KEY_LEN]);
        let committed = w.commit(Manifest::default(), &key).unwrap();
        let on_disk = std::fs::read(committed.path().join("pages-1.img")).unwrap();
        assert_eq!(on_disk.len(), len);
        for (at, p) in placed.into_inner().unwrap() {
            assert!(
                &on_disk[at as usize..at as usize + p.len()] == p,
                "piece at {at}"
            );
        }
        let m = crate::ImageDir::open(committed.path(), &key).unwrap();
        assert_eq!(
            m.manifest().files[0].blake3,
            digest::of_bytes(&on_disk).to_vec()
        );
    }

    #[test]
    fn a_stream_dropped_unfinished_stops_its_flushers() {
        let t = tempfile::tempdir().unwrap();
        let w = ImageWriter::create(&t.path().join("ck")).unwrap();
        let pw = w.pages("pages-1.img").unwrap();
        let mut stream = pw.open_stream(0).unwrap();
        stream
            .push(&sample(digest::BLOCK as usize * 3 + 1))
            .unwrap();
        // Returns: the flushers saw the stream end and were joined.
        drop(stream);
        // The file is not complete: nothing of it is recorded.
        assert_eq!(pw.written(), 0);
    }

    #[test]
    fn blocks_from_many_threads_are_hashed_in_memory() {
        let len = digest::BLOCK as usize * 5 + 777;
        let data = sample(len);
        let t = tempfile::tempdir().unwrap();
        let mut w = ImageWriter::create(&t.path().join("ck")).unwrap();
        let pw = w.pages("pages-1.img").unwrap();
        let blocks: Vec<(u64, &[u8])> = data
            .chunks(digest::BLOCK as usize)
            .enumerate()
            .map(|(i, b)| (i as u64, b))
            .rev()
            .collect();
        std::thread::scope(|s| {
            for part in blocks.chunks(2) {
                let pw = &pw;
                s.spawn(move || {
                    for &(i, b) in part {
                        pw.write_block(i, b).unwrap();
                    }
                });
            }
        });
        assert!(covering(lock(&pw.hashed).clone(), len as u64).is_some());
        w.finish_pages(pw).unwrap();
        let key = ImageKey::from_secret(Path::new("k"), [7; crate::seal::KEY_LEN]);
        let committed = w.commit(Manifest::default(), &key).unwrap();
        assert!(std::fs::read(committed.path().join("pages-1.img")).unwrap() == data);
        let m = crate::ImageDir::open(committed.path(), &key).unwrap();
        assert_eq!(
            m.manifest().files[0].blake3,
            digest::of_bytes(&data).to_vec()
        );
        // Blocks missing or repeated are no cover: the file is read back.
        let one = digest::block_digest(b"x");
        assert!(covering(vec![(0, one), (2, one)], 3 * digest::BLOCK).is_none());
        assert!(covering(vec![(0, one), (0, one)], 2 * digest::BLOCK).is_none());
    }

    fn tempfile_with(data: &[u8]) -> File {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(data).unwrap();
        f
    }

    #[test]
    fn a_hole_is_refused() {
        let data = sample(digest::BLOCK as usize * 2);
        let mut p = pieces(data.len());
        p.remove(1);
        let err = write(&data, &p).unwrap_err();
        assert!(
            err.to_string().contains("hole or overlap"),
            "unexpected error: {err}"
        );
    }
}
