//! Open files declared external at dump time and handed over at restore.
//!
//! The message is defined in `image/proto/fd_external.proto`.

pub use crate::pb::ExternalFile;

impl super::Describe for ExternalFile {
    fn describe(&self) -> String {
        format!("external {}", self.key)
    }
}
