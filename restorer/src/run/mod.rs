//! `ckpt run --pidns`: a command started in a PID namespace of its own, so
//! a later restore can give every process of it the same pids again in a
//! fresh namespace, whatever pids the host has taken meanwhile.
//!
//! Two processes: the launcher (`ckpt run`, in the caller's namespaces)
//! and ckpt's init, PID 1 of the new namespace, which starts the command
//! as PID 2. The init is tiny and dumpable like any job process: one
//! thread, fds 0-2 only, a new session and a mount namespace of its own
//! whose /proc is the new PID namespace's (so `ps` inside shows the
//! namespace). It reaps orphans, passes on [`FORWARDED`] signals to the
//! command and exits with the command's status; the launcher passes the
//! same signals on to the init and exits with the init's status.
//!
//! The dump of such a job is `ckpt dump --tree <host pid of the init>`.

mod sys;

use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::process::{Child, Command};

use nix::errno::Errno;
use nix::sys::wait::{WaitStatus, waitpid};

/// The signals the launcher and the init pass on (to the init and to the
/// command): what a user, a shell or a batch system sends to ask a job to
/// stop, hang up or act.
pub const FORWARDED: [libc::c_int; 5] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Namespaces `ckpt run` gives the job besides PID and mount.
#[derive(Debug, Default, Clone)]
pub struct JobNamespaces {
    /// A UTS namespace (hostname, domainname) of its own.
    pub uts: bool,
    /// The host name set in that namespace before the command starts (the
    /// parent's otherwise): a part of a job whose nodes share one host
    /// still tells its node by `gethostname()`, as MPI launchers do.
    pub hostname: Option<Hostname>,
    /// An IPC namespace (SysV objects, POSIX message queues) of its own.
    pub ipc: bool,
    /// A time namespace of its own, its CLOCK_MONOTONIC and CLOCK_BOOTTIME
    /// this many seconds ahead of the host's (negative: behind).
    pub time: Option<i64>,
}

/// A host name checked for `sethostname`: 1 to 64 bytes, no NUL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hostname(Vec<u8>);

/// The kernel's limit on a host name (`__NEW_UTS_LEN`).
const HOSTNAME_MAX: usize = 64;

impl Hostname {
    /// `name`, if the kernel takes it as a host name.
    pub fn new(name: &str) -> Option<Hostname> {
        let ok = !name.is_empty() && name.len() <= HOSTNAME_MAX && !name.contains('\0');
        ok.then(|| Hostname(name.as_bytes().to_vec()))
    }
}

impl JobNamespaces {
    /// Whether any is asked for.
    pub fn any(&self) -> bool {
        self.uts || self.ipc || self.time.is_some()
    }

    /// The unshare flags of the UTS and IPC namespaces asked for.
    fn uts_ipc_flags(&self) -> libc::c_int {
        let mut flags = 0;
        if self.uts {
            flags |= libc::CLONE_NEWUTS;
        }
        if self.ipc {
            flags |= libc::CLONE_NEWIPC;
        }
        flags
    }
}

/// Puts this process in the UTS and IPC namespaces `ns` asks for, and the
/// program it execs in its time namespace: for a job ckpt execs in place
/// (no --pidns).
pub fn enter_namespaces(ns: &JobNamespaces) -> io::Result<()> {
    let flags = ns.uts_ipc_flags();
    if flags != 0 {
        sys::unshare(flags)?;
    }
    if let Some(name) = &ns.hostname {
        sys::sethostname(&name.0)?;
    }
    enter_time_for_children(ns)
}

/// Puts the children this process forks from now on (and the program it
/// execs) in a new time namespace when `ns` asks for one, with its offsets:
/// the kernel takes them only until a process is in it.
fn enter_time_for_children(ns: &JobNamespaces) -> io::Result<()> {
    if let Some(secs) = ns.time {
        sys::unshare(libc::CLONE_NEWTIME)?;
        // The file is the main thread's, which `ckpt run` runs on.
        std::fs::write(
            "/proc/self/timens_offsets",
            format!(
                "{} {secs} 0\n{} {secs} 0\n",
                libc::CLOCK_MONOTONIC,
                libc::CLOCK_BOOTTIME
            ),
        )?;
    }
    Ok(())
}

/// Exit status a shell reports for a process killed by signal n: 128 + n.
const SIGNALED_STATUS_BASE: i32 = 128;

