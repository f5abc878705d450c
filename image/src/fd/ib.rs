//! InfiniBand verbs descriptors.
//!
//! The message is defined in `image/proto/fd_ib.proto`.

pub use crate::pb::IbFile;
