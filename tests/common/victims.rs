//! The C victims: compiled once per test binary, spawned as root or as the
//! test user, and driven through their ready/go/result protocol.

use super::*;

pub(crate) fn c_dir() -> PathBuf {
    // The ckpt package lives in <workspace>/ckpt, the tests in <workspace>/tests.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/c")
}

pub(crate) static COMPILE_LOCK: Mutex<()> = Mutex::new(());

/// Compiles `tests/c/<name>.c` once and returns the binary's path.
///
/// Binaries are cached in the target's tmp dir under a name derived from the
/// source text, so edits always rebuild and parallel tests (or parallel test
/// binaries) never see a half-written executable.  The binary must outlive
/// the test process's temp dirs because `ckpt restore` needs the executable
/// the image refers to.
pub fn victim_bin(name: &str) -> PathBuf {
    compile_victim(name, "gcc")
}

/// [`victim_bin`] for an MPI program, built with Open MPI's `mpicc`.
pub fn mpi_victim_bin(name: &str) -> PathBuf {
    compile_victim(name, "mpicc")
}

/// A victim built against MPICH (`mpicc.mpich`), whatever MPI the
/// system's `mpicc` is.
pub fn mpich_victim_bin(name: &str) -> PathBuf {
    compile_victim(name, "mpicc.mpich")
}

/// Where `scripts/test-deps.sh --lab` installs MPICH from PyPI (a venv),
/// a newer MPICH than Debian's (`CKPT_PIP_MPICH` there and here says
/// elsewhere).
pub fn pip_mpich_prefix() -> PathBuf {
    std::env::var_os("CKPT_PIP_MPICH")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("/opt/ckpt-mpich"), PathBuf::from)
}

/// A victim built against pip's MPICH ([`pip_mpich_prefix`]), its
/// libraries found by the runpath its `mpicc` sets.
pub fn pip_mpich_victim_bin(name: &str) -> PathBuf {
    let mpicc = pip_mpich_prefix().join("bin/mpicc");
    assert!(
        mpicc.exists(),
        "{}: no MPICH from PyPI (scripts/test-deps.sh --lab installs it)",
        mpicc.display()
    );
    compile_victim(name, path_str(&mpicc))
}

pub(crate) fn compile_victim(name: &str, compiler: &str) -> PathBuf {
    let _guard = COMPILE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let src = c_dir().join(format!("{name}.c"));
    let header = c_dir().join("victim.h");
    let src_text = fs::read(&src).unwrap_or_else(|e| panic!("read {}: {e}", src.display()));
    let header_text =
        fs::read(&header).unwrap_or_else(|e| panic!("read {}: {e}", header.display()));
    let mut h = DefaultHasher::new();
    src_text.hash(&mut h);
    header_text.hash(&mut h);
    CFLAGS.hash(&mut h);
    compiler.hash(&mut h);
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ckpt-victims");
    fs::create_dir_all(&out_dir).expect("create victim bin dir");
    let out = out_dir.join(format!("{name}-{:016x}", h.finish()));
    if out.exists() {
        return out;
    }
    let tmp = out_dir.join(format!(
        ".{name}-{}-{:?}.tmp",
        std::process::id(),
        std::thread::current().id()
    ));
    let res = Command::new(compiler)
        .args(CFLAGS)
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .args(["-lm", "-pthread"])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {compiler}: {e}"));
    assert!(
        res.status.success(),
        "{compiler} failed for {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&res.stderr)
    );
    fs::rename(&tmp, &out).expect("rename compiled victim");
    out
}

