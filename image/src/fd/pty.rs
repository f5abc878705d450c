//! Pseudo-terminal pairs whose master the tree holds.
//!
//! The message is defined in `image/proto/fd_pty.proto`.

pub use crate::pb::{PtyFile, PtyLine, PtySide};

/// Control characters in a `struct termios` (x86_64 `NCCS`).
pub const NCCS: usize = 19;

/// One end of a pty pair in one line.
impl super::Describe for PtyFile {
    fn describe(&self) -> String {
        if self.side == PtySide::Slave as i32 {
            return format!(
                "pty slave /dev/pts/{} of master file {}",
                self.index, self.master_file_id
            );
        }
        let line = self.line.clone().unwrap_or_default();
        format!(
            "pty master of /dev/pts/{} ({}x{}{}{})",
            self.index,
            line.cols,
            line.rows,
            if line.packet_mode {
                ", packet mode"
            } else {
                ""
            },
            if line.locked { ", locked" } else { "" }
        )
    }
}
