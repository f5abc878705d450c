//! Creating files on restore (unlinked files' ghosts now; FIFOs and socket
//! paths later) without ever making one the dumped user could not have
//! made, and without a moment where the file is setuid-root or open to
//! others.
//!
//! The name is created by the restored process itself while it holds the
//! dumped filesystem identity (`creds`), so it lands only where that user
//! may create files: the parent directory is opened with `O_NOFOLLOW`
//! (symbolic links higher up the path are the user's own business; the last
//! component decides where the file goes), the file with
//! `O_CREAT | O_EXCL | O_NOFOLLOW` and mode 0600 inside that directory fd.
//! The restorer then takes it through `/proc/PID/fd/N` and gives it the
//! recorded owner and group (`fchown`), its contents, and its recorded mode
//! last (`fchmod`), since a `chown` clears setuid bits and the mode must
//! not open the file to anyone before it holds the right owner.

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ckpt_image::fd::reg::GhostExtent;
use ckpt_parasite::ParasiteError;
use ckpt_parasite::remote::Remote;
use nix::errno::Errno;

use super::creds::FsIdentity;
use crate::error::{RestoreError, Result};
use crate::identity::PERMISSION_BITS;

/// Owner, group and permission bits a created file must end up with.
pub struct Ownership {
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Permission bits (setuid, setgid, sticky, rwx).
    pub mode: u32,
}

/// A file just created inside the process, still linked under `name` in
/// the directory `dir_fd` (both fds of the process).
pub struct Created {
    pid: i32,
    dir_fd: i32,
    /// The process's fd of the new file (read-write).
    pub fd: i32,
    name: String,
    /// Where it was created.
    pub path: String,
}

/// Mode the file has until it is complete: the creating user only.
const PRIVATE_MODE: u64 = 0o600;

/// Refuses to recreate, for a process of identity `fs`, a file it could
/// not have made its own: owned by another user or a group not its own
/// (see [`FsIdentity::may_own`]). No identity (an image without
/// credentials): the restorer's own rules apply, as for any file of it.
pub fn check_owner(fs: Option<&FsIdentity>, pid: i32, path: &str, own: &Ownership) -> Result<()> {
    match fs {
        Some(fs) if !fs.may_own(own.uid, own.gid) => Err(RestoreError::File {
            pid,
            path: path.to_string(),
            what: format!(
                "was owned by {}:{}, not by the process's own user (uid {}) and groups: \
                 a gone file is recreated only for its own user, refused",
                own.uid,
                own.gid,
                fs.uid()
            ),
        }),
        _ => Ok(()),
    }
}

/// Creates an empty regular file at `path`, or beside it (`PATH.ckpt-ghost.N`)
/// when that name is taken, inside the process behind `r` with its current
/// filesystem identity.
pub fn create_exclusive(r: &Remote<'_>, path: &str) -> Result<Created> {
    let pid = r.t.pid();
    let err = |what: String| RestoreError::File {
        pid,
        path: path.to_string(),
        what,
    };
    let p = Path::new(path);
    let (Some(parent), Some(name)) = (p.parent(), p.file_name().and_then(|n| n.to_str())) else {
        return Err(err("cannot recreate: not a path to a file".into()));
    };
    let parent = parent.to_str().unwrap_or("/");
    let dir_fd = r
        .open(
            parent,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        )
        .map_err(|e| err(format!("cannot open its directory to recreate it: {e}")))?;
    let alternative = format!("{name}.ckpt-ghost.{}", std::process::id());
    let mut last = None;
    for candidate in [name, alternative.as_str()] {
        match create_at(r, dir_fd, candidate) {
            Ok(fd) => {
                return Ok(Created {
                    pid,
                    dir_fd,
                    fd,
                    name: candidate.to_string(),
                    path: format!("{}/{candidate}", parent.trim_end_matches('/')),
                });
            }
            Err(e)
                if matches!(
                    e,
                    ParasiteError::RemoteSyscall {
                        errno: Errno::EEXIST,
                        ..
                    }
                ) =>
            {
                last = Some(e);
            }
            Err(e) => {
                last = Some(e);
                break;
            }
        }
    }
    let _ = r.close(dir_fd);
    Err(err(format!(
        "cannot recreate: {}",
        last.map_or_else(String::new, |e| e.to_string())
    )))
}

fn create_at(r: &Remote<'_>, dir_fd: i32, name: &str) -> std::result::Result<i32, ParasiteError> {
    let p = r.put_path(0, name)?;
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_RDWR | libc::O_CLOEXEC;
    r.call(
        "openat (create)",
        libc::SYS_openat,
        [dir_fd as u64, p, flags as u64, PRIVATE_MODE, 0, 0],
    )
    .map(|fd| fd as i32)
}

impl Created {
    fn proc_fd(&self, fd: i32) -> PathBuf {
        PathBuf::from(format!("/proc/{}/fd/{fd}", self.pid))
    }

    fn err(&self, what: String) -> RestoreError {
        RestoreError::File {
            pid: self.pid,
            path: self.path.clone(),
            what,
        }
    }

