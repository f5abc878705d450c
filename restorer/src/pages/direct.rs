//! Reading a pages file on disk with direct I/O, window by window, into a
//! few buffers used over and over.
//!
//! Read through the page cache (a mapping), a restore allocates a fresh
//! page for every page of the file on top of the process's own: on a VM
//! that hands freed memory back to its host, each fresh page is a host
//! fault, and a 4 GiB restore spent most of its time in the kernel. Read
//! directly, the file's bytes land in the same 16 MiB buffers each time.
//! Every digest block of the file is checked as its window arrives, so
//! the whole file is verified by the end, as the mapped path verifies it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;

use ckpt_image::mm::{PageCopy, PageEncoding};
use ckpt_image::{BlockChecks, ImageError, digest};
use rayon::prelude::*;

use crate::error::{RestoreError, Result};

/// Bytes read at once: four digest blocks, so each block lies in one
/// window and is checked on its own.
const WINDOW: u64 = 4 * digest::BLOCK;

/// Windows read ahead of the one being copied.
const AHEAD: usize = 3;

/// Alignment of direct reads (offset, length and buffer): a page, which
/// covers every logical block size.
const ALIGN: u64 = 4096;

/// A pages file opened for direct reads, with the sealed digests of its
/// blocks.
pub(crate) struct DirectPages<'b> {
    file: File,
    checks: BlockChecks,
    size: u64,
    buffers: &'b ReadBuffers,
}

/// The read buffers of a restore, kept from one pages file to the next:
/// a tree of 64 processes read with new buffers each faulted in 2 GiB of
/// fresh memory (64 × two 16 MiB windows) the kernel had to zero first.
#[derive(Default)]
pub struct ReadBuffers {
    spare: std::sync::Mutex<Vec<memmap2::MmapMut>>,
}

/// Buffers kept at most: enough for two files read at once.
const SPARE_BUFFERS: usize = 2 * (AHEAD + 1);

impl ReadBuffers {
    /// A buffer of at least `len` bytes: a spare one, or a new one.
    fn take(&self, len: usize) -> std::io::Result<memmap2::MmapMut> {
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        match spare.iter().position(|b| b.len() >= len) {
            Some(i) => Ok(spare.swap_remove(i)),
            None => {
                drop(spare);
                memmap2::MmapMut::map_anon(len)
            }
        }
    }

    /// Keeps `bufs` for the next file, up to [`SPARE_BUFFERS`].
    fn give_back(&self, bufs: impl Iterator<Item = memmap2::MmapMut>) {
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        for b in bufs {
            if spare.len() < SPARE_BUFFERS {
                spare.push(b);
            }
        }
    }
}

