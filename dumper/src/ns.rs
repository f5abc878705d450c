//! The tree's namespaces other than PID (see `pidns.rs`).
//!
//! A tree may have UTS, IPC and time namespaces of its own (`ckpt run
//! --utsns --ipcns --timens`): they are saved (names, SysV objects,
//! clocks) and recreated at restore. Every process of the tree must share
//! the root's namespace of each kind: a tree spanning two cannot be put
//! back in one. A network namespace other than ckpt's is recorded (not its
//! interfaces: a restore needs one named by the operator), and the tree's
//! sockets are read from a thread of ckpt inside it (sock_diag answers for
//! the asking thread's namespace). A mount namespace other than ckpt's is
//! recorded too (not its mounts: the paths of the tree's files are that
//! namespace's, and a restore needs one named by the operator), except the
//! private one `ckpt run --pidns` makes, which a restore recreates with the
//! PID namespace. User and cgroup namespaces other than ckpt's are refused
//! by name: a restore would silently move the job into ckpt's.
//!
//! What is read inside a namespace (UTS names, SysV objects) is read from
//! a thread of ckpt that enters it with setns: UTS and IPC namespaces are
//! per thread, so the rest of ckpt stays in its own.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use ckpt_image::manifest::{Namespaces, TimeNamespace, UtsNamespace};

use crate::error::{DumpError, Result};
use crate::pidns::TreeNs;
use crate::procfile;
use crate::sys;

/// Namespace kinds the tree may have of its own, saved and recreated.
const UTS: &str = "uts";
const IPC: &str = "ipc";
const TIME: &str = "time";
const NET: &str = "net";
const MNT: &str = "mnt";
/// The time namespace a process's next children get: differs from its own
/// after an `unshare(CLONE_NEWTIME)` with no fork since.
const TIME_FOR_CHILDREN: &str = "time_for_children";

/// Kinds refused when the root's differs from ckpt's, with why.
const REFUSED: [(&str, &str); 2] = [
    ("user", "user namespace of its own"),
    ("cgroup", "cgroup namespace of its own"),
];

/// Kinds every process must share with the root: a restore gives every
/// process the root's (mount: the one `ckpt run --pidns` made, or the one
/// named at restore).
const SHARED: [&str; 9] = [
    UTS,
    IPC,
    TIME,
    TIME_FOR_CHILDREN,
    "net",
    "user",
    "cgroup",
    MNT,
    "pid_for_children",
];

/// The tree's namespaces, found by [`collect`].
#[derive(Default)]
pub struct TreeNamespaces {
    /// What the manifest records (`None`: all ckpt's).
    pub saved: Option<Namespaces>,
    /// The tree's own IPC namespace, entered to read its SysV objects.
    ipc: Option<File>,
    /// The tree's own network namespace, entered to read its sockets.
    net: Option<File>,
}

impl TreeNamespaces {
    /// Runs `f` in the tree's IPC namespace (a thread of ckpt entered into
    /// it), or here when the tree shares ckpt's. `root` names errors.
    pub fn in_ipc<T: Send>(&self, root: i32, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
        match &self.ipc {
            None => f(),
            Some(ns) => within(root, ns, libc::CLONE_NEWIPC, f),
        }
    }

    /// Runs `f` in the tree's network namespace (a thread of ckpt entered
    /// into it), or here when the tree shares ckpt's.
    pub fn in_net<T: Send>(&self, root: i32, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
        match &self.net {
            None => f(),
            Some(ns) => within(root, ns, libc::CLONE_NEWNET, f),
        }
    }

    /// Whether the tree's SysV objects are those of an IPC namespace of its
    /// own, which ends with its last process (and takes them with it).
    pub fn own_ipc(&self) -> bool {
        self.ipc.is_some()
    }
}

