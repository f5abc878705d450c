//! Open files, restore side: rebuilds each process's fd table at the same
//! numbers, giving fds that shared an open file description at dump time
//! one description again (`dup3` within a process, `pidfd_getfd` from the
//! process that installed it first, so offsets and flags stay shared).
//!
//! Each kind of file has a module here implementing [`FileRestorer`] and
//! one line in [`install_file`]; the twin on the dump side is
//! `dumper/src/fd/KIND.rs`, the image message `image/src/fd/KIND.rs`.

pub(crate) mod create;
pub(crate) mod creds;
mod dev;
mod epoll;
mod eventfd;
mod external;
mod fanotify;
mod fifo;
mod ib;

pub(crate) mod inet;
pub use inet::OutsidePeers;
mod inotify;
mod linked;
mod lock;
mod memfd;
mod netlink;
mod packet;
mod pidfd;
mod pipe;
mod privileged;
mod proc;
mod pty;
pub(crate) mod reg;
mod signalfd;
mod timerfd;
mod tty;
mod unix;

use std::any::{Any, TypeId};
use std::collections::HashMap;

use ckpt_image::task::{ControllingTerminal, Creds};

use ckpt_image::ImageDir;
use ckpt_image::fd::{Fd, FdTable, File, Files, file::Kind};

use crate::context::RestoreContext;
use crate::error::{RestoreError, Result};
use crate::options::{FilePolicy, InheritFd};
use ckpt_parasite::batch;
use ckpt_parasite::remote::Remote;

/// One kind of open file, restore side.
pub trait FileRestorer {
    /// The kind's image message.
    type Image;
    /// Every fd of this kind is reconnected by its own rule instead of
    /// sharing the dumped description (terminals).
    const PER_FD: bool = false;
    /// Its files refer to other open files of the process, which must be
    /// installed first (an epoll adds its targets by fd): installed in the
    /// last pass.
    const AFTER_OTHERS: bool = false;
    /// Opens the description inside the process behind `r` and returns
    /// the fd it got there (any number; the caller moves it to `fd`).
    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &Self::Image,
        fd: i32,
    ) -> Result<i32>;
}

/// Installs `fd` of the process behind `r`: the registry of file kinds.
fn install_file(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    file: &File,
    fd: &Fd,
    pass: Pass,
) -> Result<()> {
    match &file.kind {
        Some(Kind::Reg(image)) => install(&reg::Reg, cx, r, file, image, fd, pass),
        Some(Kind::Dev(image)) => install(&dev::Dev, cx, r, file, image, fd, pass),
        Some(Kind::Tty(image)) => install(&tty::Tty, cx, r, file, image, fd, pass),
        Some(Kind::Pipe(image)) if image.outside => {
            install(&pipe::StdioPipe, cx, r, file, image, fd, pass)
        }
        Some(Kind::Pipe(image)) => install(&pipe::Pipe, cx, r, file, image, fd, pass),
        Some(Kind::Eventfd(image)) => install(&eventfd::Eventfd, cx, r, file, image, fd, pass),
        Some(Kind::External(image)) => install(&external::External, cx, r, file, image, fd, pass),
        Some(Kind::Timerfd(image)) => install(&timerfd::Timerfd, cx, r, file, image, fd, pass),
        Some(Kind::Signalfd(image)) => install(&signalfd::Signalfd, cx, r, file, image, fd, pass),
        Some(Kind::Fifo(image)) => install(&fifo::Fifo, cx, r, file, image, fd, pass),
        Some(Kind::Epoll(image)) => install(&epoll::Epoll, cx, r, file, image, fd, pass),
        Some(Kind::Pty(image)) => install(&pty::Pty, cx, r, file, image, fd, pass),
        Some(Kind::Inet(image)) => install(&inet::Inet, cx, r, file, image, fd, pass),
        Some(Kind::Inotify(image)) => install(&inotify::Inotify, cx, r, file, image, fd, pass),
        Some(Kind::Fanotify(image)) => install(&fanotify::Fanotify, cx, r, file, image, fd, pass),
        Some(Kind::Pidfd(image)) => install(&pidfd::Pidfd, cx, r, file, image, fd, pass),
        Some(Kind::Memfd(image)) => install(&memfd::Memfd, cx, r, file, image, fd, pass),
        Some(Kind::Unix(image)) if image.connect_to_file_id != 0 => {
            install(&unix::UnixConnect, cx, r, file, image, fd, pass)
        }
        Some(Kind::Unix(image)) => install(&unix::Unix, cx, r, file, image, fd, pass),
        Some(Kind::Ib(image)) => install(&ib::Ib, cx, r, file, image, fd, pass),
        Some(Kind::Proc(image)) => install(&proc::Proc, cx, r, file, image, fd, pass),
        Some(Kind::Netlink(image)) => install(&netlink::Netlink, cx, r, file, image, fd, pass),
        Some(Kind::Packet(image)) => install(&packet::Packet, cx, r, file, image, fd, pass),
        None => Err(cx.invalid(fd.fd, "file of unknown kind")),
    }
}

