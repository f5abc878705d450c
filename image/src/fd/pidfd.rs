//! pidfds (`pidfd_open(2)`, `CLONE_PIDFD`).
//!
//! The message is defined in `image/proto/fd_pidfd.proto`.

pub use crate::pb::PidfdFile;
