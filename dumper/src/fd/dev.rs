//! Character devices: the stateless ones are reopened by path, terminals
//! are reconnected by the restorer's rule (see `ckpt_image::files::FdKind::Tty`).

use std::os::unix::fs::MetadataExt;

use ckpt_image::files::{FdEntry, FdKind};

use super::FdParams;
use crate::error::Result;

/// Describes a character-device fd.
pub fn dump_char(p: &FdParams) -> Result<FdEntry> {
    let rdev = p.meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    match (major, minor) {
        // /dev/null, zero, full, random, urandom: no state worth saving.
        (1, 3) | (1, 5) | (1, 7) | (1, 8) | (1, 9) => Ok(p.entry(FdKind::CharDevice)),
        // Unix98 pty slaves, virtual consoles and /dev/tty, /dev/console.
        (136..=143, _) | (4, _) | (5, 0) | (5, 1) => Ok(p.entry(FdKind::Tty)),
        _ => Err(p.unsupported(&format!("character device {} ({major}:{minor})", p.link))),
    }
}
