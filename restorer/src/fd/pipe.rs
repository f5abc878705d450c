//! Pipes: the restorer recreates each pipe of the tree itself, refills the
//! data that was buffered in it, and every process that owned an end takes
//! that end from the restorer with `pidfd_getfd` (run inside it). The
//! restorer closes its copies once the tree runs.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};

use ckpt_image::files::{FdEntry, Pipes};
use ckpt_image::{ImageDir, ImageKind, PIPES_NAME};
use nix::fcntl::{FcntlArg, OFlag, fcntl};

use crate::error::{RestoreError, Result};

/// The restorer's copies of every pipe: id -> (read end, write end).
#[derive(Default)]
pub struct PipeTable(HashMap<u64, (File, File)>);

impl PipeTable {
    /// Creates and refills the pipes listed in `pipes.img`, if any.
    pub fn create(images: &ImageDir) -> Result<PipeTable> {
        let mut table = PipeTable::default();
        if images.digest(PIPES_NAME).is_err() {
            return Ok(table);
        }
        let pipes: Pipes = images.read_meta(PIPES_NAME, ImageKind::Pipes)?;
        let me = std::process::id() as i32;
        let err = |what: &str, e: std::io::Error| RestoreError::os(me, format!("pipe: {what}"), e);
        for p in pipes.pipes {
            let (r, w) =
                nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| err("pipe2", e.into()))?;
            if p.size > 0 {
                fcntl(w.as_fd(), FcntlArg::F_SETPIPE_SZ(p.size as libc::c_int))
                    .map_err(|e| err("F_SETPIPE_SZ", e.into()))?;
            }
            let mut w = File::from(w);
            // It fit in a pipe of this size before, so it fits again.
            fcntl(w.as_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
                .map_err(|e| err("F_SETFL", e.into()))?;
            w.write_all(&p.data).map_err(|e| err("refill", e))?;
            table.0.insert(p.id, (File::from(r), w));
        }
        Ok(table)
    }

    /// The restorer's fd for the end of the pipe that `e` is.
    pub fn end_for(&self, pid: i32, e: &FdEntry) -> Result<i32> {
        let (r, w) = self.0.get(&e.pipe_id).ok_or_else(|| {
            RestoreError::Image(ckpt_image::ImageError::Invalid {
                path: ckpt_image::files_name(pid).into(),
                what: format!("fd {}: pipe {} missing from {PIPES_NAME}", e.fd, e.pipe_id),
            })
        })?;
        let writes = e.flags & libc::O_ACCMODE as u32 == libc::O_WRONLY as u32;
        Ok(if writes { w.as_raw_fd() } else { r.as_raw_fd() })
    }
}
