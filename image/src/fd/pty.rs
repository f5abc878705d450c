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
        let in_flight = if line.input.is_empty() && line.output.is_empty() {
            String::new()
        } else {
            format!(
                ", {} bytes of input and {} of output in flight",
                line.input.len(),
                line.output.len()
            )
        };
        format!(
            "pty master of /dev/pts/{} ({}x{}{}{}{in_flight})",
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

pub use crate::pb::PtyNode;

/// `_POSIX_VDISABLE`: a control character slot that matches nothing.
const DISABLED: u8 = 0;

impl PtyLine {
    /// These settings with nothing that reacts to the bytes passing
    /// through: no echo, no signals, no input or output mapping, no
    /// editing characters; canonical mode as it was, so typed lines still
    /// end where they ended. Bytes in flight are put back through a pair
    /// set this way: they were processed once already.
    pub fn quiet(&self) -> PtyLine {
        let mut q = self.clone();
        q.lflag &= !(libc::ECHO
            | libc::ECHOE
            | libc::ECHOK
            | libc::ECHONL
            | libc::ECHOCTL
            | libc::ECHOKE
            | libc::ECHOPRT
            | libc::ISIG
            | libc::IEXTEN);
        q.iflag &= !(libc::ICRNL
            | libc::INLCR
            | libc::IGNCR
            | libc::IUCLC
            | libc::ISTRIP
            | libc::IXON
            | libc::IXOFF
            | libc::INPCK
            | libc::PARMRK);
        q.oflag &= !libc::OPOST;
        for slot in [
            libc::VERASE,
            libc::VKILL,
            libc::VWERASE,
            libc::VREPRINT,
            libc::VEOF,
            libc::VLNEXT,
            libc::VDISCARD,
        ] {
            if let Some(c) = q.cc.get_mut(slot) {
                *c = DISABLED;
            }
        }
        q
    }

    /// Whether input is read line by line (ICANON).
    pub fn canonical(&self) -> bool {
        self.lflag & libc::ICANON != 0
    }

    /// How many bytes of `input` a reader of the slave can read at once
    /// with these settings: all of it in non-canonical mode, else up to
    /// the end of its last complete line (a half-typed line waits for its
    /// end, and `FIONREAD` does not count it).
    pub fn readable_input(&self, input: &[u8]) -> usize {
        if !self.canonical() {
            return input.len();
        }
        let eol = |slot: usize| self.cc.get(slot).copied().filter(|&c| c != DISABLED);
        let ends = [Some(b'\n'), eol(libc::VEOL), eol(libc::VEOL2)];
        input
            .iter()
            .rposition(|b| ends.contains(&Some(*b)))
            .map_or(0, |i| i + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical_line() -> PtyLine {
        let mut cc = vec![DISABLED; NCCS];
        cc[libc::VERASE] = 0x7f;
        cc[libc::VEOL] = b';';
        PtyLine {
            lflag: libc::ICANON | libc::ECHO | libc::ISIG,
            iflag: libc::ICRNL,
            oflag: libc::OPOST | libc::ONLCR,
            cc,
            ..Default::default()
        }
    }

    #[test]
    fn quiet_keeps_canonical_mode_and_drops_everything_that_reacts() {
        let q = canonical_line().quiet();
        assert!(q.canonical());
        assert_eq!(q.lflag & (libc::ECHO | libc::ISIG), 0);
        assert_eq!(q.iflag & libc::ICRNL, 0);
        assert_eq!(q.oflag & libc::OPOST, 0);
        assert_eq!(q.cc[libc::VERASE], DISABLED);
        assert_eq!(q.cc[libc::VEOL], b';', "line ends stay line ends");
    }

    #[test]
    fn a_half_typed_line_is_not_readable_yet() {
        let line = canonical_line();
        assert_eq!(line.readable_input(b"ls\nech"), 3);
        assert_eq!(line.readable_input(b"a;b"), 2);
        assert_eq!(line.readable_input(b"half"), 0);
        let raw = PtyLine::default();
        assert_eq!(raw.readable_input(b"half"), 4);
    }
}
