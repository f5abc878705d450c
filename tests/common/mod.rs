//! Shared harness for the ckpt end-to-end tests.
//!
//! The victims are small C programs in `tests/c/` following a zdtm-style
//! protocol (see `tests/c/victim.h`): `victim WORKDIR` sets up its state,
//! writes `WORKDIR/ready`, polls for `WORKDIR/go`, verifies its state and
//! writes `WORKDIR/result` (`PASS` or `FAIL: ...`).
//!
//! Everything here has a timeout: a hung `ckpt` or victim must fail the test,
//! never hang CI.  Processes a test started are killed when their guard is
//! dropped, including when the test panics.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::hash_map::DefaultHasher;
use std::fs::{self, File};
use std::hash::{Hash, Hasher};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

pub const CKPT: &str = env!("CARGO_BIN_EXE_ckpt");

pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
pub const DUMP_TIMEOUT: Duration = Duration::from_secs(60);
pub const RESTORE_TIMEOUT: Duration = Duration::from_secs(30);
/// For commands that are expected to fail fast (bad images, bad pids).
pub const FAIL_TIMEOUT: Duration = Duration::from_secs(30);
pub const POLL: Duration = Duration::from_millis(10);

/// Flags the victims are built with: optimised a little (so registers
/// carry live values across the checkpoint) and with debug info.
const CFLAGS: &[&str] = &["-O1", "-g", "-Wall"];

/// Image files every dump must produce for its (single) process.
pub fn expected_images(pid: i32) -> Vec<String> {
    vec![
        "manifest.img".to_string(),
        format!("pages-{pid}.img"),
        format!("core-{pid}.img"),
        format!("mm-{pid}.img"),
        format!("fds-{pid}.img"),
        "files.img".to_string(),
    ]
}

// ---------------------------------------------------------------------------
// Victim compilation
// ---------------------------------------------------------------------------

fn c_dir() -> PathBuf {
    // The ckpt package lives in <workspace>/ckpt, the tests in <workspace>/tests.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/c")
}

static COMPILE_LOCK: Mutex<()> = Mutex::new(());

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

fn compile_victim(name: &str, compiler: &str) -> PathBuf {
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

// ---------------------------------------------------------------------------
// Temp dirs
// ---------------------------------------------------------------------------

/// Per-test scratch space: `work/` for the victim, `img/` (not created) for
/// the images, and logs of every ckpt invocation.  Kept on failure so the
/// images and logs can be inspected.
pub struct TestEnv {
    tmp: Option<tempfile::TempDir>,
    pub root: PathBuf,
    pub work: PathBuf,
    pub img: PathBuf,
    cmd_counter: AtomicUsize,
}

impl TestEnv {
    /// The image key of this test's ckpt invocations (created by its first
    /// dump), so tests never touch the site's key in /var/lib.
    pub fn image_key(&self) -> PathBuf {
        self.root.join("image.key")
    }

    /// A `ckpt` command with this test's image key, for tests that need
    /// more control than [`ckpt`] gives (fault points, odd fds, signals).
    pub fn ckpt_command(&self) -> Command {
        let mut cmd = Command::new(CKPT);
        cmd.env("CKPT_IMAGE_KEY", self.image_key());
        cmd
    }

    pub fn new(test: &str) -> TestEnv {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("ckpt-e2e-{test}-"))
            .tempdir()
            .expect("create temp dir");
        let root = tmp.path().to_path_buf();
        let work = root.join("work");
        fs::create_dir(&work).expect("create work dir");
        TestEnv {
            tmp: Some(tmp),
            img: root.join("img"),
            root,
            work,
            cmd_counter: AtomicUsize::new(0),
        }
    }
}

/// An unprivileged account for the security tests: ckpt runs as root on
/// other users' jobs, so what matters is what a restore gives a process of
/// an ordinary user.
pub struct TestUser {
    pub name: &'static str,
    pub uid: u32,
    pub gid: u32,
}

const TEST_USER: &str = "ckpt-test";

