//! Task state other than memory and files: identity, limits, signal
//! dispositions, timers, futex/rseq registrations, pending signals, and
//! finally the registers (credentials: `creds.rs`).

use ckpt_image::task::{AltStack, Core, GpRegs, PendingSignal, RobustList, Rseq};
use ckpt_parasite::Regs;

use crate::error::{RestoreError, Result};
use crate::fd::create::{self, Ownership};
use crate::fd::creds::FsIdentity;
use crate::sys;
use ckpt_parasite::batch;
use ckpt_parasite::remote::Remote;

/// SIG_DFL for every signal not in the image: the child inherited the
/// restorer's dispositions (Rust ignores SIGPIPE, for one).
pub fn restore_sigactions(r: &Remote<'_>, core: &Core) -> Result<()> {
    // Every `struct sigaction` goes into slot 0 at once and all of them are
    // set in one batch: one stop for the 62 signals instead of one each,
    // which counts in a tree of hundreds of processes.
    let signals: Vec<u32> = (1..=64u32)
        .filter(|&s| s != libc::SIGKILL as u32 && s != libc::SIGSTOP as u32)
        .collect();
    let mut acts = Vec::with_capacity(signals.len() * SIGACTION_WORDS);
    for &signo in &signals {
        let (handler, flags, restorer, mask) = core
            .sigactions
            .iter()
            .find(|s| s.signo == signo)
            .map_or((0, 0, 0, 0), |s| (s.handler, s.flags, s.restorer, s.mask));
        acts.extend([handler, flags, restorer, mask]);
    }
    let at = r.put_u64s(0, &acts)?;
    let calls: Vec<batch::Call> = signals
        .iter()
        .enumerate()
        .map(|(i, &signo)| batch::Call {
            name: "rt_sigaction",
            nr: libc::SYS_rt_sigaction,
            args: [
                u64::from(signo),
                at + (i * SIGACTION_WORDS * 8) as u64,
                0,
                SIGSET_BYTES,
                0,
                0,
            ],
        })
        .collect();
    r.call_many(&calls)?;
    Ok(())
}

/// Words of the kernel's `struct sigaction` (handler, flags, restorer,
/// mask).
const SIGACTION_WORDS: usize = 4;
/// Bytes of the kernel's signal set, rt_sigaction's last argument.
const SIGSET_BYTES: u64 = 8;

/// Interval timers, alternate stack, tid address, robust list, rseq,
/// personality, umask, name, cwd and root.
pub fn restore_misc(r: &Remote<'_>, core: &Core) -> Result<()> {
    for it in &core.itimers {
        let us = |v: u64| [v / 1_000_000, v % 1_000_000];
        let [is, iu] = us(it.interval_us);
        let [vs, vu] = us(it.value_us);
        let p = r.put_u64s(0, &[is, iu, vs, vu])?;
        r.call(
            "setitimer",
            libc::SYS_setitimer,
            [it.which as u64, p, 0, 0, 0, 0],
        )?;
    }
    // The leader's own state, its personality and umask in one stop.
    let mut calls = thread_state_calls(
        r,
        &ThreadOwn {
            altstack: core.altstack.as_ref(),
            tid_address: core.tid_address,
            robust_list: core.robust_list.as_ref(),
            rseq: core.rseq.as_ref(),
            comm: &core.comm,
        },
    )?;
    calls.push(batch::Call {
        name: "personality",
        nr: libc::SYS_personality,
        args: [core.personality as u64, 0, 0, 0, 0, 0],
    });
    calls.push(batch::Call {
        name: "umask",
        nr: libc::SYS_umask,
        args: [core.umask as u64, 0, 0, 0, 0, 0],
    });
    r.call_many(&calls)?;
    restore_dirs(r, core)
}

/// The working and root directories. The process runs as root here, and
/// a root `chdir` by path would follow whatever the user put on it since
/// the dump (their working directory swapped for a link into another
/// user's 0700 directory), handing the process a directory, and every
/// relative open and `/proc/PID/cwd` with it, its user could not reach.
/// So both are looked up once, with the process's own filesystem ids
/// (every directory on the way must be searchable by its user) and no
/// symbolic link followed (the dumped paths came from /proc, links
/// resolved), and the process moves to those very descriptors.
fn restore_dirs(r: &Remote<'_>, core: &Core) -> Result<()> {
    let identity = FsIdentity::of(core.creds.as_ref());
    let dirs = crate::fd::creds::as_user(identity.as_ref(), r, || {
        open_dirs(r, core, identity.as_ref())
    })??;
    // The move and the closes in one stop; a failed move fails the restore,
    // which kills the process with whatever it still holds.
    let mut calls = move_calls(r, &dirs)?;
    for fd in [Some(dirs.cwd), dirs.root].into_iter().flatten() {
        calls.push(batch::Call::close("close (directory)", fd));
    }
    r.call_many(&calls)?;
    Ok(())
}

