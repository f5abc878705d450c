//! FIFOs (named pipes) opened by path: the path and identity of the FIFO,
//! its capacity, and the data buffered in it, copied once per FIFO without
//! consuming it (as for pipes: `tee` from a read end reopened through
//! `/proc/PID/fd/N`). Either end may be outside the tree: a FIFO has a
//! name, so an outside peer reopens it by path after the restore. A FIFO
//! unlinked while open is recorded as such, with the name it had: restore
//! makes it again, unlinked, in that directory.

use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::fifo::FifoFile;
use ckpt_image::fd::file::Kind;

use super::pipe::read_buffered;
use super::{Blobs, FdParams, FileDumper};
use crate::error::Result;

/// What `/proc/PID/fd/N` appends to the path of an unlinked file.
const DELETED: &str = " (deleted)";

/// FIFOs: `S_IFIFO` with a path (anonymous pipes show as `pipe:[ino]`).
pub struct Fifo;

impl FileDumper for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }

    fn description(&self) -> &'static str {
        "named pipes (FIFOs) opened by path, with their buffered data; reopened at their path, which must still be the same FIFO, or, unlinked while open, made again in their directory and unlinked"
    }

    fn claims(&self, p: &FdParams) -> bool {
        p.meta.mode() & libc::S_IFMT == libc::S_IFIFO && !p.link.starts_with("pipe:")
    }

    fn collect(&self, p: &FdParams, _file_id: u64, blobs: &mut Blobs) -> Result<Kind> {
        let m = &p.meta;
        // A FIFO unlinked while open is made again under its directory
        // at restore; one with no path at all (on a filesystem not
        // reachable from the root) cannot be.
        let unlinked = m.nlink() == 0;
        let path = if unlinked {
            p.link.strip_suffix(DELETED).unwrap_or(&p.link)
        } else {
            &p.link
        };
        if !path.starts_with('/') {
            return Err(p.unsupported(&format!(
                "named pipe (FIFO) {} has no path to make it again at",
                p.link
            )));
        }
        let data = ckpt_image::fifo_data_name(m.dev(), m.ino());
        let buffered = read_buffered(p)?;
        // Every description of the FIFO sees the same buffer: keep it once.
        if !blobs.has(&data) {
            blobs.add(data.clone(), buffered.data);
        }
        Ok(Kind::Fifo(FifoFile {
            path: path.to_owned(),
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            dev: m.dev(),
            ino: m.ino(),
            capacity: buffered.capacity,
            data,
            unlinked,
        }))
    }
}
