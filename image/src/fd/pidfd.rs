//! pidfds (`pidfd_open(2)`, `CLONE_PIDFD`).
//!
//! The message is defined in `image/proto/fd_pidfd.proto`.

pub use crate::pb::PidfdFile;

impl super::Describe for PidfdFile {
    fn describe(&self) -> String {
        if self.reaped {
            "pidfd of a process that exited and was reaped".into()
        } else {
            format!("pidfd of pid {}", self.pid)
        }
    }
}
