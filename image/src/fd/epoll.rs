//! epoll(7) instances: the interest list, each target an open file of the
//! checkpoint by id.
//!
//! The messages are defined in `image/proto/fd_epoll.proto`.

pub use crate::pb::{EpollFile, EpollTarget};

impl super::Describe for EpollFile {
    fn describe(&self) -> String {
        format!(
            "epoll targets {}",
            self.targets
                .iter()
                .map(|t| format!("fd {} file {} events {:#x}", t.fd, t.file_id, t.events))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}
