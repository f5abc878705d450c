//! The address space: every VMA, how to recreate it, and where its saved
//! pages are in `pages-PID.img`.

/// All mappings of one process, in address order.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Mm {
    /// The VMAs, sorted by start address, non-overlapping.
    #[prost(message, repeated, tag = "1")]
    pub vmas: Vec<Vma>,
    /// Identity of the dumping kernel's vDSO, so restore on a different
    /// kernel is refused instead of running stale vDSO code.
    #[prost(message, optional, tag = "2")]
    pub vdso: Option<VdsoInfo>,
    /// Total bytes of page data (uncompressed).
    #[prost(uint64, tag = "3")]
    pub pages_bytes: u64,
    /// Set when the pages file holds LZ4 blocks listed in `chunks` instead
    /// of raw pages at the offsets of the VMAs' page ranges.
    #[prost(bool, tag = "4")]
    pub compressed: bool,
    /// The compressed pages file's blocks, in file order.
    #[prost(message, repeated, tag = "5")]
    pub chunks: Vec<PageChunk>,
}

/// One independently compressed run of pages (within one [`PageRange`]).
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct PageChunk {
    /// Address of the first page.
    #[prost(uint64, tag = "1")]
    pub addr: u64,
    /// Bytes of page data once decompressed (a multiple of the page size).
    #[prost(uint64, tag = "2")]
    pub raw_len: u64,
    /// Offset of the block in the pages file.
    #[prost(uint64, tag = "3")]
    pub file_offset: u64,
    /// Length of the block in the pages file.
    #[prost(uint64, tag = "4")]
    pub file_len: u64,
    /// The block is stored uncompressed (LZ4 would not have made it smaller).
    #[prost(bool, tag = "5")]
    pub stored_raw: bool,
}

/// How a VMA is recreated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum VmaKind {
    /// Private anonymous memory (including `[heap]` and `[stack]`).
    Anon = 0,
    /// Private mapping of a file: clean pages come back from the file,
    /// written (COW-ed) pages from the pages file.
    FilePrivate = 1,
    /// Shared mapping of a file: the file holds the data.
    FileShared = 2,
    /// `MAP_SHARED | MAP_ANONYMOUS` (shown as `/dev/zero (deleted)`).
    SharedAnon = 3,
    /// The kernel's `[vdso]`.
    Vdso = 4,
    /// The kernel's `[vvar]`.
    Vvar = 5,
    /// The kernel's `[vvar_vclock]`.
    VvarVclock = 6,
    /// The legacy `[vsyscall]` page (fixed; never moved).
    Vsyscall = 7,
}

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

/// One virtual memory area.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Vma {
    /// First address (page aligned).
    #[prost(uint64, tag = "1")]
    pub start: u64,
    /// One past the last address (page aligned).
    #[prost(uint64, tag = "2")]
    pub end: u64,
    /// PROT_* bits ([`prot`]).
    #[prost(uint32, tag = "3")]
    pub prot: u32,
    /// ckpt's [`vma_flags`].
    #[prost(uint32, tag = "4")]
    pub flags: u32,
    /// How it is recreated.
    #[prost(enumeration = "VmaKind", tag = "5")]
    pub kind: i32,
    /// Offset into the file in bytes, for file mappings.
    #[prost(uint64, tag = "6")]
    pub file_offset: u64,
    /// Path of the mapped file (empty for anonymous memory).
    #[prost(string, tag = "7")]
    pub path: String,
    /// What the file looked like at dump time.
    #[prost(message, optional, tag = "8")]
    pub file: Option<FileId>,
    /// Saved page contents, in address order.
    #[prost(message, repeated, tag = "9")]
    pub pages: Vec<PageRange>,
    /// Identity (shmem inode) of a shared anonymous object, so mappings of
    /// the same object can be told apart from lookalikes.
    #[prost(uint64, tag = "10")]
    pub shmem_id: u64,
    /// Set when this VMA maps the same shared anonymous object as an
    /// earlier VMA (of this or another process): it is mapped from there on
    /// restore, and its pages are saved only with that one.
    #[prost(message, optional, tag = "11")]
    pub shmem_owner: Option<ShmemOwner>,
}

/// Where the shared anonymous object of a VMA is saved.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct ShmemOwner {
    /// The process holding the owning VMA.
    #[prost(int32, tag = "1")]
    pub pid: i32,
    /// Start of the owning VMA.
    #[prost(uint64, tag = "2")]
    pub start: u64,
    /// End of the owning VMA.
    #[prost(uint64, tag = "3")]
    pub end: u64,
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

/// A run of consecutive saved pages.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct PageRange {
    /// Address of the first page.
    #[prost(uint64, tag = "1")]
    pub addr: u64,
    /// Number of pages.
    #[prost(uint64, tag = "2")]
    pub nr_pages: u64,
    /// Byte offset of the first page in the pages file (page aligned).
    #[prost(uint64, tag = "3")]
    pub offset: u64,
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

/// Enough about a file to tell whether it changed since the dump.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FileId {
    /// Size in bytes.
    #[prost(uint64, tag = "1")]
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    #[prost(int64, tag = "2")]
    pub mtime_ns: i64,
    /// Permission bits and type (`st_mode`).
    #[prost(uint32, tag = "3")]
    pub mode: u32,
}

/// Identity of the vDSO the process was using.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VdsoInfo {
    /// Length of `[vdso]` in bytes.
    #[prost(uint64, tag = "1")]
    pub vdso_len: u64,
    /// CRC32C of the `[vdso]` code.
    #[prost(uint32, tag = "2")]
    pub vdso_crc32c: u32,
    /// Length of `[vvar]` (0 when absent).
    #[prost(uint64, tag = "3")]
    pub vvar_len: u64,
    /// Length of `[vvar_vclock]` (0 when absent).
    #[prost(uint64, tag = "4")]
    pub vvar_vclock_len: u64,
}
