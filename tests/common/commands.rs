//! Running ckpt: commands with deadlines, and the dump/restore cycle tests share.

use super::*;

/// A ckpt invocation running in the background; output goes to files (not
/// pipes) so a process that inherits them can never block the harness.
/// Killed on drop if still running.
pub struct CkptCmd {
    child: Option<Child>,
    pub desc: String,
    pub out_path: PathBuf,
    pub err_path: PathBuf,
}

#[derive(Debug)]
pub struct CkptOutput {
    pub desc: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl CkptOutput {
    /// Exit code, or 128+signo when ckpt itself was killed by a signal.
    pub fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| 128 + self.status.signal().unwrap_or(0))
    }

    pub fn assert_success(&self) -> &Self {
        assert!(
            self.status.success(),
            "`{}` failed with {}\nstderr:\n{}\nstdout:\n{}",
            self.desc,
            self.status,
            self.stderr,
            self.stdout
        );
        self
    }

    /// The contract for every failure: non-zero exit (not a crash) and an
    /// `ckpt: error:` line on stderr.  Returns that line.
    pub fn assert_error(&self) -> String {
        assert!(
            self.status.code().is_some_and(|c| c != 0),
            "`{}` should have failed with a non-zero exit code, got {}\nstderr:\n{}",
            self.desc,
            self.status,
            self.stderr
        );
        self.stderr
            .lines()
            .find(|l| l.starts_with("ckpt: error:"))
            .unwrap_or_else(|| {
                panic!(
                    "`{}`: no line starting with `ckpt: error:` on stderr:\n{}",
                    self.desc, self.stderr
                )
            })
            .to_string()
    }
}

impl CkptCmd {
    pub fn spawn(env: &TestEnv, args: &[&str]) -> CkptCmd {
        CkptCmd::spawn_with_env(env, args, &[])
    }

    /// Like [`CkptCmd::spawn`] with extra environment variables (fault
    /// injection).
    pub fn spawn_with_env(env: &TestEnv, args: &[&str], vars: &[(&str, &Path)]) -> CkptCmd {
        CkptCmd::spawn_in(env, None, args, vars)
    }

    /// Like [`CkptCmd::spawn`], run inside network namespace `netns` (`ip
    /// netns exec`): a node of a [`NetNodes`] job.
    pub fn spawn_in_netns(env: &TestEnv, netns: &str, args: &[&str]) -> CkptCmd {
        CkptCmd::spawn_in(env, Some(netns), args, &[])
    }

    fn spawn_in(
        env: &TestEnv,
        netns: Option<&str>,
        args: &[&str],
        vars: &[(&str, &Path)],
    ) -> CkptCmd {
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, CKPT]);
                c
            }
            None => Command::new(CKPT),
        };
        cmd.args(args)
            .env("CKPT_IMAGE_KEY", env.image_key())
            .envs(vars.iter().map(|(k, v)| (*k, *v)));
        CkptCmd::spawn_command(env, cmd, args)
    }

    /// Starts `cmd` (a ckpt command line `args`) with stdin from /dev/null
    /// and its output to the test's files.
    pub(crate) fn spawn_command(env: &TestEnv, mut cmd: Command, args: &[&str]) -> CkptCmd {
        let n = env.cmd_counter.fetch_add(1, Ordering::SeqCst);
        let verb = args.first().copied().unwrap_or("none");
        let out_path = env.root.join(format!("ckpt-{n}-{verb}.stdout"));
        let err_path = env.root.join(format!("ckpt-{n}-{verb}.stderr"));
        cmd.stdin(Stdio::null())
            .stdout(File::create(&out_path).expect("create ckpt stdout"))
            .stderr(File::create(&err_path).expect("create ckpt stderr"));
        cloexec_inherited_fds(&mut cmd, false);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {CKPT}: {e}"));
        CkptCmd {
            child: Some(child),
            desc: format!("ckpt {}", args.join(" ")),
            out_path,
            err_path,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(-1)
    }

    pub fn stderr_now(&self) -> String {
        read_to_string_lossy(&self.err_path)
    }

    /// Some(status) once ckpt has exited (reaping it).
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().expect("try_wait ckpt"))
    }

    /// Waits for exit; on timeout kills ckpt and fails the test with what it
    /// printed so far plus `extra_diag()` (e.g. the victim's state).
    pub fn wait_with(mut self, timeout: Duration, extra_diag: impl Fn() -> String) -> CkptOutput {
        let mut status = None;
        let done = wait_until(timeout, || {
            status = self.try_status();
            status.is_some()
        });
        if !done {
            let mut child = self.child.take().expect("child");
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`{}` did not finish within {timeout:?}\nstderr:\n{}\n{}",
                self.desc,
                self.stderr_now(),
                extra_diag()
            );
        }
        self.child = None;
        CkptOutput {
            desc: self.desc.clone(),
            status: status.expect("status"),
            stdout: read_to_string_lossy(&self.out_path),
            stderr: read_to_string_lossy(&self.err_path),
        }
    }

    pub fn wait(self, timeout: Duration) -> CkptOutput {
        self.wait_with(timeout, String::new)
    }
}

