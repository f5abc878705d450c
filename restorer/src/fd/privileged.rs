//! Files a process opened while it had more privilege than it has now: a
//! daemon that opens its root-owned 0600 log as root, then drops to its
//! user and keeps writing through the fd. Its own credentials cannot open
//! the file again, yet handing it over is giving back exactly what the
//! process held. So the restorer opens it as itself, under conditions
//! that make it that very file and nothing more:
//!
//! - the checkpoint is sealed with the site's key (every restore verifies
//!   the seal first; here it must be the site's own, not a key ckpt's
//!   service derived for a user), so the recorded identity is what ckpt
//!   saw at the dump, not what someone wrote into an image;
//! - the path is resolved without following a link a user controls
//!   ([`ckpt_image::TrustedParent`]), the last component with
//!   `O_NOFOLLOW`, and only a regular file is opened;
//! - what was opened has the recorded device and inode (so only on the
//!   dumping host), owner, group and mode, and its recorded size and times
//!   unless the user allowed it to change, checked on the open fd;
//! - the restorer sees the files the process sees (same mount namespace).
//!
//! Otherwise the reopen stays refused, saying why.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use ckpt_image::fd::File;
use ckpt_image::fd::reg::RegFile;
use ckpt_parasite::remote::Remote;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::{Context, reopen_flags, take_from};
use crate::identity::Expected;

/// Why the restorer does not open the file for the process.
pub struct Refused(pub String);

/// Opens `image` as the restorer and gives the process the fd, or says
/// why not.
pub fn reopen(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    file: &File,
    image: &RegFile,
    want: &Expected<'_>,
) -> std::result::Result<i32, Refused> {
    let refuse = |why: &str| Err(Refused(why.to_string()));
    if ckpt_image::caller::acting_for().is_some() {
        return refuse("restored for a user of the ckpt service, whose own credentials decide");
    }
    if image.mode & libc::S_IFMT != libc::S_IFREG || image.ghost.is_some() {
        return refuse("only a regular file is reopened by ckpt itself");
    }
    if !cx.shared.checks.same_host {
        return refuse("not on the host of the dump, where its inode could be checked");
    }
    if !same_mount_namespace(cx.pid()) {
        return refuse("the process sees other files than ckpt (another mount namespace)");
    }
    let opened = open_trusted(&image.path, reopen_flags(file), image).map_err(Refused)?;
    let proc_fd = format!("/proc/self/fd/{}", opened.as_raw_fd());
    cx.shared
        .checks
        .verify(Path::new(&proc_fd), want)
        .map_err(|m| Refused(m.0))?;
    let got = take_from(r, std::process::id() as i32, opened.as_raw_fd())
        .map_err(|e| Refused(format!("cannot hand it to the process: {e}")))?;
    (cx.shared.options.notice)(&format!(
        "pid {}: {} reopened by ckpt for the process, which opened it with more privilege than it has now (same file, sealed checkpoint)",
        cx.pid(),
        image.path
    ));
    Ok(got)
}

/// Opens the regular file at `path` with `flags`, never through a link a
/// user controls, and only if it is the recorded inode (checked before the
/// open too, so a FIFO or device put there is never opened).
fn open_trusted(path: &str, flags: i32, image: &RegFile) -> std::result::Result<OwnedFd, String> {
    let cannot = |e: &dyn std::fmt::Display| format!("ckpt cannot open it either: {e}");
    let parent = ckpt_image::TrustedParent::resolve(Path::new(path)).map_err(|e| cannot(&e))?;
    let st = nix::sys::stat::fstatat(
        parent.dir(),
        parent.name(),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(|e| cannot(&e))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG
        || (st.st_dev, st.st_ino) != (image.dev, image.ino)
    {
        return Err("replaced by another file since the dump".into());
    }
    let flags = OFlag::from_bits_retain(flags | libc::O_NOFOLLOW | libc::O_NOCTTY);
    let fd = nix::fcntl::openat(parent.dir(), parent.name(), flags, Mode::empty())
        .map_err(|e| cannot(&e))?;
    let m = nix::sys::stat::fstat(fd.as_fd()).map_err(|e| cannot(&e))?;
    if (m.st_dev, m.st_ino) != (image.dev, image.ino) {
        return Err("replaced by another file since the dump".into());
    }
    Ok(fd)
}

/// The process behind `pid` and the restorer resolve paths in the same
/// mount namespace.
pub(super) fn same_mount_namespace(pid: i32) -> bool {
    let ns = |p: String| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
    let ours = ns("/proc/self/ns/mnt".into());
    ours.is_some() && ours == ns(format!("/proc/{pid}/ns/mnt"))
}
