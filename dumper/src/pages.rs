//! Copying saved pages from the frozen process into the pages file.
//!
//! The page ranges of all VMAs are cut into chunks of at most
//! [`CHUNK_BYTES`]; rayon copies chunks in parallel, each with one positional
//! read of `/proc/PID/mem` (which also reaches PROT_NONE pages) and one
//! positional write at the chunk's precomputed offset. Memory use is bounded
//! by chunk size × threads, whatever the process size.

use std::sync::atomic::{AtomicU64, Ordering};

use ckpt_image::PAGE_SIZE;
use ckpt_image::PagesWriter;
use ckpt_image::mm::{PageRange, Vma};
use ckpt_parasite::Tracee;
use rayon::prelude::*;

use crate::error::{DumpError, Result};

/// Largest unit of work: big enough for sequential I/O, small enough to
/// spread a process over all cores.
pub const CHUNK_BYTES: u64 = 1 << 20;

fn chunks(vmas: &[Vma]) -> Vec<PageRange> {
    let per = CHUNK_BYTES / PAGE_SIZE;
    let mut out = Vec::new();
    for r in vmas.iter().flat_map(|v| v.pages.iter()) {
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
pub fn copy_pages(
    t: &Tracee,
    vmas: &[Vma],
    out: &PagesWriter,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    let done = AtomicU64::new(0);
    chunks(vmas).par_iter().try_for_each_init(
        || vec![0u8; CHUNK_BYTES as usize],
        |buf, c| -> Result<()> {
            let b = &mut buf[..c.len() as usize];
            t.read_mem(c.addr, b).map_err(DumpError::from)?;
            out.write_at(c.offset, b)?;
            progress(done.fetch_add(c.len(), Ordering::Relaxed) + c.len());
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