impl Drop for CkptCmd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs ckpt to completion (with a timeout).
pub fn ckpt(env: &TestEnv, args: &[&str], timeout: Duration) -> CkptOutput {
    CkptCmd::spawn(env, args).wait(timeout)
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Whether `dir` is on a disk, not tmpfs: where the restorer reads pages
/// files with direct I/O.
pub fn on_disk(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir)
        .is_ok_and(|fs| fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC)
}

/// Asserts the image dir holds the files the contract promises.
pub fn assert_images(img: &Path, pid: i32) {
    for f in expected_images(pid) {
        let p = img.join(&f);
        let len = fs::metadata(&p)
            .unwrap_or_else(|e| panic!("image file {} missing after dump: {e}", p.display()))
            .len();
        assert!(len > 0, "image file {} is empty", p.display());
    }
}

/// `ckpt dump --tree PID --dir IMG <extra>`, which must succeed and produce
/// the image files.
pub fn dump(env: &TestEnv, v: &Victim, extra: &[&str]) -> CkptOutput {
    let pid = v.pid.to_string();
    let mut args = vec!["dump", "--tree", &pid, "--dir", path_str(&env.img)];
    args.extend_from_slice(extra);
    let out = CkptCmd::spawn(env, &args).wait_with(DUMP_TIMEOUT, || v.diag());
    out.assert_success();
    assert_images(&env.img, v.pid);
    out
}

/// `ckpt dump --tree PID --dir IMG <extra>`, whatever its outcome.
pub fn dump_outcome(env: &TestEnv, v: &Victim, extra: &[&str]) -> CkptOutput {
    let pid = v.pid.to_string();
    let mut args = vec!["dump", "--tree", &pid, "--dir", path_str(&env.img)];
    args.extend_from_slice(extra);
    ckpt(env, &args, DUMP_TIMEOUT)
}

/// `ckpt dump --tree PID --dir IMG`, which must fail; returns its error line.
pub fn dump_expect_error(env: &TestEnv, v: &Victim) -> String {
    dump_outcome(env, v, &[]).assert_error()
}

/// Dump with `--kill`, then reap the original so its pid is free again.
pub fn dump_kill_reap(env: &TestEnv, v: &mut Victim) {
    dump(env, v, &["--kill"]);
    v.reap_killed(Duration::from_secs(10));
}

/// `ckpt dump --tree PID --dir IMG <extra>` with fault point `point` armed
/// (`CKPT_FAULT`, see parasite/src/fault.rs) and stdin from /dev/null, not
/// yet run: the caller chooses how to collect its outcome, since such a
/// dump is meant to die or fail.
pub fn faulty_dump_command(env: &TestEnv, v: &Victim, point: &str, extra: &[&str]) -> Command {
    let mut cmd = env.ckpt_command();
    cmd.args([
        "dump",
        "--tree",
        &v.pid.to_string(),
        "--dir",
        path_str(&env.img),
    ])
    .args(extra)
    .env("CKPT_FAULT", point)
    .stdin(Stdio::null());
    cmd
}