/// The test account, created (system user, no home, no login shell) on
/// first use.
pub fn test_user() -> &'static TestUser {
    static USER: std::sync::OnceLock<TestUser> = std::sync::OnceLock::new();
    USER.get_or_init(|| {
        let lookup = || nix::unistd::User::from_name(TEST_USER).expect("read passwd");
        if lookup().is_none() {
            let out = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    TEST_USER,
                ])
                .output()
                .expect("run useradd");
            // Another test binary may have created it meanwhile.
            assert!(
                out.status.success() || lookup().is_some(),
                "useradd {TEST_USER}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let u = lookup().expect("test user exists");
        TestUser {
            name: TEST_USER,
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
        }
    })
}

impl TestEnv {
    /// Hands the work dir (where the victim keeps its state and protocol
    /// files) to `user`. The image dir stays root's.
    pub fn give_work_to(&self, user: &TestUser) {
        let own = |p: &Path| {
            nix::unistd::chown(
                p,
                Some(nix::unistd::Uid::from_raw(user.uid)),
                Some(nix::unistd::Gid::from_raw(user.gid)),
            )
            .unwrap_or_else(|e| panic!("chown {}: {e}", p.display()))
        };
        own(&self.work);
        for e in fs::read_dir(&self.work).expect("read work dir").flatten() {
            own(&e.path());
        }
        // The root dir must be reachable for the victim to get to work/.
        fs::set_permissions(&self.root, fs::Permissions::from_mode(0o755))
            .expect("chmod test root");
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(tmp) = self.tmp.take()
        {
            eprintln!("test failed: keeping {}", tmp.keep().display());
        }
    }
}

// ---------------------------------------------------------------------------
// Polling
// ---------------------------------------------------------------------------

/// Polls `f` every 10 ms until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(POLL);
    }
}

pub fn wait_for_file(path: &Path, timeout: Duration) -> bool {
    wait_until(timeout, || path.exists())
}

