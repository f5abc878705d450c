//! The ckpt service (`ckpt serve`) for a test, and ckpt run as the test
//! user through it.

use super::*;

/// A running `ckpt serve` on a socket of the test's own, sealing with the
/// test's image key. Killed on drop.
pub struct Service {
    child: Child,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Service {
    /// Starts the service under `env.root/run` (root's, 0755: a user must
    /// reach the socket, and no one but root may replace it).
    pub fn start(env: &TestEnv) -> Service {
        Service::start_with(env, &[])
    }

    /// [`Service::start`] with more arguments of `ckpt serve`.
    pub fn start_with(env: &TestEnv, extra: &[&str]) -> Service {
        let dir = env.root.join("run");
        fs::create_dir(&dir).expect("create the service's dir");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod run dir");
        fs::set_permissions(&env.root, fs::Permissions::from_mode(0o755)).expect("chmod test root");
        let socket = dir.join("ckpt.sock");
        let log = env.root.join("serve.log");
        let mut cmd = Command::new(CKPT);
        cmd.args(["serve", "--socket", path_str(&socket)])
            .args(extra)
            .env("CKPT_IMAGE_KEY", env.image_key())
            .stdin(Stdio::null())
            .stdout(File::create(&log).expect("create serve log"))
            .stderr(File::create(&log).expect("create serve log"));
        cloexec_inherited_fds(&mut cmd, true);
        let child = cmd.spawn().expect("spawn ckpt serve");
        assert!(
            wait_for_file(&socket, READY_TIMEOUT),
            "ckpt serve did not listen on {}: {}",
            socket.display(),
            fs::read_to_string(&log).unwrap_or_default()
        );
        Service { child, socket, log }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl CkptCmd {
    /// `ckpt ARGS` run by `user` (no supplementary groups, no image key of
    /// its own), in `cwd`, reaching the service at `socket`.
    pub fn spawn_as_user(
        env: &TestEnv,
        user: &TestUser,
        socket: &Path,
        cwd: &Path,
        args: &[&str],
    ) -> CkptCmd {
        CkptCmd::spawn_command(env, user_command(user, socket, cwd, args), args)
    }

    /// [`CkptCmd::spawn_as_user`] from inside the cgroup `cgroup` (a v1
    /// cgroup whose `cgroup.procs` the user may write: the client moves
    /// itself there before it execs, as a job's processes are placed by
    /// their scheduler).
    pub fn spawn_as_user_in_cgroup(
        env: &TestEnv,
        user: &TestUser,
        socket: &Path,
        cwd: &Path,
        args: &[&str],
        cgroup: &Path,
    ) -> CkptCmd {
        let mut cmd = user_command(user, socket, cwd, args);
        use std::os::unix::ffi::OsStrExt;
        let procs = std::ffi::CString::new(cgroup.join("cgroup.procs").as_os_str().as_bytes())
            .expect("cgroup path without NUL");
        let join = move || -> nix::Result<()> {
            let fd = nix::fcntl::open(
                procs.as_c_str(),
                nix::fcntl::OFlag::O_WRONLY,
                nix::sys::stat::Mode::empty(),
            )?;
            nix::unistd::write(&fd, b"0\n")?;
            Ok(())
        };
        // SAFETY: the closure runs in the forked child of a threaded test
        // process before exec: it allocates nothing (the path is built
        // here), only opens and writes a file.
        unsafe {
            cmd.pre_exec(move || join().map_err(io::Error::from));
        }
        CkptCmd::spawn_command(env, cmd, args)
    }
}

/// `ckpt ARGS` as `user` (no supplementary groups, no image key), in
/// `cwd`, reaching the service at `socket`.
fn user_command(user: &TestUser, socket: &Path, cwd: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(CKPT);
    cmd.args(args)
        .current_dir(cwd)
        .env_remove("CKPT_IMAGE_KEY")
        .env("CKPT_SERVICE_SOCKET", socket)
        .uid(user.uid)
        .gid(user.gid);
    cmd
}

/// `ckpt ARGS` as `user` through the service, to its end.
pub fn ckpt_as_user(
    env: &TestEnv,
    user: &TestUser,
    socket: &Path,
    cwd: &Path,
    args: &[&str],
) -> CkptOutput {
    CkptCmd::spawn_as_user(env, user, socket, cwd, args).wait(DUMP_TIMEOUT)
}

/// A directory of `user`'s own (0700) under the test's root.
pub fn user_dir(env: &TestEnv, user: &TestUser, name: &str) -> PathBuf {
    let dir = env.root.join(name);
    fs::create_dir(&dir).expect("create the user's dir");
    nix::unistd::chown(
        &dir,
        Some(nix::unistd::Uid::from_raw(user.uid)),
        Some(nix::unistd::Gid::from_raw(user.gid)),
    )
    .expect("chown the user's dir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).expect("chmod the user's dir");
    dir
}
