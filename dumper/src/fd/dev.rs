//! Character devices without state worth saving, reopened by path; a node
//! unlinked while open is recorded with its mode and owner, to be made
//! again on restore.

use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::dev::DevFile;
use ckpt_image::fd::file::Kind;

use super::{Blobs, FdParams, FileDumper};
use crate::error::Result;

/// `/dev/null`, `zero`, `full`, `random`, `urandom` (major 1).
pub struct Dev;

/// Minor numbers of the stateless memory devices under major 1.
const STATELESS_MINORS: [u32; 5] = [3, 5, 7, 8, 9];
const MEM_MAJOR: u32 = 1;
/// How `/proc/PID/fd` names a node unlinked while open.
const DELETED: &str = " (deleted)";

impl FileDumper for Dev {
    fn name(&self) -> &'static str {
        "dev"
    }

    fn description(&self) -> &'static str {
        "/dev/null, /dev/zero, /dev/full, /dev/random, /dev/urandom (reopened by path; a node of one unlinked while open made again, as root, for a user who could open it)"
    }

    fn claims(&self, p: &FdParams) -> bool {
        let rdev = p.meta.rdev();
        p.meta.mode() & libc::S_IFMT == libc::S_IFCHR
            && libc::major(rdev) == MEM_MAJOR
            && STATELESS_MINORS.contains(&libc::minor(rdev))
    }

    fn collect(&self, p: &FdParams, _file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        let (path, deleted) = match p.link.strip_suffix(DELETED) {
            Some(path) if p.meta.nlink() == 0 => (path.to_string(), true),
            _ => (p.link.clone(), false),
        };
        Ok(Kind::Dev(DevFile {
            path,
            rdev: p.meta.rdev(),
            deleted,
            mode: p.meta.mode(),
            uid: p.meta.uid(),
            gid: p.meta.gid(),
        }))
    }
}
