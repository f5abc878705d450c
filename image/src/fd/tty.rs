//! Terminals.
//!
//! The message is defined in `image/proto/fd_tty.proto`.

pub use crate::pb::TtyFile;