/// The process's fds of its working and root directories (`O_PATH`).
struct DirFds {
    cwd: i32,
    /// `None`: the root stays `/`.
    root: Option<i32>,
}

/// A removed working directory is made again, empty (see
/// [`create::removed_dir`]).
fn open_dirs(r: &Remote<'_>, core: &Core, identity: Option<&FsIdentity>) -> Result<DirFds> {
    const FLAGS: i32 = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
    let open = |path: &str, role: &str| {
        r.open_no_symlinks(path, FLAGS)
            .map_err(|e| dir_err(r, path, role, e))
    };
    let cwd = match &core.cwd_removed {
        None => open(&core.cwd, "working directory")?,
        Some(removed) => {
            let own = Ownership {
                uid: removed.uid,
                gid: removed.gid,
                mode: removed.mode,
            };
            create::check_owner(identity, r.t.pid(), &core.cwd, &own)?;
            create::removed_dir(r, &core.cwd, &own, FLAGS)?
        }
    };
    let root = if core.root == "/" {
        None
    } else {
        match open(&core.root, "root directory") {
            Ok(fd) => Some(fd),
            Err(e) => {
                r.close(cwd)?;
                return Err(e);
            }
        }
    };
    Ok(DirFds { cwd, root })
}

/// The calls that move into `dirs`: root first (`chroot(".")` from it), then the
/// working directory, which may lie outside the new root as it did.
fn move_calls(r: &Remote<'_>, dirs: &DirFds) -> Result<Vec<batch::Call>> {
    let call = |name, nr, arg: u64| batch::Call {
        name,
        nr,
        args: [arg, 0, 0, 0, 0, 0],
    };
    let mut calls = Vec::new();
    if let Some(root) = dirs.root {
        let dot = r.put_path(0, ".")?;
        calls.push(call("fchdir", libc::SYS_fchdir, root as u64));
        calls.push(call("chroot", libc::SYS_chroot, dot));
    }
    calls.push(call("fchdir", libc::SYS_fchdir, dirs.cwd as u64));
    Ok(calls)
}

/// A working or root directory that could not be looked up, in terms of
/// what probably happened.
fn dir_err(
    r: &Remote<'_>,
    path: &str,
    role: &str,
    e: ckpt_parasite::ParasiteError,
) -> RestoreError {
    let why = match &e {
        ckpt_parasite::ParasiteError::RemoteOpen { errno, .. } => match *errno {
            nix::errno::Errno::ELOOP => "a symbolic link is now on its path, refused".to_string(),
            nix::errno::Errno::ENOENT => "gone since the dump".to_string(),
            nix::errno::Errno::EACCES | nix::errno::Errno::EPERM => {
                "not reachable with the process's own credentials".to_string()
            }
            nix::errno::Errno::ENOTDIR => "no longer a directory".to_string(),
            other => other.to_string(),
        },
        _ => e.to_string(),
    };
    RestoreError::File {
        pid: r.t.pid(),
        path: path.into(),
        what: format!("{role}: {why}"),
    }
}

/// Session and process group. Runs right after the process is created,
/// before it forks its own children, which then inherit both. A leader
/// leads its own again; a tree member rejoins the group it was in (whose
/// leader was restored before it); the root cannot join a group outside
/// the tree and stays in the restorer's.
pub fn restore_session(r: &Remote<'_>, core: &Core, is_root: bool) -> Result<SessionOrigin> {
    if core.sid == core.pid {
        r.call("setsid", libc::SYS_setsid, [0; 6])?;
    } else if core.pgid == core.pid {
        r.call("setpgid", libc::SYS_setpgid, [0; 6])?;
    } else if !is_root {
        let pid = r.t.pid();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_err(|e| RestoreError::os(pid, "read stat", e))?;
        let pgid: i32 = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(2)?.parse().ok())
            .unwrap_or(0);
        if pgid != core.pgid {
            r.call(
                "setpgid",
                libc::SYS_setpgid,
                [0, core.pgid as u64, 0, 0, 0, 0],
            )?;
        }
    }
    // A root that did not lead its session had it from outside the tree.
    Ok(if is_root && core.sid != core.pid {
        SessionOrigin::Adopted
    } else {
        SessionOrigin::Restored
    })
}

/// Where a restored process's session and process group come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionOrigin {
    /// As dumped: its own, or its restored parent's.
    Restored,
    /// The restorer's: the dumped ones were outside the tree.
    Adopted,
}

