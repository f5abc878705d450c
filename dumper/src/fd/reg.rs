//! Regular files and directories, including files unlinked while open
//! (saved whole as ghost images, recreated and unlinked again on restore),
//! and `O_PATH` fds of them or of symbolic links.

use std::io::Read;
use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::reg::RegFile;

use super::{Blobs, FdParams, FileDumper};
use crate::error::{DumpError, Result};

const DELETED: &str = " (deleted)";
const NANOS_PER_SEC: i64 = 1_000_000_000;

/// Regular files and directories.
pub struct Reg;

impl FileDumper for Reg {
    fn name(&self) -> &'static str {
        "reg"
    }

    fn description(&self) -> &'static str {
        "regular files and directories, also unlinked or removed while open (a file's contents saved, a removed directory made again empty); O_PATH fds of them and of symbolic links"
    }

    fn claims(&self, p: &FdParams) -> bool {
        match p.meta.mode() & libc::S_IFMT {
            libc::S_IFREG => !p.link.starts_with("/memfd:"),
            libc::S_IFDIR => true,
            // Only an `O_PATH | O_NOFOLLOW` open names a symbolic link
            // itself; one unlinked since has no contents to save.
            libc::S_IFLNK => p.is_o_path() && !p.link.ends_with(DELETED),
            _ => false,
        }
    }

    fn collect(&self, p: &FdParams, file_id: u64, blobs: &mut Blobs) -> Result<Kind> {
        let m = &p.meta;
        let mut f = RegFile {
            path: p.link.clone(),
            mode: m.mode(),
            size: m.size(),
            ghost: None,
            uid: m.uid(),
            gid: m.gid(),
            dev: m.dev(),
            ino: m.ino(),
            mtime_ns: m.mtime() * NANOS_PER_SEC + m.mtime_nsec(),
            ctime_ns: m.ctime() * NANOS_PER_SEC + m.ctime_nsec(),
            removed: false,
        };
        let Some(path) = p.link.strip_suffix(DELETED) else {
            return Ok(Kind::Reg(f));
        };
        if p.meta.nlink() != 0 {
            return Ok(Kind::Reg(f));
        }
        f.path = path.to_string();
        if p.meta.is_dir() {
            // A removed directory is empty: nothing to save but its
            // owner and mode, already recorded.
            f.removed = true;
        } else {
            let name = ckpt_image::ghost_name(file_id);
            blobs.add(name.clone(), read_contents(p)?);
            f.ghost = Some(name);
        }
        Ok(Kind::Reg(f))
    }
}

fn read_contents(p: &FdParams) -> Result<Vec<u8>> {
    let path = p.proc_path();
    let mut data = Vec::new();
    std::fs::File::open(&path)
        .and_then(|mut f| f.read_to_end(&mut data))
        .map_err(|source| DumpError::Proc {
            pid: p.pid,
            path,
            source,
        })?;
    Ok(data)
}
