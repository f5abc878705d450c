//! eventfd(2) objects.
//!
//! The message is defined in `image/proto/fd_eventfd.proto`.

pub use crate::pb::EventfdFile;

impl super::Describe for EventfdFile {
    fn describe(&self) -> String {
        format!(
            "eventfd count {}{}",
            self.count,
            if self.semaphore { " semaphore" } else { "" }
        )
    }
}
