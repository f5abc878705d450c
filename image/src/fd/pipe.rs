//! Pipes whose both ends are in the dumped tree.
//!
//! The message is defined in `image/proto/fd_pipe.proto`.

pub use crate::pb::PipeFile;
