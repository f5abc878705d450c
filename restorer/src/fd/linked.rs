//! Regular files one of whose hard links was removed while open, and which
//! live on under another name: no name is left to reopen, and recreating
//! the file from a copy would split it from its other links. The dump
//! saved its file handle; on the dumping host the restorer opens the file
//! by it (`O_PATH`, through a directory of the process's own view on the
//! same filesystem), checks it is the recorded inode, and hands it to the
//! process, which reopens it through `/proc/self/fd` with its own
//! credentials and the dumped flags: its own rights on the file decide,
//! as for any reopen. The handle skips the directory permissions a path
//! is checked against, so this is done only when ckpt restores as itself,
//! never for a user of the ckpt service.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use ckpt_image::fd::File;
use ckpt_image::fd::reg::{FileHandle, RegFile};
use ckpt_parasite::remote::Remote;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::reg::{expected, reopen_failure};
use super::{Context, reopen_flags, take_from};
use crate::error::{RestoreError, Result};
use crate::sys;

/// Opens again, as fd of the process, the file of `image` found by
/// `handle` (see the module documentation).
pub(super) fn reopen(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    file: &File,
    image: &RegFile,
    handle: &FileHandle,
    fd: i32,
) -> Result<i32> {
    let pid = cx.pid();
    let changed = |what: String| RestoreError::fd_changed(pid, fd, &image.path, what);
    if ckpt_image::caller::acting_for().is_some() {
        return Err(changed(
            "its name was removed while other hard links remain: it is found again by its \
             file handle, which skips the directory permissions a path is checked against, \
             so only when ckpt restores as itself, not for a user of the ckpt service"
                .into(),
        ));
    }
    if !cx.shared.checks.same_host {
        return Err(changed(
            "its name was removed while other hard links remain: it is found again by its \
             file handle, which names that file on the host of the dump only"
                .into(),
        ));
    }
    let mount = mount_of(r, pid, image).map_err(&changed)?;
    let opened = sys::open_by_handle(mount.as_fd(), handle.handle_type, &handle.bytes)
        .map_err(|e| changed(format!("cannot open it by its file handle: {e}")))?;
    check_found(&opened, image).map_err(&changed)?;
    // Checked now: linking it under its name again moves its change time.
    let here = format!("/proc/self/fd/{}", opened.as_raw_fd());
    cx.shared
        .checks
        .verify(Path::new(&here), &expected(cx, file, image))
        .map_err(|m| changed(m.0))?;
    let path_fd = take_from(r, std::process::id() as i32, opened.as_raw_fd())?;
    let magic = format!("/proc/self/fd/{path_fd}");
    let got = match relink_and_open(r, image, &magic, reopen_flags(file)) {
        Ok(got) => Ok(got),
        Err(why) => {
            (cx.shared.options.notice)(&format!(
                "pid {pid} fd {fd}: {} reopened through another of its names ({why})",
                image.path
            ));
            // Through the magic link, the kernel checks the process's own
            // credentials against the file, as an open by name would.
            r.open(&magic, reopen_flags(file), 0)
                .map_err(|e| changed(reopen_failure(e, "", cx.fs_uid())))
        }
    };
    r.close(path_fd)?;
    let got = got?;
    let same = std::fs::metadata(format!("/proc/{pid}/fd/{got}"))
        .is_ok_and(|m| (m.dev(), m.ino()) == (image.dev, image.ino));
    if !same {
        let _ = r.close(got);
        return Err(changed(
            "what its name led to when reopened is another file".into(),
        ));
    }
    Ok(got)
}

/// Links the file (open in the process as `magic`, a `/proc/self/fd` link)
/// under its removed name again (or `NAME.ckpt-ghost.N` beside it when
/// that is taken), opens it there with `flags` and removes the name
/// again, all as the process, so the fd reads as it did (`PATH
/// (deleted)`). `Err` says why not; nothing is left behind then.
fn relink_and_open(
    r: &Remote<'_>,
    image: &RegFile,
    magic: &str,
    flags: i32,
) -> std::result::Result<i32, String> {
    let p = Path::new(&image.path);
    let (Some(parent), Some(name)) = (
        p.parent().and_then(|d| d.to_str()),
        p.file_name().and_then(|n| n.to_str()),
    ) else {
        return Err("its path names no file".into());
    };
    let dir_fd = r
        .open(
            parent,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        )
        .map_err(|e| format!("cannot open its directory: {e}"))?;
    let result = relink_in(r, dir_fd, name, magic, flags);
    let _ = r.close(dir_fd);
    result
}

