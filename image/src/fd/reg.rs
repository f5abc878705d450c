//! Regular files and directories.
//!
//! The message is defined in `image/proto/fd_reg.proto`.

pub use crate::pb::RegFile;

impl RegFile {
    /// It is a directory.
    pub fn is_dir(&self) -> bool {
        self.mode & 0o170000 == 0o040000
    }
}
