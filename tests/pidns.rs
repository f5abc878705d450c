//! PID namespaces: `ckpt run --pidns` starts a job as PID 2 of a namespace
//! of its own under ckpt's init, a dump of that init records the
//! namespace's pids, and a restore brings them back in a fresh namespace,
//! twice at once from one image (victim: tests/c/pidns.c, which checks its
//! pids from inside). What does not fit is refused by name.

use std::time::Duration;

use crate::common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A job started with `ckpt run --pidns`; dropping it kills the
/// namespace's init, which ends every process of the namespace.
struct NsJob {
    /// The `ckpt run` launcher, speaking for the victim inside.
    v: Victim,
    /// Host pid of the namespace's init.
    init: i32,
}

impl NsJob {
    fn start(env: &TestEnv, program: &std::path::Path, args: &[&str]) -> NsJob {
        let pidfile = env.root.join("init.pid");
        let mut all = vec![
            "run",
            "--pidns",
            "--pidfile",
            path_str(&pidfile),
            "--",
            path_str(program),
        ];
        all.extend_from_slice(args);
        let v = Victim::spawn_program(env, std::path::Path::new(CKPT), &all);
        assert!(
            wait_for_file(&pidfile, READY_TIMEOUT),
            "ckpt run wrote no pid file: {}",
            v.diag()
        );
        let init = read_to_string_lossy(&pidfile).trim().parse().expect("pid");
        NsJob { v, init }
    }

    /// The host pids of the init and its descendants, parents first.
    fn host_tree(&self) -> Vec<i32> {
        host_tree_of(self.init)
    }
}

/// Host pids of restored namespace inits, killed (with their namespaces)
/// when the test ends, passed or not: a restore command killed on a
/// failure leaves its tree running otherwise.
#[derive(Default)]
struct Inits(Vec<i32>);

impl Drop for Inits {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
    }
}

impl Drop for NsJob {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.init), Signal::SIGKILL);
    }
}

/// The namespace pids the victim published at ready: root, A, C, thread.
fn ready_pids(ready: &str) -> [i32; 4] {
    let v: Vec<i32> = ready
        .split_whitespace()
        .map(|n| n.parse().expect("pid in ready"))
        .collect();
    v.try_into().expect("four pids in ready")
}

fn dump_tree(env: &TestEnv, pid: i32, extra: &[&str]) -> CkptOutput {
    let pid = pid.to_string();
    let mut args = vec!["dump", "--tree", &pid, "--dir", path_str(&env.img)];
    args.extend_from_slice(extra);
    ckpt(env, &args, DUMP_TIMEOUT)
}

const RESULT_TIMEOUT: Duration = Duration::from_secs(20);

