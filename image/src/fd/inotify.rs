//! inotify(7) instances, and the `inotify` lines of `/proc/PID/fdinfo`
//! that describe their watches (read at dump time, and again at restore to
//! check what was rebuilt).
//!
//! The messages are defined in `image/proto/fd_inotify.proto`.

pub use crate::pb::{InotifyFile, InotifyHandle, InotifyWatch};

/// One `inotify wd:… ino:… sdev:… mask:… …` line of fdinfo (numbers in
/// hex, as the kernel prints them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchLine {
    /// Watch descriptor.
    pub wd: i32,
    /// Inode number.
    pub ino: u64,
    /// Device of its filesystem, kernel encoding (major << 20 | minor).
    pub sdev: u32,
    /// Watched events and flags.
    pub mask: u32,
    /// The inode's file handle: its type, then its bytes (empty where the
    /// filesystem cannot export one).
    pub handle_type: i32,
    /// The file handle's bytes.
    pub handle: Vec<u8>,
}

/// Bits of the kernel's dev_t encoding that hold the minor number.
const MINOR_BITS: u32 = 20;

impl WatchLine {
    /// The device's major number.
    pub fn major(&self) -> u32 {
        self.sdev >> MINOR_BITS
    }

    /// The device's minor number.
    pub fn minor(&self) -> u32 {
        self.sdev & ((1 << MINOR_BITS) - 1)
    }
}

/// Every watch line of an fdinfo text; `Err` names the first malformed one.
pub fn watch_lines(fdinfo: &str) -> Result<Vec<WatchLine>, String> {
    fdinfo
        .lines()
        .filter_map(|l| l.strip_prefix("inotify "))
        .map(|l| parse_line(l).ok_or_else(|| format!("bad inotify line: {l}")))
        .collect()
}

fn parse_line(line: &str) -> Option<WatchLine> {
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix(':'))
    };
    let hex32 = |key: &str| u32::from_str_radix(field(key)?, 16).ok();
    let handle_hex = field("f_handle").unwrap_or("");
    let handle = (0..handle_hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(handle_hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    let handle_len =
        field("fhandle-bytes").map_or(Some(0), |v| usize::from_str_radix(v, 16).ok())?;
    if handle_len != handle.len() {
        return None;
    }
    Some(WatchLine {
        wd: i32::try_from(hex32("wd")?).ok()?,
        ino: u64::from_str_radix(field("ino")?, 16).ok()?,
        sdev: hex32("sdev")?,
        mask: hex32("mask")?,
        handle_type: field("fhandle-type").map_or(Some(0), |v| i32::from_str_radix(v, 16).ok())?,
        handle,
    })
}

impl super::Describe for InotifyFile {
    fn describe(&self) -> String {
        format!(
            "inotify watches {}",
            self.watches
                .iter()
                .map(|w| format!("wd {} mask {:#x} {}", w.wd, w.mask, w.path))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_watch_lines() {
        let info = "pos:\t0\nflags:\t04000\nmnt_id:\t16\nino:\t1057\n\
            inotify wd:a ino:1c2 sdev:800001 mask:fce ignored_mask:0 fhandle-bytes:8 fhandle-type:1 f_handle:c201000011223344\n";
        let w = watch_lines(info).unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].wd, 10);
        assert_eq!(w[0].ino, 0x1c2);
        assert_eq!((w[0].major(), w[0].minor()), (8, 1));
        assert_eq!(w[0].mask, 0xfce);
        assert_eq!(w[0].handle_type, 1);
        assert_eq!(w[0].handle, [0xc2, 1, 0, 0, 0x11, 0x22, 0x33, 0x44]);
        assert!(watch_lines("inotify wd:zz ino:1\n").is_err());
        assert!(watch_lines("pos:\t0\n").unwrap().is_empty());
    }
}
