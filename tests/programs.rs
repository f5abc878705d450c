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

/// Lua's source, unpacked by scripts/fetch-src.sh (which
/// scripts/test-deps.sh --lab runs; here it only prints the cached
/// directory, or fetches it once).
fn lua_source() -> std::path::PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fetch-src.sh");
    let out = std::process::Command::new(&script)
        .arg("lua5.4")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    assert!(
        out.status.success(),
        "scripts/fetch-src.sh lua5.4 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Files in `dir` whose names end in `.ext`.
fn with_extension(dir: &Path, ext: &str) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(&format!(".{ext}")))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A Lua program whose output checks the interpreter: arithmetic, strings,
/// tables, sorting, closures and coroutines.
const LUA_CHECK: &str = "local s = 0 for i = 1, 1000000 do s = s + i end \
    local t = {} for i = 1, 1000 do t[i] = (i * 7919) % 1000 end table.sort(t) \
    local co = coroutine.wrap(function() for i = 1, 3 do coroutine.yield(i * i) end end) \
    local sq = co() + co() + co() \
    print(string.format('%d %d %d %s', s, t[1] + t[1000], sq, ('lua'):rep(2):upper()))";

/// `make -j4` building Lua (a real C project nobody here wrote, fetched as
/// Debian's source package): a recursive make with its jobserver pipe and
/// up to four gcc pipelines (driver, cc1, as, their temporary files),
/// dumped with `--kill` mid-build and restored: the build finishes, every
/// source file has its object, and the interpreter built runs a program
/// correctly.
#[test]
fn make_j4_builds_lua_to_the_end_after_restore() {
    let env = TestEnv::new("make-lua");
    let tree = env.work.join("lua");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(lua_source())
        .arg(&tree)
        .status()
        .expect("cp");
    assert!(copied.success(), "copy Lua's source");
    let src = tree.join("src");
    let sources = with_extension(&src, "c");
    assert!(sources.len() > 20, "Lua's sources: {sources:?}");
    let mut v = Victim::spawn_program(
        &env,
        Path::new("/usr/bin/make"),
        &["-C", path_str(&tree), "-j4", "linux"],
    );
    let built = || with_extension(&src, "o").len();
    assert!(
        wait_until(PROGRESS_TIMEOUT, || built() >= 4),
        "the build did not get going: {} objects\n{}",
        built(),
        v.diag()
    );
    dump_kill_reap(&env, &mut v);
    let at_dump = built();
    assert!(
        !src.join("lua").exists() && at_dump < sources.len(),
        "the build was over at the dump ({at_dump} of {} objects)",
        sources.len()
    );
    let out = spawn_restore(&env, &[]).wait_with(FINISH_TIMEOUT, || v.diag());
    assert_eq!(
        out.code(),
        0,
        "the restored make should finish with exit code 0; got {}\nrestore stderr:\n{}\n{}",
        out.status,
        out.stderr,
        v.diag()
    );
    let objects: Vec<String> = sources.iter().map(|c| c.replace(".c", ".o")).collect();
    assert_eq!(
        with_extension(&src, "o"),
        objects,
        "every source file has its object (restored at {at_dump})"
    );
    let run = std::process::Command::new(src.join("lua"))
        .args(["-e", LUA_CHECK])
        .output()
        .expect("run the lua built");
    assert_eq!(
        String::from_utf8_lossy(&run.stdout).trim(),
        "500000500000 999 14 LUALUA",
        "the interpreter built across the restore: {}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// Appends lines `from..=to` ("line N") to `log`.
fn append_lines(log: &Path, from: u32, to: u32) {
    use std::io::Write;
    let mut f = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
        .expect("open the followed file");
    for n in from..=to {
        writeln!(f, "line {n}").expect("append");
    }
}

/// `tail -f` of a file written by a process outside the tree: dumped with
/// `--kill` while lines keep coming, restored, it prints what was written
/// while it was gone and what comes after, each line once and in order.
/// coreutils' tail sleeps in `poll` on an inotify instance, whose watch
/// comes back; the events queued at the dump do not, so it reads the lines
/// written while it was gone at the next write.
#[test]
fn tail_f_follows_its_file_after_restore() {
    let env = TestEnv::new("tail-f");
    let log = env.work.join("log");
    let printed = env.work.join("stdout");
    append_lines(&log, 1, 100);
    let mut v = Victim::spawn_program(
        &env,
        Path::new("/usr/bin/tail"),
        &["-n", "+1", "-f", path_str(&log)],
    );
    let lines = || {
        fs::read_to_string(&printed)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    assert!(
        wait_until(PROGRESS_TIMEOUT, || lines() == 100),
        "tail printed {} lines of 100",
        lines()
    );
    append_lines(&log, 101, 200);
    assert!(
        wait_until(PROGRESS_TIMEOUT, || lines() == 200),
        "tail followed {} lines of 200",
        lines()
    );
    dump_kill_reap(&env, &mut v);
    append_lines(&log, 201, 300);
    let restore = spawn_restore(&env, &[]);
    restored_root_pid(&restore);
    append_lines(&log, 301, 400);
    let followed = wait_until(PROGRESS_TIMEOUT, || lines() == 400);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(v.pid),
        nix::sys::signal::Signal::SIGTERM,
    );
    let out = restore.wait_with(FINISH_TIMEOUT, || v.diag());
    assert!(
        followed,
        "tail printed {} lines after the restore (100 written while it was gone, 400 in all)\nrestore stderr:\n{}",
        lines(),
        out.stderr
    );
    let want: String = (1..=400).map(|n| format!("line {n}\n")).collect();
    assert_eq!(
        fs::read_to_string(&printed).unwrap_or_default(),
        want,
        "every line once, in order"
    );
}

/// Sends one RESP command (`words`) on `conn` and reads its one-line reply.
fn redis_call(conn: &mut std::io::BufReader<std::net::TcpStream>, words: &[&str]) -> String {
    use std::io::{BufRead, Write};
    let mut cmd = format!("*{}\r\n", words.len());
    for w in words {
        cmd.push_str(&format!("${}\r\n{w}\r\n", w.len()));
    }
    conn.get_mut()
        .write_all(cmd.as_bytes())
        .unwrap_or_else(|e| panic!("send {words:?}: {e}"));
    let mut line = String::new();
    conn.read_line(&mut line)
        .unwrap_or_else(|e| panic!("reply to {words:?}: {e}"));
    line.trim_end().to_string()
}

/// `redis-server` alone in the tree, its client outside (this test, one
/// TCP connection): dumped with `--tcp-established --kill`, the client
/// sends a command while the server is gone, and once it is restored gets
/// the answer on the same connection, then goes on. The network lock drops
/// the client's packets meanwhile, so its TCP retransmits instead of
/// getting a reset: a delay, nothing lost, nothing done twice.
#[test]
fn redis_outside_client_keeps_its_connection_through_dump_and_restore() {
    let env = TestEnv::new("redis-outside");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("pick a free port")
        .port();
    let port_arg = port.to_string();
    let mut v = Victim::spawn_program(
        &env,
        Path::new("/usr/bin/redis-server"),
        &[
            "--port",
            &port_arg,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            path_str(&env.work),
        ],
    );
    let stream = (0..200)
        .find_map(|_| {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .ok()
                .or_else(|| {
                    std::thread::sleep(Duration::from_millis(50));
                    None
                })
        })
        .unwrap_or_else(|| panic!("redis-server did not listen\n{}", v.diag()));
    stream
        .set_read_timeout(Some(FINISH_TIMEOUT))
        .expect("read timeout");
    let mut conn = std::io::BufReader::new(stream);
    for n in 1..=100 {
        assert_eq!(redis_call(&mut conn, &["INCR", "n"]), format!(":{n}"));
    }
    dump(&env, &v, &["--tcp-established", "--kill"]);
    v.reap_killed(Duration::from_secs(10));
    // Sent while the server is gone: the lock drops it, TCP sends it again.
    let pending = std::thread::spawn(move || {
        let reply = redis_call(&mut conn, &["INCR", "n"]);
        (conn, reply)
    });
    std::thread::sleep(Duration::from_millis(500));
    let restore = spawn_restore(&env, &[]);
    restored_root_pid(&restore);
    let (mut conn, reply) = pending.join().expect("the client's thread");
    assert_eq!(reply, ":101", "the command sent while the server was gone");
    for n in 102..=200 {
        assert_eq!(redis_call(&mut conn, &["INCR", "n"]), format!(":{n}"));
    }
    assert_eq!(redis_call(&mut conn, &["GET", "n"]), "$3");
    let mut value = String::new();
    std::io::BufRead::read_line(&mut conn, &mut value).expect("GET's value");
    assert_eq!(value.trim_end(), "200", "every INCR done exactly once");
    // No reply: the server closes the connection as it exits.
    let _ = redis_call(&mut conn, &["SHUTDOWN", "NOSAVE"]);
    let out = restore.wait_with(FINISH_TIMEOUT, || v.diag());
    assert!(
        out.code() == 0,
        "the restored redis-server did not shut down cleanly: {}\n{}",
        out.status,
        out.stderr
    );
}
