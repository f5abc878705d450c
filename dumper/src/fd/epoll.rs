//! epoll(7) instances: the interest list from `/proc/PID/fdinfo` (one
//! `tfd:` line per registration), each target resolved to the open file
//! description it refers to, by id.
//!
//! A registration names the file by the fd number it was added with, in
//! the process that added it; that fd may since have been closed or
//! dup'ed. So the targets are resolved once the whole tree is collected
//! ([`FileDumper::link_tree`]): a candidate fd of the tree must have the
//! target's inode and device, and `kcmp(KCMP_EPOLL_TFD)` must say it is the
//! registered file (where the kernel cannot tell, the inode match alone
//! decides, preferring the registered fd number).

use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::epoll::{EpollFile, EpollTarget};
use ckpt_image::fd::file::Kind;

use super::{Blobs, FdParams, FileDumper, Holder, TreeFiles};
use crate::blockers::Blockers;
use crate::error::{DumpError, Result};
use crate::procfile;
use crate::sys;

/// `anon_inode:[eventpoll]`.
pub struct Epoll;

/// What `/proc/PID/fd/N` links to for an epoll instance.
const EPOLL_LINK: &str = "anon_inode:[eventpoll]";

/// Bits of the kernel's internal `dev_t` (`sdev:` of fdinfo) that hold the
/// minor number; the major is above them.
const KERNEL_MINOR_BITS: u32 = 20;

/// One `tfd:` line of an epoll's fdinfo.
struct TargetLine {
    /// The fd number the file was registered with.
    tfd: i32,
    events: u32,
    data: u64,
    /// Inode number of the registered file.
    ino: u64,
    /// Its device, in the kernel's internal encoding.
    sdev: u32,
}

impl TargetLine {
    /// The device as `stat` reports it.
    fn dev(&self) -> u64 {
        libc::makedev(
            self.sdev >> KERNEL_MINOR_BITS,
            self.sdev & ((1 << KERNEL_MINOR_BITS) - 1),
        )
    }
}

/// The `tfd:` lines of an epoll's fdinfo, or what is wrong with one.
fn parse_targets(info: &str) -> std::result::Result<Vec<TargetLine>, String> {
    info.lines()
        .filter(|l| l.starts_with("tfd:"))
        .map(|line| {
            // "tfd: %8d events: %8x data: %16llx  pos:%lli ino:%lx sdev:%x":
            // a key is followed by its value, in the same word or the next.
            let mut fields: Vec<(&str, &str)> = Vec::new();
            let mut words = line.split_whitespace();
            while let Some(w) = words.next() {
                let (k, v) = w.split_once(':').unwrap_or((w, ""));
                let v = if v.is_empty() {
                    words.next().unwrap_or("")
                } else {
                    v
                };
                fields.push((k, v));
            }
            let get = |key: &str| {
                fields
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| *v)
                    .ok_or_else(|| format!("no {key} in \"{line}\""))
            };
            let hex = |key: &str| {
                u64::from_str_radix(get(key)?, 16)
                    .map_err(|_| format!("{key} is not a hex number in \"{line}\""))
            };
            Ok(TargetLine {
                tfd: get("tfd")?
                    .parse()
                    .map_err(|_| format!("tfd is not a number in \"{line}\""))?,
                events: u32::try_from(hex("events")?)
                    .map_err(|_| format!("events out of range in \"{line}\""))?,
                data: hex("data")?,
                ino: hex("ino")?,
                sdev: u32::try_from(hex("sdev")?)
                    .map_err(|_| format!("sdev out of range in \"{line}\""))?,
            })
        })
        .collect()
}

impl FileDumper for Epoll {
    fn name(&self) -> &'static str {
        "epoll"
    }

    fn description(&self) -> &'static str {
        "epoll instances: every registration (events, data) of a file the tree holds"
    }

    fn claims(&self, p: &FdParams) -> bool {
        p.link == EPOLL_LINK
    }

    fn collect(&self, p: &FdParams, _file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        let lines = parse_targets(&p.info).map_err(|what| DumpError::Parse {
            pid: p.pid,
            path: format!("fdinfo/{}", p.fd),
            what,
        })?;
        // The file ids are filled in by link_tree, once every fd is known.
        let targets = lines
            .iter()
            .map(|l| EpollTarget {
                file_id: 0,
                events: l.events,
                data: l.data,
                fd: l.tfd,
            })
            .collect();
        Ok(Kind::Epoll(EpollFile { targets }))
    }

    fn link_tree(&self, tree: &mut TreeFiles) -> Result<()> {
        let epolls: Vec<u64> = tree
            .files
            .files
            .iter()
            .filter(|f| matches!(f.kind, Some(Kind::Epoll(_))))
            .map(|f| f.id)
            .collect();
        let mut blockers = Blockers::default();
        for id in epolls {
            // Restore registers the targets where the epoll is created: in
            // the first process holding it.
            let Some(first) = tree.holders().find(|h| h.file_id == id) else {
                continue;
            };
            let Some(targets) = blockers.absorb(resolve_all(tree, &first))? else {
                continue;
            };
            if let Some(f) = tree.files.files.iter_mut().find(|f| f.id == id) {
                f.kind = Some(Kind::Epoll(EpollFile { targets }));
            }
        }
        blockers.into_result()
    }
}