/// A thread's own state, which only the thread itself can set: alternate
/// stack, clear_child_tid, robust list, rseq and name, in one batch (one
/// stop instead of five: a process with 2,000 threads pays it 2,000 times).
pub struct ThreadOwn<'a> {
    /// Alternate signal stack (none: disabled).
    pub altstack: Option<&'a AltStack>,
    /// `clear_child_tid` (0: left alone).
    pub tid_address: u64,
    /// Robust futex list.
    pub robust_list: Option<&'a RobustList>,
    /// Restartable-sequences registration.
    pub rseq: Option<&'a Rseq>,
    /// Name (comm), cut to the kernel's 15 bytes.
    pub comm: &'a str,
}

/// Offset of the name in argument slot 0, after the `stack_t`.
const NAME_OFFSET: usize = 32;
/// Longest thread name the kernel keeps.
const COMM_MAX: usize = 15;

/// The calls that set `own` in the thread behind `r` (their data put at
/// the start of argument slot 0), for a batch that does more in the same
/// stop.
pub fn thread_state_calls(r: &Remote<'_>, own: &ThreadOwn<'_>) -> Result<Vec<batch::Call>> {
    let (sp, flags, size) = own.altstack.map_or((0, libc::SS_DISABLE, 0), |a| {
        (a.sp, a.flags & !libc::SS_ONSTACK, a.size)
    });
    let mut slot = vec![0u8; NAME_OFFSET];
    for (i, w) in [sp, flags as u32 as u64, size].iter().enumerate() {
        slot[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    slot.extend_from_slice(&own.comm.as_bytes()[..own.comm.len().min(COMM_MAX)]);
    slot.push(0);
    let at = r.put(0, &slot)?;
    let call = |name, nr, args| batch::Call { name, nr, args };
    let mut calls = vec![call(
        "sigaltstack",
        libc::SYS_sigaltstack,
        [at, 0, 0, 0, 0, 0],
    )];
    if own.tid_address != 0 {
        calls.push(call(
            "set_tid_address",
            libc::SYS_set_tid_address,
            [own.tid_address, 0, 0, 0, 0, 0],
        ));
    }
    if let Some(rl) = own.robust_list {
        calls.push(call(
            "set_robust_list",
            libc::SYS_set_robust_list,
            [rl.head, rl.len, 0, 0, 0, 0],
        ));
    }
    if let Some(rs) = own.rseq {
        calls.push(call(
            "rseq",
            libc::SYS_rseq,
            [rs.addr, rs.len as u64, 0, rs.signature as u64, 0, 0],
        ));
    }
    calls.push(call(
        "prctl(PR_SET_NAME)",
        libc::SYS_prctl,
        [
            libc::PR_SET_NAME as u64,
            at + NAME_OFFSET as u64,
            0,
            0,
            0,
            0,
        ],
    ));
    Ok(calls)
}

/// Sets the calling thread's name (comm).
pub fn set_name(r: &Remote<'_>, comm: &str) -> Result<()> {
    let mut name = comm.as_bytes()[..comm.len().min(COMM_MAX)].to_vec();
    name.push(0);
    let p = r.put(0, &name)?;
    r.call(
        "prctl(PR_SET_NAME)",
        libc::SYS_prctl,
        [libc::PR_SET_NAME as u64, p, 0, 0, 0, 0],
    )?;
    Ok(())
}

/// Resource limits, set from outside with prlimit. A hard limit above the
/// restorer's own cannot be raised without CAP_SYS_RESOURCE; such limits are
/// capped and reported through `warn`.
pub fn restore_rlimits(pid: i32, core: &Core, warn: &dyn Fn(&str)) -> Result<()> {
    for rl in &core.rlimits {
        let res = rl.resource;
        let err = match sys::set_rlimit(pid, res, rl.soft, rl.hard) {
            Ok(()) => continue,
            Err(e) => e,
        };
        if err.raw_os_error() != Some(libc::EPERM) {
            return Err(RestoreError::os(
                pid,
                format!("prlimit resource {res}"),
                err,
            ));
        }
        let (_, max) = sys::get_rlimit(pid, res)
            .map_err(|e| RestoreError::os(pid, format!("prlimit resource {res}"), e))?;
        sys::set_rlimit(pid, res, rl.soft.min(max), rl.hard.min(max))
            .map_err(|e| RestoreError::os(pid, format!("prlimit resource {res}"), e))?;
        warn(&format!(
            "pid {pid}: resource limit {res} capped at {max} (dumped hard limit {} needs CAP_SYS_RESOURCE)",
            rl.hard
        ));
    }
    Ok(())
}

/// Re-queues the signals that were pending at dump time, from the thread
/// `r` runs in (queuing to oneself is allowed for any si_code). The mask is
/// still all-blocked here, so nothing is delivered before the process runs.
/// A pending SIGTRAP waits for [`queue_traps`]: every remote syscall ends
/// on ckpt's own breakpoint, whose SIGTRAP the kernel forces through the
/// mask and would merge with it, so it would be taken for the breakpoint
/// and lost.
pub fn queue_pending(r: &Remote<'_>, tgid: i32, pending: &[PendingSignal]) -> Result<()> {
    for p in pending {
        if signo_of(tgid, p)? != libc::SIGTRAP {
            queue_one(r, tgid, p, Stop::Breakpoint)?;
        }
    }
    Ok(())
}

/// Re-queues the pending SIGTRAPs held back by [`queue_pending`], once no
/// breakpoint will run in the thread of `r` any more: each by a syscall
/// stopped at its exit (no breakpoint), with every signal blocked (the
/// breakpoints before unblocked SIGTRAP). The caller sets the thread's
/// own mask afterwards.
pub fn queue_traps(r: &Remote<'_>, tgid: i32, pending: &[PendingSignal]) -> Result<()> {
    let traps: Vec<&PendingSignal> = pending
        .iter()
        .filter(|p| signo_of(tgid, p).is_ok_and(|s| s == libc::SIGTRAP))
        .collect();
    if traps.is_empty() {
        return Ok(());
    }
    r.t.set_sigmask(ALL_BLOCKED)?;
    for p in traps {
        queue_one(r, tgid, p, Stop::SyscallExit)?;
    }
    Ok(())
}

/// A mask blocking every signal (the kernel ignores SIGKILL's and
/// SIGSTOP's bits).
const ALL_BLOCKED: u64 = u64::MAX;

/// How a remote syscall hands the thread back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// On ckpt's breakpoint after it.
    Breakpoint,
    /// At its exit (`PTRACE_SYSCALL`).
    SyscallExit,
}

/// The signal number of pending signal `p` of process `tgid`.
fn signo_of(tgid: i32, p: &PendingSignal) -> Result<i32> {
    if p.siginfo.len() != ckpt_parasite::SIGINFO_SIZE {
        return Err(RestoreError::Image(ckpt_image::ImageError::Invalid {
            path: ckpt_image::core_name(tgid).into(),
            what: "pending signal with a short siginfo".into(),
        }));
    }
    Ok(i32::from_le_bytes(
        p.siginfo[..4].try_into().expect("4 bytes"),
    ))
}

/// Queues `p` to the process (shared) or to the thread of `r`.
fn queue_one(r: &Remote<'_>, tgid: i32, p: &PendingSignal, stop: Stop) -> Result<()> {
    // The syscalls run inside the process: its own namespace's ids.
    let tid = crate::pid::inner(r.t.pid())? as u64;
    let tgid_inside = crate::pid::inner(tgid)? as u64;
    let signo = signo_of(tgid, p)? as u64;
    let info = r.put(0, &p.siginfo)?;
    let (name, nr, args) = if p.shared {
        (
            "rt_sigqueueinfo",
            libc::SYS_rt_sigqueueinfo,
            [tgid_inside, signo, info, 0, 0, 0],
        )
    } else {
        (
            "rt_tgsigqueueinfo",
            libc::SYS_rt_tgsigqueueinfo,
            [tgid_inside, tid, signo, info, 0, 0],
        )
    };
    match stop {
        Stop::Breakpoint => {
            r.call(name, nr, args)?;
        }
        Stop::SyscallExit => {
            let ret = r.t.syscall_stop_at_exit(r.base, nr, args)?;
            ckpt_parasite::check_ret(r.t.pid(), name, ret)?;
        }
    }
    Ok(())
}

/// The image's registers as ptrace wants them.
pub fn regs_from_image(g: &GpRegs) -> Regs {
    Regs {
        r15: g.r15,
        r14: g.r14,
        r13: g.r13,
        r12: g.r12,
        rbp: g.rbp,
        rbx: g.rbx,
        r11: g.r11,
        r10: g.r10,
        r9: g.r9,
        r8: g.r8,
        rax: g.rax,
        rcx: g.rcx,
        rdx: g.rdx,
        rsi: g.rsi,
        rdi: g.rdi,
        orig_rax: g.orig_rax,
        rip: g.rip,
        cs: g.cs,
        eflags: g.eflags,
        rsp: g.rsp,
        ss: g.ss,
        fs_base: g.fs_base,
        gs_base: g.gs_base,
        ds: g.ds,
        es: g.es,
        fs: g.fs,
        gs: g.gs,
    }
}