impl<'b> DirectPages<'b> {
    /// `file` (opened with `O_DIRECT`) of `size` bytes, checked by `checks`,
    /// read into `buffers`.
    pub(crate) fn new(
        file: File,
        checks: BlockChecks,
        size: u64,
        buffers: &'b ReadBuffers,
    ) -> DirectPages<'b> {
        DirectPages {
            file,
            checks,
            size,
            buffers,
        }
    }

    /// Reads the whole file, checks every block, and calls `place` with
    /// each of `pieces` and its stored bytes. `pieces` must be sorted by
    /// file offset, inside the file and apart ([`in_file_order`]). Pieces
    /// of one window are placed in parallel; a piece across windows is
    /// gathered first.
    pub(crate) fn stream(
        &self,
        pieces: &[PageCopy],
        place: impl Fn(&PageCopy, &[u8]) -> Result<()> + Sync,
    ) -> Result<()> {
        let windows = self.size.div_ceil(WINDOW);
        let (free_tx, free_rx) = mpsc::sync_channel::<memmap2::MmapMut>(AHEAD + 1);
        let (full_tx, full_rx) = mpsc::sync_channel::<Filled>(AHEAD + 1);
        // A small file needs one small buffer, not AHEAD + 1 whole windows.
        let buffers = windows.min(AHEAD as u64 + 1);
        let buf_len = WINDOW.min(self.size.next_multiple_of(ALIGN)) as usize;
        for _ in 0..buffers {
            let buf = self
                .buffers
                .take(buf_len)
                .map_err(|e| self.io("map a read buffer", e))?;
            // The channel holds AHEAD + 1 and is not full.
            let _ = free_tx.send(buf);
        }
        std::thread::scope(|s| {
            // The reader hands its end of the free buffers back when done,
            // so that they are kept for the next file.
            let reader = s.spawn(move || {
                for w in 0..windows {
                    let Ok(mut buf) = free_rx.recv() else {
                        break;
                    };
                    let read = self.read_window(w, &mut buf);
                    let stop = read.is_err();
                    if full_tx.send(Filled { buf, read }).is_err() || stop {
                        break;
                    }
                }
                free_rx
            });
            // The channels go with this call, so on an early return the
            // reader's next send or receive fails and it ends.
            let consumed = self.consume(windows, pieces, &place, free_tx, full_rx);
            if let Ok(free_rx) = reader.join() {
                self.buffers.give_back(free_rx.try_iter());
            }
            consumed
        })
    }

    /// The copying side of [`DirectPages::stream`].
    fn consume(
        &self,
        windows: u64,
        pieces: &[PageCopy],
        place: &(impl Fn(&PageCopy, &[u8]) -> Result<()> + Sync),
        free_tx: mpsc::SyncSender<memmap2::MmapMut>,
        full_rx: mpsc::Receiver<Filled>,
    ) -> Result<()> {
        let mut next = 0usize;
        // The bytes so far of `pieces[next]`, begun in an earlier window.
        let mut gathering: Option<Vec<u8>> = None;
        for w in 0..windows {
            let Ok(Filled { buf, read }) = full_rx.recv() else {
                return Err(self.io("read", std::io::Error::other("the reader stopped early")));
            };
            let len = read?;
            let at = w * WINDOW;
            let data = &buf[..len];
            let end = at + len as u64;
            let first = next;
            if let Some(g) = gathering.as_mut() {
                let want = (pieces[first].file_len as usize - g.len()).min(len);
                g.extend_from_slice(&data[..want]);
            }
            while next < pieces.len() && pieces[next].file_offset + pieces[next].file_len <= end {
                next += 1;
            }
            // Whole pieces of this window, after the gathered one.
            let whole = if gathering.is_some() {
                first + 1
            } else {
                first
            };
            let (verified, placed) = rayon::join(
                || self.check_window(w, data),
                || {
                    pieces[whole.min(next)..next].par_iter().try_for_each(|c| {
                        let off = (c.file_offset - at) as usize;
                        place(c, &data[off..off + c.file_len as usize])
                    })
                },
            );
            verified?;
            placed?;
            if let Some(g) = gathering.take() {
                if g.len() as u64 == pieces[first].file_len {
                    place(&pieces[first], &g)?;
                } else {
                    gathering = Some(g);
                }
            }
            // A piece that starts here and goes on into the next window.
            if gathering.is_none()
                && let Some(c) = pieces.get(next)
                && c.file_offset < end
            {
                let mut g = Vec::with_capacity(c.file_len as usize);
                g.extend_from_slice(&data[(c.file_offset - at) as usize..]);
                gathering = Some(g);
            }
            // Fails only once the reader has stopped: nothing to hand back.
            let _ = free_tx.send(buf);
        }
        if next < pieces.len() || gathering.is_some() {
            return Err(RestoreError::Image(ImageError::Invalid {
                path: self.checks.path().into(),
                what: "page data past the end of the file".into(),
            }));
        }
        Ok(())
    }

    /// Reads window `w` into `buf`; the number of file bytes in it.
    fn read_window(&self, w: u64, buf: &mut memmap2::MmapMut) -> Result<usize> {
        let at = w * WINDOW;
        let want = WINDOW.min(self.size - at) as usize;
        let aligned = (want as u64).next_multiple_of(ALIGN) as usize;
        let mut got = 0usize;
        while got < want {
            match self.file.read_at(&mut buf[got..aligned], at + got as u64) {
                Ok(0) => {
                    return Err(RestoreError::Image(ImageError::Size {
                        path: self.checks.path().into(),
                        found: at + got as u64,
                        expected: self.size,
                    }));
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io("read", e)),
            }
        }
        Ok(want)
    }

    /// Checks the digest blocks of window `w`, whose bytes are `data`.
    fn check_window(&self, w: u64, data: &[u8]) -> Result<()> {
        let first = (w * WINDOW / digest::BLOCK) as usize;
        data.par_chunks(digest::BLOCK as usize)
            .enumerate()
            .try_for_each(|(i, block)| self.checks.check_data(first + i, block))
            .map_err(RestoreError::from)
    }

    fn io(&self, op: &'static str, e: std::io::Error) -> RestoreError {
        RestoreError::Image(ImageError::io(self.checks.path(), op, e))
    }
}

