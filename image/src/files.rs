//! The fd table.

/// All open file descriptors of one process.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Files {
    /// Entries sorted by fd number.
    #[prost(message, repeated, tag = "1")]
    pub fds: Vec<FdEntry>,
}

/// What an fd refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum FdKind {
    /// A regular file reachable by its path.
    Regular = 0,
    /// A regular file that was unlinked while open; its contents are in a
    /// ghost image.
    Unlinked = 1,
    /// A directory.
    Directory = 2,
    /// A character device reopened by path (`/dev/null`, `/dev/zero`, ...).
    CharDevice = 3,
    /// A terminal: reconnected by the rule in the restorer (the restorer's
    /// own fd with the same number, else /dev/null).
    Tty = 4,
    /// One end of a pipe whose both ends are in the dumped tree; its
    /// buffered data is in `pipes.img`.
    Pipe = 5,
}

/// One open file descriptor.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FdEntry {
    /// The fd number.
    #[prost(int32, tag = "1")]
    pub fd: i32,
    /// What it refers to.
    #[prost(enumeration = "FdKind", tag = "2")]
    pub kind: i32,
    /// Path at dump time (without the " (deleted)" suffix).
    #[prost(string, tag = "3")]
    pub path: String,
    /// open(2) flags (access mode, O_APPEND, O_NONBLOCK, ...), without O_CLOEXEC.
    #[prost(uint32, tag = "4")]
    pub flags: u32,
    /// FD_CLOEXEC is set.
    #[prost(bool, tag = "5")]
    pub cloexec: bool,
    /// File offset.
    #[prost(int64, tag = "6")]
    pub pos: i64,
    /// `st_mode` of the file.
    #[prost(uint32, tag = "7")]
    pub mode: u32,
    /// Ghost image holding the contents of an unlinked file.
    #[prost(string, tag = "8")]
    pub ghost: String,
    /// The fd (in this process, or in `owner_pid`) whose open file
    /// description this fd shares; equal to `fd` for the first one.
    #[prost(uint64, tag = "9")]
    pub description: u64,
    /// Size of the file at dump time.
    #[prost(uint64, tag = "10")]
    pub size: u64,
    /// When non-zero, the open file description is shared with fd
    /// `description` of this (earlier restored) process, usually inherited
    /// across fork; restore takes it from there with pidfd_getfd.
    #[prost(int32, tag = "11")]
    pub owner_pid: i32,
    /// For a pipe end: the pipe's identity (its inode at dump time).
    #[prost(uint64, tag = "12")]
    pub pipe_id: u64,
}

/// The pipes of a checkpoint and the data buffered in them.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Pipes {
    /// One entry per pipe.
    #[prost(message, repeated, tag = "1")]
    pub pipes: Vec<PipeData>,
}

/// One pipe.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PipeData {
    /// Identity, as in [`FdEntry::pipe_id`].
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Capacity (`F_GETPIPE_SZ`).
    #[prost(uint32, tag = "2")]
    pub size: u32,
    /// Bytes written but not yet read, in order.
    #[prost(bytes = "vec", tag = "3")]
    pub data: Vec<u8>,
}
