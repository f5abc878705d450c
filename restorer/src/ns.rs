//! The tree's UTS, IPC and time namespaces (Manifest.namespaces), made new
//! for the restored root and everything it forks.
//!
//! Order, and why:
//! 1. time, before the root exists: the restorer's thread unshares a time
//!    namespace for its children and writes its offsets, which the kernel
//!    accepts only until the first process enters it. The offsets make the
//!    job's CLOCK_MONOTONIC and CLOCK_BOOTTIME continue from their dumped
//!    values, whatever this host's uptime is;
//! 2. UTS and IPC, with the root: clone3 flags of its fork;
//! 3. names, and SysV objects with their ids, right after: from a thread
//!    of the restorer that enters the root's namespaces (both are per
//!    thread), before any process of the tree runs or attaches them.

use std::fs::File;
use std::os::fd::AsFd;

use ckpt_image::manifest::{Namespaces, TimeNamespace, UtsNamespace};

use crate::error::{RestoreError, Result};
use crate::sys;

/// Bytes a UTS name may hold (`__NEW_UTS_LEN`).
const UTS_NAME_MAX: usize = 64;

/// The clone3 flags that give the root new namespaces of the saved kinds
/// (time excepted: see [`enter_time`]).
pub fn clone_flags(ns: Option<&Namespaces>) -> u64 {
    let Some(ns) = ns else { return 0 };
    let mut flags = 0;
    if ns.uts.is_some() {
        flags |= libc::CLONE_NEWUTS as u64;
    }
    if ns.ipc {
        flags |= libc::CLONE_NEWIPC as u64;
    }
    flags
}

/// Bounds what the image says before anything is created.
pub fn check(root: i32, ns: Option<&Namespaces>) -> Result<()> {
    if let Some(uts) = ns.and_then(|n| n.uts.as_ref()) {
        for (what, name) in [("hostname", &uts.hostname), ("domainname", &uts.domainname)] {
            if name.len() > UTS_NAME_MAX {
                return Err(RestoreError::Host {
                    pid: root,
                    what: format!(
                        "the image's {what} is {} bytes long, more than {UTS_NAME_MAX}",
                        name.len()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Children this thread forks from now on go into a new time namespace
/// whose clocks continue from `time`'s. Call right before forking the
/// root, from the thread that forks it.
pub fn enter_time(root: i32, time: &TimeNamespace) -> Result<()> {
    let os = |op: &str, e| RestoreError::os(root, op, e);
    let monotonic =
        sys::clock_ns(libc::CLOCK_MONOTONIC).map_err(|e| os("clock_gettime(MONOTONIC)", e))?;
    let boottime =
        sys::clock_ns(libc::CLOCK_BOOTTIME).map_err(|e| os("clock_gettime(BOOTTIME)", e))?;
    let offsets = format!(
        "{}\n{}\n",
        offset_line(
            libc::CLOCK_MONOTONIC,
            time.monotonic_ns.saturating_sub(monotonic)
        ),
        offset_line(
            libc::CLOCK_BOOTTIME,
            time.boottime_ns.saturating_sub(boottime)
        )
    );
    // The offsets file is the process's (its main thread's): the new
    // namespace must be that thread's children's, and the root its child.
    if !sys::is_main_thread() {
        return Err(RestoreError::Host {
            pid: root,
            what: "a time namespace can be recreated only from the restorer's main thread".into(),
        });
    }
    sys::unshare_time_namespace().map_err(|e| os("unshare(CLONE_NEWTIME)", e))?;
    std::fs::write("/proc/self/timens_offsets", &offsets)
        .map_err(|e| os(&format!("write timens_offsets {offsets:?}"), e))?;
    log::info!("namespaces: new time namespace, offsets {offsets:?}");
    Ok(())
}

/// One line of timens_offsets: `CLOCKID SECONDS NANOSECONDS`, the
/// nanoseconds never negative.
fn offset_line(clock: libc::clockid_t, ns: i64) -> String {
    format!(
        "{clock} {} {}",
        ns.div_euclid(sys::NANOS_PER_SEC),
        ns.rem_euclid(sys::NANOS_PER_SEC)
    )
}

/// Runs `f` in a thread of the restorer that entered namespace `kind`
/// (`nstype`) of `host_pid`.
fn within<T: Send>(
    host_pid: i32,
    kind: &str,
    nstype: libc::c_int,
    f: impl FnOnce() -> Result<T> + Send,
) -> Result<T> {
    let path = format!("/proc/{host_pid}/ns/{kind}");
    let ns =
        File::open(&path).map_err(|e| RestoreError::os(host_pid, format!("open {path}"), e))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            sys::setns(ns.as_fd(), nstype)
                .map_err(|e| RestoreError::os(host_pid, format!("setns {path}"), e))?;
            f()
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Names the new UTS namespace of the restored root (`host_pid`).
pub fn set_uts(host_pid: i32, uts: &UtsNamespace) -> Result<()> {
    within(host_pid, "uts", libc::CLONE_NEWUTS, || {
        sys::set_uts_names(uts.hostname.as_bytes(), uts.domainname.as_bytes())
            .map_err(|e| RestoreError::os(host_pid, "sethostname/setdomainname", e))
    })?;
    log::info!("namespaces: new UTS namespace, hostname {:?}", uts.hostname);
    Ok(())
}

/// Runs `f` in the restored root's (`host_pid`) IPC namespace when the
/// tree had one of its own, else here.
pub fn in_ipc<T: Send>(
    host_pid: i32,
    own: bool,
    f: impl FnOnce() -> Result<T> + Send,
) -> Result<T> {
    if own {
        within(host_pid, "ipc", libc::CLONE_NEWIPC, f)
    } else {
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_written_with_non_negative_nanoseconds() {
        assert_eq!(
            offset_line(libc::CLOCK_MONOTONIC, -1_500_000_000),
            format!("{} -2 500000000", libc::CLOCK_MONOTONIC)
        );
        assert_eq!(
            offset_line(libc::CLOCK_BOOTTIME, 864_000 * sys::NANOS_PER_SEC + 7),
            format!("{} 864000 7", libc::CLOCK_BOOTTIME)
        );
    }

    #[test]
    fn flags_follow_the_saved_kinds() {
        assert_eq!(clone_flags(None), 0);
        let ns = Namespaces {
            uts: Some(UtsNamespace::default()),
            ipc: true,
            time: Some(TimeNamespace::default()),
        };
        assert_eq!(
            clone_flags(Some(&ns)),
            (libc::CLONE_NEWUTS | libc::CLONE_NEWIPC) as u64
        );
        let long = Namespaces {
            uts: Some(UtsNamespace {
                hostname: "h".repeat(UTS_NAME_MAX + 1),
                domainname: String::new(),
            }),
            ..ns
        };
        assert!(check(1, Some(&long)).is_err());
    }
}
