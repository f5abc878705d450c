//! Terminals: recorded, and reconnected on restore by the terminal rule
//! (see `ckpt_image::fd::tty::TtyFile`).

use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::tty::TtyFile;

use super::{Blobs, FdParams, FileDumper};
use crate::error::Result;

/// Unix98 pty slaves, virtual consoles, `/dev/tty` and `/dev/console`.
pub struct Tty;

impl FileDumper for Tty {
    fn name(&self) -> &'static str {
        "tty"
    }

    fn description(&self) -> &'static str {
        "terminals: pty slaves, virtual consoles, /dev/tty, /dev/console (rebound on restore; as a session's controlling terminal, not restored, one line)"
    }

    fn claims(&self, p: &FdParams) -> bool {
        let rdev = p.meta.rdev();
        p.meta.mode() & libc::S_IFMT == libc::S_IFCHR
            && matches!(
                (libc::major(rdev), libc::minor(rdev)),
                (136..=143, _) | (4, _) | (5, 0) | (5, 1)
            )
    }

    fn collect(&self, p: &FdParams, _file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        Ok(Kind::Tty(TtyFile {
            path: p.link.clone(),
            rdev: p.meta.rdev(),
        }))
    }
}