/// The passes over a process's fd table: kinds whose files refer to other
/// files ([`FileRestorer::AFTER_OTHERS`]) go last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    First,
    Last,
}

/// The restorer's standard input, output and error: passed to the
/// terminal fds of the same numbers, so output appears where restore runs
/// (unless they are someone else's files: [`Context::foreign_stdio`]).
const STDIO: [i32; 3] = [0, 1, 2];

/// Where an open file description was first installed.
#[derive(Clone, Copy)]
struct Installed {
    pid: i32,
    fd: i32,
}

/// What the fd restore keeps from one process to the next, across the
/// whole tree.
#[derive(Default)]
pub struct Tables {
    installed: HashMap<u64, Installed>,
    /// Per kind, state private to that kind, shared across its fds and
    /// processes (see [`Context::state`]).
    states: HashMap<TypeId, Box<dyn Any>>,
    /// Fds given the restorer's fd of their number by the terminal rule,
    /// tree order.
    bound: Vec<Bound>,
    /// Stdio fds given `/dev/null` instead of a file of someone else's
    /// that the restorer held, tree order.
    withheld: Vec<Withheld>,
}

impl Tables {
    /// Every fd given the restorer's fd of its number, tree order.
    pub fn bound(&self) -> &[Bound] {
        &self.bound
    }

    /// Every stdio fd given `/dev/null` instead of the restorer's file,
    /// tree order.
    pub fn withheld(&self) -> &[Withheld] {
        &self.withheld
    }
}

/// The fd restore of one process: what the whole restore shares, the
/// fd restore's tables, and the process's own fds so far.
pub struct Context<'c, 'a> {
    /// What the restore shares with the other resources (images, shared
    /// memory objects, outside peers, file checks, options).
    pub shared: &'c mut RestoreContext<'a>,
    tables: &'c mut Tables,
    /// The current process's fds installed so far: fd -> file id.
    here: HashMap<i32, u64>,
    /// The process being rebuilt and the fds it inherited from the restorer.
    pid: i32,
    inherited: Vec<i32>,
    /// The filesystem uid its files are reopened with, once known.
    fs: Option<creds::FsIdentity>,
    /// The effective capabilities the process was dumped with (none if
    /// the image has no credentials).
    cap_eff: u64,
    /// Fds taken from earlier processes, not yet in place ([`put_takes`]).
    takes: Vec<Take>,
}

/// An fd to be taken from the earlier process that installed its file.
struct Take {
    /// The earlier process and its fd (the restorer's view).
    owner: i32,
    owner_fd: i32,
    /// Where it goes here, and its FD_CLOEXEC.
    fd: i32,
    cloexec: bool,
}

/// A stdio fd of a restored process that got `/dev/null` because the
/// restorer's fd of its number was a file neither the process's user owns
/// nor a stream (a root-run hook's log, say): the restorer's rights must
/// not reach the process through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Withheld {
    /// The process.
    pub pid: i32,
    /// The fd number.
    pub fd: i32,
    /// The owner of the restorer's file (`None`: it could not be looked at).
    pub owner: Option<u32>,
}

