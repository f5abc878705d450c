//! pidfds (`pidfd_open(2)`, `CLONE_PIDFD`).
//!
//! The message is defined in `image/proto/fd_pidfd.proto`.

pub use crate::pb::PidfdFile;

impl super::Describe for PidfdFile {
    fn describe(&self) -> String {
        format!("pidfd of pid {}", self.pid)
    }
}
