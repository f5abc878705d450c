//! InfiniBand verbs descriptors.
//!
//! The message is defined in `image/proto/fd_ib.proto`.

pub use crate::pb::IbFile;

impl super::Describe for IbFile {
    fn describe(&self) -> String {
        format!("verbs {} (recreated by the verbs layer)", self.path)
    }
}
