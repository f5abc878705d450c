//! inotify(7) instances: every watch of `/proc/PID/fdinfo` (wd, mask,
//! inode and its file handle), with a path for its inode found by opening
//! the handle (`open_by_handle_at` on a mount of the inode's filesystem,
//! from `/proc/PID/mountinfo`) and reading the link of what was opened; the
//! path is checked to name that inode (or, if no name is left there but the
//! inode has links, the handle is saved to be opened again at restore).
//! Events queued and not read are not
//! saved (the kernel offers no way to queue them again): they are counted
//! with `FIONREAD` on a copy of the fd and logged as dropped.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::inotify::{self, InotifyFile, InotifyHandle, InotifyWatch, WatchLine};

use super::{Blobs, FdParams, FileDumper};
use crate::error::{DumpError, Result};
use crate::{procfile, sys};

/// `anon_inode:inotify`.
pub struct Inotify;

impl FileDumper for Inotify {
    fn name(&self) -> &'static str {
        "inotify"
    }

    fn description(&self) -> &'static str {
        "inotify instances: watches with their wd numbers, masks and paths, or file handles for inodes whose name is gone but that have other links (queued events are dropped)"
    }

    fn claims(&self, p: &FdParams) -> bool {
        p.link == "anon_inode:inotify"
    }

    fn collect(&self, p: &FdParams, _file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        let lines = inotify::watch_lines(&p.info).map_err(|what| DumpError::Parse {
            pid: p.pid,
            path: format!("fdinfo/{}", p.fd),
            what,
        })?;
        let mounts = procfile::read(p.pid, "mountinfo")?;
        let mut watches = Vec::new();
        for line in &lines {
            let (path, by_handle) = match path_of(p, line, &mounts)? {
                Found::Path(path) => (path, None),
                Found::HandleOnly { shown, mount_point } => {
                    log::info!(
                        "pid {}: fd {}: inotify wd {}: no path names inode {} any more ({shown}), but it has other links: watched again through its file handle",
                        p.pid,
                        p.fd,
                        line.wd,
                        line.ino
                    );
                    let handle = InotifyHandle {
                        handle_type: line.handle_type,
                        handle: line.handle.clone(),
                        mount_point,
                    };
                    (shown, Some(handle))
                }
            };
            log::debug!(
                "pid {}: fd {}: inotify wd {} mask {:#x} {path}",
                p.pid,
                p.fd,
                line.wd,
                line.mask
            );
            watches.push(InotifyWatch {
                wd: line.wd,
                mask: line.mask,
                path,
                ino: line.ino,
                sdev: line.sdev,
                by_handle,
            });
        }
        watches.sort_by_key(|w| w.wd);
        match sys::queued_bytes(p.pid, p.fd) {
            Ok(0) => {}
            Ok(n) => log::warn!(
                "pid {}: fd {}: {n} bytes of inotify events not read yet are dropped",
                p.pid,
                p.fd
            ),
            Err(e) => log::warn!(
                "pid {}: fd {}: cannot tell whether inotify events are queued: {e}",
                p.pid,
                p.fd
            ),
        }
        Ok(Kind::Inotify(InotifyFile { watches }))
    }
}

/// A path naming the watched inode, through the process's mounts of its
/// filesystem, or the mount its handle opens on when it has no name left
/// there but still has links.
fn path_of(p: &FdParams, line: &WatchLine, mountinfo: &str) -> Result<Found> {
    let handle = Handle {
        ino: line.ino,
        major: line.major(),
        minor: line.minor(),
        handle_type: line.handle_type,
        bytes: &line.handle,
    };
    path_of_handle(p, &handle, mountinfo).map_err(|why| {
        p.unsupported(&format!(
            "inotify watch wd {} on inode {} of device {}:{}: {why}",
            line.wd, line.ino, handle.major, handle.minor
        ))
    })
}

/// What [`path_of_handle`] found.
pub(super) enum Found {
    /// A path naming the inode.
    Path(String),
    /// No path names it, yet it has links (a hard link the process's
    /// mounts do not show by name): only its handle reaches it.
    HandleOnly {
        /// What its path reads as (`PATH (deleted)`).
        shown: String,
        /// The mount point its handle was opened through.
        mount_point: String,
    },
}

/// An inode as fdinfo names it: number, device, file handle.
pub(super) struct Handle<'a> {
    pub ino: u64,
    pub major: u32,
    pub minor: u32,
    pub handle_type: i32,
    pub bytes: &'a [u8],
}

/// A path naming the inode `h`, found by opening its file handle through
/// the process's mounts of its filesystem, and checked to name that
/// inode; `Err` says why there is none.
pub(super) fn path_of_handle(
    p: &FdParams,
    h: &Handle<'_>,
    mountinfo: &str,
) -> std::result::Result<Found, String> {
    if h.bytes.is_empty() {
        return Err("its filesystem gives no file handle".into());
    }
    let dev = format!("{}:{}", h.major, h.minor);
    let mut last_error = String::from("no mount of the process reaches it");
    for mount_point in mount_points(mountinfo, &dev) {
        // open_by_handle_at takes no O_PATH fd: the mount point is opened
        // for reading, as a directory.
        let at = procfile::path(p.pid, "root").join(mount_point.trim_start_matches('/'));
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(&at)
            .and_then(|mount| sys::open_by_handle(&mount, h.handle_type, h.bytes));
        let found = match opened {
            Ok(found) => found,
            Err(e) => {
                last_error = format!("cannot open its file handle through {mount_point}: {e}");
                continue;
            }
        };
        use std::os::fd::AsRawFd;
        let link = std::fs::read_link(format!("/proc/self/fd/{}", found.as_raw_fd()));
        let path = match link {
            Ok(path) => path.to_string_lossy().into_owned(),
            Err(e) => {
                last_error = format!("cannot read its path: {e}");
                continue;
            }
        };
        // The link of an inode with no name left reads "PATH (deleted)".
        let names_it = std::fs::symlink_metadata(&path).is_ok_and(|m| {
            m.ino() == h.ino && libc::major(m.dev()) == h.major && libc::minor(m.dev()) == h.minor
        });
        if names_it {
            return Ok(Found::Path(path));
        }
        let linked = std::fs::metadata(format!("/proc/self/fd/{}", found.as_raw_fd()))
            .is_ok_and(|m| m.nlink() > 0);
        if linked {
            return Ok(Found::HandleOnly {
                shown: path,
                mount_point,
            });
        }
        return Err(format!("no path names it any more ({path})"));
    }
    Err(last_error)
}

/// The mount points (fifth field of mountinfo, octal escapes undone) of the
/// mounts of device `dev` ("major:minor").
pub(super) fn mount_points<'a>(
    mountinfo: &'a str,
    dev: &'a str,
) -> impl Iterator<Item = String> + 'a {
    mountinfo.lines().filter_map(move |l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.get(2) == Some(&dev)).then(|| unescape(f.get(4).copied().unwrap_or("/")))
    })
}

/// Undoes mountinfo's `\NNN` octal escapes (space, tab, newline, backslash).
pub(super) fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (b[i], octal) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_mount_points_of_a_device() {
        let info = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n\
                    30 22 0:40 / /my\\040dir rw - tmpfs tmpfs rw\n\
                    31 22 8:1 /home /home rw - ext4 /dev/sda1 rw\n";
        let m: Vec<String> = mount_points(info, "8:1").collect();
        assert_eq!(m, ["/", "/home"]);
        let m: Vec<String> = mount_points(info, "0:40").collect();
        assert_eq!(m, ["/my dir"]);
    }
}
