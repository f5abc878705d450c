//! The tree's UTS, IPC and time namespaces (Manifest.namespaces), made new
//! for the restored root and everything it forks, and the network and
//! mount namespaces the operator names for it (`--netns`, `--mntns`).
//!
//! Order, and why:
//! 0. mount, for the whole rebuild: the restorer thread that forks the
//!    root enters the named namespace first and leaves it only once every
//!    process is rebuilt (or the rebuild failed). The processes reopen
//!    their files themselves, but the restorer opens some paths for them
//!    too (ghost files, FIFOs, /dev/ptmx, identity checks), which must
//!    resolve where the processes live. The image is read through a
//!    directory fd opened before, so it is found wherever the thread is;
//!    /proc, which the restorer works through, must be one of its PID
//!    namespace there ([`MntTarget::open`] checks). A tree dumped in a
//!    mount namespace of its own needs one named (the paths of its files
//!    are that namespace's); a tree from ckpt's own may be moved into one.
//!    A tree restored into a new PID namespace gets a new mount namespace
//!    made from the named one, as `ckpt run --pidns` makes one from its
//!    own (its init mounts the namespace's /proc there);
//! 1. network: the root is forked from a restorer thread inside the named
//!    namespace, which then goes back to its own. Its sockets are created
//!    by the processes themselves, so they live there; the restorer only
//!    works on its copies of them. A tree dumped in a network namespace of
//!    its own needs one named (its interfaces and routes are not in the
//!    image); a tree from ckpt's own may be moved into one;
//! 2. time, before the root exists: the restorer's thread unshares a time
//!    namespace for its children and writes its offsets, which the kernel
//!    accepts only until the first process enters it. The offsets make the
//!    job's CLOCK_MONOTONIC and CLOCK_BOOTTIME continue from their dumped
//!    values, whatever this host's uptime is;
//! 3. UTS and IPC, with the root: clone3 flags of its fork;
//! 4. names, and SysV objects with their ids, right after: from a thread
//!    of the restorer that enters the root's namespaces (both are per
//!    thread), before any process of the tree runs or attaches them.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, IntoRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

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

/// What a file type is, for messages.
fn type_name(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_char_device() || t.is_block_device() {
        "device"
    } else if t.is_dir() {
        "directory"
    } else {
        "symbolic link"
    }
}

/// Opens the namespace file an operator named. An `O_PATH` open first,
/// which opens nothing: a FIFO there would block a plain open for ever, a
/// device open could act. Namespace files are regular files of nsfs; only
/// such a file is then opened for real, through the `O_PATH` fd.
fn open_ns_file(path: &Path) -> std::result::Result<File, String> {
    use std::os::fd::AsRawFd;
    let named = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| e.to_string())?;
    let kind = named
        .metadata()
        .map_err(|e| format!("stat: {e}"))?
        .file_type();
    if !kind.is_file() {
        return Err(format!("a {}, not a namespace file", type_name(kind)));
    }
    File::open(format!("/proc/self/fd/{}", named.as_raw_fd())).map_err(|e| e.to_string())
}

/// A network namespace named for the restored tree (`--netns PATH`).
pub struct NetTarget {
    ns: File,
    path: std::path::PathBuf,
}

impl NetTarget {
    /// Opens `path`, which must be a network namespace file (such as
    /// `/run/netns/NAME` or `/proc/PID/ns/net`): anything else is refused
    /// by name before the restore starts.
    pub fn open(path: &std::path::Path) -> Result<NetTarget> {
        let err = |what: String| RestoreError::NetNamespace {
            path: path.into(),
            what,
        };
        let ns = open_ns_file(path).map_err(err)?;
        match sys::ns_type(ns.as_fd()) {
            Ok(libc::CLONE_NEWNET) => Ok(NetTarget {
                ns,
                path: path.into(),
            }),
            Ok(_) => Err(err("a namespace, but not a network namespace".into())),
            Err(e) => Err(err(format!("not a namespace file ({e})"))),
        }
    }
}

