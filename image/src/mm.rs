//! The address space: every VMA, how to recreate it, and where its saved
//! pages are in `pages-PID.img`.
//!
//! The messages are defined in `image/proto/mm.proto`; this module gives
//! them their Rust path, the helpers, and the bit constants the schema's
//! integer fields carry.

pub use crate::pb::{
    FileId, Mm, PageChunk, PageRange, PageSpan, ShmemOwner, VdsoInfo, Vma, VmaKind, WriteTracking,
};

impl VmaKind {
    /// True for mappings the kernel provides and the restorer moves rather
    /// than creates.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            VmaKind::Vdso | VmaKind::Vvar | VmaKind::VvarVclock | VmaKind::Vsyscall
        )
    }

    /// True for mappings of a shared memory object of `shmem.img`.
    pub fn maps_shmem(self) -> bool {
        matches!(self, VmaKind::Shmem | VmaKind::ShmemPrivate)
    }
}

/// Protection bits as in mmap(2).
pub mod prot {
    /// PROT_READ.
    pub const READ: u32 = 1;
    /// PROT_WRITE.
    pub const WRITE: u32 = 2;
    /// PROT_EXEC.
    pub const EXEC: u32 = 4;
}

/// Extra VMA flags ckpt needs to reproduce (its own bits, not the kernel's).
///
/// `mm.proto` lists the same values in its comment on `Vma.flags`, for
/// readers in other languages: change both together.
pub mod vma_flags {
    /// `MAP_GROWSDOWN` stack.
    pub const GROWSDOWN: u32 = 1;
    /// The VMA is the `[heap]`.
    pub const HEAP: u32 = 2;
    /// The VMA is the main `[stack]`.
    pub const STACK: u32 = 4;
    /// A shared mapping (of a file or shared memory object) that may be made
    /// writable (mapped from an fd opened O_RDWR).
    pub const MAYWRITE: u32 = 8;
    /// `MADV_DONTFORK` was applied.
    pub const DONTFORK: u32 = 16;
    /// `MADV_DONTDUMP` was applied.
    pub const DONTDUMP: u32 = 32;
    /// `MADV_WIPEONFORK` was applied.
    pub const WIPEONFORK: u32 = 64;
    /// `MADV_HUGEPAGE` was applied.
    pub const HUGEPAGE: u32 = 128;
    /// `MADV_NOHUGEPAGE` was applied.
    pub const NOHUGEPAGE: u32 = 256;
}

