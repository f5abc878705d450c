//! fanotify(7) groups: the init flags and every mark of `/proc/PID/fdinfo`,
//! each with a path reaching what it marks: for an inode, found by opening
//! its file handle (as for inotify watches); for a mount, its mount point;
//! for a filesystem, a mount point of it. Events queued and not read are
//! not saved (the kernel offers no way to queue them again): they are
//! counted and logged as dropped. A mark left with no events at all (its
//! ignored events cleared by a modification) has no effect and cannot be
//! added again: it is not saved.
//!
//! Restoring a group takes CAP_SYS_ADMIN (fanotify_init), which the
//! restorer lends the process; so only a process that holds CAP_SYS_ADMIN
//! itself is dumped with one: an ordinary user's group (made with the
//! unprivileged subset of fanotify) is refused by name.

use ckpt_image::fd::fanotify::{self, FanotifyFile, FanotifyMark, FanotifyMarkKind, MarkLine};
use ckpt_image::fd::file::Kind;

use super::inotify::{Found, Handle, mount_points, path_of_handle};
use super::{Blobs, FdParams, FileDumper};
use crate::error::{DumpError, Result};
use crate::{procfile, sys};

/// `anon_inode:[fanotify]`.
pub struct Fanotify;

impl FileDumper for Fanotify {
    fn name(&self) -> &'static str {
        "fanotify"
    }

    fn description(&self) -> &'static str {
        "fanotify groups of processes with CAP_SYS_ADMIN: init flags, inode, mount and filesystem marks with their masks (queued events are dropped)"
    }

    fn claims(&self, p: &FdParams) -> bool {
        p.link == "anon_inode:[fanotify]"
    }

    fn collect(&self, p: &FdParams, _file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        // fanotify_init wants CAP_SYS_ADMIN of a full group.
        if !procfile::has_effective_cap(p.pid, caps::Capability::CAP_SYS_ADMIN)? {
            return Err(p.unsupported(
                "fanotify group of a process without CAP_SYS_ADMIN (restoring it would take privileges the process does not have)",
            ));
        }
        let info = fanotify::group_info(&p.info).map_err(|what| DumpError::Parse {
            pid: p.pid,
            path: format!("fdinfo/{}", p.fd),
            what,
        })?;
        let mounts = procfile::read(p.pid, "mountinfo")?;
        let mut marks = Vec::new();
        for line in &info.marks {
            if line.mask == 0 && line.ignored_mask == 0 {
                // Its ignored events were cleared by a modification (no
                // FAN_MARK_IGNORED_SURV_MODIFY): it changes no event, and
                // the kernel offers no way to add an empty mark.
                log::debug!(
                    "pid {}: fd {}: empty fanotify {} mark not saved",
                    p.pid,
                    p.fd,
                    line.kind.label()
                );
                continue;
            }
            let path = path_of(p, line, &mounts)?;
            let mark = FanotifyMark {
                kind: line.kind.into(),
                mflags: line.mflags,
                mask: line.mask,
                ignored_mask: line.ignored_mask,
                path,
                ino: line.ino,
                sdev: line.sdev,
                mnt_id: line.mnt_id,
            };
            log::debug!("pid {}: fd {}: fanotify {}", p.pid, p.fd, mark.describe());
            marks.push(mark);
        }
        match sys::queued_bytes(p.pid, p.fd) {
            Ok(0) => {}
            Ok(n) => log::warn!(
                "pid {}: fd {}: {n} bytes of fanotify events not read yet are dropped",
                p.pid,
                p.fd
            ),
            Err(e) => log::warn!(
                "pid {}: fd {}: cannot tell whether fanotify events are queued: {e}",
                p.pid,
                p.fd
            ),
        }
        Ok(Kind::Fanotify(FanotifyFile {
            init_flags: info.group.flags,
            event_flags: info.group.event_flags,
            marks,
        }))
    }
}

/// A path reaching what the mark is on.
fn path_of(p: &FdParams, line: &MarkLine, mountinfo: &str) -> Result<String> {
    let refuse = |why: String| {
        p.unsupported(&format!(
            "fanotify {} mark (mask {:#x}): {why}",
            line.kind.label(),
            line.mask
        ))
    };
    match line.kind {
        FanotifyMarkKind::Inode => {
            let handle = Handle {
                ino: line.ino,
                major: line.major(),
                minor: line.minor(),
                handle_type: line.handle_type,
                bytes: &line.handle,
            };
            let why = match path_of_handle(p, &handle, mountinfo) {
                Ok(Found::Path(path)) => return Ok(path),
                Ok(Found::HandleOnly { shown, .. }) => {
                    format!("no path names it any more ({shown})")
                }
                Err(why) => why,
            };
            Err(refuse(format!(
                "inode {} of device {}:{}: {why}",
                line.ino, handle.major, handle.minor
            )))
        }
        FanotifyMarkKind::Mount => mount_point_of_id(mountinfo, line.mnt_id).ok_or_else(|| {
            refuse(format!(
                "no mount {} in the process's mountinfo",
                line.mnt_id
            ))
        }),
        FanotifyMarkKind::Filesystem => {
            let dev = format!("{}:{}", line.major(), line.minor());
            mount_points(mountinfo, &dev).next().ok_or_else(|| {
                refuse(format!(
                    "no mount of device {dev} in the process's mountinfo"
                ))
            })
        }
        FanotifyMarkKind::Unspecified => Err(refuse("of no kind".into())),
    }
}

/// The mount point of mount `id` (first field of mountinfo).
fn mount_point_of_id(mountinfo: &str, id: i32) -> Option<String> {
    let id = id.to_string();
    mountinfo.lines().find_map(|l| {
        let mut f = l.split(' ');
        (f.next() == Some(id.as_str())).then(|| super::inotify::unescape(f.nth(3).unwrap_or("/")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_mount_by_id() {
        let info = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n\
                    30 22 0:40 / /my\\040dir rw - tmpfs tmpfs rw\n";
        assert_eq!(mount_point_of_id(info, 30).as_deref(), Some("/my dir"));
        assert_eq!(mount_point_of_id(info, 22).as_deref(), Some("/"));
        assert_eq!(mount_point_of_id(info, 3), None);
    }
}
