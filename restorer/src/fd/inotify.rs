//! inotify(7) instances, rebuilt inside the process: `inotify_init1`, then
//! each watch added by path (with the process's filesystem identity, never
//! following a last symbolic link) so that it gets its dumped wd back. The
//! kernel hands out wds in increasing order and does not reuse a removed
//! one until it wraps, so, as CRIU does, a watch whose wd comes out lower
//! than wanted is removed and added again until it gets its number; the
//! `IN_IGNORED` events those removals queue are read out before the
//! process runs. What was rebuilt is then checked in `/proc/PID/fdinfo`:
//! every wd with its mask, and on the dumping host its inode.

use ckpt_image::fd::File;
use ckpt_image::fd::inotify::{self, InotifyFile, InotifyWatch};
use ckpt_parasite::remote::Remote;

use super::{Context, FileRestorer, set_status_flags};
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
            removed += add_at_wd(r, ifd, fd, w, &image.watches[..i])?;
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

/// Adds watch `w` until it gets its wd; returns how many times it was
/// removed to skip lower numbers.
fn add_at_wd(
    r: &Remote<'_>,
    ifd: i32,
    fd: i32,
    w: &InotifyWatch,
    earlier: &[InotifyWatch],
) -> Result<u64> {
    let pid = r.t.pid();
    let changed = |what: String| RestoreError::fd_changed(pid, fd, &w.path, what);
    let path = r.put_path(PATH_SLOT, &w.path)?;
    let mut removed = 0;
    loop {
        let got = r.t.syscall_at(
            r.base,
            libc::SYS_inotify_add_watch,
            [
                ifd as u64,
                path,
                u64::from(w.mask | IN_DONT_FOLLOW),
                0,
                0,
                0,
            ],
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
