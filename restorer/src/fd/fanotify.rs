//! fanotify(7) groups, rebuilt inside the process: `fanotify_init` with the
//! dumped flags, then each mark added again by path (never following a
//! last symbolic link), its events first and its ignored events in a
//! second call, as the kernel takes them. What was rebuilt is then checked
//! in `/proc/PID/fdinfo`: the group's flags and every mark with its masks,
//! and on the dumping host what it is on.
//!
//! `fanotify_init` wants CAP_SYS_ADMIN: the process still has the
//! restorer's privileges here (its dumped credentials are set after its
//! files), so the group is made only for a process dumped with
//! CAP_SYS_ADMIN in its effective set, which the dump requires too.

use ckpt_image::fd::File;
use ckpt_image::fd::fanotify::{self, FanotifyFile, FanotifyMark, FanotifyMarkKind, MarkLine};
use ckpt_parasite::remote::Remote;

use super::{Context, FileRestorer, set_status_flags};
use crate::error::{RestoreError, Result};

/// fanotify groups.
pub struct Fanotify;

/// `CAP_SYS_ADMIN`.
const CAP_SYS_ADMIN: u32 = 21;
/// Scratch slot for a mark's path.
const PATH_SLOT: u64 = 0;
/// `AT_FDCWD` as a syscall argument.
const AT_FDCWD: u64 = libc::AT_FDCWD as i64 as u64;
/// Mark flags fdinfo reports that say how the ignored events are kept.
const IGNORE_FLAGS: u32 = libc::FAN_MARK_IGNORE | libc::FAN_MARK_IGNORED_SURV_MODIFY;

impl FileRestorer for Fanotify {
    type Image = FanotifyFile;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &FanotifyFile,
        fd: i32,
    ) -> Result<i32> {
        if !cx.dumped_with_cap(CAP_SYS_ADMIN) {
            return Err(cx.invalid(
                fd,
                "fanotify group of a process dumped without CAP_SYS_ADMIN (ckpt never saves one)",
            ));
        }
        let gfd = r.call(
            "fanotify_init",
            libc::SYS_fanotify_init,
            [
                u64::from(image.init_flags | libc::FAN_CLOEXEC),
                u64::from(image.event_flags),
                0,
                0,
                0,
                0,
            ],
        )? as i32;
        for mark in &image.marks {
            add_mark(r, gfd, fd, mark)?;
        }
        check_rebuilt(cx, r.t.pid(), gfd, fd, image)?;
        set_status_flags(r, gfd, file.flags)?;
        Ok(gfd)
    }
}

/// The `fanotify_mark` flag naming what a mark of this kind is on.
fn kind_flag(kind: FanotifyMarkKind) -> u32 {
    match kind {
        FanotifyMarkKind::Mount => libc::FAN_MARK_MOUNT,
        FanotifyMarkKind::Filesystem => libc::FAN_MARK_FILESYSTEM,
        FanotifyMarkKind::Inode | FanotifyMarkKind::Unspecified => 0,
    }
}

/// Adds `mark` to group `gfd`: its events, then its ignored events.
fn add_mark(r: &Remote<'_>, gfd: i32, fd: i32, mark: &FanotifyMark) -> Result<()> {
    let pid = r.t.pid();
    if mark.kind() == FanotifyMarkKind::Unspecified {
        return Err(RestoreError::fd_changed(
            pid,
            fd,
            &mark.path,
            "fanotify mark of no kind".into(),
        ));
    }
    let path = r.put_path(PATH_SLOT, &mark.path)?;
    let base = libc::FAN_MARK_ADD
        | libc::FAN_MARK_DONT_FOLLOW
        | kind_flag(mark.kind())
        | (mark.mflags & libc::FAN_MARK_EVICTABLE);
    let ignore = if mark.mflags & libc::FAN_MARK_IGNORE != 0 {
        mark.mflags & IGNORE_FLAGS
    } else {
        libc::FAN_MARK_IGNORED_MASK | (mark.mflags & libc::FAN_MARK_IGNORED_SURV_MODIFY)
    };
    let calls = [(base, mark.mask), (base | ignore, mark.ignored_mask)];
    for (flags, mask) in calls.into_iter().filter(|(_, mask)| *mask != 0) {
        let got = r.t.syscall_at(
            r.base,
            libc::SYS_fanotify_mark,
            [
                gfd as u64,
                u64::from(flags),
                u64::from(mask),
                AT_FDCWD,
                path,
                0,
            ],
        )?;
        if got < 0 {
            let e = std::io::Error::from_raw_os_error(-got as i32);
            return Err(RestoreError::fd_changed(
                pid,
                fd,
                &mark.path,
                format!("cannot add the fanotify {} again: {e}", mark.describe()),
            ));
        }
    }
    Ok(())
}