/// Starts `program args` (ckpt itself in its init role) as PID 1 of a new
/// PID namespace, in a new mount namespace with that namespace's /proc and
/// a new session, and the namespaces `ns` asks for, with fds above 2
/// closed, and passes [`FORWARDED`] signals this process receives on to
/// it. Returns the init, whose `id()` is its pid on the host. This process
/// stays in its UTS and IPC namespaces (so the job's end with the job).
pub fn spawn_init(program: &Path, args: &[OsString], ns: &JobNamespaces) -> io::Result<Child> {
    sys::unshare_pid_namespace()?;
    enter_time_for_children(ns)?;
    let flags = ns.uts_ipc_flags();
    let hostname = ns.hostname.clone();
    let mut cmd = Command::new(program);
    cmd.args(args);
    // SAFETY: the hook runs between fork and exec and makes raw syscalls
    // only (unshare, sethostname, mount, setsid, close_range): no
    // allocation, no locks.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            if flags != 0 {
                sys::unshare(flags)?;
            }
            if let Some(name) = &hostname {
                sys::sethostname(&name.0)?;
            }
            sys::enter_private_proc_and_session()
        });
    }
    let child = cmd.spawn()?;
    sys::forward_signals(&FORWARDED, child.id() as i32)?;
    Ok(child)
}

/// From now on passes [`FORWARDED`] signals this process receives on to
/// `pid`: what a namespace's init does for its command (`ckpt restore
/// --pidns`, PID 1 of its namespace, for the restored root), or a process
/// for the child that stands for it (a delegated `ckpt` command).
pub fn forward_to(pid: i32) -> io::Result<()> {
    sys::forward_signals(&FORWARDED, pid)
}

/// A wait status as a shell reports it: the exit code, or 128 + the
/// signal that killed the process.
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| SIGNALED_STATUS_BASE + s))
        .unwrap_or(SIGNALED_STATUS_BASE)
}

/// The environment of the command `ckpt run` starts.
#[derive(Debug, Clone, Copy)]
pub enum CommandEnv<'a> {
    /// This process's own, with these set on top (the verbs layer's
    /// LD_PRELOAD of `ckpt run --ib`, which has no business in the init).
    Inherited(&'a [(OsString, OsString)]),
    /// Exactly these: the job's own environment, handed over by the ckpt
    /// service, where this process's is root's worker's.
    Exactly(&'a [(OsString, OsString)]),
}

/// Makes this process `caller`'s for good, before it starts a job for them
/// (the ckpt service's `ckpt run`): their uid, gid and supplementary
/// groups, no capabilities, and dumpable again (a change of ids makes a
/// process non-dumpable, and the job's init must be dumpable by its user).
pub fn become_caller(caller: &ckpt_image::Caller) -> io::Result<()> {
    use nix::unistd::{Gid, Uid};
    let (uid, gid) = (Uid::from_raw(caller.uid), Gid::from_raw(caller.gid));
    let groups: Vec<Gid> = caller.groups.iter().map(|&g| Gid::from_raw(g)).collect();
    nix::unistd::setgroups(&groups)?;
    nix::unistd::setresgid(gid, gid, gid)?;
    nix::unistd::setresuid(uid, uid, uid)?;
    let u = nix::unistd::getresuid()?;
    if [u.real, u.effective, u.saved] != [uid; 3] {
        return Err(io::Error::other(format!(
            "the ids did not all change to uid {}",
            caller.uid
        )));
    }
    nix::sys::prctl::set_dumpable(true)?;
    Ok(())
}

/// The init loop (PID 1 of the namespace): starts `command` (its first
/// element is the program), reaps every process that ends in the
/// namespace, and returns the command's exit code (128 + signal if a
/// signal killed it) once it ends. The caller exits with it, which ends
/// the namespace.
/// `env` is the command's environment.
pub fn init(command: &[OsString], env: CommandEnv<'_>) -> io::Result<i32> {
    let Some((program, args)) = command.split_first() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no command to run",
        ));
    };
    // Whatever the launcher's caller leaked to it is not the job's.
    sys::close_fds_above_stdio()?;
    // A signal between the spawn and knowing the command's pid would be
    // lost: hold them until the handler knows where to send them.
    sys::mask_signals(&FORWARDED, true)?;
    let mut cmd = Command::new(program);
    cmd.args(args);
    match env {
        CommandEnv::Inherited(vars) => cmd.envs(vars.iter().map(|(k, v)| (k, v))),
        CommandEnv::Exactly(vars) => cmd.env_clear().envs(vars.iter().map(|(k, v)| (k, v))),
    };
    // SAFETY: the hook runs between fork and exec and only calls
    // pthread_sigmask, which is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            // The command must not inherit the hold.
            sys::mask_signals(&FORWARDED, false)
        });
    }
    let child = cmd.spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            sys::mask_signals(&FORWARDED, false)?;
            return Err(e);
        }
    };
    let pid = child.id() as i32;
    sys::forward_signals(&FORWARDED, pid)?;
    sys::mask_signals(&FORWARDED, false)?;
    // The command is reaped below through waitpid(-1), with the orphans.
    drop(child);
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(p, code)) if p.as_raw() == pid => return Ok(code),
            Ok(WaitStatus::Signaled(p, sig, _)) if p.as_raw() == pid => {
                return Ok(SIGNALED_STATUS_BASE + sig as i32);
            }
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}