    /// Opens the new file in the restorer, checking it is the empty regular
    /// file just created (one link, owned by `creator`).
    pub fn open_here(&self, creator: u32) -> Result<std::fs::File> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.proc_fd(self.fd))
            .map_err(|e| self.err(format!("cannot open the recreated file: {e}")))?;
        let m = f
            .metadata()
            .map_err(|e| self.err(format!("cannot stat the recreated file: {e}")))?;
        if !m.is_file() || m.nlink() != 1 || m.len() != 0 || m.uid() != creator {
            return Err(self.err("the recreated file is not the one ckpt created".into()));
        }
        Ok(f)
    }

    /// Removes the name again (the file stays open), after checking the
    /// name still points at the file created.
    pub fn unlink(&self, r: &Remote<'_>, file: &std::fs::File) -> Result<()> {
        let ours = file
            .metadata()
            .map_err(|e| self.err(format!("cannot stat the recreated file: {e}")))?;
        let named = std::fs::symlink_metadata(self.proc_fd(self.dir_fd).join(&self.name))
            .map_err(|e| self.err(format!("the recreated file's name is gone: {e}")))?;
        if (named.dev(), named.ino()) != (ours.dev(), ours.ino()) {
            return Err(self.err(
                "the recreated file was renamed or replaced before ckpt could unlink it".into(),
            ));
        }
        let p = r.put_path(0, &self.name)?;
        r.call(
            "unlinkat (recreated file)",
            libc::SYS_unlinkat,
            [self.dir_fd as u64, p, 0, 0, 0, 0],
        )?;
        Ok(())
    }

    /// Removes the name of a file that could not be completed (as the
    /// process's filesystem identity, inside the directory it was made in).
    pub fn discard(&self, r: &Remote<'_>) -> Result<()> {
        let p = r.put_path(0, &self.name)?;
        r.call(
            "unlinkat (incomplete file)",
            libc::SYS_unlinkat,
            [self.dir_fd as u64, p, 0, 0, 0, 0],
        )?;
        Ok(())
    }

    /// Closes the process's fds of the file and its directory.
    pub fn close(self, r: &Remote<'_>) -> Result<()> {
        r.close(self.fd)?;
        r.close(self.dir_fd)?;
        Ok(())
    }
}

/// What a recreated file holds.
pub enum Filling<'a> {
    /// All its bytes, from offset 0.
    Whole(&'a [u8]),
    /// A file of `size` bytes with `data` at `extents` (their bytes one
    /// after another) and holes everywhere else.
    Sparse {
        /// Its length.
        size: u64,
        /// Where the data goes, in order.
        extents: &'a [GhostExtent],
        /// The extents' bytes.
        data: &'a [u8],
    },
}

/// A file's access and modification times.
pub struct Times {
    /// Last access, nanoseconds since the epoch.
    pub atime_ns: i64,
    /// Last modification, likewise.
    pub mtime_ns: i64,
}

/// Gives a file ckpt created its owner, contents, times and, last, its
/// mode.
pub fn fill(
    file: &mut std::fs::File,
    own: &Ownership,
    contents: &Filling<'_>,
    times: &Times,
) -> std::io::Result<()> {
    std::os::unix::fs::fchown(file.as_fd(), Some(own.uid), Some(own.gid))?;
    match contents {
        Filling::Whole(data) => file.write_all(data)?,
        Filling::Sparse {
            size,
            extents,
            data,
        } => {
            // Set first, the length leaves every byte not written a hole.
            file.set_len(*size)?;
            let mut at = 0usize;
            for e in extents.iter() {
                let len = usize::try_from(e.len).map_err(std::io::Error::other)?;
                let bytes = data.get(at..at + len).ok_or_else(|| {
                    std::io::Error::other("the ghost image is shorter than its extents")
                })?;
                file.write_all_at(bytes, e.offset)?;
                at += len;
            }
            if at != data.len() {
                return Err(std::io::Error::other(
                    "the ghost image is longer than its extents",
                ));
            }
        }
    }
    file.set_permissions(std::fs::Permissions::from_mode(own.mode & PERMISSION_BITS))?;
    // Last: writing the contents moved the modification time.
    file.set_times(
        std::fs::FileTimes::new()
            .set_accessed(system_time(times.atime_ns))
            .set_modified(system_time(times.mtime_ns)),
    )
}

/// `ns` nanoseconds after (or, negative, before) the epoch.
fn system_time(ns: i64) -> std::time::SystemTime {
    let since = std::time::Duration::from_nanos(ns.unsigned_abs());
    if ns >= 0 {
        std::time::UNIX_EPOCH + since
    } else {
        std::time::UNIX_EPOCH - since
    }
}