/// The image of a namespace's init speaks the namespace's pids everywhere
/// (processes, parents, sessions, groups, threads, pidfds); the job runs
/// on unharmed and passes its own checks.
#[test]
fn dump_of_namespace_init_records_namespace_pids() {
    let env = TestEnv::new("pidns-dump");
    let mut job = NsJob::start(&env, &victim_bin("pidns"), &[path_str(&env.work)]);
    let [r, a, c, t] = ready_pids(&job.v.wait_ready());
    assert_eq!(r, 2, "the command is PID 2 of its namespace");
    let host = job.host_tree();
    assert_eq!(host.len(), 4, "init, root, A and C on the host: {host:?}");

    let out = dump_tree(&env, job.init, &[]);
    out.assert_success();
    assert!(out.stderr.contains("4 processes"), "{}", out.stderr);
    let show = show_json(&env);
    assert_eq!(show["root_pid"], 1, "root is PID 1 of its namespace");
    assert_eq!(show["pid_namespace"]["root_host_pid"], job.init);
    let procs: Vec<(i64, i64)> = show["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["pid"].as_i64().unwrap(), p["ppid"].as_i64().unwrap()))
        .collect();
    let want: Vec<(i64, i64)> = vec![(1, 0), (2, 1), (a.into(), 2), (c.into(), a.into())];
    assert_eq!(procs, want, "pids and parents in the namespace's numbers");
    for p in show["processes"].as_array().unwrap() {
        assert_eq!(p["sid"], 1, "session of pid {} is the init's", p["pid"]);
        assert_eq!(p["pgid"], 1, "group of pid {} is the init's", p["pid"]);
    }
    assert_eq!(show["processes"][1]["threads"], serde_json::json!([t]));
    let pidfds = fds_of_kind(&show, "pidfd");
    assert_eq!(pidfds.len(), 1, "{pidfds:?}");
    assert_eq!(pidfds[0]["object"], format!("pidfd of pid {a}"));
    assert_eq!(
        fds_of_kind(&show, "pipe").len(),
        3,
        "the pipe from A to the root: its read end, the write end in A and C (inherited)"
    );
    let names: Vec<String> = show["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect();
    for pid in [1, r, a, c] {
        let core = format!("core-{pid}.img");
        assert!(names.contains(&core), "{core} missing: {names:?}");
    }

    job.v.go();
    assert_eq!(
        job.v.wait_result(RESULT_TIMEOUT),
        "PASS",
        "{}",
        job.v.diag()
    );
    let status = job.v.wait_original_exit(RESULT_TIMEOUT);
    assert_eq!(
        status.code(),
        Some(0),
        "ckpt run exits with the command's status"
    );
}

/// The pid of host process `host` in its own PID namespace (last NSpid).
fn inner_pid(host: i32) -> i32 {
    status_field(host, "NSpid")
        .and_then(|v| v.split_whitespace().last()?.parse().ok())
        .unwrap_or_else(|| panic!("no NSpid for pid {host}"))
}

/// The host pid of the init a `ckpt restore` runs (its only child), once
/// the restore reported it running with its `processes`.
fn restored_init(restore: &CkptCmd, processes: usize, inits: &mut Inits) -> i32 {
    let init = restored_root_pid(restore);
    inits.0.push(init);
    let tree = host_tree_of(restore.pid());
    assert_eq!(
        tree.get(1),
        Some(&init),
        "the reported pid is the restore's child, the init"
    );
    assert_eq!(tree.len(), processes + 1, "restored tree {tree:?}");
    init
}

/// The same image restored twice at once: each copy is a fresh PID
/// namespace with the same pids inside (impossible in one namespace), a
/// private /proc, and each passes the victim's checks from inside
/// (getpid, getppid, session, group, thread id, pidfd).
#[test]
fn namespace_restored_twice_at_once_with_the_same_pids() {
    let env = TestEnv::new("pidns-restore");
    let mut job = NsJob::start(&env, &victim_bin("pidns"), &[path_str(&env.work)]);
    let [r, a, c, t] = ready_pids(&job.v.wait_ready());
    dump_tree(&env, job.init, &["--kill"]).assert_success();
    let status = job.v.wait_original_exit(RESULT_TIMEOUT);
    assert_eq!(status.code(), Some(128 + 9), "the init was killed");
    let inside = vec![1, r, a, c];

    let mut inits = Inits::default();
    let mut first = spawn_restore(&env, &[]);
    wait_restored_and_running(&job.v, &mut first);
    let init1 = restored_init(&first, 4, &mut inits);
    let second = spawn_restore(&env, &[]);
    let init2 = restored_init(&second, 4, &mut inits);
    let tree1 = host_tree_of(init1);
    let tree2 = host_tree_of(init2);
    for tree in [&tree1, &tree2] {
        let pids: Vec<i32> = tree.iter().map(|h| inner_pid(*h)).collect();
        assert_eq!(pids, inside, "namespace pids of host pids {tree:?}");
        assert_eq!(inner_pid(tree[1]), r);
    }
    assert!(
        tree1.iter().all(|h| !tree2.contains(h)),
        "two copies, two sets of host pids: {tree1:?} {tree2:?}"
    );
    let thread = format!("/proc/{}/task", tree2[1]);
    let tids: Vec<i32> = std::fs::read_dir(&thread)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().parse().unwrap())
        .filter(|tid| *tid != tree2[1])
        .map(inner_pid)
        .collect();
    assert_eq!(tids, vec![t], "the thread's id inside");
    // Each copy's /proc is its namespace's.
    let proc_of = |init: i32| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{init}/root/proc"))
            .unwrap()
            .filter_map(|e| {
                let n = e.unwrap().file_name().to_string_lossy().into_owned();
                n.parse::<i32>().is_ok().then_some(n)
            })
            .collect();
        v.sort();
        v
    };
    for init in [init1, init2] {
        assert_eq!(proc_of(init), ["1", "2", "3", "4"].map(String::from));
    }

    // The copies share the work dir: the second sees another one in its
    // private mount namespace, so each reports on its own.
    let other = own_work_dir_in(&env, init2);

    job.v.go();
    finish_restore(&job.v, first);
    write_atomic(&other.join("go"), "go");
    let out = second.wait_with(RESULT_TIMEOUT, || job.v.diag());
    assert_eq!(out.code(), 0, "second copy: {}", out.stderr);
    assert_eq!(
        read_to_string_lossy(&other.join("result")),
        "PASS",
        "second copy's checks"
    );
    assert_eq!(
        Some(read_to_string_lossy(&other.join("incarnation.final"))),
        job.v.incarnation,
        "the second copy is the dumped process, restored"
    );
}

