//! FIFOs (named pipes): a FIFO is a file of the user's filesystem, so
//! restore never creates one; it must still exist at its path with the
//! recorded type, owner, group and mode (and inode on the dumping host),
//! or the restore fails naming pid, fd and path.
//!
//! The process reopens it itself, with its own filesystem identity and
//! `O_NOFOLLOW`, as for regular files. Opening one end of a FIFO blocks
//! until the other end is open, so (as CRIU does) a write end is first
//! opened `O_RDWR` (which never blocks), the buffered data is refilled
//! while that reader exists, and the dumped access mode is then taken by
//! reopening `/proc/self/fd/N`; a read end is opened `O_RDONLY |
//! O_NONBLOCK`, which never blocks either. The file status flags are the
//! dumped ones at the end.
//!
//! A FIFO unlinked while open is made again, as CRIU does for ghost
//! files: see [`ghost`].
//!
//! The data buffered at dump time is written back once per FIFO, by the
//! first description restored. If the other end was outside the tree, the
//! outside peer reopens the FIFO by path and finds that data there.

use std::collections::HashSet;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;

use ckpt_image::fd::File;
use ckpt_image::fd::fifo::FifoFile;
use ckpt_parasite::ParasiteError;
use ckpt_parasite::remote::Remote;
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, fcntl};

mod ghost;

use super::{Context, FileRestorer, set_status_flags};
use crate::error::{RestoreError, Result};
use crate::identity::{Contents, Expected, Inode, PERMISSION_BITS};

/// FIFOs (named pipes).
pub struct Fifo;

/// The FIFOs whose buffered data was already written back, by data image.
#[derive(Default)]
struct Refilled(HashSet<String>);

/// The access-mode bits of open(2) flags.
const ACCESS_MODE: i32 = libc::O_ACCMODE;

impl FileRestorer for Fifo {
    type Image = FifoFile;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &FifoFile,
        fd: i32,
    ) -> Result<i32> {
        if image.unlinked {
            return ghost::open(cx, r, file, image, fd);
        }
        let pid = cx.pid();
        let changed = |what: String| RestoreError::fd_changed(pid, fd, &image.path, what);
        let dumped_access = file.flags as i32 & ACCESS_MODE;
        // Neither open blocks: O_RDWR is a reader and a writer at once, and
        // a non-blocking read open never waits for a writer.
        let first_access = if dumped_access == libc::O_RDONLY {
            libc::O_RDONLY
        } else {
            libc::O_RDWR
        };
        let flags = first_access | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let got = r
            .open(&image.path, flags, 0)
            .map_err(|e| changed(open_failure(e, image, cx.fs_uid())))?;
        let done = settle(cx, r, file, image, got, dumped_access).map_err(|e| match e {
            Settle::Mismatch(what) => changed(what),
            Settle::Failed(e) => e,
        });
        match done {
            Ok(final_fd) => Ok(final_fd),
            Err(e) => {
                let _ = r.close(got);
                Err(e)
            }
        }
    }
}

/// Why a reopened FIFO could not be made the description the process had.
enum Settle {
    /// It is not the FIFO the process had.
    Mismatch(String),
    /// Something else failed.
    Failed(RestoreError),
}

impl From<RestoreError> for Settle {
    fn from(e: RestoreError) -> Self {
        Settle::Failed(e)
    }
}

impl From<ParasiteError> for Settle {
    fn from(e: ParasiteError) -> Self {
        Settle::Failed(e.into())
    }
}

/// Checks the FIFO opened at `got`, refills it if it is the first of its
/// FIFO, gives it the dumped access mode and status flags; returns the
/// process's fd of the final description.
fn settle(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    file: &File,
    image: &FifoFile,
    got: i32,
    dumped_access: i32,
) -> std::result::Result<i32, Settle> {
    let pid = cx.pid();
    let opened = std::path::PathBuf::from(format!("/proc/{pid}/fd/{got}"));
    let want = Expected {
        mode: image.mode,
        uid: image.uid,
        gid: image.gid,
        inode: Inode {
            dev: image.dev,
            ino: image.ino,
        },
        contents: Contents::Any,
    };
    cx.shared
        .checks
        .verify(&opened, &want)
        .map_err(|m| Settle::Mismatch(m.0))?;
    finish(cx, r, file, image, got, dumped_access)
}