/// Why an fd was given the restorer's own fd of its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundKind {
    /// It was a terminal.
    Terminal,
    /// It was a stdio pipe to a launcher outside the tree.
    StdioPipe,
}

/// An fd of a restored process that is now the restorer's fd of the same
/// number (the terminal rule).
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// The process.
    pub pid: i32,
    /// The fd number.
    pub fd: i32,
    /// What it was at dump time.
    pub kind: BoundKind,
}

impl Context<'_, '_> {
    /// What the user allows to reach the processes.
    fn policy(&self) -> &FilePolicy {
        &self.shared.options.files
    }

    /// The terminal rule, for fds whose dumped object belonged to the old
    /// launcher (a terminal, a stdio pipe): fd `fd` of the current process
    /// becomes the restorer's own fd of that number when the process
    /// inherited it and the user allows it ([`Context::may_inherit`]), else
    /// `/dev/null` opened with the dumped flags. Returns the fd it got.
    pub fn bind_to_restorer(
        &mut self,
        r: &Remote<'_>,
        file: &File,
        fd: i32,
        kind: BoundKind,
    ) -> Result<i32> {
        if self.may_inherit(fd) {
            if let Some(w) = self.foreign_stdio(fd) {
                self.tables.withheld.push(w);
                return Ok(r.open("/dev/null", reopen_flags(file), 0)?);
            }
            self.tables.bound.push(Bound {
                pid: self.pid,
                fd,
                kind,
            });
            return Ok(fd);
        }
        Ok(r.open("/dev/null", reopen_flags(file), 0)?)
    }