/// A tree dumped on the host (not under `ckpt run --pidns`) restored twice
/// at once: the first copy takes its pids back on the host, so a plain
/// second restore is refused with advice a user can follow, and `ckpt
/// restore --pidns` restores the second copy with the same pid and thread
/// ids inside a new PID namespace whose init is that restore. Both copies
/// pass their checks (each worker's tid, TLS counter, signal mask, name,
/// alternate stack and a callee-saved register), and a SIGTERM to the
/// second restore reaches its root through the init.
#[test]
fn host_dump_restored_beside_itself_with_pidns() {
    let env = TestEnv::new("pidns-restore-host");
    let mut v = Victim::spawn(&env, "threads", &[]);
    v.wait_ready();
    let tids = |host: i32| -> Vec<i32> {
        let mut t: Vec<i32> = std::fs::read_dir(format!("/proc/{host}/task"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().parse().unwrap())
            .map(inner_pid)
            .collect();
        t.sort_unstable();
        t
    };
    let dumped_tids = tids(v.pid);
    dump_kill_reap(&env, &mut v);
    let mut first = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut first);
    assert_eq!(tids(v.pid), dumped_tids, "the first copy's threads");

    let out = ckpt(
        &env,
        &["restore", "--dir", path_str(&env.img), "--pid-wait", "1"],
        FAIL_TIMEOUT,
    );
    let line = out.assert_error();
    assert!(
        dumped_tids
            .iter()
            .any(|t| line.contains(&format!("pid {t} is in use")))
            && line.contains("ckpt restore --pidns"),
        "the refusal names a pid the first copy holds and the way out: {line}"
    );

    let second = spawn_restore(&env, &["--pidns"]);
    let mut inits = Inits::default();
    assert_eq!(restored_root_pid(&second), v.pid, "the pid inside");
    // The launcher, the init (the restore again, PID 1), the root.
    let tree = host_tree_of(second.pid());
    assert_eq!(tree.len(), 3, "launcher, init and root: {tree:?}");
    let (init, root) = (tree[1], tree[2]);
    inits.0.push(init);
    assert_eq!(inner_pid(init), 1, "the restore is the namespace's init");
    assert_eq!(inner_pid(root), v.pid, "the dumped pid, inside");
    assert_ne!(
        root, v.pid,
        "another process than the first copy on the host"
    );
    assert_eq!(tids(root), dumped_tids, "the second copy's threads, inside");

    // The copies share the work dir: the second sees another one in its
    // private mount namespace, so each reports on its own.
    let other = own_work_dir_in(&env, root);
    write_atomic(&other.join("ping"), "ping");
    assert!(
        wait_until(READY_TIMEOUT, || other.join("pong").exists()),
        "the second copy does not answer: {}",
        second.stderr_now()
    );
    v.go();
    finish_restore(&v, first);
    write_atomic(&other.join("go"), "go");
    let out = second.wait_with(RESULT_TIMEOUT, || v.diag());
    assert_eq!(out.code(), 0, "second copy: {}", out.stderr);
    assert_eq!(
        read_to_string_lossy(&other.join("result")),
        "PASS",
        "second copy's checks"
    );
    assert_eq!(
        Some(read_to_string_lossy(&other.join("incarnation.final"))),
        v.incarnation,
        "the second copy is the dumped process, restored"
    );

    // A signal for the job reaches the root through the init.
    let env2 = TestEnv::new("pidns-restore-host-term");
    let mut w = Victim::spawn(&env2, "threads", &[]);
    w.wait_ready();
    dump_kill_reap(&env2, &mut w);
    let mut third = spawn_restore(&env2, &["--pidns"]);
    wait_restored_and_running(&w, &mut third);
    if let Some(&init) = host_tree_of(third.pid()).get(1) {
        inits.0.push(init);
    }
    kill(Pid::from_raw(third.pid()), Signal::SIGTERM).expect("SIGTERM the restore");
    let out = third.wait(RESULT_TIMEOUT);
    assert_eq!(
        out.code(),
        128 + Signal::SIGTERM as i32,
        "the root died of the SIGTERM: {}",
        out.stderr
    );
}