/// Runs `f` in a thread that entered namespace `ns` of kind `nstype`.
fn within<T: Send>(
    root: i32,
    ns: &File,
    nstype: libc::c_int,
    f: impl FnOnce() -> Result<T> + Send,
) -> Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            sys::setns(ns.as_fd(), nstype)
                .map_err(|e| procfile::proc_err(root, ns_path(root, nstype), e))?;
            f()
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Inode of namespace `kind` of `pid` (`/proc/PID/ns/KIND`).
fn inode(pid: i32, kind: &str) -> Result<u64> {
    let path = procfile::path(pid, &format!("ns/{kind}"));
    std::fs::metadata(&path)
        .map(|m| m.ino())
        .map_err(|e| procfile::proc_err(pid, path, e))
}

/// Inode of ckpt's own namespace `kind`.
fn own_inode(root: i32, kind: &str) -> Result<u64> {
    let path = std::path::PathBuf::from(format!("/proc/thread-self/ns/{kind}"));
    std::fs::metadata(&path)
        .map(|m| m.ino())
        .map_err(|e| procfile::proc_err(root, path, e))
}

/// `/proc/ROOT/ns/KIND` of a setns type, for errors.
fn ns_path(root: i32, nstype: libc::c_int) -> std::path::PathBuf {
    let kind = match nstype {
        libc::CLONE_NEWUTS => UTS,
        libc::CLONE_NEWNET => NET,
        _ => IPC,
    };
    procfile::path(root, &format!("ns/{kind}"))
}

fn open_ns(pid: i32, kind: &str) -> Result<File> {
    let path = procfile::path(pid, &format!("ns/{kind}"));
    File::open(&path).map_err(|e| procfile::proc_err(pid, path, e))
}

/// The namespaces of the tree rooted at `root` (`pids`: every live process,
/// root first) filling PID namespace `pid_ns`, or every reason it cannot be
/// saved.
pub fn collect(root: i32, pids: &[i32], pid_ns: TreeNs) -> Result<TreeNamespaces> {
    let mut refused = crate::blockers::Blockers::default();
    for &pid in pids.iter().filter(|p| **p != root) {
        for kind in SHARED {
            // A process's children get its *_for_children, which must be
            // the root's own.
            let roots = match kind {
                TIME_FOR_CHILDREN => inode(root, TIME)?,
                _ => inode(root, kind)?,
            };
            if inode(pid, kind)? != roots {
                refused.absorb::<()>(Err(DumpError::Unsupported {
                    pid,
                    what: format!("{kind} namespace other than the tree root's (pid {root})"),
                }))?;
            }
        }
    }
    for (kind, what) in REFUSED {
        if inode(root, kind)? != own_inode(root, kind)? {
            refused.absorb::<()>(Err(DumpError::Unsupported {
                pid: root,
                what: what.into(),
            }))?;
        }
    }
    if inode(root, TIME_FOR_CHILDREN)? != inode(root, TIME)? {
        refused.absorb::<()>(Err(DumpError::Unsupported {
            pid: root,
            what: "time namespace for children other than its own (unshare(CLONE_NEWTIME) with no fork since)".into(),
        }))?;
    }
    refused.into_result()?;

    let mut saved = Namespaces::default();
    let mut any = false;
    if inode(root, UTS)? != own_inode(root, UTS)? {
        let ns = open_ns(root, UTS)?;
        let (hostname, domainname) = within(root, &ns, libc::CLONE_NEWUTS, || {
            sys::uts_names()
                .map_err(|e| procfile::proc_err(root, ns_path(root, libc::CLONE_NEWUTS), e))
        })?;
        log::info!("namespaces: UTS of its own, hostname {hostname:?}");
        saved.uts = Some(UtsNamespace {
            hostname,
            domainname,
        });
        any = true;
    }
    let ipc = if inode(root, IPC)? != own_inode(root, IPC)? {
        log::info!("namespaces: IPC of its own");
        saved.ipc = true;
        any = true;
        Some(open_ns(root, IPC)?)
    } else {
        None
    };
    let net_inode = inode(root, NET)?;
    let net = if net_inode != own_inode(root, NET)? {
        log::info!("namespaces: network namespace of its own, net:[{net_inode}]");
        saved.net = Some(ckpt_image::manifest::NetNamespace { inode: net_inode });
        any = true;
        Some(open_ns(root, NET)?)
    } else {
        None
    };
    let mnt_inode = inode(root, MNT)?;
    if mnt_inode != own_inode(root, MNT)? {
        match pid_ns {
            // The init of `ckpt run --pidns` made it (a slave of the
            // launcher's, with the namespace's /proc): a restore into a new
            // PID namespace makes another the same way.
            TreeNs::RootInit { .. } => log::debug!(
                "namespaces: mount namespace mnt:[{mnt_inode}] is the PID namespace's own, recreated with it"
            ),
            TreeNs::Ckpt => {
                log::info!("namespaces: mount namespace of its own, mnt:[{mnt_inode}]");
                saved.mnt = Some(ckpt_image::manifest::MntNamespace { inode: mnt_inode });
                any = true;
            }
        }
    }
    if inode(root, TIME)? != own_inode(root, TIME)? {
        let time = clocks(root)?;
        log::info!(
            "namespaces: time of its own, monotonic {} ns, boottime {} ns",
            time.monotonic_ns,
            time.boottime_ns
        );
        saved.time = Some(time);
        any = true;
    }
    Ok(TreeNamespaces {
        saved: any.then_some(saved),
        ipc,
        net,
    })
}

