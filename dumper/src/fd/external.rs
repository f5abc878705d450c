//! Open files the user declared external (`ckpt dump --external KEY`): the
//! other side lives outside the dumped tree (a launcher's pipe, a log
//! collector's socket), so nothing of it is saved; restore is given an fd
//! for it. Keys follow CRIU's convention: `pipe:[INODE]` or
//! `socket:[INODE]` as `/proc/PID/fd` shows the fd, or the file's path.

use ckpt_image::fd::external::ExternalFile;
use ckpt_image::fd::file::Kind;

use super::{Blobs, FdParams, FileDumper};
use crate::error::Result;

/// Fds whose key the user named with `--external`.
pub struct External;

impl FileDumper for External {
    fn name(&self) -> &'static str {
        "external"
    }

    fn description(&self) -> &'static str {
        "anything named with `ckpt dump --external KEY` (pipe:[INO], socket:[INO], a path), handed over with `ckpt restore --inherit-fd fd[N]:KEY`"
    }

    fn claims(&self, p: &FdParams) -> bool {
        p.external
    }

    fn collect(&self, p: &FdParams, _file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        Ok(Kind::External(ExternalFile {
            key: p.link.clone(),
        }))
    }
}