/// A process inside a namespace it is not the init of cannot be dumped on
/// its own (its pids there could not be given back): refused naming it,
/// the job runs on and passes.
#[test]
fn dump_of_non_init_in_nested_namespace_is_refused() {
    let env = TestEnv::new("pidns-noninit");
    let mut job = NsJob::start(&env, &victim_bin("pidns"), &[path_str(&env.work)]);
    job.v.wait_ready();
    let root = job.host_tree()[1];
    let err = dump_tree(&env, root, &[]).assert_error();
    assert!(
        err.contains(&format!("pid {root}")) && err.contains("whose init is not the dumped root"),
        "error should name pid {root} and its namespace's init: {err}"
    );
    assert!(!env.img.exists(), "failed dump left {}", env.img.display());
    job.v.go();
    assert_eq!(
        job.v.wait_result(RESULT_TIMEOUT),
        "PASS",
        "{}",
        job.v.diag()
    );
}

/// A tree spanning a second namespace below the root's (here `unshare
/// --pid` inside the job) is refused naming the process in it.
#[test]
fn dump_of_tree_spanning_namespaces_is_refused() {
    let env = TestEnv::new("pidns-nested");
    let job = NsJob::start(
        &env,
        std::path::Path::new("/usr/bin/unshare"),
        &["--pid", "--fork", "--kill-child", "sleep", "60"],
    );
    assert!(
        wait_until(READY_TIMEOUT, || job.host_tree().len() == 3),
        "init, unshare and sleep: {:?}",
        job.host_tree()
    );
    let sleep = job.host_tree()[2];
    let err = dump_tree(&env, job.init, &[]).assert_error();
    assert!(
        err.contains(&format!("pid {sleep}")) && err.contains("nested in the tree's"),
        "error should name pid {sleep} in a namespace nested in the tree's: {err}"
    );
    assert!(!env.img.exists(), "failed dump left {}", env.img.display());
    assert!(pid_exists(sleep), "the job runs on");
}

/// `ckpt run`'s init reaps what is orphaned in its namespace, and a signal
/// to `ckpt run` reaches the command, whose exit status `ckpt run` exits
/// with.
#[test]
fn run_reaps_orphans_and_forwards_signals() {
    let env = TestEnv::new("pidns-run");
    // The subshell's sleep is orphaned at once and ends after 1 s: the
    // init must reap it. The command answers SIGTERM with status 7.
    let script = "(sleep 1 &); trap 'exit 7' TERM; touch ready; \
                  while :; do sleep 0.05; done";
    let mut job = NsJob::start(
        &env,
        std::path::Path::new("/bin/sh"),
        &["-c", &format!("cd {} && {script}", path_str(&env.work))],
    );
    assert!(
        wait_for_file(&env.work.join("ready"), READY_TIMEOUT),
        "{}",
        job.v.diag()
    );
    // The orphan's subshell is gone by ready: the orphan is the init's
    // child next to the command.
    let init_children = |init: i32| -> Vec<i32> {
        std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .map(|k| k.parse().unwrap())
            .collect()
    };
    let mut orphan = None;
    assert!(
        wait_until(READY_TIMEOUT, || {
            orphan = init_children(job.init)
                .into_iter()
                .find(|p| inner_pid(*p) != 2);
            orphan.is_some()
        }),
        "no orphan under the init: {:?}",
        job.host_tree()
    );
    let orphan = orphan.unwrap();
    // A zombie would still be listed in /proc: reaped means gone.
    assert!(
        wait_until(RESULT_TIMEOUT, || !pid_exists(orphan)),
        "orphan {orphan} not reaped (state {:?})",
        proc_state(orphan)
    );
    assert_eq!(
        inner_pid(init_children(job.init)[0]),
        2,
        "the command is still PID 2"
    );
    job.v.send(Signal::SIGTERM);
    let status = job.v.wait_original_exit(RESULT_TIMEOUT);
    assert_eq!(
        status.code(),
        Some(7),
        "ckpt run exits with the command's status"
    );
}

