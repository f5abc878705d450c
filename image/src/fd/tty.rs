//! Terminals.
//!
//! The message is defined in `image/proto/fd_tty.proto`.

pub use crate::pb::TtyFile;

impl super::Describe for TtyFile {
    fn describe(&self) -> String {
        self.path.clone()
    }
}
