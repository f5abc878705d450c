//! fanotify(7) groups, and the `fanotify` lines of `/proc/PID/fdinfo` that
//! describe the group and its marks (read at dump time, and again at
//! restore to check what was rebuilt).
//!
//! The messages are defined in `image/proto/fd_fanotify.proto`.

pub use crate::pb::{FanotifyFile, FanotifyMark, FanotifyMarkKind};

/// The `fanotify flags:… event-flags:…` line: what `fanotify_init` was
/// given (hex, as the kernel prints it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupLine {
    /// `fanotify_init` flags.
    pub flags: u32,
    /// `fanotify_init` event_f_flags.
    pub event_flags: u32,
}

/// One mark line: `fanotify ino:… sdev:… mflags:… mask:… ignored_mask:…
/// fhandle-bytes:… fhandle-type:… f_handle:…` (inode),
/// `fanotify mnt_id:… mflags:…` (mount), `fanotify sdev:… mflags:…`
/// (filesystem).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkLine {
    /// What the mark is attached to.
    pub kind: FanotifyMarkKind,
    /// Inode number (inode marks; 0 otherwise).
    pub ino: u64,
    /// Filesystem device, kernel encoding (inode and filesystem marks).
    pub sdev: u32,
    /// Mount id (mount marks).
    pub mnt_id: i32,
    /// Mark flags.
    pub mflags: u32,
    /// Reported events.
    pub mask: u32,
    /// Ignored events.
    pub ignored_mask: u32,
    /// The inode's file handle type (inode marks).
    pub handle_type: i32,
    /// The inode's file handle bytes (empty where there is none).
    pub handle: Vec<u8>,
}

/// Bits of the kernel's dev_t encoding that hold the minor number.
const MINOR_BITS: u32 = 20;

impl MarkLine {
    /// The device's major number.
    pub fn major(&self) -> u32 {
        self.sdev >> MINOR_BITS
    }

    /// The device's minor number.
    pub fn minor(&self) -> u32 {
        self.sdev & ((1 << MINOR_BITS) - 1)
    }
}

/// What fdinfo says of a fanotify group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupInfo {
    /// Its init flags.
    pub group: GroupLine,
    /// Its marks, in fdinfo order.
    pub marks: Vec<MarkLine>,
}

/// Parses a fanotify fd's fdinfo text; `Err` names the first malformed
/// line (or the missing group line).
pub fn group_info(fdinfo: &str) -> Result<GroupInfo, String> {
    let mut group = None;
    let mut marks = Vec::new();
    for line in fdinfo.lines().filter_map(|l| l.strip_prefix("fanotify ")) {
        let bad = || format!("bad fanotify line: {line}");
        if field(line, "flags").is_some() {
            group = Some(GroupLine {
                flags: hex32(line, "flags").ok_or_else(bad)?,
                event_flags: hex32(line, "event-flags").ok_or_else(bad)?,
            });
        } else {
            marks.push(parse_mark(line).ok_or_else(bad)?);
        }
    }
    let group = group.ok_or_else(|| "no fanotify flags line".to_string())?;
    Ok(GroupInfo { group, marks })
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix(':'))
}

fn hex32(line: &str, key: &str) -> Option<u32> {
    u32::from_str_radix(field(line, key)?, 16).ok()
}

fn parse_mark(line: &str) -> Option<MarkLine> {
    let kind = if field(line, "ino").is_some() {
        FanotifyMarkKind::Inode
    } else if field(line, "mnt_id").is_some() {
        FanotifyMarkKind::Mount
    } else if field(line, "sdev").is_some() {
        FanotifyMarkKind::Filesystem
    } else {
        return None;
    };
    let handle_hex = field(line, "f_handle").unwrap_or("");
    let handle = (0..handle_hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(handle_hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    let handle_len =
        field(line, "fhandle-bytes").map_or(Some(0), |v| usize::from_str_radix(v, 16).ok())?;
    if handle_len != handle.len() {
        return None;
    }
    let optional =
        |key: &str| field(line, key).map_or(Some(0), |v| u32::from_str_radix(v, 16).ok());
    Some(MarkLine {
        kind,
        ino: field(line, "ino").map_or(Some(0), |v| u64::from_str_radix(v, 16).ok())?,
        sdev: optional("sdev")?,
        mnt_id: i32::try_from(optional("mnt_id")?).ok()?,
        mflags: hex32(line, "mflags")?,
        mask: hex32(line, "mask")?,
        ignored_mask: hex32(line, "ignored_mask")?,
        handle_type: field(line, "fhandle-type")
            .map_or(Some(0), |v| i32::from_str_radix(v, 16).ok())?,
        handle,
    })
}

impl FanotifyMarkKind {
    /// How messages name it.
    pub fn label(self) -> &'static str {
        match self {
            FanotifyMarkKind::Inode => "inode",
            FanotifyMarkKind::Mount => "mount",
            FanotifyMarkKind::Filesystem => "filesystem",
            FanotifyMarkKind::Unspecified => "unspecified",
        }
    }
}

impl FanotifyMark {
    /// One line: kind, masks and path.
    pub fn describe(&self) -> String {
        format!(
            "{} mark mask {:#x} ignored {:#x} {}",
            self.kind().label(),
            self.mask,
            self.ignored_mask,
            self.path
        )
    }
}

impl super::Describe for FanotifyFile {
    fn describe(&self) -> String {
        format!(
            "fanotify flags {:#x} marks {}",
            self.init_flags,
            self.marks
                .iter()
                .map(FanotifyMark::describe)
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_group_and_marks() {
        let info = "pos:\t0\nflags:\t02004002\nmnt_id:\t17\nino:\t1038\n\
            fanotify flags:3 event-flags:8000\n\
            fanotify sdev:fe00000 mflags:0 mask:10 ignored_mask:0\n\
            fanotify mnt_id:1b mflags:0 mask:20 ignored_mask:0\n\
            fanotify ino:98c0b1 sdev:fe00000 mflags:0 mask:a ignored_mask:0 fhandle-bytes:8 fhandle-type:1 f_handle:b1c098003d6655f8\n";
        let g = group_info(info).unwrap();
        assert_eq!(
            g.group,
            GroupLine {
                flags: 3,
                event_flags: 0x8000
            }
        );
        assert_eq!(g.marks.len(), 3);
        assert_eq!(g.marks[0].kind, FanotifyMarkKind::Filesystem);
        assert_eq!((g.marks[0].major(), g.marks[0].minor()), (254, 0));
        assert_eq!(g.marks[0].mask, 0x10);
        assert_eq!(g.marks[1].kind, FanotifyMarkKind::Mount);
        assert_eq!(g.marks[1].mnt_id, 0x1b);
        assert_eq!(g.marks[2].kind, FanotifyMarkKind::Inode);
        assert_eq!(g.marks[2].ino, 0x98c0b1);
        assert_eq!(g.marks[2].mask, 0xa);
        assert_eq!(g.marks[2].handle_type, 1);
        assert_eq!(g.marks[2].handle.len(), 8);
        assert!(group_info("pos:\t0\n").is_err());
        assert!(group_info("fanotify flags:0 event-flags:0\nfanotify ino:zz\n").is_err());
    }
}
