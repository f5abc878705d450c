//! Stateless character devices, reopened by path and checked to be the
//! same device number. A node unlinked while
//! open (`mknod /tmp/x c 1 3`, opened, removed) has no path left: a node
//! of the same device number is made again beside the dumped path by the
//! restorer (`mknod` wants CAP_MKNOD, which no ordinary user has), inside
//! the directory the process itself opened (so only one its user could
//! reach, never through a link in the last component), only if the
//! process's user could have opened the node with its access mode, and
//! only for the devices this kind claims; it is opened, checked to be the
//! node made, given its owner and mode, unlinked, and handed over.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use ckpt_image::fd::File;
use ckpt_image::fd::dev::DevFile;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag};

use super::{Context, FileRestorer, reopen_flags, take_from};
use crate::error::{RestoreError, Result};
use ckpt_parasite::remote::Remote;

/// `/dev/null`, `zero`, `full`, `random`, `urandom`.
pub struct Dev;

impl FileRestorer for Dev {
    type Image = DevFile;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &DevFile,
        fd: i32,
    ) -> Result<i32> {
        if image.deleted {
            return recreate(cx, r, file, image, fd);
        }
        let got = r.open(&image.path, reopen_flags(file), 0)?;
        // Whatever is at the path now must be that device.
        let pid = cx.pid();
        let same = std::fs::metadata(format!("/proc/{pid}/fd/{got}"))
            .is_ok_and(|m| m.mode() & libc::S_IFMT == libc::S_IFCHR && m.rdev() == image.rdev);
        if !same {
            let _ = r.close(got);
            return Err(RestoreError::fd_changed(
                pid,
                fd,
                &image.path,
                format!(
                    "is no longer the character device {}:{}",
                    libc::major(image.rdev),
                    libc::minor(image.rdev)
                ),
            ));
        }
        Ok(got)
    }
}

/// Permission bits of a mode.
const PERMISSION_BITS: u32 = 0o7777;
/// Mode the node has until it is complete: root's only.
const PRIVATE_MODE: u32 = 0o600;

/// Makes the unlinked node of `image` again and gives the process an fd
/// of it with the dumped flags (see the module documentation).
fn recreate(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    file: &File,
    image: &DevFile,
    fd: i32,
) -> Result<i32> {
    let pid = cx.pid();
    let refused = |what: String| RestoreError::fd_changed(pid, fd, &image.path, what);
    let flags = reopen_flags(file);
    log::debug!(
        "pid {pid}: fd {fd}: device node {} unlinked while open (mode {:o}, owner {}:{}), made again",
        image.path,
        image.mode,
        image.uid,
        image.gid
    );
    if let Some(fs) = cx.fs_identity()
        && !fs.may_open(image.uid, image.gid, image.mode, flags)
    {
        return Err(refused(format!(
            "device node unlinked while open (mode {:o}, owner {}:{}), which the process's user \
             (uid {}) could not have opened: not made again",
            image.mode & PERMISSION_BITS,
            image.uid,
            image.gid,
            fs.uid()
        )));
    }
    let p = Path::new(&image.path);
    let (Some(parent), Some(name)) = (
        p.parent().and_then(|d| d.to_str()),
        p.file_name().and_then(|n| n.to_str()),
    ) else {
        return Err(refused(
            "device node unlinked while open: its path names no file".into(),
        ));
    };
    let theirs = r
        .open(
            parent,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        )
        .map_err(|e| {
            refused(format!(
                "cannot open the directory of the unlinked device node: {e}"
            ))
        })?;
    let dir = nix::fcntl::open(
        format!("/proc/{pid}/fd/{theirs}").as_str(),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    );
    r.close(theirs)?;
    let dir = dir.map_err(|e| {
        refused(format!(
            "cannot open the directory of the unlinked device node: {e}"
        ))
    })?;
    let node = make_open_unlink(&dir, name, image, flags).map_err(refused)?;
    take_from(r, std::process::id() as i32, node.as_raw_fd())
}

