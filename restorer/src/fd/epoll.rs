//! epoll(7) instances, created inside the process with `epoll_create1`,
//! every target added back with its events and data.
//!
//! The targets are open files of the checkpoint (by id), so an epoll is
//! restored after every other fd of its process (see `restore` in the
//! parent module): a target is then added from the fd of this process
//! that holds it or, if the process no longer has it open, from a copy
//! taken from the process that installed it, closed again afterwards.
//! Readiness is not saved: the kernel recomputes it on each add, so a
//! ready edge-triggered target is reported once more after restore.
//!
//! An epoll may watch other epolls (libraries such as UCX nest one per
//! subsystem): the inner ones are restored first ([`nesting`]), so each
//! is complete when the outer one adds it.

use ckpt_image::fd::File;
use ckpt_image::fd::epoll::{EpollFile, EpollTarget};

use super::{Context, FileRestorer, set_status_flags};
use crate::error::{RestoreError, Result};
use ckpt_parasite::remote::Remote;

/// epoll instances.
pub struct Epoll;

/// `EPOLL_CTL_ADD`.
const EPOLL_CTL_ADD: u64 = libc::EPOLL_CTL_ADD as u64;

/// Argument slot of the scratch area holding the `struct epoll_event`.
const EVENT_SLOT: u64 = 0;

impl FileRestorer for Epoll {
    type Image = EpollFile;
    const AFTER_OTHERS: bool = true;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &EpollFile,
        fd: i32,
    ) -> Result<i32> {
        let epfd = r.call(
            "epoll_create1",
            libc::SYS_epoll_create1,
            [libc::EPOLL_CLOEXEC as u64, 0, 0, 0, 0, 0],
        )? as i32;
        // epoll_create1 takes no O_NONBLOCK; it is a status flag.
        if file.flags & libc::O_NONBLOCK as u32 != 0 {
            set_status_flags(r, epfd, file.flags)?;
        }
        for t in &image.targets {
            add_target(cx, r, epfd, fd, t)?;
        }
        Ok(epfd)
    }
}

/// How deep the epolls nest under file `id`: 0 for a file that is no
/// epoll or watches no epoll, else one more than its deepest epoll target.
/// Files are restored by increasing nesting. The kernel refuses loops and
/// nests at most [`MAX_NESTING`] deep; an image claiming more stops
/// counting there (its restore then fails on the missing inner epoll).
pub fn nesting(files: &ckpt_image::fd::Files, id: u64) -> u32 {
    fn depth(files: &ckpt_image::fd::Files, id: u64, budget: u32) -> u32 {
        let Some(ckpt_image::fd::file::Kind::Epoll(e)) =
            files.get(id).and_then(|f| f.kind.as_ref())
        else {
            return 0;
        };
        if budget == 0 {
            return 0;
        }
        e.targets
            .iter()
            .filter(|t| {
                matches!(
                    files.get(t.file_id).and_then(|f| f.kind.as_ref()),
                    Some(ckpt_image::fd::file::Kind::Epoll(_))
                )
            })
            .map(|t| 1 + depth(files, t.file_id, budget - 1))
            .max()
            .unwrap_or(0)
    }
    depth(files, id, MAX_NESTING)
}

/// The kernel's limit on epolls inside epolls (`EP_MAX_NESTS`).
const MAX_NESTING: u32 = 4;

/// Registers target `t` in the epoll at `epfd` (to become fd `fd`).
fn add_target(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    epfd: i32,
    fd: i32,
    t: &EpollTarget,
) -> Result<()> {
    let pid = cx.pid();
    let (src, borrowed) = match cx.fd_here(t.file_id, t.fd) {
        Some(src) => (src, false),
        None => match cx.take_installed(r, t.file_id)? {
            Some(src) => (src, true),
            None => {
                return Err(RestoreError::File {
                    pid,
                    path: format!("epoll fd {fd}"),
                    what: format!(
                        "target fd {} (file {}) is neither open in this process nor restored \
                         by an earlier one",
                        t.fd, t.file_id
                    ),
                });
            }
        },
    };
    // The registration is keyed by file and fd number (what fdinfo shows
    // and epoll_ctl(DEL) names), so add it under the dumped number when
    // that number is free, as it is after the program closed it.
    let mut temporary = false;
    let mut at = src;
    if src != t.fd && t.fd >= 0 && !is_open(pid, t.fd) {
        let dup = r.call(
            "dup3 (epoll target)",
            libc::SYS_dup3,
            [src as u64, t.fd as u64, libc::O_CLOEXEC as u64, 0, 0, 0],
        );
        // A number the process cannot have now (rlimit) falls back to src.
        if dup.is_ok() {
            at = t.fd;
            temporary = true;
        }
    }
    let event = r.put(EVENT_SLOT, &event_bytes(t.events, t.data))?;
    let added = r.call(
        "epoll_ctl(EPOLL_CTL_ADD)",
        libc::SYS_epoll_ctl,
        [epfd as u64, EPOLL_CTL_ADD, at as u64, event, 0, 0],
    );
    if temporary {
        r.close(at)?;
    }
    if borrowed {
        r.close(src)?;
    }
    added.map_err(|e| RestoreError::File {
        pid,
        path: format!("epoll fd {fd}"),
        what: format!(
            "target fd {} (file {}), events {:#x}: {e}",
            t.fd, t.file_id, t.events
        ),
    })?;
    Ok(())
}

/// `struct epoll_event` as this architecture lays it out: the events
/// first, the data in the last 8 bytes (packed on x86-64, padded elsewhere).
fn event_bytes(events: u32, data: u64) -> Vec<u8> {
    let size = std::mem::size_of::<libc::epoll_event>();
    let mut b = vec![0u8; size];
    b[..4].copy_from_slice(&events.to_ne_bytes());
    b[size - 8..].copy_from_slice(&data.to_ne_bytes());
    b
}

/// Fd `fd` of `pid` is open now (looked at from the restorer, which sees
/// the process's table through /proc).
fn is_open(pid: i32, fd: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}/fd/{fd}"))
        .symlink_metadata()
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_layout_matches_libc() {
        let b = event_bytes(0x8000_0001, 0x1122_3344_5566_7788);
        let ev = libc::epoll_event {
            events: 0x8000_0001,
            u64: 0x1122_3344_5566_7788,
        };
        assert_eq!(b.len(), std::mem::size_of_val(&ev));
        assert_eq!(&b[..4], &{ ev.events }.to_ne_bytes());
        assert_eq!(&b[b.len() - 8..], &{ ev.u64 }.to_ne_bytes());
    }
}
