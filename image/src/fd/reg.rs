//! Regular files and directories.
//!
//! The message is defined in `image/proto/fd_reg.proto`.

pub use crate::pb::{FileHandle, GhostExtent, RegFile};

impl RegFile {
    /// It is a directory.
    pub fn is_dir(&self) -> bool {
        self.mode & 0o170000 == 0o040000
    }
}

impl super::Describe for RegFile {
    fn describe(&self) -> String {
        match &self.ghost {
            Some(g) => format!("{} (deleted, contents in {g})", self.path),
            None if self.removed => format!("{} (removed directory)", self.path),
            None if self.handle.is_some() => {
                format!("{} (name removed, other hard links left)", self.path)
            }
            None => self.path.clone(),
        }
    }
}
