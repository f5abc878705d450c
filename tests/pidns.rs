//! PID namespaces: `ckpt run --pidns` starts a job as PID 2 of a namespace
//! of its own under ckpt's init, and a dump of that init records the
//! namespace's pids (victim: tests/c/pidns.c, which checks its pids from
//! inside). What does not fit is refused by name.

mod common;

use std::time::Duration;

use common::*;
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

    /// The host pids of the init's descendants, parents first.
    fn host_tree(&self) -> Vec<i32> {
        let mut out = vec![self.init];
        let mut i = 0;
        while i < out.len() {
            let p = out[i];
            let kids =
                std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
            out.extend(kids.split_whitespace().map(|k| k.parse::<i32>().unwrap()));
            i += 1;
        }
        out
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

/// Restoring such an image needs a fresh PID namespace, which this version
/// does not create: refused by name, after a dump that killed the job.
#[test]
fn restore_of_namespace_image_is_refused_by_name() {
    let env = TestEnv::new("pidns-restore");
    let mut job = NsJob::start(&env, &victim_bin("pidns"), &[path_str(&env.work)]);
    job.v.wait_ready();
    let host = job.host_tree();
    dump_tree(&env, job.init, &["--kill"]).assert_success();
    let status = job.v.wait_original_exit(RESULT_TIMEOUT);
    assert_eq!(status.code(), Some(128 + 9), "the init was killed");
    assert!(
        wait_until(RESULT_TIMEOUT, || host.iter().all(|h| !pid_exists(*h))),
        "the namespace's processes are gone"
    );
    let err = restore_expect_error(&env);
    assert!(
        err.contains("PID namespace") && err.contains("not supported yet"),
        "restore should refuse the PID namespace by name: {err}"
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