impl FileId {
    /// The SHA-256 of everything `r` yields, as [`FileId::sha256`] holds
    /// it (computed the same way on both sides).
    pub fn content_sha256(mut r: impl std::io::Read) -> std::io::Result<Vec<u8>> {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match r.read(&mut buf) {
                Ok(0) => return Ok(h.finalize().to_vec()),
                Ok(n) => h.update(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl Vma {
    /// Length in bytes (0 for a reversed VMA, which
    /// [`Mm::page_copies`] refuses).
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// True for a zero-length VMA (never produced by the dumper).
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

impl PageRange {
    /// Length in bytes (saturating: [`Mm::page_copies`] refuses a range
    /// whose length overflows).
    pub fn len(&self) -> u64 {
        self.nr_pages.saturating_mul(crate::PAGE_SIZE)
    }

    /// True when the range holds no pages.
    pub fn is_empty(&self) -> bool {
        self.nr_pages == 0
    }
}

/// Longest `[vdso]` an image may hold ([`VdsoInfo::vdso_code`]); x86-64
/// kernels map 2 pages (8 KiB).
pub const MAX_VDSO_LEN: u64 = 1 << 20;

/// The `madvise` advice that makes guard pages (Linux 6.13+, uapi
/// `asm-generic/mman-common.h`; the libc crate does not name it yet).
pub const MADV_GUARD_INSTALL: i32 = 102;

/// Most page data one LZ4 block may hold once decompressed; the restorer
/// allocates a block's buffer only after checking this (the dumper writes
/// blocks of at most 1 MiB).
pub const MAX_BLOCK_RAW_LEN: u64 = 16 << 20;

/// How a piece of saved page data is stored in the pages file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageEncoding {
    /// The bytes as they go into memory.
    Raw,
    /// One LZ4 block.
    Lz4,
}

/// One piece of saved page data and where it goes, checked against its VMA
/// and the pages file by [`Mm::page_copies`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageCopy {
    /// Address of the first page.
    pub addr: u64,
    /// Offset of the data in the pages file.
    pub file_offset: u64,
    /// Bytes of the data in the pages file.
    pub file_len: u64,
    /// Bytes it fills in memory (at most [`MAX_BLOCK_RAW_LEN`] for a block).
    pub raw_len: u64,
    /// How the data is stored.
    pub encoding: PageEncoding,
}

/// Why the page data of an mm image cannot be laid out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageLayoutError {
    /// A VMA is empty, reversed or not page aligned.
    #[error("VMA {start:#x}-{end:#x} is empty, reversed or not page aligned")]
    BadVma {
        /// Its start.
        start: u64,
        /// Its end.
        end: u64,
    },
    /// Saved pages lie outside every VMA (or their length overflows).
    #[error("{pages} pages at {addr:#x} lie outside every saved VMA")]
    OutsideVma {
        /// Where they start.
        addr: u64,
        /// How many.
        pages: u64,
    },
    /// Saved pages or their place in the file are not page aligned.
    #[error("pages at {addr:#x} (file offset {file_offset:#x}) are not page aligned")]
    Misaligned {
        /// Where they start.
        addr: u64,
        /// Where their data is.
        file_offset: u64,
    },
    /// The data lies (partly) beyond the end of the pages file.
    #[error(
        "data for {addr:#x} at file offset {file_offset:#x} (+{len}) is beyond the pages file's {file_len} bytes"
    )]
    OutsideFile {
        /// Where it goes.
        addr: u64,
        /// Where it is.
        file_offset: u64,
        /// How long it is.
        len: u64,
        /// The pages file's length.
        file_len: u64,
    },
    /// A block would decompress to more than [`MAX_BLOCK_RAW_LEN`], or to
    /// nothing.
    #[error("block for {addr:#x} decompresses to {raw_len} bytes (limit {MAX_BLOCK_RAW_LEN})")]
    BlockSize {
        /// Where it goes.
        addr: u64,
        /// What it claims to hold.
        raw_len: u64,
    },
    /// A block's stored length cannot hold what it claims.
    #[error("block for {addr:#x}: {file_len} bytes in the file cannot hold {raw_len} bytes")]
    BlockLen {
        /// Where it goes.
        addr: u64,
        /// Its length in the file.
        file_len: u64,
        /// What it claims to hold.
        raw_len: u64,
    },
    /// The page data does not add up to the pages file.
    #[error("page data totals {declared} bytes, the pages file has {file_len}")]
    Total {
        /// What the image adds up to.
        declared: u64,
        /// The pages file's length.
        file_len: u64,
    },
}

/// LZ4's worst case for `raw` bytes, as the LZ4 block format defines it.
pub fn lz4_bound(raw: u64) -> u64 {
    raw.saturating_add(raw / 255).saturating_add(16)
}