/// Refills the FIFO opened at `got` if it is the first of its FIFO, gives
/// it the dumped access mode and status flags; returns the process's fd
/// of the final description.
fn finish(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    file: &File,
    image: &FifoFile,
    got: i32,
    dumped_access: i32,
) -> std::result::Result<i32, Settle> {
    let pid = cx.pid();
    let opened = std::path::PathBuf::from(format!("/proc/{pid}/fd/{got}"));
    if !cx.state::<Refilled>().0.contains(&image.data) {
        refill(cx, image, &opened)?;
        cx.state::<Refilled>().0.insert(image.data.clone());
    }
    let fd = if dumped_access == libc::O_WRONLY {
        // The O_RDWR description is a reader, so this write open does not
        // fail with ENXIO; /proc/self/fd is a magic link the kernel
        // resolves to the same FIFO (O_NOFOLLOW would refuse it), and the
        // open checks the process's own permission again.
        let proc_link = format!("/proc/self/fd/{got}");
        let reopened = r.open(
            &proc_link,
            libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
            0,
        )?;
        r.close(got)?;
        reopened
    } else {
        got
    };
    set_status_flags(r, fd, file.flags)?;
    Ok(fd)
}

/// Sets the FIFO's capacity and writes back what was buffered in it, from
/// the restorer, through the process's open description (which is a
/// reader, so the write open does not block or fail).
fn refill(
    cx: &Context<'_, '_>,
    image: &FifoFile,
    opened: &std::path::Path,
) -> std::result::Result<(), Settle> {
    let pid = cx.pid();
    let err = |what: &str, e: std::io::Error| {
        Settle::Failed(RestoreError::File {
            pid,
            path: image.path.clone(),
            what: format!("FIFO: {what}: {e}"),
        })
    };
    let data = cx
        .shared
        .images
        .read_raw(&image.data)
        .map_err(RestoreError::from)?;
    if data.len() as u64 > u64::from(image.capacity) {
        return Err(Settle::Failed(RestoreError::File {
            pid,
            path: image.path.clone(),
            what: format!(
                "{} holds {} bytes, more than the FIFO's capacity {}",
                image.data,
                data.len(),
                image.capacity
            ),
        }));
    }
    let mut w = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(opened)
        .map_err(|e| err("open for refill", e))?;
    if image.capacity > 0 {
        fcntl(
            w.as_fd(),
            FcntlArg::F_SETPIPE_SZ(image.capacity as libc::c_int),
        )
        .map_err(|e| err("F_SETPIPE_SZ", e.into()))?;
    }
    // It fit in the FIFO before; if it does not now, someone outside put
    // data in it since, and the order of bytes could not be kept.
    w.write_all(&data).map_err(|e| {
        err(
            "refill the data buffered at dump time (written to it since the dump?)",
            e,
        )
    })?;
    Ok(())
}

/// Says why the reopen failed in terms of what probably happened: a FIFO
/// that is gone gets the recipe to recreate it, as ckpt never does.
fn open_failure(e: ParasiteError, image: &FifoFile, fs_uid: Option<u32>) -> String {
    match &e {
        ParasiteError::RemoteOpen {
            errno: Errno::ENOENT,
            ..
        } => format!(
            "the FIFO is gone since the dump; ckpt does not create it: recreate it (mkfifo, owner {}:{}, mode {:04o}) and restore again",
            image.uid,
            image.gid,
            image.mode & PERMISSION_BITS
        ),
        _ => super::reg::reopen_failure(e, " the FIFO", fs_uid),
    }
}