    /// Whether the restorer's stdio fd `fd`, which the process inherited,
    /// must be withheld from it: a restorer of another user (root, in a
    /// hook) may hold a file the process's user could never open, such as
    /// a root-owned 0600 log, and the process would write it (or read it)
    /// with the restorer's rights. Streams (pipes, sockets), `/dev/null`
    /// and the user's own files pass; so does everything when the restorer
    /// runs as that user (it has nothing more to give), or when the user
    /// running the restore asked for it with `--inherit-fd N`.
    fn foreign_stdio(&self, fd: i32) -> Option<Withheld> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        if self.policy().inherit_fds.contains(&InheritFd::Terminal(fd)) {
            return None;
        }
        let user = self.fs_uid()?;
        if nix::unistd::geteuid().as_raw() == user {
            return None;
        }
        let withheld = |owner| {
            Some(Withheld {
                pid: self.pid,
                fd,
                owner,
            })
        };
        // The very file the process holds, through its own fd.
        let Ok(st) = std::fs::metadata(format!("/proc/{}/fd/{fd}", self.pid)) else {
            return withheld(None);
        };
        let t = st.file_type();
        let dev_null = t.is_char_device() && st.rdev() == libc::makedev(1, 3);
        if t.is_fifo() || t.is_socket() || dev_null || st.uid() == user {
            return None;
        }
        withheld(Some(st.uid()))
    }

    /// The filesystem uid the current process's files are reopened with.
    pub fn fs_uid(&self) -> Option<u32> {
        self.fs.as_ref().map(creds::FsIdentity::uid)
    }

    /// The filesystem identity the current process's files are reopened
    /// and recreated with.
    pub fn fs_identity(&self) -> Option<&creds::FsIdentity> {
        self.fs.as_ref()
    }

    /// The user allowed the file at `path` to change since the dump.
    pub fn may_change(&self, path: &str) -> bool {
        self.policy()
            .allow_changed
            .iter()
            .any(|p| p.as_os_str() == path)
    }

    /// A kind's own state (created empty at first use, dropped when the
    /// restore ends), so a kind keeps what it shares across fds (a pipe
    /// created once for both ends) without a field here. Only for state
    /// private to one kind: what several resources share is a field of
    /// [`RestoreContext`].
    pub fn state<T: Default + 'static>(&mut self) -> &mut T {
        self.tables
            .states
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Box::new(T::default()))
            .downcast_mut()
            .expect("keyed by its own TypeId")
    }

    /// An fd of the current process already holding open file `file_id`:
    /// `want` if it does, else the lowest.
    pub fn fd_here(&self, file_id: u64, want: i32) -> Option<i32> {
        if self.here.get(&want) == Some(&file_id) {
            return Some(want);
        }
        self.here
            .iter()
            .filter(|(_, id)| **id == file_id)
            .map(|(fd, _)| *fd)
            .min()
    }

    /// A new fd of the process behind `r` for open file `file_id`, taken
    /// from the earlier process that installed it (the caller closes it),
    /// or `None` if no earlier process did.
    pub fn take_installed(&self, r: &Remote<'_>, file_id: u64) -> Result<Option<i32>> {
        match self.tables.installed.get(&file_id) {
            Some(at) if at.pid != self.pid => take_from(r, at.pid, at.fd).map(Some),
            _ => Ok(None),
        }
    }

    /// The process had capability `cap` in its effective set at the dump.
    pub fn dumped_with_cap(&self, cap: u32) -> bool {
        self.cap_eff & (1u64 << cap) != 0
    }

    /// The process being rebuilt.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The process inherited fd `fd` from the restorer and may keep it on
    /// a terminal fd of that number: stdio, or a number the user passed
    /// with `--inherit-fd`.
    pub fn may_inherit(&self, fd: i32) -> bool {
        let allowed =
            STDIO.contains(&fd) || self.policy().inherit_fds.contains(&InheritFd::Terminal(fd));
        allowed && self.inherited.contains(&fd)
    }

    /// A launcher gave the restorer a stream of its own as fd `fd` (a pipe
    /// or socket, which the process inherited), or the user handed that
    /// fd over (`--inherit-fd`): it takes the place of the process's old
    /// stdio pipe.
    pub fn launcher_gave(&self, fd: i32) -> bool {
        use std::os::unix::fs::FileTypeExt;
        if self.policy().inherit_fds.contains(&InheritFd::Terminal(fd)) {
            return true;
        }
        self.inherited.contains(&fd)
            && std::fs::metadata(format!("/proc/self/fd/{fd}"))
                .is_ok_and(|m| m.file_type().is_fifo() || m.file_type().is_socket())
    }

    /// The restorer's fd the user handed over for external `key`.
    pub fn external_fd(&self, key: &str) -> Option<i32> {
        self.policy().inherit_fds.iter().find_map(|i| match i {
            InheritFd::External { fd, key: k } if k == key => Some(*fd),
            _ => None,
        })
    }

    /// An error for a bad entry of this process's fd table.
    pub fn invalid(&self, fd: i32, what: &str) -> RestoreError {
        RestoreError::Image(ckpt_image::ImageError::Invalid {
            path: self
                .shared
                .images
                .path()
                .join(ckpt_image::fds_name(self.pid)),
            what: format!("fd {fd}: {what}"),
        })
    }
}

/// Checks a process's fd table against the tree's files before anything
/// is created.
pub fn validate(images: &ImageDir, pid: i32, table: &FdTable, files: &Files) -> Result<()> {
    let invalid = |what: String| {
        RestoreError::Image(ckpt_image::ImageError::Invalid {
            path: images.path().join(ckpt_image::fds_name(pid)),
            what,
        })
    };
    let mut last = -1;
    for f in &table.fds {
        if f.fd <= last {
            return Err(invalid(format!("fd {} out of order or repeated", f.fd)));
        }
        last = f.fd;
        if files.get(f.file_id).is_none() {
            return Err(invalid(format!(
                "fd {}: no file {} in files.img",
                f.fd, f.file_id
            )));
        }
    }
    for f in &table.in_flight {
        if f.fd <= last {
            return Err(invalid(format!(
                "file in flight at fd {}: not above every fd",
                f.fd
            )));
        }
        last = f.fd;
        if files.get(f.file_id).is_none() {
            return Err(invalid(format!(
                "file in flight at fd {}: no file {} in files.img",
                f.fd, f.file_id
            )));
        }
    }
    for l in &table.locks {
        if !table.fds.iter().any(|f| f.fd == l.fd) {
            return Err(invalid(format!("lock on fd {}, not in the table", l.fd)));
        }
        let in_range = i64::try_from(l.start).is_ok() && i64::try_from(l.len).is_ok();
        let lease = l.class() == ckpt_image::fd::lock::LockClass::Lease;
        let signal_ok =
            (0..=libc::SIGRTMAX()).contains(&l.lease_signal) && (lease || l.lease_signal == 0);
        if l.class() == ckpt_image::fd::lock::LockClass::Unspecified || !in_range || !signal_ok {
            return Err(invalid(format!("fd {}: bad lock {}", l.fd, l.describe())));
        }
    }
    Ok(())
}

