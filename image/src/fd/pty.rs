//! Pseudo-terminal pairs whose master the tree holds.
//!
//! The message is defined in `image/proto/fd_pty.proto`.

pub use crate::pb::{PtyFile, PtyLine, PtySide};

/// Control characters in a `struct termios` (x86_64 `NCCS`).
pub const NCCS: usize = 19;