pub fn read_to_string_lossy(path: &Path) -> String {
    fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Creates a file atomically (write tmp, rename), so victims never read a
/// partial one.
pub fn write_atomic(path: &Path, content: &str) {
    let tmp = path.with_extension("harness-tmp");
    fs::write(&tmp, content).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    fs::rename(&tmp, path).unwrap_or_else(|e| panic!("rename to {}: {e}", path.display()));
}

/// Copies `from` to `to` as an executable (mode 0755) through a child
/// `install`, so no descriptor of this process ever writes `to`. Writing it
/// here would race with the other test threads: a child they fork while the
/// write is open holds the file open for writing until it execs, and running
/// the file in that window fails with ETXTBSY ("Text file busy").
pub fn install_executable(from: &Path, to: &Path) {
    let out = Command::new("install")
        .args(["-m", "0755"])
        .arg(from)
        .arg(to)
        .output()
        .unwrap_or_else(|e| panic!("run install for {}: {e}", to.display()));
    assert!(
        out.status.success(),
        "install {} {}: {}",
        from.display(),
        to.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes a script to run (a fake Slurm client, a launcher), executable and
/// safe from the ETXTBSY race [`install_executable`] explains.
pub fn write_executable(path: &Path, text: &str) {
    let src = path.with_extension("harness-src");
    fs::write(&src, text).unwrap_or_else(|e| panic!("write {}: {e}", src.display()));
    install_executable(&src, path);
    fs::remove_file(&src).unwrap_or_else(|e| panic!("remove {}: {e}", src.display()));
}

// ---------------------------------------------------------------------------
// /proc helpers
// ---------------------------------------------------------------------------

pub fn pid_exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

pub fn proc_status(pid: i32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/status")).ok()
}

/// Value of a `/proc/PID/status` field, e.g. `status_field(pid, "State")`.
pub fn status_field(pid: i32, field: &str) -> Option<String> {
    let status = proc_status(pid)?;
    status.lines().find_map(|l| {
        l.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    })
}

/// Single-letter process state (R, S, D, T, t, Z, ...).
pub fn proc_state(pid: i32) -> Option<char> {
    status_field(pid, "State").and_then(|s| s.chars().next())
}

pub fn tracer_pid(pid: i32) -> Option<i32> {
    status_field(pid, "TracerPid").and_then(|s| s.parse().ok())
}

pub fn ppid_of(pid: i32) -> Option<i32> {
    status_field(pid, "PPid").and_then(|s| s.parse().ok())
}

/// Signal mask fields of /proc/PID/status (SigPnd, ShdPnd, SigBlk, ...).
pub fn sig_mask_field(pid: i32, field: &str) -> Option<u64> {
    status_field(pid, field).and_then(|s| u64::from_str_radix(&s, 16).ok())
}

pub fn exe_of(pid: i32) -> Option<PathBuf> {
    fs::read_link(format!("/proc/{pid}/exe")).ok()
}

pub fn cmdline_of(pid: i32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Asserts the process exists, is neither stopped nor traced, and is not a
/// zombie: what "untouched" means after a failed dump.
pub fn assert_running_untouched(pid: i32, context: &str) {
    let state = proc_state(pid);
    assert!(
        matches!(state, Some('R' | 'S' | 'D')),
        "{context}: pid {pid} should be running, state is {state:?}"
    );
    assert_eq!(
        tracer_pid(pid),
        Some(0),
        "{context}: pid {pid} is still traced (TracerPid)"
    );
}

/// A pid that is not in use now (counting down from pid_max).
pub fn unused_pid() -> i32 {
    let max: i32 = fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32768);
    (2..max)
        .rev()
        .find(|p| !pid_exists(*p))
        .expect("no free pid")
}

/// True once nothing runs as `pid` any more, or only a process that has
/// nothing to do with this test (pid reuse): a zombie or anything running
/// the victim binary or naming the work dir counts as still there.
pub fn victim_gone(pid: i32, bin: &Path, work: &Path) -> bool {
    if !pid_exists(pid) {
        return true;
    }
    let zombie = proc_state(pid) == Some('Z');
    !zombie && !is_our_victim(pid, bin, work)
}

fn is_our_victim(pid: i32, bin: &Path, work: &Path) -> bool {
    let work = work.to_string_lossy();
    cmdline_of(pid).contains(work.as_ref()) || exe_of(pid).as_deref() == Some(bin)
}

// ---------------------------------------------------------------------------
// Spawning
// ---------------------------------------------------------------------------

/// Makes every inherited fd above 2 close-on-exec in the child.  Whatever the
/// test runner leaked (pipes, jobserver fds) must not end up in a victim:
/// ckpt cannot dump pipes, and the files test compares the whole fd table.
fn cloexec_inherited_fds(cmd: &mut Command, new_session: bool) {
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

    fn spawn_full(
        env: &TestEnv,
        bin: PathBuf,
        name: &str,
        extra_args: &[&str],
        [stdin, stdout, stderr]: [Stdio; 3],
        user: Option<&TestUser>,
    ) -> Victim {
        let mut cmd = Command::new(&bin);
        cmd.arg(&env.work)
            .args(extra_args)
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
        let stdout = File::create(env.work.join("stdout")).expect("create stdout file");
        let stderr = File::create(env.work.join("stderr")).expect("create stderr file");
        let mut cmd = Command::new(program);
        cmd.args(args)
            .current_dir(&env.work)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
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
fn enter_ns_at_exec(cmd: &mut Command, ns: &Path, nstype: libc::c_int) -> File {
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

// ---------------------------------------------------------------------------
// A mount namespace of a test's own
// ---------------------------------------------------------------------------

/// A mount namespace of its own (private: nothing mounted in it reaches
/// the test's, nor the other way) with a tmpfs at `dir` that only its
/// processes see, kept alive by a `sleep` in it. Dropping it kills the
/// sleeper; the namespace, and the tmpfs with its files, end with the last
/// process in it.
pub struct MntNs {
    /// Where the tmpfs is mounted inside (an empty directory outside).
    pub dir: PathBuf,
    sleeper: Child,
}

impl MntNs {
    /// Makes the namespace and mounts the tmpfs (`dir` is created).
    pub fn new(dir: &Path) -> MntNs {
        use std::os::unix::ffi::OsStrExt;
        fs::create_dir_all(dir).expect("create the mount point");
        let at = std::ffi::CString::new(dir.as_os_str().as_bytes()).expect("mount point");
        let mut cmd = Command::new("sleep");
        cmd.arg("600")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cloexec_inherited_fds(&mut cmd, false);
        // SAFETY: between fork and exec the hook makes raw syscalls only,
        // on static strings and a CString made before the fork; it does
        // not allocate.
        unsafe {
            cmd.pre_exec(move || {
                let private = libc::MS_REC | libc::MS_PRIVATE;
                if libc::unshare(libc::CLONE_NEWNS) != 0
                    || libc::mount(
                        std::ptr::null(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        private,
                        std::ptr::null(),
                    ) != 0
                    || libc::mount(
                        c"ckpt-test".as_ptr(),
                        at.as_ptr(),
                        c"tmpfs".as_ptr(),
                        0,
                        c"mode=0755".as_ptr().cast(),
                    ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let sleeper = cmd
            .spawn()
            .expect("start a process in a new mount namespace");
        MntNs {
            dir: dir.to_path_buf(),
            sleeper,
        }
    }

    /// The namespace file: `/proc/PID/ns/mnt` of the sleeper.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/mnt", self.sleeper.id()))
    }

    /// The namespace's inode (`mnt:[INODE]`).
    pub fn inode(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(self.path())
            .expect("stat the mount namespace")
            .ino()
    }

    /// `path` (absolute) as the namespace's processes see it, reached from
    /// outside through the sleeper's root.
    pub fn inside(&self, path: &Path) -> PathBuf {
        Path::new(&format!("/proc/{}/root", self.sleeper.id()))
            .join(path.strip_prefix("/").unwrap_or(path))
    }
}

impl Drop for MntNs {
    fn drop(&mut self) {
        let _ = self.sleeper.kill();
        let _ = self.sleeper.wait();
    }
}

// ---------------------------------------------------------------------------
// Running ckpt
// ---------------------------------------------------------------------------

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
        let n = env.cmd_counter.fetch_add(1, Ordering::SeqCst);
        let verb = args.first().copied().unwrap_or("none");
        let out_path = env.root.join(format!("ckpt-{n}-{verb}.stdout"));
        let err_path = env.root.join(format!("ckpt-{n}-{verb}.stderr"));
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
            .envs(vars.iter().map(|(k, v)| (*k, *v)))
            .stdin(Stdio::null())
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

// ---------------------------------------------------------------------------
// The standard cycle
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Reading what a checkpoint and a victim say
// ---------------------------------------------------------------------------

/// `ckpt show --json` of the test's checkpoint.
pub fn show_json(env: &TestEnv) -> serde_json::Value {
    let show = ckpt(env, &["show", path_str(&env.img), "--json"], FAIL_TIMEOUT);
    show.assert_success();
    serde_json::from_str(show.stdout.trim()).expect("show --json prints one JSON value")
}

/// Every fd of file kind `kind` in `show` (from [`show_json`]), all
/// processes together, as `ckpt show --json` describes them.
pub fn fds_of_kind(show: &serde_json::Value, kind: &str) -> Vec<serde_json::Value> {
    show["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .flat_map(|p| p["fds"].as_array().cloned().unwrap_or_default())
        .filter(|f| f["kind"] == kind)
        .collect()
}

/// The distinct open-file ids of `fds` (from [`fds_of_kind`]).
pub fn file_ids(fds: &[serde_json::Value]) -> Vec<u64> {
    let mut ids: Vec<u64> = fds
        .iter()
        .map(|f| f["file_id"].as_u64().expect("file_id"))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The "tick N" numbers readable from `r` (non-blocking) within `wait`;
/// the ticker victims write such lines.
pub fn read_ticks(r: &mut File, wait: Duration) -> Vec<u64> {
    use std::io::Read;
    let mut text = String::new();
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match r.read(&mut buf) {
            Ok(n) if n > 0 => text.push_str(&String::from_utf8_lossy(&buf[..n])),
            // EOF of a FIFO without writer yet, or nothing yet: wait.
            Ok(_) => sleep(POLL),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => sleep(POLL),
            Err(e) => panic!("read ticks: {e}"),
        }
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("tick ")?.parse().ok())
        .collect()
}

/// A launcher's pipe for a ticker victim's stdout: (read end, non-blocking,
/// for [`read_ticks`]; write end, to hand to the victim or to restore).
pub fn launcher_pipe() -> (File, std::os::fd::OwnedFd) {
    let (r, w) = nix::unistd::pipe().expect("pipe");
    nix::fcntl::fcntl(
        &r,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .expect("O_NONBLOCK");
    (File::from(r), w)
}

/// The ticker victim (tests/c/ticker.c), ready, with `stdout` (a
/// launcher's pipe, socket or FIFO) as its stdout and /dev/null as its
/// stdin and stderr.
pub fn spawn_ticker(env: &TestEnv, stdout: Stdio) -> Victim {
    let mut v = Victim::spawn_with(env, "ticker", &[], Stdio::null(), stdout, Stdio::null());
    v.wait_ready();
    v
}

/// What the victim's stdout is, as /proc names it (`pipe:[INO]`,
/// `socket:[INO]`): the key `--external` and `--inherit-fd` take.
pub fn stdout_key(v: &Victim) -> String {
    fs::read_link(format!("/proc/{}/fd/1", v.pid))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// The last tick a ticker wrote into its old launcher's `r` before it was
/// dumped (and killed); there must be one.
pub fn last_tick_before_dump(r: &mut File) -> u64 {
    let before = read_ticks(r, Duration::from_millis(100));
    *before.last().expect("ticks before the dump")
}

/// `ckpt restore --detach --inherit-fd fd[1]:KEY` with `stdout` (a new
/// launcher's end) as its fd 1, standing in for the external `key`; the
/// restore must succeed.
pub fn restore_inheriting_stdout(env: &TestEnv, key: &str, stdout: std::os::fd::OwnedFd) {
    let status = env
        .ckpt_command()
        .args([
            "restore",
            "--detach",
            "--dir",
            path_str(&env.img),
            "--inherit-fd",
        ])
        .arg(format!("fd[1]:{key}"))
        .stdin(Stdio::null())
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::null())
        .status()
        .expect("run restore");
    assert!(status.success(), "restore with --inherit-fd failed");
}

/// After a restore under a new launcher reading `r`: the ticker's lines
/// carry on from `last`, and after go the victim passes.
pub fn assert_ticks_carry_on(r: &mut File, last: u64, v: &Victim) {
    let after = read_ticks(r, Duration::from_millis(500));
    assert!(!after.is_empty(), "no ticks in the new launcher's pipe");
    assert_eq!(
        after[0],
        last + 1,
        "ticks should carry on from {last}: {after:?}"
    );
    v.go_and_pass();
}

/// The outside_pipe victim: its stdin is a pipe whose write end (returned,
/// keep it open) stays with the test, outside the tree; the victim moves
/// it to fd 10, where the stdio rule does not cover it.
pub fn spawn_with_outside_pipe(env: &TestEnv) -> (Victim, std::os::fd::OwnedFd) {
    let (r, w) = nix::unistd::pipe().expect("pipe");
    let mut v = Victim::spawn_with(
        env,
        "outside_pipe",
        &[],
        Stdio::from(r),
        Stdio::null(),
        Stdio::null(),
    );
    v.wait_ready();
    (v, w)
}

// ---------------------------------------------------------------------------
// Nodes on one machine: network namespaces on a bridge
// ---------------------------------------------------------------------------

/// "Nodes" of a distributed job on this machine: one network namespace
/// each, joined by a bridge in the host namespace, each with its own
/// address (10.X.Y.n/24; the host side is .254). Removed on drop.
pub struct NetNodes {
    /// Namespace names, node 1 first.
    pub names: Vec<String>,
    /// Their addresses, in the same order.
    pub addrs: Vec<String>,
    /// The host's address on the bridge (where a coordinator listens).
    pub host_addr: String,
    bridge: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run ip: {e}"));
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl NetNodes {
    /// Creates `n` nodes for the test named `tag` (unique per test process).
    pub fn new(tag: &str, n: usize) -> NetNodes {
        // Unique per test process and per instance within it: several
        // tests of one binary run at once, each with its own nodes.
        static INSTANCES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 3;
        let id = std::process::id();
        let net = format!("10.{}.{}", 100 + ((id >> 8) % 50) * 3 + k, id % 256);
        let short = format!("{:x}{k}", id % 0xfffff);
        let bridge = format!("ckb{short}{}", &tag[..tag.len().min(3)]);
        let mut nodes = NetNodes {
            names: Vec::new(),
            addrs: Vec::new(),
            host_addr: format!("{net}.254"),
            bridge: bridge.clone(),
        };
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&[
            "addr",
            "add",
            &format!("{}/24", nodes.host_addr),
            "dev",
            &bridge,
        ]);
        ip(&["link", "set", &bridge, "up"]);
        for i in 1..=n {
            let name = format!("ckpt-{tag}-{short}-n{i}");
            let (outer, inner) = (format!("ckv{short}{i}"), format!("ckp{short}{i}"));
            let addr = format!("{net}.{i}");
            ip(&["netns", "add", &name]);
            nodes.names.push(name.clone());
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ]);
            ip(&["link", "set", &outer, "master", &bridge, "up"]);
            ip(&["link", "set", &inner, "netns", &name]);
            ip(&[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                &inner,
            ]);
            ip(&["-n", &name, "link", "set", &inner, "up"]);
            ip(&["-n", &name, "link", "set", "lo", "up"]);
            nodes.addrs.push(addr);
        }
        nodes
    }

    /// `ip netns exec NODE` in front of `args`: run on node `i` (0-based).
    pub fn on(&self, i: usize, args: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = ["netns", "exec", &self.names[i]]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(args.iter().map(|s| s.to_string()));
        v
    }
}

impl Drop for NetNodes {
    fn drop(&mut self) {
        for i in 0..self.names.len() {
            // Whatever a failed test left running in its nodes (daemons
            // such as Open MPI's orted are no test's child).
            for pid in self.pids(i) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
    }
}

impl NetNodes {
    /// The pid (in the host's pid namespace) of the process named `comm`
    /// inside node `i`'s network namespace, if there is exactly one.
    pub fn pid_of(&self, i: usize, comm: &str) -> Option<i32> {
        let found: Vec<i32> = self
            .pids(i)
            .into_iter()
            .filter(|&p| {
                fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm)
            })
            .collect();
        match found[..] {
            [pid] => Some(pid),
            _ => None,
        }
    }
}

impl NetNodes {
    /// Every process in node `i`'s network namespace.
    pub fn pids(&self, i: usize) -> Vec<i32> {
        Command::new("ip")
            .args(["netns", "pids", &self.names[i]])
            .output()
            .map(|out| {
                String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A coordinated checkpoint of a job spread over [`NetNodes`]: a
/// coordinator (`ckpt coord`) on the bridge, reachable from every node,
/// and one agent per node (`ckpt dump --coord` / `ckpt restore --coord`)
/// run inside that node, as a site would run them through its launcher.
pub struct Coordinated<'a> {
    env: &'a TestEnv,
    nodes: &'a NetNodes,
    job: String,
    addr: String,
    state: PathBuf,
    secret: String,
    coord: CkptCmd,
}

impl<'a> Coordinated<'a> {
    /// Starts the coordinator of job `job` expecting one agent per node.
    pub fn start(env: &'a TestEnv, nodes: &'a NetNodes, job: &str) -> Coordinated<'a> {
        let port = std::net::TcpListener::bind("0.0.0.0:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let addr = format!("{}:{port}", nodes.host_addr);
        let state = env.root.join("coord");
        let expect = nodes.names.len().to_string();
        let coord = CkptCmd::spawn(
            env,
            &[
                "coord",
                "--listen",
                &addr,
                "--job",
                job,
                "--expect",
                &expect,
                "--state-dir",
                path_str(&state),
            ],
        );
        let secret = state.join(format!("{job}.secret"));
        assert!(
            wait_until(Duration::from_secs(10), || secret.exists()),
            "coordinator did not start: {}",
            coord.stderr_now()
        );
        Coordinated {
            env,
            nodes,
            job: job.to_string(),
            addr,
            state,
            secret: path_str(&secret).to_string(),
            coord,
        }
    }

    /// Runs the agent of part `part` (its checkpoint root `node<part+1>`,
    /// node name `n<part+1>`) inside node `on`: a dump of the tree at
    /// `dump_root` (killed once the checkpoint is committed), or a restore
    /// of the part's images when `dump_root` is `None`, with `extra`
    /// arguments.
    fn agent(&self, part: usize, on: usize, dump_root: Option<i32>, extra: &[String]) -> CkptCmd {
        let dir = self.env.root.join(format!("node{}", part + 1));
        let node = format!("n{}", part + 1);
        let mut args: Vec<String> = Vec::new();
        match dump_root {
            // The peers are on other nodes: outside this node's tree.
            Some(pid) => args.extend(
                [
                    "dump",
                    "--tree",
                    &pid.to_string(),
                    "--kill",
                    "--tcp-established",
                ]
                .map(String::from),
            ),
            None => args.push("restore".into()),
        }
        args.extend(
            [
                "--dir",
                path_str(&dir),
                "--coord",
                &self.addr,
                "--job",
                &self.job,
                "--node",
                &node,
                "--secret-file",
                &self.secret,
            ]
            .map(String::from),
        );
        args.extend(extra.iter().cloned());
        CkptCmd::spawn_in_netns(
            self.env,
            &self.nodes.names[on],
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    }

    /// Checkpoints the tree rooted at `roots[i]` on node `i`, every node at
    /// once, kills the job once the coordinator has committed the epoch,
    /// and asserts both succeeded.
    pub fn dump_and_kill(&self, roots: &[i32], timeout: Duration) {
        let agents: Vec<CkptCmd> = roots
            .iter()
            .enumerate()
            .map(|(i, &pid)| self.agent(i, i, Some(pid), &[]))
            .collect();
        for out in agents.into_iter().map(|a| a.wait(timeout)) {
            out.assert_success();
        }
        let epoch = self
            .state
            .join(&self.job)
            .join(format!("epoch-{:016}.json", 1));
        assert!(
            epoch.exists(),
            "epoch 1 committed by the coordinator: {:?}",
            fs::read_dir(&self.state).map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        );
    }

    /// Restores every node's part at once, inside its node, and returns
    /// each agent's outcome (its exit code is its tree root's) when the
    /// restored job has finished.
    pub fn restore(&mut self, timeout: Duration) -> Vec<CkptOutput> {
        let home: Vec<usize> = (0..self.nodes.names.len()).collect();
        self.restore_on(&home, timeout)
    }

    /// Restores part `i` inside node `placement[i]` (parts may move or
    /// swap nodes; the agents exchange addresses so connections follow),
    /// every part at once, and returns each part's agent outcome.
    pub fn restore_on(&mut self, placement: &[usize], timeout: Duration) -> Vec<CkptOutput> {
        let peers: Vec<String> = (1..=placement.len()).map(|i| format!("n{i}")).collect();
        // `ip netns exec` gives every command a mount namespace of its own
        // (a copy of the host's): a part started with it was dumped from
        // another, and comes back in its agent's, where the same files are.
        let extra = [
            "--peers".to_string(),
            peers.join(","),
            "--mntns".to_string(),
            "/proc/self/ns/mnt".to_string(),
        ];
        let agents: Vec<CkptCmd> = placement
            .iter()
            .enumerate()
            .map(|(part, &on)| self.agent(part, on, None, &extra))
            .collect();
        let outs = agents.into_iter().map(|a| a.wait(timeout)).collect();
        let _ = self.coord.try_status();
        outs
    }
}

/// Gives the processes in the mount namespace of `pid` (a restored copy of
/// a job, in a private mount namespace) a work directory of their own,
/// `ROOT/work2`, bound over the shared one, so that two copies report
/// apart. Returns it.
pub fn own_work_dir_in(env: &TestEnv, pid: i32) -> PathBuf {
    let other = env.root.join("work2");
    std::fs::create_dir(&other).unwrap();
    let mnt = format!("--mount=/proc/{pid}/ns/mnt");
    let bind = Command::new("nsenter")
        .args([
            &mnt,
            "mount",
            "--bind",
            path_str(&other),
            path_str(&env.work),
        ])
        .status()
        .expect("run nsenter");
    assert!(bind.success(), "bind mount in the copy's namespace: {bind}");
    other
}

/// For every thread of `pid` (by tid, sorted): the lines of its
/// `/proc/PID/task/TID/status` that start with one of `fields`.
pub fn thread_status_lines(pid: i32, fields: &[&str]) -> Vec<(String, Vec<String>)> {
    let mut tids: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    tids.sort();
    tids.into_iter()
        .map(|tid| {
            let status = read_to_string_lossy(Path::new(&format!("/proc/{pid}/task/{tid}/status")));
            let lines = status
                .lines()
                .filter(|l| fields.iter().any(|f| l.starts_with(f)))
                .map(str::to_string)
                .collect();
            (tid, lines)
        })
        .collect()
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

/// The workspace's root (where `scripts/` is).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The QEMU guests of scripts/ib-vm.sh, for tests that run ckpt on
/// another kernel or on a verbs device.
pub mod guest {
    use super::*;

    /// Runs `scripts/ib-vm.sh ARGS`.
    pub fn ib_vm(args: &[&str]) -> std::process::Output {
        Command::new(workspace().join("scripts/ib-vm.sh"))
            .args(args)
            .output()
            .expect("run scripts/ib-vm.sh")
    }

    /// `scripts/ib-vm.sh setup ARGS...`, or the test fails with the
    /// harness's message (a missing prerequisite never skips a test).
    pub fn setup(args: &[&str]) {
        let mut all = vec!["setup"];
        all.extend_from_slice(args);
        let out = ib_vm(&all);
        assert!(
            out.status.success(),
            "scripts/ib-vm.sh {}: {}",
            all.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    /// A scratch directory the guest shares writable (under /var/tmp: the
    /// guest sees the host's tree but not its /tmp).
    pub fn scratch(prefix: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/var/tmp")
            .expect("scratch dir")
    }

    /// Copies a binary into the scratch directory, executable.
    pub fn copy_executable(from: &Path, to: &Path) {
        super::install_executable(from, to);
    }

    /// Writes `script` to `scratch/name` and boots the guest of `kernel` (a
    /// series such as "6.12", or the default 6.1) on it; its output.
    pub fn run(
        kernel: Option<&str>,
        scratch: &Path,
        name: &str,
        script: &str,
        timeout_secs: u32,
    ) -> std::process::Output {
        let path = scratch.join(name);
        super::write_executable(&path, script);
        let timeout = timeout_secs.to_string();
        let mut args = vec!["run"];
        if let Some(k) = kernel {
            args.extend(["--kernel", k]);
        }
        let s = scratch.to_str().expect("utf-8 scratch path");
        let p = path.to_str().expect("utf-8 script path");
        args.extend(["--timeout", &timeout, "--scratch", s, "--", p]);
        ib_vm(&args)
    }
}