/// The restorer thread's own network namespace while it forks the root in
/// another; [`OwnNet::restore`] goes back.
pub struct OwnNet {
    ns: File,
}

impl OwnNet {
    /// The calling thread is in its own network namespace again.
    pub fn restore(self, root: i32) -> Result<()> {
        sys::setns(self.ns.as_fd(), libc::CLONE_NEWNET).map_err(|e| {
            RestoreError::os(root, "setns back into the restorer's network namespace", e)
        })
    }
}

/// Puts the calling thread in `target`, so the root it forks next (and
/// everything that root forks) lives there.
pub fn enter_net(root: i32, target: &NetTarget) -> Result<OwnNet> {
    let own = File::open("/proc/thread-self/ns/net")
        .map_err(|e| RestoreError::os(root, "open /proc/thread-self/ns/net", e))?;
    sys::setns(target.ns.as_fd(), libc::CLONE_NEWNET)
        .map_err(|e| RestoreError::os(root, format!("setns into {}", target.path.display()), e))?;
    log::info!(
        "namespaces: restoring into network namespace {}",
        target.path.display()
    );
    Ok(OwnNet { ns: own })
}

/// A mount namespace named for the restored tree (`--mntns PATH`).
pub struct MntTarget {
    ns: File,
    path: PathBuf,
}

impl MntTarget {
    /// Opens `path`, which must be a mount namespace file (such as
    /// `/proc/PID/ns/mnt`, or one bind-mounted elsewhere) whose /proc
    /// shows this process under its own pid: anything else is refused by
    /// name before the restore starts.
    pub fn open(path: &Path) -> Result<MntTarget> {
        let err = |what: String| RestoreError::MntNamespace {
            path: path.into(),
            what,
        };
        let ns = open_ns_file(path).map_err(err)?;
        match sys::ns_type(ns.as_fd()) {
            Ok(libc::CLONE_NEWNS) => {}
            Ok(_) => return Err(err("a namespace, but not a mount namespace".into())),
            Err(e) => return Err(err(format!("not a namespace file ({e})"))),
        }
        let target = MntTarget {
            ns,
            path: path.into(),
        };
        target.check_proc().map_err(err)?;
        Ok(target)
    }