/// Every registration of the epoll at `epoll` (pid, fd) with its file id.
fn resolve_all(tree: &TreeFiles, epoll: &Holder) -> Result<Vec<EpollTarget>> {
    let (pid, efd) = (epoll.pid, epoll.fd);
    let info = procfile::read(pid, &format!("fdinfo/{efd}"))?;
    let lines = parse_targets(&info).map_err(|what| DumpError::Parse {
        pid,
        path: format!("fdinfo/{efd}"),
        what,
    })?;
    let order: Vec<i32> = tree.tables.iter().map(|(p, _)| *p).collect();
    let rank = |p: i32| order.iter().position(|&o| o == p);
    let mut targets = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        let refuse = |why: String| DumpError::Unsupported {
            pid,
            what: format!("fd {efd}: epoll target fd {}: {why}", line.tfd),
        };
        // kcmp counts registrations under one fd number from 0, in the
        // order fdinfo lists them.
        let toff = lines[..i].iter().filter(|l| l.tfd == line.tfd).count() as u32;
        let Some(h) = resolve(tree, epoll, line, toff)? else {
            return Err(refuse(format!(
                "no fd of the tree that ckpt saves holds the registered file (ino {:#x})",
                line.ino
            )));
        };
        // An epoll target may be an epoll itself: restore rebuilds the
        // inner one first.
        let file = tree.file(h.file_id);
        // Restore adds a target from this process's fds or, failing that,
        // from the process that installed the file first, which must be
        // rebuilt before this one.
        let held_here = tree
            .holders()
            .any(|o| o.pid == pid && o.file_id == h.file_id);
        if !held_here {
            let first = tree
                .holders()
                .find(|o| o.file_id == h.file_id)
                .map(|o| o.pid)
                .unwrap_or(h.pid);
            if matches!(file.kind, Some(Kind::Tty(_))) {
                // Terminals are reconnected per fd, never shared by id.
                return Err(refuse(
                    "a terminal no longer open in this process (not supported)".into(),
                ));
            }
            if rank(first) > rank(pid) {
                return Err(refuse(format!(
                    "its file ({}) is no longer open in this process and pid {first}, which \
                     holds it, is restored later",
                    file.kind_name()
                )));
            }
        }
        targets.push(EpollTarget {
            file_id: h.file_id,
            events: line.events,
            data: line.data,
            fd: line.tfd,
        });
    }
    Ok(targets)
}

/// The fd of the tree that holds the file registered by `line`: the
/// registered number in the epoll's process first, then any other fd.
fn resolve(
    tree: &TreeFiles,
    epoll: &Holder,
    line: &TargetLine,
    toff: u32,
) -> Result<Option<Holder>> {
    let mut candidates: Vec<Holder> = tree.holders().collect();
    // Stable sort: the registered number in the epoll's process, then the
    // rest of that process, then the tree in order.
    candidates.sort_by_key(|h| (h.pid != epoll.pid, h.fd != line.tfd));
    let mut inode_match: Option<Holder> = None;
    for h in candidates {
        let path = procfile::path(h.pid, &format!("fd/{}", h.fd));
        let meta = std::fs::metadata(&path).map_err(|s| procfile::proc_err(h.pid, path, s))?;
        if meta.ino() != line.ino || meta.dev() != line.dev() {
            continue;
        }
        match sys::same_epoll_target(h.pid, h.fd, epoll.pid, epoll.fd, line.tfd, toff) {
            Ok(true) => return Ok(Some(h)),
            Ok(false) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP | libc::EINVAL | libc::ENOSYS)
                ) =>
            {
                // The kernel cannot compare; the inode decides.
                inode_match.get_or_insert(h);
            }
            Err(source) => {
                return Err(DumpError::Proc {
                    pid: epoll.pid,
                    path: format!(
                        "kcmp(KCMP_EPOLL_TFD) pid {} fd {} / epoll fd {} target fd {}",
                        h.pid, h.fd, epoll.fd, line.tfd
                    )
                    .into(),
                    source,
                });
            }
        }
    }
    Ok(inode_match)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_target_lines() {
        let info = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\n\
                    tfd:        5 events:       19 data:             1111  pos:0 ino:2a sdev:d\n\
                    tfd:       12 events: 40000019 data: ffffffffffffffff  pos:3 ino:7 sdev:100003\n";
        let t = parse_targets(info).expect("parses");
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t[0].tfd, t[0].events, t[0].data, t[0].ino),
            (5, 0x19, 0x1111, 0x2a)
        );
        assert_eq!(t[1].events, 0x4000_0019);
        assert_eq!(t[1].data, u64::MAX);
        assert_eq!(t[1].dev(), libc::makedev(1, 3));
        assert!(parse_targets("tfd: x events: 1 data: 1 pos:0 ino:1 sdev:1").is_err());
    }
}