/// A real multi-process job in its own namespace (a Python
/// `multiprocessing.Pool`) dumped with `--kill`: every process dies at once
/// (ckpt collects the deaths it traces, so the init can finish reaping its
/// namespace), and the restored job finishes.
#[test]
fn python_pool_in_a_namespace_is_killed_at_once_and_finishes_after_restore() {
    let env = TestEnv::new("pidns-python");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/py/pool.py");
    let mut job = NsJob::start(
        &env,
        std::path::Path::new("/usr/bin/python3"),
        &[path_str(&script), path_str(&env.work)],
    );
    let progress = || {
        std::fs::read_to_string(env.work.join("progress"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(
        wait_until(Duration::from_secs(60), || progress() >= 100),
        "the pool did not get going: {}",
        job.v.diag()
    );
    let out = dump_tree(&env, job.init, &["--kill"]);
    out.assert_success();
    assert!(
        !out.stderr.contains("still exiting") && !out.stderr.contains("has not died"),
        "the killed namespace lingered: {}",
        out.stderr
    );
    let status = job.v.wait_original_exit(RESULT_TIMEOUT);
    assert_eq!(status.code(), Some(128 + 9), "the init was killed");
    let restore = spawn_restore(&env, &[]);
    let out = restore.wait_with(Duration::from_secs(120), || job.v.diag());
    assert_eq!(out.code(), 0, "restored pool: {}", out.stderr);
    let result = std::fs::read_to_string(env.work.join("result")).unwrap_or_default();
    assert!(result.starts_with("PASS"), "{result}");
}

/// Live processes whose command line names `work` (every process of a
/// job started on it, restored ones included: their argument area comes
/// back from the image).
fn processes_naming(work: &std::path::Path) -> Vec<i32> {
    let work = path_str(work);
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| cmdline_of(*p).contains(work))
        .collect()
}

/// A restore of a namespace that fails once its processes exist (here the
/// job's log grew after the dump) ends promptly with its one-line error
/// naming the file, and leaves nothing of the job behind: the namespace's
/// init used to wait for traced zombies only the restorer could reap,
/// while the restorer waited for the init.
#[test]
fn failed_restore_of_a_namespace_ends_and_leaves_nothing() {
    let env = TestEnv::new("pidns-failed");
    let mut job = NsJob::start(&env, &victim_bin("pidns"), &[path_str(&env.work)]);
    job.v.wait_ready();
    dump_tree(&env, job.init, &["--kill"]).assert_success();
    let status = job.v.wait_original_exit(RESULT_TIMEOUT);
    assert_eq!(status.code(), Some(128 + 9), "the init was killed");
    let log = env.work.join("stdout");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"written after the dump\n"))
        .expect("grow the job's log");
    // go exists from the start: a restored process that ran would report.
    job.v.go();
    let restore = spawn_restore(&env, &[]);
    let out = restore.wait_with(RESULT_TIMEOUT, || {
        format!("left running: {:?}", processes_naming(&env.work))
    });
    let err = out.assert_error();
    assert!(err.contains("stdout"), "error should name the log: {err}");
    assert_eq!(
        out.stderr.trim().lines().count(),
        1,
        "one line: {}",
        out.stderr
    );
    assert!(
        wait_until(Duration::from_secs(10), || processes_naming(&env.work)
            .is_empty()),
        "processes of the job left after the failed restore: {:?}",
        processes_naming(&env.work)
    );
    assert!(
        job.v.result().is_none(),
        "a process of the job ran: {}",
        job.v.diag()
    );
}
