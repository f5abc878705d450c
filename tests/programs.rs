//! Real programs nobody here wrote, dumped mid-computation, killed and
//! restored: they must finish with the right result, every piece of work
//! done exactly once (each program checks that itself and writes
//! `result`: "PASS ..." or "FAIL why").

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::common::*;

/// Long enough for a slow machine to reach the first progress mark.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(60);
/// Long enough for the rest of the job after restore.
const FINISH_TIMEOUT: Duration = Duration::from_secs(120);

const PYTHON: &str = "/usr/bin/python3";

fn script(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/py")
        .join(name)
        .display()
        .to_string()
}

fn progress(v: &Victim) -> u64 {
    fs::read_to_string(v.path("progress"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits for the job to be at least `from` units in (and not done), dumps
/// it with `--kill`, restores it and waits for it to finish: returns the
/// progress at the dump and the result line.
fn checkpoint_mid_job(env: &TestEnv, v: &mut Victim, from: u64, total: u64) -> (u64, String) {
    checkpoint_mid_job_with(env, v, from, total, false)
}

/// [`checkpoint_mid_job`], the dump taken with `--background` (the job runs
/// on while its memory is saved, and is killed once it is committed) when
/// `background`.
fn checkpoint_mid_job_with(
    env: &TestEnv,
    v: &mut Victim,
    from: u64,
    total: u64,
    background: bool,
) -> (u64, String) {
    assert!(
        wait_until(PROGRESS_TIMEOUT, || progress(v) >= from),
        "job did not get going: progress {}\n{}",
        progress(v),
        v.diag()
    );
    if background {
        dump(env, v, &["--background"]);
        // The whole job (its own session): its pids must be free again.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(v.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        v.reap_killed(std::time::Duration::from_secs(10));
    } else {
        dump_kill_reap(env, v);
    }
    let at_dump = progress(v);
    assert!(
        at_dump < total,
        "the job had already finished when it was dumped ({at_dump} of {total})"
    );
    let restore = spawn_restore(env, &[]);
    let out = restore.wait_with(FINISH_TIMEOUT, || v.diag());
    let result = fs::read_to_string(v.path("result")).unwrap_or_default();
    assert_eq!(
        out.code(),
        0,
        "the restored job should finish with exit code 0; got {}\nresult: {result}\nrestore stderr:\n{}\n{}",
        out.status,
        out.stderr,
        v.diag()
    );
    (at_dump, result)
}

/// A Python `multiprocessing.Pool` of 4 workers over 800 tasks, with a
/// `Queue` feeding a reporter thread: pipes, POSIX semaphores (deleted
/// files in /dev/shm, mapped shared), threads, a forked tree.
#[test]
fn python_multiprocessing_pool_finishes_after_restore() {
    let env = TestEnv::new("python-pool");
    let work = env.work.display().to_string();
    let mut v = Victim::spawn_program(&env, Path::new(PYTHON), &[&script("pool.py"), &work]);
    let (at_dump, result) = checkpoint_mid_job(&env, &mut v, 100, 800);
    assert!(
        result.starts_with("PASS"),
        "pool job after a restore at {at_dump} of 800 tasks: {result}"
    );
}

/// The same pool dumped with `--background`: five processes write to
/// their memory, allocate and free while it is saved; the restored job
/// starts from the freeze instant and finishes.
#[test]
fn python_pool_dumped_in_the_background_finishes_after_restore() {
    let env = TestEnv::new("python-pool-bg");
    let work = env.work.display().to_string();
    let mut v = Victim::spawn_program(&env, Path::new(PYTHON), &[&script("pool.py"), &work]);
    let (at_dump, result) = checkpoint_mid_job_with(&env, &mut v, 100, 800, true);
    assert!(
        result.starts_with("PASS"),
        "pool job after a restore of a background dump at {at_dump} of 800 tasks: {result}"
    );
}

/// `redis-server` with a client connected over TCP inside the same tree:
/// a 1 MiB value, a counter INCRed 3000 times and a list appended to over
/// one connection that lives through the checkpoint.
#[test]
fn redis_server_and_its_tcp_client_finish_after_restore() {
    let env = TestEnv::new("redis");
    let work = env.work.display().to_string();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("pick a free port")
        .port()
        .to_string();
    let mut v = Victim::spawn_program(
        &env,
        Path::new(PYTHON),
        &[&script("redis_job.py"), &work, &port],
    );
    let (at_dump, result) = checkpoint_mid_job(&env, &mut v, 300, 3000);
    assert!(
        result.starts_with("PASS") && result.ends_with(" 3000"),
        "redis job after a restore at {at_dump} of 3000 rounds: {result}"
    );
}

/// Rounds of the MPI job: about 10 s on this machine.
const MPI_ROUNDS: u64 = 3000;

/// `mpirun` with 4 ranks of tests/c/mpi_job.c on this node, with the byte
/// transfer layer `btl` (Open MPI's `--mca btl`).
fn mpi_job(test: &str, btl: &str) {
    let env = TestEnv::new(test);
    let bin = mpi_victim_bin("mpi_job");
    let work = env.work.display().to_string();
    let rounds = MPI_ROUNDS.to_string();
    let mpirun = Path::new("/usr/bin/mpirun");
    let mut v = Victim::spawn_program(
        &env,
        mpirun,
        &[
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "4",
            "--mca",
            "btl",
            btl,
            bin.to_str().expect("utf-8 path"),
            &work,
            &rounds,
        ],
    );
    let (at_dump, result) = checkpoint_mid_job(&env, &mut v, 300, MPI_ROUNDS);
    assert!(
        result.starts_with("PASS"),
        "MPI job ({btl}) after a restore at round {at_dump} of {MPI_ROUNDS}: {result}"
    );
}

/// Open MPI, 4 ranks on one node talking through shared memory (the
/// `vader` transport: files in /dev/shm mapped by every rank), with
/// `mpirun` and its ranks talking over TCP and UNIX sockets, the ranks'
/// output through pseudo-terminals `mpirun` holds.
#[test]
fn open_mpi_shared_memory_job_finishes_after_restore() {
    mpi_job("mpi-vader", "self,vader");
}

/// The same job with every message between ranks over TCP connections
/// (each rank listening, connected to every other), restored through TCP
/// repair mode.
#[test]
fn open_mpi_tcp_job_finishes_after_restore() {
    mpi_job("mpi-tcp", "self,tcp");
}

const TMUX: &str = "/usr/bin/tmux";

/// Runs `tmux` on the test's own server socket `sock`; returns its stdout.
fn tmux(sock: &Path, args: &[&str]) -> String {
    let mut cmd = std::process::Command::new(TMUX);
    cmd.arg("-S")
        .arg(sock)
        .args(["-f", "/dev/null"])
        .args(args)
        .stdin(std::process::Stdio::null());
    // The server it may start must not keep what the test runner leaked.
    cloexec_inherited_fds(&mut cmd, false);
    let out = cmd.output().expect("run tmux");
    assert!(
        out.status.success(),
        "tmux {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The loop's progress file: its last timestamp, or nothing yet.
fn stamp(file: &Path) -> String {
    fs::read_to_string(file).unwrap_or_default()
}

/// A tmux server whose pane runs an interactive bash with a job in the
/// foreground (a loop that sleeps), dumped with `--kill` and restored:
/// the pane's pty comes back as bash's controlling terminal with the job
/// as its foreground group, so `tmux send-keys C-c` interrupts the job
/// (its INT trap writes a marker), as it would have before the dump, and
/// bash, in front again, runs the next command typed.
#[test]
fn tmux_pane_job_is_interrupted_by_ctrl_c_after_restore() {
    let env = TestEnv::new("tmux");
    let work = env.work.clone();
    let sock = work.join("tmux.sock");
    let progress = work.join("progress");
    let marker = work.join("interrupted");
    tmux(
        &sock,
        &[
            "new-session",
            "-d",
            "-s",
            "ck",
            "-x",
            "80",
            "-y",
            "24",
            "bash --norc --noprofile -i",
        ],
    );
    let job = format!(
        "sh -c 'trap \"echo interrupted > {m}; exit 0\" INT; while :; do date +%s%N > {p}; sleep 0.2; done'",
        m = marker.display(),
        p = progress.display()
    );
    tmux(&sock, &["send-keys", "-t", "ck", &job, "Enter"]);
    assert!(
        wait_until(PROGRESS_TIMEOUT, || !stamp(&progress).is_empty()),
        "the job in the tmux pane did not start"
    );
    let server = tmux(&sock, &["display-message", "-p", "#{pid}"])
        .trim()
        .to_string();
    let dumped = ckpt(
        &env,
        &[
            "dump",
            "--tree",
            &server,
            "--dir",
            path_str(&env.img),
            "--kill",
        ],
        FINISH_TIMEOUT,
    );
    dumped.assert_success();
    let restored = ckpt(
        &env,
        &["restore", "--detach", "--dir", path_str(&env.img)],
        FINISH_TIMEOUT,
    );
    restored.assert_success();
    // The job runs on.
    let at_restore = stamp(&progress);
    assert!(
        wait_until(PROGRESS_TIMEOUT, || stamp(&progress) != at_restore),
        "the job did not run on after restore\n{}",
        restored.stderr
    );
    assert!(!marker.exists(), "interrupted before any ^C");
    tmux(&sock, &["send-keys", "-t", "ck", "C-c"]);
    let interrupted = wait_until(Duration::from_secs(10), || marker.exists());
    // bash takes the terminal back and reads the next command.
    let back = work.join("back");
    let echo = format!("echo back > {}", back.display());
    if interrupted {
        tmux(&sock, &["send-keys", "-t", "ck", &echo, "Enter"]);
    }
    let prompt = interrupted && wait_until(Duration::from_secs(10), || back.exists());
    let _ = std::process::Command::new(TMUX)
        .arg("-S")
        .arg(&sock)
        .arg("kill-server")
        .status();
    assert!(
        interrupted,
        "C-c sent through tmux did not interrupt the job after restore\n{}",
        restored.stderr
    );
    assert!(prompt, "bash did not read a command after the job ended");
}
