//! FIFOs (named pipes) opened by path: the path and identity of the FIFO,
//! its capacity, and the data buffered in it, copied once per FIFO without
//! consuming it (as for pipes: `tee` from a read end reopened through
//! `/proc/PID/fd/N`). Either end may be outside the tree: a FIFO has a
//! name, so an outside peer reopens it by path after the restore.

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
        "named pipes (FIFOs) opened by path, with their buffered data; reopened at their path, which must still be the same FIFO"
    }

    fn claims(&self, p: &FdParams) -> bool {
        p.meta.mode() & libc::S_IFMT == libc::S_IFIFO && !p.link.starts_with("pipe:")
    }

    fn collect(&self, p: &FdParams, _file_id: u64, blobs: &mut Blobs) -> Result<Kind> {
        let m = &p.meta;
        // Restore reopens a FIFO by its name and never creates one, so a
        // FIFO without a name cannot come back.
        if m.nlink() == 0 || !p.link.starts_with('/') {
            return Err(p.unsupported(&format!(
                "named pipe (FIFO) {} was unlinked while open",
                p.link.trim_end_matches(DELETED)
            )));
        }
        let data = ckpt_image::fifo_data_name(m.dev(), m.ino());
        let buffered = read_buffered(p)?;
        // Every description of the FIFO sees the same buffer: keep it once.
        if !blobs.has(&data) {
            blobs.add(data.clone(), buffered.data);
        }
        Ok(Kind::Fifo(FifoFile {
            path: p.link.clone(),
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            dev: m.dev(),
            ino: m.ino(),
            capacity: buffered.capacity,
            data,
        }))
    }
}