/// `pieces` (sorted by file offset) with raw ones cut where they cross a
/// window's edge: the whole pages before it, the one page across it (the
/// only bytes gathered), and the rest. An LZ4 block stays whole.
pub(crate) fn cut_at_windows(pieces: Vec<PageCopy>) -> Vec<PageCopy> {
    let mut out = Vec::with_capacity(pieces.len() + pieces.len() / 4);
    for c in pieces {
        let edge = (c.file_offset / WINDOW + 1) * WINDOW;
        let end = c.file_offset + c.file_len;
        if c.encoding != PageEncoding::Raw || end <= edge {
            out.push(c);
            continue;
        }
        let before = (edge - c.file_offset) / ALIGN * ALIGN;
        let across = if (edge - c.file_offset).is_multiple_of(ALIGN) {
            0
        } else {
            ALIGN
        };
        let mut at = 0;
        for len in [before, across, c.file_len - before - across] {
            if len > 0 {
                out.push(super::layout::raw_part(&c, at, len));
            }
            at += len;
        }
    }
    out
}

/// Whether `pieces` are sorted by file offset and none overlaps the next,
/// as [`DirectPages::stream`] needs (a dump writes them so; an image that
/// shares stored bytes between pieces is read through the mapping).
pub(crate) fn in_file_order(pieces: &[PageCopy]) -> bool {
    pieces
        .windows(2)
        .all(|p| p[0].file_offset.saturating_add(p[0].file_len) <= p[1].file_offset)
}

/// A window as the reader hands it over.
struct Filled {
    buf: memmap2::MmapMut,
    /// File bytes at the buffer's start, or why reading failed.
    read: Result<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(addr: u64, file_offset: u64, len: u64) -> PageCopy {
        PageCopy {
            addr,
            file_offset,
            file_len: len,
            raw_len: len,
            encoding: PageEncoding::Raw,
        }
    }

    #[test]
    fn a_raw_piece_across_an_edge_is_cut_so_one_page_is_gathered() {
        let off = WINDOW - 3 * ALIGN - 100;
        let cut = cut_at_windows(vec![raw(0x10000, off, 8 * ALIGN)]);
        assert_eq!(
            cut,
            vec![
                raw(0x10000, off, 3 * ALIGN),
                raw(0x10000 + 3 * ALIGN, off + 3 * ALIGN, ALIGN),
                raw(0x10000 + 4 * ALIGN, off + 4 * ALIGN, 4 * ALIGN),
            ]
        );
        // Only the middle page crosses the edge.
        assert!(cut[0].file_offset + cut[0].file_len <= WINDOW);
        assert!(cut[2].file_offset >= WINDOW);
    }

    #[test]
    fn a_piece_on_an_edge_or_compressed_is_not_gathered_needlessly() {
        let on_edge = raw(0x10000, WINDOW - 2 * ALIGN, 4 * ALIGN);
        assert_eq!(
            cut_at_windows(vec![on_edge]),
            vec![
                raw(0x10000, WINDOW - 2 * ALIGN, 2 * ALIGN),
                raw(0x10000 + 2 * ALIGN, WINDOW, 2 * ALIGN),
            ]
        );
        let inside = raw(0x10000, 5, 4 * ALIGN);
        assert_eq!(cut_at_windows(vec![inside]), vec![inside]);
        let lz4 = PageCopy {
            encoding: PageEncoding::Lz4,
            file_len: 1000,
            raw_len: 8 * ALIGN,
            ..raw(0x10000, WINDOW - 10, 0)
        };
        assert_eq!(cut_at_windows(vec![lz4]), vec![lz4]);
    }

    #[test]
    fn overlapping_pieces_are_not_in_file_order() {
        assert!(in_file_order(&[raw(0, 0, ALIGN), raw(ALIGN, ALIGN, ALIGN)]));
        assert!(!in_file_order(&[
            raw(0, 0, 2 * ALIGN),
            raw(0x9000, ALIGN, ALIGN)
        ]));
    }
}
