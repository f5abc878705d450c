//! Regular files and directories.

/// A regular file or directory, reopened by path on restore. An unlinked
/// file's contents travel in a ghost image.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RegFile {
    /// Path at dump time (without the " (deleted)" suffix).
    #[prost(string, tag = "1")]
    pub path: String,
    /// `st_mode` (type and permission bits).
    #[prost(uint32, tag = "2")]
    pub mode: u32,
    /// Size at dump time.
    #[prost(uint64, tag = "3")]
    pub size: u64,
    /// For a file unlinked while open: the ghost image holding its
    /// contents ([`crate::ghost_name`]).
    #[prost(string, optional, tag = "4")]
    pub ghost: Option<String>,
}

impl RegFile {
    /// It is a directory.
    pub fn is_dir(&self) -> bool {
        self.mode & 0o170000 == 0o040000
    }
}