/// Rebuilds the fd table of the process behind `r` (processes in tree
/// order, parents first, so a shared description's first holder is
/// already rebuilt). Files are opened with the process's dumped
/// filesystem identity (`creds`), see [`creds`].
pub fn restore(
    shared: &mut RestoreContext<'_>,
    tables: &mut Tables,
    r: &Remote<'_>,
    table: &FdTable,
    creds: Option<&Creds>,
    ctty: Option<&ControllingTerminal>,
) -> Result<()> {
    let pid = r.t.pid();
    let cx = &mut Context {
        shared,
        tables,
        here: HashMap::new(),
        pid,
        inherited: inherited_fds(pid)?,
        fs: creds::FsIdentity::of(creds),
        cap_eff: creds.map_or(0, |c| c.cap_eff),
        takes: Vec::new(),
    };
    let previous = cx.fs.as_ref().map(|i| i.assume(r)).transpose()?;
    // An epoll registered in another epoll is rebuilt first: the outer one
    // adds it as a complete file.
    // Files held only in flight are opened like fds, at numbers above
    // them, then handed to the restorer to be sent.
    let mut order: Vec<&Fd> = table.fds.iter().chain(&table.in_flight).collect();
    order.sort_by_key(|fd| epoll::nesting(cx.shared.files, fd.file_id));
    for pass in [Pass::First, Pass::Last] {
        for fd in order.iter().copied() {
            let file = cx
                .shared
                .files
                .get(fd.file_id)
                .ok_or_else(|| cx.invalid(fd.fd, "no such file"))?;
            install_file(cx, r, file, fd, pass)?;
        }
        put_takes(cx, r)?;
    }
    unix::hold_in_flight(cx, r, &table.in_flight)?;
    if let Some(p) = previous {
        p.restore(r)?;
    }
    // Every process of the tree exists in its group: the session leader
    // gives its terminal the foreground group it had.
    if let Some(ctty) = ctty {
        pty::restore_foreground(cx, r, ctty)?;
    }
    // What the restorer passed down and the process did not have.
    // (A file in flight took and closed its number already.)
    let closes: Vec<batch::Call> = std::mem::take(&mut cx.inherited)
        .into_iter()
        .filter(|&fd| !table.fds.iter().chain(&table.in_flight).any(|f| f.fd == fd))
        .map(|fd| batch::Call {
            name: "close (inherited)",
            nr: libc::SYS_close,
            args: [fd as u64, 0, 0, 0, 0, 0],
        })
        .collect();
    r.call_many(&closes)?;
    // Last: closing any fd of a file releases the process's POSIX locks on it.
    let rights = lock::LeaseRights {
        fs_uid: cx.fs_uid(),
        cap_lease: cx.dumped_with_cap(lock::CAP_LEASE),
    };
    lock::retake(r, &table.locks, &rights)?;
    Ok(())
}

/// Sends the UNIX socket queues that carry files (SCM_RIGHTS), once every
/// process of the tree has its fds: before any process resumes.
pub fn send_in_flight(shared: &mut RestoreContext<'_>, tables: &mut Tables) -> Result<()> {
    unix::send_deferred(shared, tables)
}

