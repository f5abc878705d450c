//! inotify(7) instances, rebuilt inside the process: `inotify_init1`, then
//! each watch added by path (with the process's filesystem identity, never
//! following a last symbolic link) so that it gets its dumped wd back. The
//! kernel hands out wds in increasing order and does not reuse a removed
//! one until it wraps, so, as CRIU does, a watch whose wd comes out lower
//! than wanted is removed and added again until it gets its number; the
//! `IN_IGNORED` events those removals queue are read out before the
//! process runs. What was rebuilt is then checked in `/proc/PID/fdinfo`:
//! every wd with its mask, and on the dumping host its inode.
//!
//! A watched inode no path names any more but that still has links (a
//! hard link elsewhere) is reached through its file handle: the restorer
//! opens it (`open_by_handle_at`, on the dumping host, checked to be the
//! dumped inode), hands the process that fd, and the process adds the
//! watch through `/proc/self/fd/N` with its own filesystem identity. This
//! skips the directory permissions a path would have been checked
//! against, so it is done only when the restorer acts for itself, not for
//! a user of the ckpt service.

use ckpt_image::fd::File;
use ckpt_image::fd::inotify::{self, InotifyFile, InotifyWatch};
use ckpt_parasite::remote::Remote;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

use ckpt_image::fd::inotify::InotifyHandle;

use super::{Context, FileRestorer, set_status_flags, take_from};
use crate::error::{RestoreError, Result};

/// inotify instances.
pub struct Inotify;

/// Highest wd ckpt recreates: reaching wd N takes N - 1 removals at worst,
/// two remote syscalls each, so a corrupt image cannot make this loop long.
const MAX_WD: i32 = 1 << 16;
/// `IN_DONT_FOLLOW`: the dumped path names the inode itself.
const IN_DONT_FOLLOW: u32 = 0x0200_0000;
/// Scratch slot for the path, and for the events read out.
const PATH_SLOT: u64 = 0;
const EVENTS_SLOT: u64 = 1;
/// Bytes read per `read` of the events (one scratch slot).
const EVENTS_LEN: u64 = 4096;

impl FileRestorer for Inotify {
    type Image = InotifyFile;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &InotifyFile,
        fd: i32,
    ) -> Result<i32> {
        let pid = r.t.pid();
        let mut last = 0;
        for w in &image.watches {
            if w.wd <= last || w.wd > MAX_WD {
                return Err(cx.invalid(fd, &format!("inotify wd {} out of order or range", w.wd)));
            }
            last = w.wd;
        }
        let ifd = r.call(
            "inotify_init1",
            libc::SYS_inotify_init1,
            [(libc::IN_NONBLOCK | libc::IN_CLOEXEC) as u64, 0, 0, 0, 0, 0],
        )? as i32;
        let mut removed = 0u64;
        for (i, w) in image.watches.iter().enumerate() {
            let Some(h) = &w.by_handle else {
                let target = Target {
                    path: &w.path,
                    flags: IN_DONT_FOLLOW,
                };
                removed += add_at_wd(r, ifd, fd, w, &target, &image.watches[..i])?;
                continue;
            };
            let opened = open_handle(cx, w, h).map_err(|why| {
                RestoreError::fd_changed(
                    pid,
                    fd,
                    &w.path,
                    format!("inotify wd {} through its file handle: {why}", w.wd),
                )
            })?;
            let there = take_from(r, std::process::id() as i32, opened.as_raw_fd())?;
            drop(opened);
            // Following the /proc magic link reaches the inode itself.
            let path = format!("/proc/self/fd/{there}");
            let target = Target {
                path: &path,
                flags: 0,
            };
            let added = add_at_wd(r, ifd, fd, w, &target, &image.watches[..i]);
            r.close(there)?;
            removed += added?;
        }
        if removed > 0 {
            log::debug!("pid {pid}: fd {fd}: {removed} wds skipped");
            read_out_events(r, ifd, removed)?;
        }
        check_rebuilt(cx, pid, ifd, fd, image)?;
        set_status_flags(r, ifd, file.flags)?;
        Ok(ifd)
    }
}