/// What a rebuilt mark is compared on (`same_host`: also what it is on).
/// Ignored events that do not survive modification may be cleared by any
/// write to the object between the mark and the check, so they are left
/// out.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct MarkKey {
    kind: i32,
    mflags: u32,
    mask: u32,
    ignored_mask: u32,
    ino: u64,
    sdev: u32,
    mnt_id: i32,
}

impl MarkKey {
    fn of_image(m: &FanotifyMark, same_host: bool) -> Self {
        MarkKey {
            kind: m.kind,
            mflags: m.mflags,
            mask: m.mask,
            ignored_mask: lasting_ignored(m.mflags, m.ignored_mask),
            ino: if same_host { m.ino } else { 0 },
            sdev: if same_host { m.sdev } else { 0 },
            mnt_id: if same_host { m.mnt_id } else { 0 },
        }
    }

    fn of_line(l: &MarkLine, same_host: bool) -> Self {
        MarkKey {
            kind: l.kind as i32,
            mflags: l.mflags,
            mask: l.mask,
            ignored_mask: lasting_ignored(l.mflags, l.ignored_mask),
            ino: if same_host { l.ino } else { 0 },
            sdev: if same_host { l.sdev } else { 0 },
            mnt_id: if same_host { l.mnt_id } else { 0 },
        }
    }
}

/// The ignored events a mark keeps whatever is written meanwhile.
fn lasting_ignored(mflags: u32, ignored_mask: u32) -> u32 {
    if mflags & libc::FAN_MARK_IGNORED_SURV_MODIFY != 0 {
        ignored_mask
    } else {
        0
    }
}

/// The group has its flags and every mark with its masks (and, on the
/// dumping host, on the same inode, mount or filesystem).
fn check_rebuilt(
    cx: &mut Context<'_, '_>,
    pid: i32,
    gfd: i32,
    fd: i32,
    image: &FanotifyFile,
) -> Result<()> {
    let path = format!("/proc/{pid}/fdinfo/{gfd}");
    let info = std::fs::read_to_string(&path)
        .map_err(|e| RestoreError::os(pid, format!("read {path}"), e))?;
    let got = fanotify::group_info(&info).map_err(|what| cx.invalid(fd, &what))?;
    let same_host = cx.shared.checks.same_host;
    let mut want: Vec<MarkKey> = image
        .marks
        .iter()
        .map(|m| MarkKey::of_image(m, same_host))
        .collect();
    let mut have: Vec<MarkKey> = got
        .marks
        .iter()
        .map(|l| MarkKey::of_line(l, same_host))
        .collect();
    want.sort();
    have.sort();
    // fdinfo shows FAN_CLOEXEC and FAN_NONBLOCK, which the fd's flags carry.
    let fd_flags = libc::FAN_CLOEXEC | libc::FAN_NONBLOCK;
    if want != have || (got.group.flags & !fd_flags) != (image.init_flags & !fd_flags) {
        return Err(RestoreError::fd_changed(
            pid,
            fd,
            "fanotify",
            format!(
                "group rebuilt with flags {:#x} and marks {have:?}, dumped flags {:#x} and marks {want:?}",
                got.group.flags, image.init_flags
            ),
        ));
    }
    Ok(())
}
