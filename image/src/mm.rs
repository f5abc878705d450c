//! The address space: every VMA, how to recreate it, and where its saved
//! pages are in `pages-PID.img`.
//!
//! The messages are defined in `image/proto/mm.proto`; this module gives
//! them their Rust path, the helpers, and the bit constants the schema's
//! integer fields carry.

pub use crate::pb::{FileId, Mm, PageChunk, PageRange, ShmemOwner, VdsoInfo, Vma, VmaKind};

impl VmaKind {
    /// True for mappings the kernel provides and the restorer moves rather
    /// than creates.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            VmaKind::Vdso | VmaKind::Vvar | VmaKind::VvarVclock | VmaKind::Vsyscall
        )
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
    /// A shared file mapping that may be made writable (opened O_RDWR).
    pub const MAYWRITE: u32 = 8;
    /// `MADV_DONTFORK` was applied.
    pub const DONTFORK: u32 = 16;
    /// `MADV_DONTDUMP` was applied.
    pub const DONTDUMP: u32 = 32;
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
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// True for a zero-length VMA (never produced by the dumper).
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

impl PageRange {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.nr_pages * crate::PAGE_SIZE
    }

    /// True when the range holds no pages.
    pub fn is_empty(&self) -> bool {
        self.nr_pages == 0
    }
}
