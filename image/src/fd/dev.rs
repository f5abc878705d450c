//! Character devices without state worth saving.
//!
//! The message is defined in `image/proto/fd_dev.proto`.

pub use crate::pb::DevFile;

impl super::Describe for DevFile {
    fn describe(&self) -> String {
        if self.deleted {
            format!("{} (deleted device node)", self.path)
        } else {
            self.path.clone()
        }
    }
}
