//! `ckpt serve`: the root service that checkpoints and restores users'
//! own processes (see the module above).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use ckpt_image::Caller;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::wire::{self, ClientMessage, PeerIds, WireError};
use super::worker::{CALLER_ENV, CGROUP_ENV, JOB_ENV_PREFIX};
use super::{DEFAULT_SOCKET, PASSED_SIGNALS, ServiceError};

/// Arguments of `ckpt serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The socket users' `ckpt` connects to (its directory is created
    /// 0755 and must be root's and writable by no one else).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Most requests running at once, everyone's together (a restore runs
    /// as long as the job it waits for); more are told the service is busy.
    #[arg(long, value_name = "N", default_value_t = 256)]
    max_requests: usize,
    /// Most requests of one user running at once, so that no user can
    /// keep the service from the others.
    #[arg(long, value_name = "N", default_value_t = 16)]
    max_per_user: usize,
}

/// How long a new connection may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The environment a worker gets (besides the caller and the site's key).
const WORKER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Exit code the client gets when it has too many requests running
/// ("conflict": may go through next time).
const BUSY_EXIT: u8 = 8;
/// Exit code for a request the service could not run (internal).
const FAILED_EXIT: u8 = 1;

/// Runs the service until killed.
pub fn run(a: ServeArgs) -> anyhow::Result<ExitCode> {
    if !nix::unistd::geteuid().is_root() {
        return Err(ServiceError::NotRoot.into());
    }
    let exe = std::env::current_exe().context("the ckpt executable")?;
    let listener = bind(&a.socket)?;
    log::info!("ckpt serve: listening on {}", a.socket.display());
    let limits = Arc::new(Limits {
        max_requests: a.max_requests,
        max_per_user: a.max_per_user,
        running: Mutex::new(Running::default()),
    });
    loop {
        let conn = match wire::accept(listener.as_fd()) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("ckpt serve: {e}");
                continue;
            }
        };
        // Bounded before a thread is spawned: connections that send nothing
        // cost no more than the cap.
        let Some(slot) = Slot::take(&limits) else {
            let _ = wire::send_busy(conn.as_fd());
            continue;
        };
        let exe = exe.clone();
        std::thread::spawn(move || {
            if let Err(e) = serve_one(&conn, &exe, slot) {
                log::warn!("ckpt serve: request: {e:#}");
            }
        });
    }
}

/// How many requests run at once.
struct Limits {
    max_requests: usize,
    max_per_user: usize,
    running: Mutex<Running>,
}

/// The requests running now, in all and per user.
#[derive(Default)]
struct Running {
    all: usize,
    per_user: HashMap<u32, usize>,
}

/// A request's place among those running; given back when dropped.
struct Slot {
    limits: Arc<Limits>,
    user: Option<u32>,
}

impl Slot {
    /// A place among all requests, if one is free.
    fn take(limits: &Arc<Limits>) -> Option<Slot> {
        let mut r = limits.running.lock().unwrap_or_else(|e| e.into_inner());
        if r.all >= limits.max_requests {
            return None;
        }
        r.all += 1;
        Some(Slot {
            limits: limits.clone(),
            user: None,
        })
    }

    /// Counts the request as `uid`'s too, if that user has room.
    fn claim_for(&mut self, uid: u32) -> bool {
        let mut r = self
            .limits
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mine = r.per_user.entry(uid).or_default();
        if *mine >= self.limits.max_per_user {
            return false;
        }
        *mine += 1;
        self.user = Some(uid);
        true
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut r = self
            .limits
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        r.all -= 1;
        if let Some(uid) = self.user
            && let Some(n) = r.per_user.get_mut(&uid)
        {
            *n -= 1;
            if *n == 0 {
                r.per_user.remove(&uid);
            }
        }
    }
}

/// Binds the socket: its directory root's and closed to others (whoever
/// could write it could put their own socket in the service's place), a
/// leftover socket of an earlier service replaced, the socket open to all
/// (who asks is learnt from the kernel, per connection).
fn bind(socket: &Path) -> anyhow::Result<OwnedFd> {
    let dir = socket
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if std::fs::symlink_metadata(dir).is_err() {
        std::fs::create_dir_all(dir).with_context(|| format!("{}: create", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("{}: chmod", dir.display()))?;
    }
    let st = std::fs::symlink_metadata(dir).with_context(|| format!("{}: stat", dir.display()))?;
    anyhow::ensure!(
        st.is_dir() && st.uid() == 0 && st.mode() & 0o022 == 0,
        "{}: the service's directory must be a directory of root's that no one else can write",
        dir.display()
    );
    match std::fs::symlink_metadata(socket) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(socket)
            .with_context(|| format!("{}: remove the old socket", socket.display()))?,
        Ok(_) => anyhow::bail!("{}: exists and is not a socket", socket.display()),
        Err(_) => {}
    }
    let fd = wire::listen(socket).with_context(|| format!("{}: listen", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666))
        .with_context(|| format!("{}: chmod", socket.display()))?;
    Ok(fd)
}

