//! FIFOs (named pipes) opened by path, with their buffered data.
//!
//! The message is defined in `image/proto/fd_fifo.proto`.

pub use crate::pb::FifoFile;

impl super::Describe for FifoFile {
    fn describe(&self) -> String {
        format!(
            "fifo {}{} capacity {}",
            self.path,
            if self.unlinked { " (unlinked)" } else { "" },
            self.capacity
        )
    }
}