/// Opens the inode of watch `w` from its file handle, as the restorer, and
/// checks it is the dumped one; `Err` says why not.
fn open_handle(
    cx: &Context<'_, '_>,
    w: &InotifyWatch,
    h: &InotifyHandle,
) -> std::result::Result<OwnedFd, String> {
    if ckpt_image::caller::acting_for().is_some() {
        return Err(
            "its name is gone, and ckpt opens a file handle only when restoring as itself, not for a user of the ckpt service".into(),
        );
    }
    if !cx.shared.checks.same_host {
        return Err(
            "its name is gone, and a file handle is opened only on the host of the dump".into(),
        );
    }
    if !super::privileged::same_mount_namespace(cx.pid()) {
        return Err("the process sees other files than ckpt (another mount namespace)".into());
    }
    // The mount point as the process sees it, from its root.
    let at = format!(
        "/proc/{}/root/{}",
        cx.pid(),
        h.mount_point.trim_start_matches('/')
    );
    let mount = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(&at)
        .map_err(|e| format!("cannot open mount {}: {e}", h.mount_point))?;
    let opened = crate::sys::open_by_handle(mount.as_fd(), h.handle_type, &h.handle)
        .map_err(|e| format!("cannot open it through {}: {e}", h.mount_point))?;
    let m = std::fs::metadata(format!("/proc/self/fd/{}", opened.as_raw_fd()))
        .map_err(|e| format!("cannot look at it: {e}"))?;
    let sdev = (libc::major(m.dev()) << MINOR_BITS) | libc::minor(m.dev());
    if m.ino() != w.ino || sdev != w.sdev {
        return Err("the handle names another inode now".into());
    }
    Ok(opened)
}

/// Bits of the kernel's dev_t encoding (fdinfo's sdev) that hold the minor.
const MINOR_BITS: u32 = 20;

/// What `inotify_add_watch` is given for a watch.
struct Target<'a> {
    path: &'a str,
    /// Extra flags (`IN_DONT_FOLLOW`, or none to follow a /proc link).
    flags: u32,
}

/// Adds watch `w` until it gets its wd; returns how many times it was
/// removed to skip lower numbers.
fn add_at_wd(
    r: &Remote<'_>,
    ifd: i32,
    fd: i32,
    w: &InotifyWatch,
    target: &Target<'_>,
    earlier: &[InotifyWatch],
) -> Result<u64> {
    let pid = r.t.pid();
    let changed = |what: String| RestoreError::fd_changed(pid, fd, &w.path, what);
    let path = r.put_path(PATH_SLOT, target.path)?;
    let mut removed = 0;
    loop {
        let got = r.t.syscall_at(
            r.base,
            libc::SYS_inotify_add_watch,
            [ifd as u64, path, u64::from(w.mask | target.flags), 0, 0, 0],
        )?;
        if got < 0 {
            let e = std::io::Error::from_raw_os_error(-got as i32);
            return Err(changed(format!("cannot watch it again (wd {}): {e}", w.wd)));
        }
        let got = got as i32;
        if got == w.wd {
            return Ok(removed);
        }
        if got > w.wd || earlier.iter().any(|e| e.wd == got) {
            return Err(changed(format!(
                "inotify wd {} came back as {got} (the path names another watched inode, or the numbers ran past it)",
                w.wd
            )));
        }
        r.call(
            "inotify_rm_watch",
            libc::SYS_inotify_rm_watch,
            [ifd as u64, got as u64, 0, 0, 0, 0],
        )?;
        removed += 1;
    }
}

/// Reads out the `IN_IGNORED` events the skipping queued (at most one event
/// per removal, so the loop is bounded by `removed`).
fn read_out_events(r: &Remote<'_>, ifd: i32, removed: u64) -> Result<()> {
    let buf = r.put(EVENTS_SLOT, &[])?;
    for _ in 0..=removed {
        let n = r.t.syscall_at(
            r.base,
            libc::SYS_read,
            [ifd as u64, buf, EVENTS_LEN, 0, 0, 0],
        )?;
        if n <= 0 {
            break;
        }
    }
    Ok(())
}

/// Every wd is there with its mask (and, on the dumping host, its inode).
fn check_rebuilt(
    cx: &mut Context<'_, '_>,
    pid: i32,
    ifd: i32,
    fd: i32,
    image: &InotifyFile,
) -> Result<()> {
    let path = format!("/proc/{pid}/fdinfo/{ifd}");
    let info = std::fs::read_to_string(&path)
        .map_err(|e| RestoreError::os(pid, format!("read {path}"), e))?;
    let mut lines = inotify::watch_lines(&info).map_err(|what| cx.invalid(fd, &what))?;
    lines.sort_by_key(|l| l.wd);
    let same_host = cx.shared.checks.same_host;
    let mismatch = image.watches.len() != lines.len()
        || image.watches.iter().zip(&lines).any(|(w, l)| {
            w.wd != l.wd || w.mask != l.mask || (same_host && (w.ino != l.ino || w.sdev != l.sdev))
        });
    if mismatch {
        let want: Vec<String> = image
            .watches
            .iter()
            .map(|w| format!("wd {} mask {:#x} {}", w.wd, w.mask, w.path))
            .collect();
        let got: Vec<String> = lines
            .iter()
            .map(|l| format!("wd {} mask {:#x} ino {}", l.wd, l.mask, l.ino))
            .collect();
        return Err(RestoreError::fd_changed(
            pid,
            fd,
            "inotify",
            format!(
                "watches rebuilt as [{}], dumped [{}]",
                got.join(", "),
                want.join(", ")
            ),
        ));
    }
    Ok(())
}