/// One connection: its request, run by a worker, the client's signals
/// passed on, the worker's exit code sent back.
fn serve_one(conn: &OwnedFd, exe: &Path, mut slot: Slot) -> anyhow::Result<()> {
    let timeout = nix::sys::time::TimeVal::new(REQUEST_TIMEOUT.as_secs() as i64, 0);
    nix::sys::socket::setsockopt(conn, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)?;
    let peer = wire::peer(conn.as_fd())?;
    let request = match wire::recv_request(conn.as_fd()) {
        // A probe (`ckpt check`): connected and left.
        Err(WireError::Closed) => return Ok(()),
        other => other?,
    };
    let no_timeout = nix::sys::time::TimeVal::new(0, 0);
    nix::sys::socket::setsockopt(conn, nix::sys::socket::sockopt::ReceiveTimeout, &no_timeout)?;
    let client_stderr = request.stdio[2].try_clone()?;
    let said = |line: &str, code: u8| -> anyhow::Result<()> {
        let mut err = std::fs::File::from(client_stderr.try_clone()?);
        let _ = std::io::Write::write_all(&mut err, format!("ckpt: error: {line}\n").as_bytes());
        wire::send_exit(conn.as_fd(), code)?;
        Ok(())
    };
    if !slot.claim_for(peer.uid) {
        return said(
            "the ckpt service runs as many of your requests as it takes; try again when one ends",
            BUSY_EXIT,
        );
    }
    if peer.uid == 0 {
        return said(
            "root runs ckpt directly, not through the ckpt service",
            FAILED_EXIT,
        );
    }
    let caller = Caller {
        uid: peer.uid,
        gid: peer.gid,
        groups: peer.groups.clone(),
    };
    log::info!(
        "ckpt serve: uid {} (pid {}): ckpt {}",
        peer.uid,
        peer.pid,
        request
            .args
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut child = match spawn_worker(exe, &peer, &caller, request) {
        Ok(c) => c,
        Err(e) => {
            return said(
                &format!("the ckpt service could not start: {e:#}"),
                FAILED_EXIT,
            );
        }
    };
    let code = supervise(conn, &mut child)?;
    log::info!(
        "ckpt serve: uid {} (pid {}): exit {code}",
        peer.uid,
        peer.pid
    );
    match wire::send_exit(conn.as_fd(), code) {
        // The client went away; the request ran all the same.
        Err(WireError::Os { .. }) => Ok(()),
        other => Ok(other?),
    }
}

/// Starts the worker: the service's own `ckpt` with the client's arguments,
/// working directory and stdio. The client's environment is the job's
/// (`ckpt run`), never the worker's: it travels under names nothing reads
/// ([`JOB_ENV_PREFIX`]), as a variable could name another key or socket,
/// or preload a library into a root process.
fn spawn_worker(
    exe: &Path,
    peer: &PeerIds,
    caller: &Caller,
    request: wire::Request,
) -> anyhow::Result<Child> {
    let [stdin, stdout, stderr] = request.stdio;
    let mut cmd = Command::new(exe);
    cmd.args(&request.args)
        .env_clear()
        .env("PATH", WORKER_PATH)
        .env(CALLER_ENV, caller.encode())
        // The cwd fd is open in the forked child until exec: chdir through
        // it, whatever the path (the client may not even see its name).
        .current_dir(format!("/proc/self/fd/{}", request.cwd.as_raw_fd()))
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr));
    if let Some(key) = std::env::var_os(ckpt_image::seal::KEY_ENV) {
        cmd.env(ckpt_image::seal::KEY_ENV, key);
    }
    for (i, entry) in request.env.iter().enumerate() {
        cmd.env(format!("{JOB_ENV_PREFIX}{i}"), entry);
    }
    let cgroups = super::cgroup::dirs_of(peer.pid);
    if !cgroups.is_empty() && peer.still_alive() {
        cmd.env(CGROUP_ENV, super::cgroup::encode(&cgroups));
    }
    let child = cmd.spawn().context("spawn the worker")?;
    drop(request.cwd);
    Ok(child)
}

/// Waits for the worker, passing on the client's signals; returns its exit
/// code (128 + signal if killed, as a shell reports it).
fn supervise(conn: &OwnedFd, child: &mut Child) -> anyhow::Result<u8> {
    let exited = wire::pidfd(child.id())?;
    let mut listening = true;
    loop {
        let mut fds = vec![PollFd::new(exited.as_fd(), PollFlags::POLLIN)];
        if listening {
            fds.push(PollFd::new(conn.as_fd(), PollFlags::POLLIN));
        }
        poll(&mut fds, PollTimeout::NONE)?;
        let client_spoke = fds
            .get(1)
            .and_then(PollFd::revents)
            .is_some_and(|r| !r.is_empty());
        if client_spoke {
            match wire::recv_client_message(conn.as_fd()) {
                Ok(ClientMessage::Signal(n)) => pass_on(child, n),
                // The client is gone or confused: the request runs to its end.
                Err(_) => listening = false,
            }
        }
        if let Some(status) = child.try_wait()? {
            use std::os::unix::process::ExitStatusExt;
            let code = status
                .code()
                .or_else(|| status.signal().map(|s| 128 + s))
                .unwrap_or(i32::from(FAILED_EXIT));
            return Ok(u8::try_from(code).unwrap_or(FAILED_EXIT));
        }
    }
}

/// Passes signal `n` from the client on to its worker, if it is one a
/// client may send.
fn pass_on(child: &Child, n: i32) {
    if let Some(sig) = PASSED_SIGNALS.into_iter().find(|s| *s as i32 == n) {
        // Not reaped yet (only this thread waits for it), so the pid is
        // still the worker's.
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, sig);
    }
}
