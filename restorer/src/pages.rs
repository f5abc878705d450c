//! Copying the saved pages into the rebuilt address space: raw pages go
//! straight from the mapped pages file, LZ4 blocks are decompressed into
//! place. Every range is checked against its VMA and the file first.

use ckpt_image::PAGE_SIZE;
use ckpt_image::mm::{Mm, PageChunk};
use ckpt_parasite::remote::Remote;

use crate::error::{RestoreError, Result};
use crate::mm::invalid;

/// Copies saved pages from the (verified, mapped) pages file into place.
pub fn fill_pages(
    r: &Remote<'_>,
    mm: &Mm,
    pages: &[u8],
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<()> {
    if mm.compressed {
        return fill_compressed(r, mm, pages, progress);
    }
    let mut done = 0;
    for v in &mm.vmas {
        for pr in &v.pages {
            let (off, len) = (pr.offset as usize, pr.len() as usize);
            let src = pages
                .get(off..off + len)
                .filter(|_| pr.addr >= v.start && pr.addr + pr.len() <= v.end)
                .filter(|_| pr.offset % PAGE_SIZE == 0)
                .ok_or_else(|| invalid(r.t.pid(), v, "page range outside the pages file or VMA"))?;
            r.t.write_mem_fast(pr.addr, src)?;
            done += pr.len();
            if let Some(p) = progress {
                p(done, mm.pages_bytes);
            }
        }
    }
    Ok(())
}

/// Decompresses each LZ4 block of the pages file into place.
fn fill_compressed(
    r: &Remote<'_>,
    mm: &Mm,
    pages: &[u8],
    progress: Option<&dyn Fn(u64, u64)>,
) -> Result<()> {
    let pid = r.t.pid();
    let bad = |c: &PageChunk, what: &str| {
        RestoreError::Image(ckpt_image::ImageError::Invalid {
            path: ckpt_image::pages_name(pid).into(),
            what: format!(
                "block at {:#x} ({} bytes): {what}",
                c.file_offset, c.file_len
            ),
        })
    };
    let mut buf = Vec::new();
    let mut done = 0;
    for c in &mm.chunks {
        let inside = mm
            .vmas
            .iter()
            .any(|v| c.addr >= v.start && c.addr + c.raw_len <= v.end);
        if !inside || c.raw_len % PAGE_SIZE != 0 {
            return Err(bad(c, "does not belong to a saved VMA"));
        }
        let (off, len) = (c.file_offset as usize, c.file_len as usize);
        let block = pages
            .get(off..off.saturating_add(len))
            .ok_or_else(|| bad(c, "outside the pages file"))?;
        let data = if c.stored_raw {
            if block.len() as u64 != c.raw_len {
                return Err(bad(c, "stored block has the wrong length"));
            }
            block
        } else {
            buf.resize(c.raw_len as usize, 0);
            let n = lz4_flex::block::decompress_into(block, &mut buf)
                .map_err(|e| bad(c, &format!("cannot decompress: {e}")))?;
            if n as u64 != c.raw_len {
                return Err(bad(c, "decompressed to the wrong length"));
            }
            &buf[..]
        };
        r.t.write_mem_fast(c.addr, data)?;
        done += c.raw_len;
        if let Some(p) = progress {
            p(done, mm.pages_bytes);
        }
    }
    Ok(())
}