/// Gives the session the process behind `r` has just become the leader
/// of its controlling terminal again, before the process forks anything
/// (see `pty::take_controlling_terminal`).
pub fn take_controlling_terminal(
    shared: &mut RestoreContext<'_>,
    tables: &mut Tables,
    r: &Remote<'_>,
    ctty: &ControllingTerminal,
) -> Result<()> {
    let cx = &mut Context {
        shared,
        tables,
        here: HashMap::new(),
        pid: r.t.pid(),
        inherited: Vec::new(),
        fs: None,
        cap_eff: 0,
        takes: Vec::new(),
    };
    pty::take_controlling_terminal(cx, r, ctty)
}

/// Installs one fd: shares the description if an earlier fd got it, else
/// has the kind open it; then puts it at its number with its FD_CLOEXEC.
fn install<K: FileRestorer>(
    kind: &K,
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    file: &File,
    image: &K::Image,
    fd: &Fd,
    pass: Pass,
) -> Result<()> {
    let wanted = if K::AFTER_OTHERS {
        Pass::Last
    } else {
        Pass::First
    };
    if pass != wanted {
        return Ok(());
    }
    let earlier = if K::PER_FD {
        None
    } else {
        cx.tables.installed.get(&file.id).copied()
    };
    if let Some(at) = earlier
        && at.pid != cx.pid
        && RESTORER_PIDFD.load(std::sync::atomic::Ordering::Relaxed) != NO_PIDFD
    {
        // Put in place with the takes next to it, in two stops for all.
        cx.takes.push(Take {
            owner: at.pid,
            owner_fd: at.fd,
            fd: fd.fd,
            cloexec: fd.cloexec,
        });
        cx.here.insert(fd.fd, file.id);
        return Ok(());
    }
    // Whatever this fd's kind does may use the numbers of the fds before.
    put_takes(cx, r)?;
    let got = match earlier {
        Some(at) if at.pid == cx.pid => at.fd,
        Some(at) => take_from(r, at.pid, at.fd)?,
        None => kind.open(cx, r, file, image, fd.fd)?,
    };
    if got == fd.fd {
        set_cloexec(r, fd.fd, fd.cloexec)?;
    } else {
        let flags = if fd.cloexec { libc::O_CLOEXEC } else { 0 };
        let mut calls = vec![batch::Call {
            name: "dup3",
            nr: libc::SYS_dup3,
            args: [got as u64, fd.fd as u64, flags as u64, 0, 0, 0],
        }];
        // A description installed earlier in this process stays where it is.
        if earlier.is_none_or(|at| at.pid != cx.pid) {
            calls.push(batch::Call {
                name: "close",
                nr: libc::SYS_close,
                args: [got as u64, 0, 0, 0, 0, 0],
            });
        }
        r.call_many(&calls)?;
    }
    cx.here.insert(fd.fd, file.id);
    if !K::PER_FD && earlier.is_none() {
        cx.tables.installed.insert(
            file.id,
            Installed {
                pid: cx.pid,
                fd: fd.fd,
            },
        );
    }
    Ok(())
}

