//! Rebuilding the fd table at the same numbers, flags and offsets.
//!
//! Terminal rule: a terminal fd N is connected to whatever the restorer's
//! own fd N is (the child inherited the restorer's table), so a program's
//! output appears where `ckpt restore` runs; if the restorer has no fd N,
//! /dev/null is used. Unlinked files are recreated from their ghost image
//! next to the original path, opened, and unlinked again.

use std::collections::HashSet;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use ckpt_image::ImageDir;
use ckpt_image::files::{FdEntry, FdKind, Files};

pub mod pipe;

use crate::error::{RestoreError, Result};
use crate::remote::Remote;
use pipe::PipeTable;

/// Removes ghost files still linked if the restore fails halfway.
#[derive(Default)]
pub struct GhostCleanup(Vec<PathBuf>);

impl Drop for GhostCleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Rebuilds the fd table of the child from `files`.
pub fn restore(r: &Remote<'_>, files: &Files, images: &ImageDir, pipes: &PipeTable) -> Result<()> {
    let pid = r.t.pid();
    let inherited = inherited_fds(pid)?;
    let keep: HashSet<i32> = files
        .fds
        .iter()
        .filter(|e| e.kind == FdKind::Tty as i32 && inherited.contains(&e.fd))
        .map(|e| e.fd)
        .collect();
    for fd in inherited.iter().filter(|fd| !keep.contains(fd)) {
        r.close(*fd)?;
    }
    let mut ghosts = GhostCleanup::default();
    for e in &files.fds {
        let cloexec = if e.cloexec { libc::O_CLOEXEC } else { 0 };
        let kind = FdKind::try_from(e.kind).map_err(|_| bad(pid, e, "unknown fd kind"))?;
        if e.owner_pid != 0 && e.owner_pid != pid && kind != FdKind::Tty {
            // Shared with a process restored earlier (inherited over fork).
            let got = take_from(r, e.owner_pid, e.description as i32)?;
            if got != e.fd {
                dup_to(r, got, e.fd, cloexec)?;
                r.close(got)?;
            } else {
                set_cloexec(r, e.fd, e.cloexec)?;
            }
            continue;
        }
        // Terminals follow the terminal rule even when they shared one open
        // file description at dump time (0, 1 and 2 usually do).
        if e.description != e.fd as u64 && kind != FdKind::Tty {
            // Shares the open file description of an earlier fd.
            dup_to(r, e.description as i32, e.fd, cloexec)?;
            continue;
        }
        let open_flags = (e.flags as i32) & !(libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL);
        let tmp = match kind {
            FdKind::Pipe => {
                let got = take_from(r, std::process::id() as i32, pipes.end_for(pid, e)?)?;
                // File status flags belong to the description: set ours.
                r.call(
                    "fcntl(F_SETFL)",
                    libc::SYS_fcntl,
                    [
                        got as u64,
                        libc::F_SETFL as u64,
                        (open_flags & libc::O_NONBLOCK) as u64,
                        0,
                        0,
                        0,
                    ],
                )?;
                if got == e.fd {
                    set_cloexec(r, e.fd, e.cloexec)?;
                    continue;
                }
                got
            }
            FdKind::Tty if keep.contains(&e.fd) => {
                set_cloexec(r, e.fd, e.cloexec)?;
                continue;
            }
            FdKind::Tty => r.open("/dev/null", open_flags | cloexec, 0)?,
            FdKind::Regular | FdKind::CharDevice => r.open(&e.path, open_flags | cloexec, 0)?,
            FdKind::Directory => r.open(&e.path, open_flags | libc::O_DIRECTORY | cloexec, 0)?,
            FdKind::Unlinked => {
                let path = recreate_ghost(pid, e, images, &mut ghosts)?;
                let fd = r.open(&path, open_flags | cloexec, 0);
                let _ = std::fs::remove_file(&path);
                ghosts.0.retain(|p| p.to_str() != Some(path.as_str()));
                fd?
            }
        };
        if tmp != e.fd {
            dup_to(r, tmp, e.fd, cloexec)?;
            r.close(tmp)?;
        }
        if matches!(kind, FdKind::Regular | FdKind::Unlinked | FdKind::Directory) {
            r.call(
                "lseek",
                libc::SYS_lseek,
                [e.fd as u64, e.pos as u64, libc::SEEK_SET as u64, 0, 0, 0],
            )?;
        }
    }
    Ok(())
}

/// Copies fd `fd` of process `owner` into the process behind `r`
/// (pidfd_open + pidfd_getfd, run inside it): the same open file
/// description, offset included.
fn take_from(r: &Remote<'_>, owner: i32, fd: i32) -> Result<i32> {
    let pidfd = r.call(
        "pidfd_open",
        libc::SYS_pidfd_open,
        [owner as u64, 0, 0, 0, 0, 0],
    )? as i32;
    let got = r.call(
        "pidfd_getfd",
        libc::SYS_pidfd_getfd,
        [pidfd as u64, fd as u64, 0, 0, 0, 0],
    );
    r.close(pidfd)?;
    Ok(got? as i32)
}

/// Sets or clears FD_CLOEXEC on `fd`.
fn set_cloexec(r: &Remote<'_>, fd: i32, cloexec: bool) -> Result<()> {
    r.call(
        "fcntl(F_SETFD)",
        libc::SYS_fcntl,
        [fd as u64, libc::F_SETFD as u64, cloexec as u64, 0, 0, 0],
    )?;
    Ok(())
}

fn dup_to(r: &Remote<'_>, from: i32, to: i32, cloexec: i32) -> Result<()> {
    r.call(
        "dup3",
        libc::SYS_dup3,
        [from as u64, to as u64, cloexec as u64, 0, 0, 0],
    )?;
    Ok(())
}

fn inherited_fds(pid: i32) -> Result<Vec<i32>> {
    let dir = format!("/proc/{pid}/fd");
    let rd =
        std::fs::read_dir(&dir).map_err(|e| RestoreError::os(pid, format!("read {dir}"), e))?;
    Ok(rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}

/// Writes the ghost image next to the original path and returns the path
/// the child should open.
fn recreate_ghost(
    pid: i32,
    e: &FdEntry,
    images: &ImageDir,
    cleanup: &mut GhostCleanup,
) -> Result<String> {
    let data = images.read_raw(&e.ghost)?;
    let mut path = PathBuf::from(&e.path);
    if path.symlink_metadata().is_ok() {
        path = PathBuf::from(format!("{}.ckpt-ghost.{}", e.path, std::process::id()));
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(e.mode & 0o7777)
        .open(&path)
        .map_err(|err| RestoreError::File {
            pid,
            path: path.display().to_string(),
            what: format!("cannot recreate unlinked file: {err}"),
        })?;
    cleanup.0.push(path.clone());
    f.write_all(&data).map_err(|err| RestoreError::File {
        pid,
        path: path.display().to_string(),
        what: format!("cannot write unlinked file's contents: {err}"),
    })?;
    Ok(path.display().to_string())
}

fn bad(pid: i32, e: &FdEntry, what: &str) -> RestoreError {
    RestoreError::Image(ckpt_image::ImageError::Invalid {
        path: ckpt_image::files_name(pid).into(),
        what: format!("fd {}: {what}", e.fd),
    })
}