pub fn spawn_restore(env: &TestEnv, extra: &[&str]) -> CkptCmd {
    let mut args = vec!["restore", "--dir", path_str(&env.img)];
    args.extend_from_slice(extra);
    CkptCmd::spawn(env, &args)
}

/// `ckpt restore --dir IMG` with no options, whatever its outcome.
pub fn restore_outcome(env: &TestEnv) -> CkptOutput {
    ckpt(env, &["restore", "--dir", path_str(&env.img)], FAIL_TIMEOUT)
}

/// `ckpt restore --dir IMG`, which must fail; returns its error line.
pub fn restore_expect_error(env: &TestEnv) -> String {
    restore_outcome(env).assert_error()
}

/// Waits (bounded) until the restored victim's own code answers a ping.
/// Fails early, with ckpt's stderr, if the restore command exits first.
pub fn wait_restored_and_running(v: &Victim, restore: &mut CkptCmd) {
    let _ = fs::remove_file(v.path("pong"));
    write_atomic(&v.path("ping"), "ping");
    let deadline = Instant::now() + RESTORE_TIMEOUT;
    while !v.path("pong").exists() {
        if let Some(status) = restore.try_status() {
            panic!(
                "`{}` exited ({status}) before the restored victim answered a ping\n\
                 stderr:\n{}\n{}",
                restore.desc,
                restore.stderr_now(),
                v.diag()
            );
        }
        assert!(
            Instant::now() < deadline,
            "restored victim pid {} did not answer a ping within {RESTORE_TIMEOUT:?} \
             (state {:?})\nrestore stderr:\n{}\n{}",
            v.pid,
            proc_state(v.pid),
            restore.stderr_now(),
            v.diag()
        );
        sleep(POLL);
    }
}

/// Waits for a foreground `ckpt restore` to end and checks the contract: it
/// exits with the victim's exit code (0 = PASS) and the victim wrote PASS.
pub fn finish_restore(v: &Victim, restore: CkptCmd) -> CkptOutput {
    let out = restore.wait_with(RESTORE_TIMEOUT, || v.diag());
    assert_eq!(
        out.code(),
        0,
        "`{}` should exit with the restored victim's exit code 0; got {}\n\
         restore stderr:\n{}\n{}",
        out.desc,
        out.status,
        out.stderr,
        v.diag()
    );
    v.assert_pass();
    out
}

/// restore (foreground) + go + wait + PASS.
pub fn restore_and_check(env: &TestEnv, v: &Victim) -> CkptOutput {
    let restore = spawn_restore(env, &[]);
    // The victim polls for go: it may see it as soon as it runs again.
    v.go();
    finish_restore(v, restore)
}

/// The whole standard scenario for a victim that needs nothing special.
pub fn standard_cycle(test: &str, victim: &str, args: &[&str]) {
    let env = TestEnv::new(test);
    let mut v = Victim::spawn(&env, victim, args);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    restore_and_check(&env, &v);
}

/// The host pid a running `ckpt restore` reports for the restored root
/// ("ckpt: restored pid N"), once it has.
pub fn restored_root_pid(restore: &CkptCmd) -> i32 {
    let reported = || {
        restore.stderr_now().lines().find_map(|l| {
            l.strip_prefix("ckpt: restored pid ")?
                .trim()
                .parse::<i32>()
                .ok()
        })
    };
    assert!(
        wait_until(Duration::from_secs(20), || reported().is_some()),
        "restore {} reported no restored pid:\n{}",
        restore.pid(),
        restore.stderr_now()
    );
    reported().unwrap()
}