/// Copies fd `fd` of process `owner` into the process behind `r`
/// (`pidfd_getfd`, run inside it): the same open file description, offset
/// included. The restorer's own fds are taken through the pidfd of it the
/// process inherited ([`RESTORER_PIDFD`]); so is another process's, once
/// the restorer has a copy of it (one stop instead of two); without that
/// pidfd, through a pidfd of the owner opened and closed around the copy.
pub fn take_from(r: &Remote<'_>, owner: i32, fd: i32) -> Result<i32> {
    let inherited = RESTORER_PIDFD.load(std::sync::atomic::Ordering::Relaxed);
    if inherited != NO_PIDFD {
        let from_restorer = |mine: i32| -> Result<i32> {
            Ok(r.call(
                "pidfd_getfd",
                libc::SYS_pidfd_getfd,
                [inherited as u64, mine as u64, 0, 0, 0, 0],
            )? as i32)
        };
        if owner == std::process::id() as i32 {
            return from_restorer(fd);
        }
        // The owner is a process of the tree, stopped and traced here.
        let mine = crate::sys::take_fd(owner, fd)
            .map_err(|e| RestoreError::os(owner, "pidfd_getfd", e))?;
        return from_restorer(std::os::fd::AsRawFd::as_raw_fd(&mine));
    }
    // The call runs inside the process: the owner's pid as it sees it.
    let owner = crate::pid::inner(owner)?;
    let pidfd = r.call(
        "pidfd_open",
        libc::SYS_pidfd_open,
        [owner as u64, 0, 0, 0, 0, 0],
    )?;
    // Copy and close in one stop; a failed copy leaves the pidfd open in a
    // process the failed restore kills.
    let got = r.call_many(&[
        batch::Call {
            name: "pidfd_getfd",
            nr: libc::SYS_pidfd_getfd,
            args: [pidfd, fd as u64, 0, 0, 0, 0],
        },
        batch::Call {
            name: "close (pidfd)",
            nr: libc::SYS_close,
            args: [pidfd, 0, 0, 0, 0, 0],
        },
    ])?;
    Ok(got[0] as i32)
}