/// The clocks the root's time namespace shows now: ckpt's plus the
/// namespace's offsets.
fn clocks(root: i32) -> Result<TimeNamespace> {
    let text = procfile::read(root, "timens_offsets")?;
    let offsets = Offsets::parse(&text).ok_or_else(|| DumpError::Parse {
        pid: root,
        path: format!("/proc/{root}/timens_offsets"),
        what: format!("no monotonic and boottime offsets in {text:?}"),
    })?;
    let now = |clock| {
        sys::clock_ns(clock)
            .map_err(|e| procfile::proc_err(root, procfile::path(root, "timens_offsets"), e))
    };
    let monotonic = now(libc::CLOCK_MONOTONIC)?;
    let boottime = now(libc::CLOCK_BOOTTIME)?;
    Ok(TimeNamespace {
        monotonic_ns: monotonic.saturating_add(offsets.monotonic_ns),
        boottime_ns: boottime.saturating_add(offsets.boottime_ns),
        monotonic_offset_ns: offsets.monotonic_ns,
        boottime_offset_ns: offsets.boottime_ns,
    })
}

/// `/proc/PID/timens_offsets`: one `CLOCK SECONDS NANOSECONDS` line per
/// clock.
#[derive(Debug, PartialEq, Eq)]
struct Offsets {
    monotonic_ns: i64,
    boottime_ns: i64,
}

impl Offsets {
    fn parse(text: &str) -> Option<Offsets> {
        let mut monotonic_ns = None;
        let mut boottime_ns = None;
        for line in text.lines() {
            let mut f = line.split_whitespace();
            let (Some(clock), Some(secs), Some(nanos)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            let ns = secs
                .parse::<i64>()
                .ok()?
                .checked_mul(sys::NANOS_PER_SEC)?
                .checked_add(nanos.parse::<i64>().ok()?)?;
            match clock {
                "monotonic" => monotonic_ns = Some(ns),
                "boottime" => boottime_ns = Some(ns),
                _ => {}
            }
        }
        Some(Offsets {
            monotonic_ns: monotonic_ns?,
            boottime_ns: boottime_ns?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_parse_both_clocks_and_signs() {
        let text = "monotonic     864000         0\nboottime         -5 500000000\n";
        assert_eq!(
            Offsets::parse(text),
            Some(Offsets {
                monotonic_ns: 864_000 * sys::NANOS_PER_SEC,
                boottime_ns: -5 * sys::NANOS_PER_SEC + 500_000_000,
            })
        );
        assert_eq!(Offsets::parse("monotonic 1 0\n"), None, "boottime missing");
        assert_eq!(Offsets::parse("monotonic x 0\nboottime 0 0\n"), None);
    }

    #[test]
    fn a_tree_in_ckpts_namespaces_saves_none() {
        let me = std::process::id() as i32;
        let found = collect(me, &[me], TreeNs::Ckpt).unwrap();
        assert!(found.saved.is_none());
        assert!(!found.own_ipc());
    }
}