impl Mm {
    /// Every piece of page data to copy, each checked with overflow-safe
    /// arithmetic: inside a VMA, page aligned, inside a pages file of
    /// `file_len` bytes, and for LZ4 blocks bounded by
    /// [`MAX_BLOCK_RAW_LEN`]. Pure, so restore can refuse a bad image before
    /// it creates anything, and fuzzing can reach it.
    pub fn page_copies(&self, file_len: u64) -> Result<Vec<PageCopy>, PageLayoutError> {
        let ps = crate::PAGE_SIZE;
        for v in &self.vmas {
            if v.start >= v.end || v.start % ps != 0 || v.end % ps != 0 {
                return Err(PageLayoutError::BadVma {
                    start: v.start,
                    end: v.end,
                });
            }
        }
        // Sorted by start, so each check is a binary search: a process may
        // have some 65,000 VMAs, each with its own ranges.
        let mut spans: Vec<(u64, u64)> = self.vmas.iter().map(|v| (v.start, v.end)).collect();
        spans.sort_unstable();
        let inside = |addr: u64, len: u64| {
            let Some(end) = addr.checked_add(len) else {
                return false;
            };
            // The VMA starting last at or before `addr` (VMAs of a valid
            // image do not overlap, so it is the only candidate).
            let i = spans.partition_point(|&(start, _)| start <= addr);
            i > 0 && end <= spans[i - 1].1
        };
        let in_file = |addr: u64, file_offset: u64, len: u64| {
            if file_offset
                .checked_add(len)
                .is_some_and(|end| end <= file_len)
            {
                Ok(())
            } else {
                Err(PageLayoutError::OutsideFile {
                    addr,
                    file_offset,
                    len,
                    file_len,
                })
            }
        };
        let mut out = Vec::new();
        let mut declared = 0u64;
        if self.compressed {
            for c in &self.chunks {
                if c.raw_len == 0 || c.raw_len > MAX_BLOCK_RAW_LEN {
                    return Err(PageLayoutError::BlockSize {
                        addr: c.addr,
                        raw_len: c.raw_len,
                    });
                }
                if c.addr % ps != 0 || c.raw_len % ps != 0 {
                    return Err(PageLayoutError::Misaligned {
                        addr: c.addr,
                        file_offset: c.file_offset,
                    });
                }
                if !inside(c.addr, c.raw_len) {
                    return Err(PageLayoutError::OutsideVma {
                        addr: c.addr,
                        pages: c.raw_len / ps,
                    });
                }
                let fits = if c.stored_raw {
                    c.file_len == c.raw_len
                } else {
                    c.file_len > 0 && c.file_len <= lz4_bound(c.raw_len)
                };
                if !fits {
                    return Err(PageLayoutError::BlockLen {
                        addr: c.addr,
                        file_len: c.file_len,
                        raw_len: c.raw_len,
                    });
                }
                in_file(c.addr, c.file_offset, c.file_len)?;
                declared = declared.saturating_add(c.file_len);
                out.push(PageCopy {
                    addr: c.addr,
                    file_offset: c.file_offset,
                    file_len: c.file_len,
                    raw_len: c.raw_len,
                    encoding: if c.stored_raw {
                        PageEncoding::Raw
                    } else {
                        PageEncoding::Lz4
                    },
                });
            }
        } else {
            declared = self.pages_bytes;
            for r in self.vmas.iter().flat_map(|v| &v.pages) {
                let len = r
                    .nr_pages
                    .checked_mul(ps)
                    .filter(|_| inside(r.addr, r.len()));
                let Some(len) = len else {
                    return Err(PageLayoutError::OutsideVma {
                        addr: r.addr,
                        pages: r.nr_pages,
                    });
                };
                if r.addr % ps != 0 || r.offset % ps != 0 {
                    return Err(PageLayoutError::Misaligned {
                        addr: r.addr,
                        file_offset: r.offset,
                    });
                }
                in_file(r.addr, r.offset, len)?;
                out.push(PageCopy {
                    addr: r.addr,
                    file_offset: r.offset,
                    file_len: len,
                    raw_len: len,
                    encoding: PageEncoding::Raw,
                });
            }
        }
        if declared != file_len {
            return Err(PageLayoutError::Total { declared, file_len });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anon(start: u64, end: u64) -> Vma {
        Vma {
            start,
            end,
            ..Default::default()
        }
    }

    #[test]
    fn huge_or_overflowing_lengths_are_refused_before_use() {
        let mut mm = Mm {
            vmas: vec![anon(0x1000, 0x3000)],
            compressed: true,
            chunks: vec![PageChunk {
                addr: 0x1000,
                raw_len: 1 << 43,
                file_offset: 0,
                file_len: 16,
                stored_raw: false,
            }],
            ..Default::default()
        };
        assert!(matches!(
            mm.page_copies(16),
            Err(PageLayoutError::BlockSize { .. })
        ));
        mm.chunks[0].raw_len = 0x1000;
        mm.chunks[0].addr = u64::MAX - 0xfff;
        assert!(matches!(
            mm.page_copies(16),
            Err(PageLayoutError::Misaligned { .. } | PageLayoutError::OutsideVma { .. })
        ));
        mm.chunks[0].addr = 0x1000;
        mm.chunks[0].file_offset = u64::MAX;
        assert!(matches!(
            mm.page_copies(16),
            Err(PageLayoutError::OutsideFile { .. })
        ));
        mm.chunks[0].file_offset = 0;
        assert_eq!(mm.page_copies(16).unwrap().len(), 1);

        let mut raw = Mm {
            vmas: vec![anon(0x1000, 0x3000)],
            pages_bytes: 0x1000,
            ..Default::default()
        };
        raw.vmas[0].pages = vec![PageRange {
            addr: 0x1000,
            nr_pages: u64::MAX / 2,
            offset: 0,
        }];
        assert!(matches!(
            raw.page_copies(0x1000),
            Err(PageLayoutError::OutsideVma { .. })
        ));
        raw.vmas[0].pages[0].nr_pages = 1;
        assert_eq!(raw.page_copies(0x1000).unwrap()[0].raw_len, 0x1000);
        raw.vmas[0].end = 0;
        assert!(matches!(
            raw.page_copies(0x1000),
            Err(PageLayoutError::BadVma { .. })
        ));
    }
}