/// Puts the fds of `cx.takes` in place in the process behind `r`: the
/// restorer copies each from its holder, the process takes all the copies
/// through the restorer's pidfd in one stop and moves them to their
/// numbers in another (a process's three stdio fds shared with its
/// parent were three stops each).
fn put_takes(cx: &mut Context<'_, '_>, r: &Remote<'_>) -> Result<()> {
    let takes = std::mem::take(&mut cx.takes);
    if takes.is_empty() {
        return Ok(());
    }
    let inherited = RESTORER_PIDFD.load(std::sync::atomic::Ordering::Relaxed) as u64;
    let mine = takes
        .iter()
        .map(|t| {
            crate::sys::take_fd(t.owner, t.owner_fd).map_err(|e| {
                RestoreError::os(t.owner, format!("pidfd_getfd of fd {}", t.owner_fd), e)
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let getfds: Vec<batch::Call> = mine
        .iter()
        .map(|m| batch::Call {
            name: "pidfd_getfd",
            nr: libc::SYS_pidfd_getfd,
            args: [
                inherited,
                std::os::fd::AsRawFd::as_raw_fd(m) as u64,
                0,
                0,
                0,
                0,
            ],
        })
        .collect();
    let mut got: Vec<i32> = r
        .call_many(&getfds)?
        .into_iter()
        .map(|g| g as i32)
        .collect();
    drop(mine);
    // Moved in order, a take must not land on a copy not moved yet: such
    // copies go above every number in play first (one more stop, rare).
    if lands_on_a_copy(&takes.iter().map(|t| t.fd).collect::<Vec<_>>(), &got) {
        let above = takes
            .iter()
            .map(|t| t.fd)
            .chain(got.iter().copied())
            .max()
            .unwrap_or(0)
            + 1;
        let relocate: Vec<batch::Call> = got
            .iter()
            .flat_map(|&g| {
                [
                    batch::Call {
                        name: "fcntl(F_DUPFD_CLOEXEC)",
                        nr: libc::SYS_fcntl,
                        args: [
                            g as u64,
                            libc::F_DUPFD_CLOEXEC as u64,
                            above as u64,
                            0,
                            0,
                            0,
                        ],
                    },
                    batch::Call::close("close", g),
                ]
            })
            .collect();
        let moved = r.call_many(&relocate)?;
        got = moved.iter().step_by(2).map(|&g| g as i32).collect();
    }
    let mut moves = Vec::new();
    for (t, &g) in takes.iter().zip(&got) {
        if g == t.fd {
            // pidfd_getfd sets FD_CLOEXEC.
            moves.push(batch::Call {
                name: "fcntl(F_SETFD)",
                nr: libc::SYS_fcntl,
                args: [g as u64, libc::F_SETFD as u64, t.cloexec as u64, 0, 0, 0],
            });
            continue;
        }
        let flags = if t.cloexec { libc::O_CLOEXEC } else { 0 };
        moves.push(batch::Call {
            name: "dup3",
            nr: libc::SYS_dup3,
            args: [g as u64, t.fd as u64, flags as u64, 0, 0, 0],
        });
        moves.push(batch::Call::close("close", g));
    }
    r.call_many(&moves)?;
    Ok(())
}

/// Whether moving copies `got[i]` to `targets[i]` one after another would
/// put one onto a copy not moved yet (a child's fds 7 and 8 taken while
/// 5 and 7 are the lowest free numbers: the first move drops the second
/// copy).
fn lands_on_a_copy(targets: &[i32], got: &[i32]) -> bool {
    (0..targets.len()).any(|i| got[i + 1..].contains(&targets[i]))
}

/// No inherited pidfd of the restorer ([`RESTORER_PIDFD`]).
pub const NO_PIDFD: i32 = -1;

/// While a tree is rebuilt: the fd number at which its processes
/// inherited a pidfd of the restorer (closed with the other inherited fds
/// by [`restore`]), else [`NO_PIDFD`]. One rebuild at a time per restoring
/// process.
pub static RESTORER_PIDFD: std::sync::atomic::AtomicI32 =
    std::sync::atomic::AtomicI32::new(NO_PIDFD);

/// Sets the file status flags (`F_SETFL`) of `fd`: they belong to the
/// description, so a description made by ckpt gets the dumped ones.
pub fn set_status_flags(r: &Remote<'_>, fd: i32, flags: u32) -> Result<()> {
    r.call(
        "fcntl(F_SETFL)",
        libc::SYS_fcntl,
        [fd as u64, libc::F_SETFL as u64, flags as u64, 0, 0, 0],
    )?;
    Ok(())
}

/// The open(2) flags to reopen a dumped description with: its access mode
/// and status flags, never creating or truncating anything.
pub fn reopen_flags(file: &File) -> i32 {
    // O_NOFOLLOW only acted when the file was opened (f_flags keeps it):
    // carried over, it would refuse the reopen through a /proc magic link.
    let open_time_only = libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL | libc::O_NOFOLLOW;
    (file.flags as i32 & !open_time_only) | libc::O_CLOEXEC
}

/// Sets or clears FD_CLOEXEC on `fd`.
fn set_cloexec(r: &Remote<'_>, fd: i32, cloexec: bool) -> Result<()> {
    r.call(
        "fcntl(F_SETFD)",
        libc::SYS_fcntl,
        [fd as u64, libc::F_SETFD as u64, cloexec as u64, 0, 0, 0],
    )?;
    Ok(())
}

fn inherited_fds(pid: i32) -> Result<Vec<i32>> {
    let dir = format!("/proc/{pid}/fd");
    let rd =
        std::fs::read_dir(&dir).map_err(|e| RestoreError::os(pid, format!("read {dir}"), e))?;
    let mut fds: Vec<i32> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::lands_on_a_copy;

    #[test]
    fn a_move_onto_a_copy_not_moved_yet_is_seen() {
        // Copies at 5 and 7 for fds 7 and 8: moving the first to 7 drops
        // the second's copy.
        assert!(lands_on_a_copy(&[7, 8], &[5, 7]));
        assert!(lands_on_a_copy(&[4, 5], &[3, 4]));
    }

    #[test]
    fn moves_onto_copies_already_moved_or_in_place_are_fine() {
        // Stdio first: its copies are moved before the later fds land.
        assert!(!lands_on_a_copy(&[0, 1, 2, 4, 5], &[5, 7, 8, 9, 11]));
        assert!(!lands_on_a_copy(&[0, 1, 2, 7, 8], &[5, 7, 8, 9, 11]));
        // A copy already at its number stays.
        assert!(!lands_on_a_copy(&[3, 9], &[3, 4]));
        assert!(!lands_on_a_copy(&[], &[]));
    }
}