/// Makes every inherited fd above 2 close-on-exec in the child.  Whatever the
/// test runner leaked (pipes, jobserver fds) must not end up in a victim:
/// ckpt cannot dump pipes, and the files test compares the whole fd table.
pub(crate) fn cloexec_inherited_fds(cmd: &mut Command, new_session: bool) {
    let hook = move || -> io::Result<()> {
        if new_session {
            nix::unistd::setsid().map_err(io::Error::from)?;
        }
        // SAFETY: close_range only changes fd flags in this (child) process;
        // it takes no pointers.
        let rc = unsafe {
            libc::close_range(
                3,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC as libc::c_int,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before exec and only calls
    // setsid and close_range, which are async-signal-safe and do not
    // allocate or take locks.
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// A running victim.  Dropping it kills whatever still runs as its pid and
/// is recognisably the victim (the original, or the restored copy).
pub struct Victim {
    pub pid: i32,
    pub bin: PathBuf,
    pub work: PathBuf,
    pub name: String,
    /// Id the victim published at ready (see victim.h); the restored process
    /// must report the same one, or it is a fresh process, not a restore.
    pub incarnation: Option<String>,
    child: Option<Child>,
}

impl Victim {
    /// Starts `tests/c/<name>.c` in its own session with stdin=/dev/null and
    /// stdout/stderr going to regular files in the work dir (ckpt supports
    /// neither pipes nor terminals).
    pub fn spawn(env: &TestEnv, name: &str, extra_args: &[&str]) -> Victim {
        let stdout = File::create(env.work.join("stdout")).expect("create stdout file");
        let stderr = File::create(env.work.join("stderr")).expect("create stderr file");
        Victim::spawn_with(
            env,
            name,
            extra_args,
            Stdio::null(),
            stdout.into(),
            stderr.into(),
        )
    }

    /// Like [`Victim::spawn`], running as `user` (uid, gid, no
    /// supplementary groups). Call [`TestEnv::give_work_to`] first.
    pub fn spawn_as(env: &TestEnv, name: &str, extra_args: &[&str], user: &TestUser) -> Victim {
        let stdout = File::create(env.work.join("stdout")).expect("create stdout file");
        let stderr = File::create(env.work.join("stderr")).expect("create stderr file");
        env.give_work_to(user);
        Victim::spawn_full(
            env,
            victim_bin(name),
            name,
            extra_args,
            [Stdio::null(), stdout.into(), stderr.into()],
            Some(user),
        )
    }

    /// Like [`Victim::spawn_as`], running the executable `bin` (a copy of a
    /// victim, e.g. to change it between dump and restore).
    pub fn spawn_bin_as(env: &TestEnv, bin: &Path, extra_args: &[&str], user: &TestUser) -> Victim {
        let stdout = File::create(env.work.join("stdout")).expect("create stdout file");
        let stderr = File::create(env.work.join("stderr")).expect("create stderr file");
        env.give_work_to(user);
        let name = bin
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        Victim::spawn_full(
            env,
            bin.to_path_buf(),
            &name,
            extra_args,
            [Stdio::null(), stdout.into(), stderr.into()],
            Some(user),
        )
    }

    /// Like [`Victim::spawn_as`] with the standard fds chosen by the
    /// caller (the work dir is handed to `user` here).
    pub fn spawn_with_as(
        env: &TestEnv,
        name: &str,
        extra_args: &[&str],
        stdio: [Stdio; 3],
        user: &TestUser,
    ) -> Victim {
        env.give_work_to(user);
        Victim::spawn_full(env, victim_bin(name), name, extra_args, stdio, Some(user))
    }

    /// Like [`Victim::spawn`] with the standard fds chosen by the caller.
    pub fn spawn_with(
        env: &TestEnv,
        name: &str,
        extra_args: &[&str],
        stdin: Stdio,
        stdout: Stdio,
        stderr: Stdio,
    ) -> Victim {
        Victim::spawn_full(
            env,
            victim_bin(name),
            name,
            extra_args,
            [stdin, stdout, stderr],
            None,
        )
    }

    /// Like [`Victim::spawn`], with the variables `vars` added to its
    /// environment.
    pub fn spawn_with_vars(
        env: &TestEnv,
        name: &str,
        extra_args: &[&str],
        vars: &[(&str, &str)],
    ) -> Victim {
        let stdout = File::create(env.work.join("stdout")).expect("create stdout file");
        let stderr = File::create(env.work.join("stderr")).expect("create stderr file");
        Victim::spawn_full_with_vars(
            env,
            victim_bin(name),
            name,
            extra_args,
            [Stdio::null(), stdout.into(), stderr.into()],
            None,
            vars,
        )
    }

    fn spawn_full(
        env: &TestEnv,
        bin: PathBuf,
        name: &str,
        extra_args: &[&str],
        stdio: [Stdio; 3],
        user: Option<&TestUser>,
    ) -> Victim {
        Victim::spawn_full_with_vars(env, bin, name, extra_args, stdio, user, &[])
    }

    fn spawn_full_with_vars(
        env: &TestEnv,
        bin: PathBuf,
        name: &str,
        extra_args: &[&str],
        [stdin, stdout, stderr]: [Stdio; 3],
        user: Option<&TestUser>,
        vars: &[(&str, &str)],
    ) -> Victim {
        let mut cmd = Command::new(&bin);
        cmd.arg(&env.work)
            .args(extra_args)
            .envs(vars.iter().copied())
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr);
        if let Some(u) = user {
            // std drops the supplementary groups when root sets a uid.
            cmd.uid(u.uid).gid(u.gid);
        }
        cloexec_inherited_fds(&mut cmd, true);
        // A binary a test just wrote can be "busy" for a moment: a process
        // another test thread forked meanwhile holds the write fd until it
        // execs.
        let deadline = Instant::now() + READY_TIMEOUT;
        let child = loop {
            match cmd.spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && Instant::now() < deadline => {
                    sleep(POLL)
                }
                other => break other.unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display())),
            }
        };
        Victim {
            pid: child.id() as i32,
            bin,
            work: env.work.clone(),
            name: name.to_string(),
            incarnation: None,
            child: Some(child),
        }
    }

    /// Like [`Victim::spawn`], in the named network namespace (`ip netns
    /// add NAME`), entered between fork and exec.
    pub fn spawn_in_netns(env: &TestEnv, name: &str, extra_args: &[&str], netns: &str) -> Victim {
        let ns = format!("/run/netns/{netns}");
        Victim::spawn_in_ns(env, name, extra_args, Path::new(&ns), libc::CLONE_NEWNET)
    }

    /// Like [`Victim::spawn`], in the mount namespace of `mnt`, entered
    /// between fork and exec.
    pub fn spawn_in_mntns(env: &TestEnv, name: &str, extra_args: &[&str], mnt: &MntNs) -> Victim {
        Victim::spawn_in_ns(env, name, extra_args, &mnt.path(), libc::CLONE_NEWNS)
    }

    /// Like [`Victim::spawn`], in namespace file `ns` of kind `nstype`.
    fn spawn_in_ns(
        env: &TestEnv,
        name: &str,
        extra_args: &[&str],
        ns: &Path,
        nstype: libc::c_int,
    ) -> Victim {
        let stdout = File::create(env.work.join("stdout")).expect("create stdout file");
        let stderr = File::create(env.work.join("stderr")).expect("create stderr file");
        let mut cmd = Command::new(victim_bin(name));
        cmd.arg(&env.work)
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        cloexec_inherited_fds(&mut cmd, true);
        let ns = enter_ns_at_exec(&mut cmd, ns, nstype);
        let child = cmd.spawn().expect("spawn victim in a namespace");
        drop(ns);
        Victim {
            pid: child.id() as i32,
            bin: victim_bin(name),
            work: env.work.clone(),
            name: name.to_string(),
            incarnation: None,
            child: Some(child),
        }
    }

    /// Like [`Victim::spawn_program`], in the mount namespace of `mnt`
    /// (entered between fork and exec).
    pub fn spawn_program_in_mntns(
        env: &TestEnv,
        program: &Path,
        args: &[&str],
        mnt: &MntNs,
    ) -> Victim {
        let stdout = File::create(env.work.join("stdout")).expect("create stdout file");
        let stderr = File::create(env.work.join("stderr")).expect("create stderr file");
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        cloexec_inherited_fds(&mut cmd, true);
        let ns = enter_ns_at_exec(&mut cmd, &mnt.path(), libc::CLONE_NEWNS);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
        drop(ns);
        Victim {
            pid: child.id() as i32,
            bin: program.to_path_buf(),
            work: env.work.clone(),
            name: program.display().to_string(),
            incarnation: None,
            child: Some(child),
        }
    }

    /// Starts a real program nobody here wrote, `program args...`, in its
    /// own session with stdin `/dev/null`, stdout and stderr to files in the
    /// work dir and inherited fds closed. It speaks no victim protocol: its
    /// arguments name the work dir if it reports there.
    pub fn spawn_program(env: &TestEnv, program: &Path, args: &[&str]) -> Victim {
        Victim::spawn_program_full(env, program, args, None, &[])
    }

    /// Like [`Victim::spawn_program`], run by `user` (stdout and stderr
    /// files and the work dir theirs) with `vars` added to its environment
    /// and no image key of the test's.
    pub fn spawn_program_as(
        env: &TestEnv,
        program: &Path,
        args: &[&str],
        user: &TestUser,
        vars: &[(&str, &str)],
    ) -> Victim {
        Victim::spawn_program_full(env, program, args, Some(user), vars)
    }

    fn spawn_program_full(
        env: &TestEnv,
        program: &Path,
        args: &[&str],
        user: Option<&TestUser>,
        vars: &[(&str, &str)],
    ) -> Victim {
        let stdout = File::create(env.work.join("stdout")).expect("create stdout file");
        let stderr = File::create(env.work.join("stderr")).expect("create stderr file");
        let mut cmd = Command::new(program);
        cmd.args(args)
            .current_dir(&env.work)
            .envs(vars.iter().copied())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        if let Some(u) = user {
            env.give_work_to(u);
            cmd.env_remove("CKPT_IMAGE_KEY").uid(u.uid).gid(u.gid);
        }
        cloexec_inherited_fds(&mut cmd, true);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
        Victim {
            pid: child.id() as i32,
            bin: program.to_path_buf(),
            work: env.work.clone(),
            name: program.display().to_string(),
            incarnation: None,
            child: Some(child),
        }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.work.join(file)
    }

    /// Everything the victim has said so far, for failure messages.
    pub fn diag(&self) -> String {
        format!(
            "victim {} (pid {}): result={:?} stderr={:?}",
            self.name,
            self.pid,
            read_to_string_lossy(&self.path("result")),
            read_to_string_lossy(&self.path("stderr")),
        )
    }

    /// Waits for the ready file and returns its content.
    pub fn wait_ready(&mut self) -> String {
        let ready = self.path("ready");
        let deadline = Instant::now() + READY_TIMEOUT;
        while !ready.exists() {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "victim exited ({status}) before becoming ready: {}",
                    self.diag()
                );
            }
            assert!(
                Instant::now() < deadline,
                "victim not ready after {READY_TIMEOUT:?}: {}",
                self.diag()
            );
            sleep(POLL);
        }
        let id = read_to_string_lossy(&self.path("incarnation"));
        assert!(
            !id.is_empty(),
            "victim wrote ready without an incarnation id"
        );
        self.incarnation = Some(id);
        read_to_string_lossy(&ready)
    }

    /// Whether the original process (our child) has exited; reaps it if so.
    pub fn original_exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Reaps the original process, which must die within `timeout`.  It
    /// must have been killed by a signal: a victim that exited by itself
    /// ran its checks without a go file, which means something is wrong.
    pub fn reap_killed(&mut self, timeout: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("original victim already reaped");
        let mut status = None;
        let exited = wait_until(timeout, || {
            status = child.try_wait().expect("try_wait victim");
            status.is_some()
        });
        let status = status.filter(|_| exited).unwrap_or_else(|| {
            panic!(
                "original victim pid {} still alive {timeout:?} after `ckpt dump --kill` \
                 (state {:?})",
                self.pid,
                proc_state(self.pid)
            )
        });
        self.child = None;
        assert!(
            status.signal().is_some(),
            "original victim was not killed but exited with {status}: {}",
            self.diag()
        );
        assert!(
            !pid_exists(self.pid),
            "pid {} still exists after reaping the original",
            self.pid
        );
        status
    }

    /// Waits for the original (our child) to exit by itself.
    pub fn wait_original_exit(&mut self, timeout: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("original victim already reaped");
        let mut status = None;
        let exited = wait_until(timeout, || {
            status = child.try_wait().expect("try_wait victim");
            status.is_some()
        });
        assert!(
            exited,
            "original victim did not exit within {timeout:?}: {}",
            self.diag()
        );
        self.child = None;
        status.expect("status")
    }

    /// Drops our handle on the original without reaping it (zombie test).
    pub fn take_child(&mut self) -> Child {
        self.child.take().expect("original victim already reaped")
    }

    pub fn clear_protocol_files(&self) {
        for f in [
            "go",
            "go2",
            "result",
            "stage1",
            "ping",
            "pong",
            "incarnation.final",
        ] {
            let _ = fs::remove_file(self.path(f));
        }
    }

    pub fn go(&self) {
        write_atomic(&self.path("go"), "go");
    }

    /// Writes go and waits (10 s at most) for the victim's own check to
    /// pass.
    pub fn go_and_pass(&self) {
        self.go();
        assert_eq!(
            self.wait_result(Duration::from_secs(10)),
            "PASS",
            "{}",
            self.diag()
        );
    }

    pub fn result(&self) -> Option<String> {
        fs::read_to_string(self.path("result")).ok()
    }

    /// Waits for the result file (for victims that are nobody's child here).
    pub fn wait_result(&self, timeout: Duration) -> String {
        assert!(
            wait_for_file(&self.path("result"), timeout),
            "no result from victim within {timeout:?}: {}",
            self.diag()
        );
        self.result().unwrap_or_default()
    }

    /// The victim wrote PASS, and it is the same incarnation that became
    /// ready before the dump (not a re-executed copy).
    pub fn assert_pass(&self) {
        let result = self.result();
        assert_eq!(
            result.as_deref(),
            Some("PASS"),
            "victim check failed: {}",
            self.diag()
        );
        let final_id = read_to_string_lossy(&self.path("incarnation.final"));
        assert_eq!(
            Some(&final_id),
            self.incarnation.as_ref(),
            "the process that passed is not the one that was dumped (incarnation id \
             changed: it was started afresh instead of restored)"
        );
    }

    /// The original victim survived whatever ckpt just did to it: alive,
    /// not stopped or traced, still running its own loop, and — once told
    /// to go — passes its own checks and exits 0.
    pub fn assert_unharmed_and_passes(&mut self, context: &str) {
        assert!(
            self.original_exited().is_none(),
            "{context}: victim died: {}",
            self.diag()
        );
        assert_running_untouched(self.pid, context);
        assert!(
            self.ping(READY_TIMEOUT),
            "{context}: victim stopped looping: {}",
            self.diag()
        );
        self.go();
        let status = self.wait_original_exit(RESTORE_TIMEOUT);
        assert_eq!(
            status.code(),
            Some(0),
            "{context}: victim failed its own check: {}",
            self.diag()
        );
        self.assert_pass();
    }

    /// Round-trips ping/pong: proves the victim's own code is executing.
    pub fn ping(&self, timeout: Duration) -> bool {
        let _ = fs::remove_file(self.path("pong"));
        write_atomic(&self.path("ping"), "ping");
        wait_for_file(&self.path("pong"), timeout)
    }

    pub fn send(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid), sig)
            .unwrap_or_else(|e| panic!("kill({}, {sig}): {e}", self.pid));
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        // Restored copies are nobody's child here: only kill the pid if it is
        // still recognisably ours, never an unrelated process reusing it.
        if pid_exists(self.pid) && is_our_victim(self.pid, &self.bin, &self.work) {
            let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
        }
    }
}

/// Makes `cmd` enter namespace file `ns` (of kind `nstype`) between fork
/// and exec. The returned file must stay open until `cmd` is spawned.
pub(crate) fn enter_ns_at_exec(cmd: &mut Command, ns: &Path, nstype: libc::c_int) -> File {
    use std::os::fd::AsRawFd;
    let file = File::open(ns).unwrap_or_else(|e| panic!("open {}: {e}", ns.display()));
    let raw = file.as_raw_fd();
    // SAFETY: setns only, on an fd held open across the fork; it is
    // async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(raw, nstype) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    file
}