/// [`relink_and_open`] inside the directory `dir_fd` of the process.
fn relink_in(
    r: &Remote<'_>,
    dir_fd: i32,
    name: &str,
    magic: &str,
    flags: i32,
) -> std::result::Result<i32, String> {
    let alternative = format!("{name}.ckpt-ghost.{}", std::process::id());
    let mut linked = None;
    for candidate in [name, alternative.as_str()] {
        let from = r.put_path(0, magic).map_err(|e| e.to_string())?;
        let to = r.put_path(1, candidate).map_err(|e| e.to_string())?;
        match r.call(
            "linkat (removed name)",
            libc::SYS_linkat,
            [
                libc::AT_FDCWD as u64,
                from,
                dir_fd as u64,
                to,
                libc::AT_SYMLINK_FOLLOW as u64,
                0,
            ],
        ) {
            Ok(_) => {
                linked = Some(candidate);
                break;
            }
            Err(ckpt_parasite::ParasiteError::RemoteSyscall {
                errno: nix::errno::Errno::EEXIST,
                ..
            }) => continue,
            Err(e) => return Err(format!("cannot link it under its name again: {e}")),
        }
    }
    let Some(linked) = linked else {
        return Err("its name and the one beside it are taken".into());
    };
    let at = r.put_path(0, linked).map_err(|e| e.to_string())?;
    let opened = r.call(
        "openat (removed name)",
        libc::SYS_openat,
        [
            dir_fd as u64,
            at,
            (flags | libc::O_NOFOLLOW) as u64,
            0,
            0,
            0,
        ],
    );
    // Whatever happened, the name goes again.
    let at = r.put_path(0, linked).map_err(|e| e.to_string())?;
    let unlinked = r.call(
        "unlinkat (removed name)",
        libc::SYS_unlinkat,
        [dir_fd as u64, at, 0, 0, 0, 0],
    );
    let got = opened.map_err(|e| format!("cannot open it under its name again: {e}"))? as i32;
    if let Err(e) = unlinked {
        let _ = r.close(got);
        return Err(format!("cannot remove its name again: {e}"));
    }
    Ok(got)
}

/// An `O_PATH` fd, in the restorer, of the nearest directory above
/// `image`'s path that is on its filesystem, as the process sees it (it
/// opens each, the restorer takes it through `/proc`): the filesystem a
/// file handle is decoded on. Which directory it is matters not: what is
/// opened by the handle is checked to be the recorded inode.
fn mount_of(r: &Remote<'_>, pid: i32, image: &RegFile) -> std::result::Result<OwnedFd, String> {
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
    for dir in Path::new(&image.path).ancestors().skip(1) {
        let Some(dir) = dir.to_str().filter(|d| !d.is_empty()) else {
            continue;
        };
        let Ok(theirs) = r.open(dir, flags, 0) else {
            continue;
        };
        // open_by_handle_at takes no O_PATH fd for the filesystem.
        let here = nix::fcntl::open(
            format!("/proc/{pid}/fd/{theirs}").as_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        );
        r.close(theirs).map_err(|e| e.to_string())?;
        let Ok(here) = here else {
            continue;
        };
        if nix::sys::stat::fstat(&here).is_ok_and(|st| st.st_dev == image.dev) {
            return Ok(here);
        }
    }
    Err(
        "its name was removed while other hard links remain, and no directory above it is \
         on its filesystem any more to find it again by its file handle"
            .into(),
    )
}

/// Checks the file opened by handle is the recorded regular file, still
/// linked somewhere.
fn check_found(opened: &OwnedFd, image: &RegFile) -> std::result::Result<(), String> {
    let st = nix::sys::stat::fstat(opened).map_err(|e| format!("cannot stat it: {e}"))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG
        || (st.st_dev, st.st_ino) != (image.dev, image.ino)
    {
        return Err("its file handle now leads to another file".into());
    }
    if st.st_nlink == 0 {
        return Err("its other hard links were removed since the dump".into());
    }
    Ok(())
}
