//! Regular files and directories, including files unlinked while open
//! (their data extents saved as ghost images, with their holes, times,
//! owner and mode, recreated and unlinked again on restore), and `O_PATH`
//! fds of them or of symbolic links. A file one of whose hard links was
//! removed while open, and which lives on under another, is saved with
//! its file handle, by which restore opens it again.

use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::reg::{FileHandle, GhostExtent, RegFile};

use super::{Blobs, FdParams, FileDumper};
use crate::error::{DumpError, Result};
use crate::sys;

const DELETED: &str = " (deleted)";
const NANOS_PER_SEC: i64 = 1_000_000_000;

/// Regular files and directories.
pub struct Reg;

impl FileDumper for Reg {
    fn name(&self) -> &'static str {
        "reg"
    }

    fn description(&self) -> &'static str {
        "regular files and directories, also unlinked or removed while open (a file's data saved with its holes, mode, owner and times; a name of a hard-linked file removed, the file found again by its file handle; a removed directory made again empty); O_PATH fds of them and of symbolic links"
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
            atime_ns: m.atime() * NANOS_PER_SEC + m.atime_nsec(),
            ctime_ns: m.ctime() * NANOS_PER_SEC + m.ctime_nsec(),
            removed: false,
            ghost_extents_only: false,
            ghost_extents: Vec::new(),
            handle: None,
        };
        let Some(path) = p.link.strip_suffix(DELETED) else {
            return Ok(Kind::Reg(f));
        };
        if p.meta.nlink() != 0 {
            if p.meta.is_file() {
                // One name of a hard-linked file removed: the file lives
                // on under another, which nothing tells cheaply.
                f.path = path.to_string();
                f.handle = Some(handle_of(p, path)?);
            }
            return Ok(Kind::Reg(f));
        }
        f.path = path.to_string();
        if p.meta.is_dir() {
            // A removed directory is empty: nothing to save but its
            // owner and mode, already recorded.
            f.removed = true;
        } else {
            let name = ckpt_image::ghost_name(file_id);
            let (extents, data) = read_extents(p, m.size())?;
            blobs.add(name.clone(), data);
            f.ghost = Some(name);
            f.ghost_extents_only = true;
            f.ghost_extents = extents;
        }
        Ok(Kind::Reg(f))
    }
}

/// The handle restore finds the file of `p` again by, whose name `path`
/// was removed while other hard links to it remain.
fn handle_of(p: &FdParams, path: &str) -> Result<FileHandle> {
    let handle = sys::file_handle_of(&p.proc_path()).map_err(|e| {
        p.unsupported(&format!(
            "regular file {path}: its name was removed while other hard links remain, \
             and its filesystem gives no file handle to find it again by ({e})"
        ))
    })?;
    Ok(FileHandle {
        handle_type: handle.handle_type,
        bytes: handle.bytes,
    })
}

/// The data extents of the unlinked file `p` holds, up to `size`, and
/// their bytes one after another. Read with `O_NOATIME`, so the access
/// time saved (taken before) is also the one the file keeps.
fn read_extents(p: &FdParams, size: u64) -> Result<(Vec<GhostExtent>, Vec<u8>)> {
    let path = p.proc_path();
    let err = |source| DumpError::Proc {
        pid: p.pid,
        path: path.clone(),
        source,
    };
    let open = |flags| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(&path)
    };
    // O_NOATIME is for the file's owner (or CAP_FOWNER) only.
    let file = match open(libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(0),
        other => other,
    }
    .map_err(err)?;
    let extents = data_extents(&file, size).map_err(err)?;
    let total: u64 = extents.iter().map(|e| e.len).sum();
    let mut data = vec![0; total as usize];
    let mut at = 0;
    for e in &extents {
        let end = at + e.len as usize;
        file.read_exact_at(&mut data[at..end], e.offset)
            .map_err(err)?;
        at = end;
    }
    Ok((extents, data))
}

/// Where `file` has data below `size`, as SEEK_DATA and SEEK_HOLE tell
/// (a filesystem without holes reports the whole file as data).
fn data_extents(file: &std::fs::File, size: u64) -> std::io::Result<Vec<GhostExtent>> {
    let fd = file.as_raw_fd();
    let mut extents = Vec::new();
    let mut off = 0;
    while off < size {
        let Some(data) = sys::seek(fd, off, libc::SEEK_DATA)? else {
            break;
        };
        if data >= size {
            break;
        }
        let hole = sys::seek(fd, data, libc::SEEK_HOLE)?
            .unwrap_or(size)
            .min(size);
        extents.push(GhostExtent {
            offset: data,
            len: hole - data,
        });
        off = hole;
    }
    Ok(extents)
}