    /// The restorer reads and drives the processes through /proc while it
    /// is in the namespace: there, /proc must show this very thread under
    /// its pid and tid, in this namespace (a /proc of another PID
    /// namespace, or none, would name other processes or nothing). Looked
    /// at from a thread of its own that enters and ends.
    fn check_proc(&self) -> std::result::Result<(), String> {
        let inode = self.ns.metadata().map_err(|e| format!("stat: {e}"))?.ino();
        std::thread::scope(|s| {
            s.spawn(|| {
                sys::unshare_fs().map_err(|e| format!("unshare(CLONE_FS): {e}"))?;
                sys::setns(self.ns.as_fd(), libc::CLONE_NEWNS)
                    .map_err(|e| format!("cannot enter it: {e}"))?;
                let me = format!("{}/task/{}", std::process::id(), sys::gettid());
                let shown = std::fs::read_link("/proc/thread-self").ok();
                let in_ns = std::fs::metadata("/proc/thread-self/ns/mnt").map(|m| m.ino());
                if shown.as_deref() == Some(Path::new(&me)) && in_ns.ok() == Some(inode) {
                    Ok(())
                } else {
                    Err(
                        "its /proc is not one of ckpt's PID namespace (the restorer works on \
                         the processes through it): mount one there"
                            .into(),
                    )
                }
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

/// What the restorer thread had before it entered the tree's mount
/// namespace ([`enter_mnt`]). [`OwnMnt::restore`] goes back to it; so does
/// dropping it (a rebuild that failed), which can only log a failure.
pub struct OwnMnt {
    ns: File,
    root: OwnedFd,
    cwd: OwnedFd,
    /// The tree's root pid, for errors.
    pid: i32,
    /// Back already.
    back: bool,
}

impl OwnMnt {
    /// The calling thread is in its own mount namespace again, with its
    /// root and cwd (setns left them at the namespace's root).
    pub fn restore(mut self) -> Result<()> {
        self.back = true;
        self.go_back()
    }

    fn go_back(&self) -> Result<()> {
        let os = |op: &str, e| RestoreError::os(self.pid, op, e);
        // Threads started meanwhile (the lazy page server's) share this
        // thread's filesystem context, which setns refuses: they stay.
        sys::unshare_fs().map_err(|e| os("unshare(CLONE_FS)", e))?;
        sys::setns(self.ns.as_fd(), libc::CLONE_NEWNS)
            .map_err(|e| os("setns back into the restorer's mount namespace", e))?;
        sys::fchdir(self.root.as_fd()).map_err(|e| os("fchdir to the restorer's root", e))?;
        sys::chroot_to_cwd().map_err(|e| os("chroot to the restorer's root", e))?;
        sys::fchdir(self.cwd.as_fd()).map_err(|e| os("fchdir to the restorer's cwd", e))?;
        log::debug!("namespaces: back in the restorer's mount namespace");
        Ok(())
    }
}

impl Drop for OwnMnt {
    fn drop(&mut self) {
        if !self.back
            && let Err(e) = self.go_back()
        {
            log::error!("namespaces: {e}");
        }
    }
}

/// Puts the calling thread in `target` with a filesystem context of its
/// own (the process's other threads stay where they are), so the root it
/// forks next lives there and the paths it opens resolve there, until
/// [`OwnMnt::restore`]. `root` names errors.
pub fn enter_mnt(root: i32, target: &MntTarget) -> Result<OwnMnt> {
    let os = |op: &str, e| RestoreError::os(root, op, e);
    // Threads made after this share the thread's namespace and context:
    // rayon's pool (page copies) must exist before, in ckpt's.
    rayon::current_num_threads();
    sys::unshare_fs().map_err(|e| os("unshare(CLONE_FS)", e))?;
    let dir = |path: &str| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(path)
            .map(OwnedFd::from)
            .map_err(|e| os(&format!("open {path}"), e))
    };
    let mut own = OwnMnt {
        ns: File::open("/proc/thread-self/ns/mnt")
            .map_err(|e| os("open /proc/thread-self/ns/mnt", e))?,
        root: dir("/")?,
        cwd: dir(".")?,
        pid: root,
        // Not gone anywhere yet: nothing to go back from.
        back: true,
    };
    sys::setns(target.ns.as_fd(), libc::CLONE_NEWNS)
        .map_err(|e| os(&format!("setns into {}", target.path.display()), e))?;
    log::info!(
        "namespaces: restoring into mount namespace {}",
        target.path.display()
    );
    own.back = false;
    Ok(own)
}

/// A tree dumped in a mount namespace of its own goes only where the
/// operator says: the paths of its files are that namespace's.
pub fn check_mnt(root: i32, ns: Option<&Namespaces>, target: Option<&MntTarget>) -> Result<()> {
    match (ns.and_then(|n| n.mnt.as_ref()), target) {
        (Some(mnt), None) => Err(RestoreError::Host {
            pid: root,
            what: format!(
                "the tree lived in a mount namespace of its own (mnt:[{}]); name the one to \
                 restore it into with --mntns PATH (--mntns /proc/self/ns/mnt: ckpt's own, \
                 as for a job started by `ip netns exec`)",
                mnt.inode
            ),
        }),
        _ => Ok(()),
    }
}

/// A tree dumped in a network namespace of its own goes only where the
/// operator says.
pub fn check_net(root: i32, ns: Option<&Namespaces>, target: Option<&NetTarget>) -> Result<()> {
    match (ns.and_then(|n| n.net.as_ref()), target) {
        (Some(net), None) => Err(RestoreError::Host {
            pid: root,
            what: format!(
                "the tree lived in a network namespace of its own (net:[{}]); name the one to \
                 restore it into with --netns PATH",
                net.inode
            ),
        }),
        _ => Ok(()),
    }
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

/// No fd in [`RESTORER_TIME_NS`].
const NO_FD: i32 = -1;

/// The restorer's own time namespace (an fd of /proc/self/ns/time) when
/// its main thread could not go back to it after forking a root into a
/// job's: a single-threaded child of the restorer (the detached page
/// server) goes back with [`leave_job_time_ns`].
static RESTORER_TIME_NS: AtomicI32 = AtomicI32::new(NO_FD);

/// The fd [`leave_job_time_ns`] needs, for a child that closes the others.
pub fn restorer_time_fd() -> Option<std::os::fd::RawFd> {
    let fd = RESTORER_TIME_NS.load(Ordering::Relaxed);
    (fd != NO_FD).then_some(fd)
}

/// In a single-threaded child of the restorer: back to the restorer's own
/// time namespace if the child was forked into a job's, so its clocks are
/// the host's again (its deadlines were taken there). Logs nothing (a
/// forked child may not take the logger's lock).
pub fn leave_job_time_ns() -> std::io::Result<()> {
    match restorer_time_fd() {
        Some(fd) => {
            // SAFETY: the fd was leaked into the static by
            // `OwnTime::restore` and is never closed while this process
            // lives.
            let ns = unsafe { BorrowedFd::borrow_raw(fd) };
            sys::setns(ns, libc::CLONE_NEWTIME)
        }
        None => Ok(()),
    }
}

/// The restorer's own time namespace, to go back to once the root is
/// forked into the new one ([`enter_time`]).
pub struct OwnTime {
    ns: File,
}

impl OwnTime {
    /// Children the restorer forks from now on are in its own time
    /// namespace again. setns of a time namespace needs a single-threaded
    /// caller; a restorer with threads keeps the fd for its children to go
    /// back themselves ([`leave_job_time_ns`]).
    pub fn restore(self) {
        match sys::setns(self.ns.as_fd(), libc::CLONE_NEWTIME) {
            Ok(()) => log::debug!("namespaces: back in the restorer's time namespace"),
            Err(e) => {
                log::debug!(
                    "namespaces: the restorer's children go back to its time namespace themselves (setns here: {e})"
                );
                let old = RESTORER_TIME_NS.swap(self.ns.into_raw_fd(), Ordering::Relaxed);
                if old != NO_FD {
                    // SAFETY: an fd this module leaked earlier, replaced
                    // by an equivalent one; nothing else uses it.
                    unsafe { libc::close(old) };
                }
            }
        }
    }
}

/// Children this thread forks from now on go into a new time namespace
/// whose clocks continue from `time`'s. Call right before forking the
/// root, from the thread that forks it; then [`OwnTime::restore`].
pub fn enter_time(root: i32, time: &TimeNamespace) -> Result<OwnTime> {
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
    let own = File::open("/proc/self/ns/time").map_err(|e| os("open /proc/self/ns/time", e))?;
    sys::unshare_time_namespace().map_err(|e| os("unshare(CLONE_NEWTIME)", e))?;
    std::fs::write("/proc/self/timens_offsets", &offsets)
        .map_err(|e| os(&format!("write timens_offsets {offsets:?}"), e))?;
    log::info!("namespaces: new time namespace, offsets {offsets:?}");
    Ok(OwnTime { ns: own })
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
            net: None,
            mnt: None,
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

    #[test]
    fn a_tree_of_a_mount_namespace_of_its_own_needs_one_named() {
        let own = Namespaces {
            mnt: Some(ckpt_image::manifest::MntNamespace { inode: 7 }),
            ..Namespaces::default()
        };
        let e = check_mnt(1, Some(&own), None).unwrap_err().to_string();
        assert!(e.contains("mnt:[7]") && e.contains("--mntns"), "{e}");
        assert!(check_mnt(1, Some(&Namespaces::default()), None).is_ok());
        assert!(check_mnt(1, None, None).is_ok());
        let e = MntTarget::open(Path::new("/dev/null"))
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains("--mntns /dev/null") && e.contains("not a namespace"),
            "{e}"
        );
    }
}