/// In `dir`: makes the node as `name` (or `NAME.ckpt-ghost.N` beside it
/// when taken), opens it with `flags`, checks it is the node just made,
/// gives it its owner and mode, and unlinks it. `Err` says why not; the
/// name is gone either way.
fn make_open_unlink(
    dir: &OwnedFd,
    name: &str,
    image: &DevFile,
    flags: i32,
) -> std::result::Result<OwnedFd, String> {
    let alternative = format!("{name}.ckpt-ghost.{}", std::process::id());
    let mut made = None;
    for candidate in [name, alternative.as_str()] {
        match nix::sys::stat::mknodat(
            dir.as_fd(),
            candidate,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(PRIVATE_MODE),
            image.rdev,
        ) {
            Ok(()) => {
                made = Some(candidate);
                break;
            }
            Err(nix::errno::Errno::EEXIST) => continue,
            Err(e) => return Err(format!("cannot make the unlinked device node again: {e}")),
        }
    }
    let Some(made) = made else {
        return Err(
            "cannot make the unlinked device node again: its name and the one beside it are taken"
                .into(),
        );
    };
    let opened = open_made(dir, made, image, flags);
    let named = nix::sys::stat::fstatat(dir.as_fd(), made, AtFlags::AT_SYMLINK_NOFOLLOW);
    let ours = match (&opened, &named) {
        (Ok(node), Ok(st)) => node
            .metadata()
            .is_ok_and(|m| (m.dev(), m.ino()) == (st.st_dev, st.st_ino)),
        _ => false,
    };
    // Only the node made is unlinked: a name replaced meanwhile is left.
    if ours || opened.is_err() && named.is_ok_and(|st| st.st_uid == 0 && st.st_nlink == 1) {
        nix::unistd::unlinkat(dir.as_fd(), made, nix::unistd::UnlinkatFlags::NoRemoveDir)
            .map_err(|e| format!("cannot unlink the device node made again: {e}"))?;
    }
    let node = opened?;
    if !ours {
        return Err("the device node made again was replaced before ckpt could unlink it".into());
    }
    Ok(node.into())
}

/// Opens the node just made as `name` in `dir` with `flags`, checks it is
/// a root-owned character device of the recorded number with one link,
/// and gives it the recorded owner and, last, mode.
fn open_made(
    dir: &OwnedFd,
    name: &str,
    image: &DevFile,
    flags: i32,
) -> std::result::Result<std::fs::File, String> {
    // O_NONBLOCK: a FIFO put there meanwhile must not block the open.
    let node: std::fs::File = nix::fcntl::openat(
        dir.as_fd(),
        name,
        OFlag::from_bits_retain(flags) | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open the device node made again: {e}"))?
    .into();
    let m = node
        .metadata()
        .map_err(|e| format!("cannot stat the device node made again: {e}"))?;
    if m.mode() & libc::S_IFMT != libc::S_IFCHR
        || m.rdev() != image.rdev
        || m.uid() != 0
        || m.nlink() != 1
    {
        return Err("what was opened is not the device node ckpt made".into());
    }
    if flags & libc::O_NONBLOCK == 0 {
        nix::fcntl::fcntl(
            &node,
            nix::fcntl::FcntlArg::F_SETFL(OFlag::from_bits_retain(flags)),
        )
        .map_err(|e| format!("cannot set the device node's flags: {e}"))?;
    }
    std::os::unix::fs::fchown(&node, Some(image.uid), Some(image.gid))
        .map_err(|e| format!("cannot give the device node its owner: {e}"))?;
    nix::sys::stat::fchmod(
        &node,
        Mode::from_bits_truncate(image.mode & PERMISSION_BITS),
    )
    .map_err(|e| format!("cannot give the device node its mode: {e}"))?;
    Ok(node)
}