/// Makes an empty directory like one removed while in use: at `path`, or
/// beside it (`PATH.ckpt-ghost.N`) when that name is taken, created by the
/// process behind `r` with its current filesystem identity (so only where
/// its user may create), opened there with `flags`, given `own`'s owner
/// and mode by the restorer, and removed again. Returns the process's fd
/// of it, which then reads as removed, as the dumped one did.
pub fn removed_dir(r: &Remote<'_>, path: &str, own: &Ownership, flags: i32) -> Result<i32> {
    let pid = r.t.pid();
    let err = |what: String| RestoreError::File {
        pid,
        path: path.to_string(),
        what,
    };
    let p = Path::new(path);
    let (Some(parent), Some(name)) = (p.parent(), p.file_name().and_then(|n| n.to_str())) else {
        return Err(err(
            "cannot make the removed directory again: not a path to one".into(),
        ));
    };
    let parent = parent.to_str().unwrap_or("/");
    let dir_fd = r
        .open(
            parent,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        )
        .map_err(|e| {
            err(format!(
                "cannot open its parent to make the removed directory again: {e}"
            ))
        })?;
    let made = mkdir_exclusive(r, dir_fd, name)
        .map_err(|e| err(format!("cannot make the removed directory again: {e}")));
    let result = made.and_then(|made| {
        let opened = open_made_dir(r, dir_fd, &made, own, flags);
        // Whatever happened, the name goes.
        let removed = remove_made_dir(r, dir_fd, &made);
        let fd = opened.map_err(|what| err(format!("{what} (made as {})", made)))?;
        if let Err(e) = removed {
            let _ = r.close(fd);
            return Err(err(format!("cannot remove the directory made again: {e}")));
        }
        Ok(fd)
    });
    let _ = r.close(dir_fd);
    result
}

/// `mkdirat(dir_fd, name, 0700)`, or `NAME.ckpt-ghost.N` beside it when
/// the name is taken; the name made.
fn mkdir_exclusive(
    r: &Remote<'_>,
    dir_fd: i32,
    name: &str,
) -> std::result::Result<String, ParasiteError> {
    let mkdir = |candidate: &str| {
        let p = r.put_path(0, candidate)?;
        r.call(
            "mkdirat (removed directory)",
            libc::SYS_mkdirat,
            [dir_fd as u64, p, PRIVATE_DIR_MODE, 0, 0, 0],
        )
        .map(|_| candidate.to_string())
    };
    match mkdir(name) {
        Err(ParasiteError::RemoteSyscall {
            errno: Errno::EEXIST,
            ..
        }) => mkdir(&format!("{name}.ckpt-ghost.{}", std::process::id())),
        other => other,
    }
}

/// Mode a directory made again has until it is complete.
const PRIVATE_DIR_MODE: u64 = 0o700;

/// Opens the directory just made as `name` in `dir_fd` with `flags`,
/// checks it is the empty one the process made, and gives it its owner
/// and, last, its mode.
fn open_made_dir(
    r: &Remote<'_>,
    dir_fd: i32,
    name: &str,
    own: &Ownership,
    flags: i32,
) -> std::result::Result<i32, String> {
    let p = r.put_path(0, name).map_err(|e| e.to_string())?;
    let flags = flags | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    let fd = r
        .call(
            "openat (removed directory)",
            libc::SYS_openat,
            [dir_fd as u64, p, flags as u64, 0, 0, 0],
        )
        .map_err(|e| format!("cannot open the directory made again: {e}"))? as i32;
    let finish = || -> std::result::Result<(), String> {
        // Through /proc the restorer reaches the very inode the process
        // holds (an O_PATH fd too), whatever the name points at now.
        let here = std::fs::File::open(format!("/proc/{}/fd/{fd}", r.t.pid()))
            .map_err(|e| format!("cannot open the directory made again: {e}"))?;
        let m = here
            .metadata()
            .map_err(|e| format!("cannot stat the directory made again: {e}"))?;
        let creator = r
            .call(
                "setfsuid (query)",
                libc::SYS_setfsuid,
                [u32::MAX as u64, 0, 0, 0, 0, 0],
            )
            .map_err(|e| e.to_string())? as u32;
        let named = std::fs::symlink_metadata(format!("/proc/{}/fd/{dir_fd}/{name}", r.t.pid()))
            .map_err(|e| format!("the directory made again is gone: {e}"))?;
        if !m.is_dir() || m.uid() != creator || (named.dev(), named.ino()) != (m.dev(), m.ino()) {
            return Err("the directory made again is not the one ckpt made".into());
        }
        std::os::unix::fs::fchown(here.as_fd(), Some(own.uid), Some(own.gid))
            .map_err(|e| format!("cannot give the directory made again its owner: {e}"))?;
        here.set_permissions(std::fs::Permissions::from_mode(own.mode & PERMISSION_BITS))
            .map_err(|e| format!("cannot give the directory made again its mode: {e}"))
    };
    if let Err(e) = finish() {
        let _ = r.close(fd);
        return Err(e);
    }
    Ok(fd)
}

/// Removes the directory made again (`unlinkat(AT_REMOVEDIR)`), as the
/// process, inside the directory it was made in.
fn remove_made_dir(
    r: &Remote<'_>,
    dir_fd: i32,
    name: &str,
) -> std::result::Result<(), ParasiteError> {
    let p = r.put_path(0, name)?;
    r.call(
        "unlinkat (removed directory)",
        libc::SYS_unlinkat,
        [dir_fd as u64, p, libc::AT_REMOVEDIR as u64, 0, 0, 0],
    )?;
    Ok(())
}
