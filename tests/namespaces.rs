//! UTS, IPC and time namespaces: a job started with `ckpt run --utsns
//! --ipcns --timens` (with and without --pidns) sets its hostname, creates
//! SysV objects and reads its clocks; after dump, kill and restore it finds
//! its names, its objects under the same ids and its clocks continuing from
//! the dump (victim: tests/c/namespaces.c, which checks from inside). The
//! host's hostname and IPC namespace are untouched. Trees spanning
//! namespaces, and network and user namespaces, are refused by name.

use std::time::{Duration, Instant};

use crate::common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const RESULT_TIMEOUT: Duration = Duration::from_secs(20);
/// The job's clocks start this far ahead of the host's (10 days): a
/// restore that ignored the time namespace would send them back.
const CLOCK_OFFSET_SECS: i64 = 864_000;
const NANOS_PER_SEC: i64 = 1_000_000_000;
/// The victim's SysV key (tests/c/namespaces.c).
const VICTIM_KEY: i64 = 0x4e53_434b;
/// Pause between the dump and the restore: a restore that copied the
/// offsets instead of continuing the clocks would add it to them.
const GAP: Duration = Duration::from_secs(2);

/// Kills the listed pids (namespace inits, launchers) when the test ends.
#[derive(Default)]
struct Kill(Vec<i32>);

impl Drop for Kill {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
    }
}

/// ckpt's (the test's) hostname, as its UTS namespace has it.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("read hostname")
        .trim_end()
        .to_string()
}

/// Host boot clock in nanoseconds (/proc/uptime, 10 ms resolution).
fn host_uptime_ns() -> i64 {
    let text = std::fs::read_to_string("/proc/uptime").expect("read /proc/uptime");
    let secs: f64 = text
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .expect("uptime");
    (secs * NANOS_PER_SEC as f64) as i64
}

/// Whether ckpt's (the host's) IPC namespace holds an object of the
/// victim's key.
fn host_has_victim_key() -> bool {
    ["shm", "sem", "msg"].iter().any(|kind| {
        std::fs::read_to_string(format!("/proc/sysvipc/{kind}"))
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().next() == Some(&VICTIM_KEY.to_string()))
    })
}

/// The victim's ready line: shmid semid msqid monotonic_ns boottime_ns.
struct Ready {
    ids: [i64; 3],
    monotonic_ns: i64,
}

fn parse_ready(ready: &str) -> Ready {
    let v: Vec<i64> = ready
        .split_whitespace()
        .map(|n| n.parse().expect("number in ready"))
        .collect();
    assert_eq!(v.len(), 5, "ready {ready:?}");
    Ready {
        ids: [v[0], v[1], v[2]],
        monotonic_ns: v[3],
    }
}

/// Starts the victim under `ckpt run` with the three namespaces (and a PID
/// namespace when `pidns`), through `prefix` (e.g. setpriv); returns it
/// and the pid to dump.
fn start(
    env: &TestEnv,
    pidns: bool,
    prefix: &[&str],
    host: &str,
    kill: &mut Kill,
) -> (Victim, i32) {
    let pidfile = env.root.join("job.pid");
    let offset = CLOCK_OFFSET_SECS.to_string();
    let bin = victim_bin("namespaces");
    let mut args = vec!["run"];
    if pidns {
        args.push("--pidns");
    }
    args.extend([
        "--utsns",
        "--ipcns",
        "--timens",
        "--clock-offset",
        &offset,
        "--pidfile",
        path_str(&pidfile),
        "--",
    ]);
    args.extend_from_slice(prefix);
    args.extend([path_str(&bin), path_str(&env.work), host]);
    let v = Victim::spawn_program(env, std::path::Path::new(CKPT), &args);
    let pid = pid_from(&v, &pidfile);
    kill.0.push(pid);
    (v, pid)
}

/// Run, dump, kill, restore: the victim checks names, objects and clocks
/// from inside. `as_user`: the job is the unprivileged test user's (which
/// cannot set its hostname: it keeps the one its namespace started with).
fn cycle(test: &str, pidns: bool, as_user: bool) {
    let env = TestEnv::new(test);
    let host_before = hostname();
    let mut kill = Kill::default();
    let (uid, gid);
    let mut prefix = Vec::new();
    let job_host = if as_user {
        let user = test_user();
        env.give_work_to(user);
        uid = format!("--reuid={}", user.uid);
        gid = format!("--regid={}", user.gid);
        prefix.extend(["setpriv", &uid, &gid, "--clear-groups", "--"]);
        host_before.clone()
    } else {
        format!("ckpt-{test}")
    };
    let arg = if as_user { "-" } else { &job_host };
    let (mut v, pid) = start(&env, pidns, &prefix, arg, &mut kill);
    let ready = parse_ready(&v.wait_ready());
    assert_eq!(hostname(), host_before, "the job's hostname is its own");
    assert!(!host_has_victim_key(), "the job's SysV objects are its own");

    let dump_pid = pid.to_string();
    ckpt(
        &env,
        &[
            "dump",
            "--tree",
            &dump_pid,
            "--dir",
            path_str(&env.img),
            "--kill",
        ],
        DUMP_TIMEOUT,
    )
    .assert_success();
    v.wait_original_exit(RESULT_TIMEOUT);
    let dumped = Instant::now();

    let text = ckpt(&env, &["show", path_str(&env.img)], FAIL_TIMEOUT);
    for line in [
        "uts namespace: its own",
        "ipc namespace: its own",
        "time namespace: its own",
    ] {
        assert!(text.stdout.contains(line), "ckpt show: {}", text.stdout);
    }
    let show = show_json(&env);
    let ns = &show["namespaces"];
    assert_eq!(ns["uts"]["hostname"], job_host.as_str(), "{ns}");
    if !as_user {
        assert_eq!(ns["uts"]["domainname"], "ckpt-ns-domain", "{ns}");
    }
    assert_eq!(ns["ipc"], true, "{ns}");
    assert_eq!(
        ns["time"]["monotonic_offset_ns"].as_i64(),
        Some(CLOCK_OFFSET_SECS * NANOS_PER_SEC),
        "{ns}"
    );
    let dumped_mono = ns["time"]["monotonic_ns"].as_i64().expect("monotonic");
    let dumped_boot = ns["time"]["boottime_ns"].as_i64().expect("boottime");
    assert!(
        dumped_mono >= ready.monotonic_ns
            && dumped_mono - ready.monotonic_ns < RESULT_TIMEOUT.as_nanos() as i64,
        "the dump read the job's clock {dumped_mono}, the job read {} at ready",
        ready.monotonic_ns
    );
    assert!(
        dumped_boot - host_uptime_ns() > (CLOCK_OFFSET_SECS - 60) * NANOS_PER_SEC,
        "the job's boot clock {dumped_boot} is not 10 days ahead of the host's"
    );
    let ids: Vec<i64> = ["shm", "sem", "msg"]
        .iter()
        .map(|k| show["ipc"][k][0]["id"].as_i64().expect("one object"))
        .collect();
    assert_eq!(ids, ready.ids, "saved ids {}", show["ipc"]);
    if as_user {
        let uid = test_user().uid;
        assert_eq!(
            show["ipc"]["shm"][0]["uid"].as_u64(),
            Some(uid.into()),
            "the objects are the user's: {}",
            show["ipc"]
        );
        assert!(
            show["processes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["uids"][0].as_u64() == Some(uid.into())),
            "a process of the tree is the user's"
        );
    }

    std::thread::sleep(GAP.saturating_sub(dumped.elapsed()));
    let restore_started = Instant::now();
    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    assert_eq!(hostname(), host_before, "a restore leaves the host's name");
    assert!(
        !host_has_victim_key(),
        "restored objects are in the job's namespace"
    );
    v.go();
    finish_restore(&v, restore);
    let restore_took = restore_started.elapsed().as_nanos() as i64;
    let after: i64 = read_to_string_lossy(&v.path("clock"))
        .trim()
        .parse()
        .expect("clock");
    // Continued from the dump: what passed since is at most the restore's
    // own time, not the pause before it (the clocks stood still while the
    // job was on disk).
    assert!(
        after >= dumped_mono && after - dumped_mono <= restore_took,
        "job's CLOCK_MONOTONIC {after} after restore, {dumped_mono} at dump: {} ns passed in a restore of {restore_took} ns after a pause of {GAP:?}",
        after - dumped_mono
    );
    assert_eq!(hostname(), host_before);
}

/// With --pidns: the job is PID 2 under ckpt's init, all in new namespaces.
#[test]
fn uts_ipc_time_namespaces_survive_restore_in_a_pid_namespace() {
    cycle("ns-pidns", true, false);
}

/// Without --pidns: ckpt run execs the job in its new namespaces.
#[test]
fn uts_ipc_time_namespaces_survive_restore_without_pid_namespace() {
    cycle("ns-plain", false, false);
}

/// A job of an unprivileged user (as sites restore them): the same.
#[test]
fn namespaces_of_an_unprivileged_job_survive_restore() {
    cycle("ns-user-job", true, true);
}

/// `unshare ARGS sleep` under the given ckpt run options; the pid to dump.
fn start_unshared(env: &TestEnv, run: &[&str], unshare: &[&str], kill: &mut Kill) -> (Victim, i32) {
    let pidfile = env.root.join("job.pid");
    let mut args = vec!["run"];
    args.extend_from_slice(run);
    args.extend(["--pidfile", path_str(&pidfile), "--", "unshare"]);
    args.extend_from_slice(unshare);
    args.extend(["sleep", "100"]);
    let v = Victim::spawn_program(env, std::path::Path::new(CKPT), &args);
    let pid = pid_from(&v, &pidfile);
    kill.0.push(pid);
    // unshare has exec'd sleep once the comm says so.
    let sleeping = |p: i32| {
        std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sleep")
    };
    assert!(
        wait_until(READY_TIMEOUT, || sleeping(pid)
            || std::fs::read_to_string(format!(
                "/proc/{pid}/task/{pid}/children"
            ))
            .unwrap_or_default()
            .split_whitespace()
            .any(|c| c.parse().is_ok_and(sleeping))),
        "sleep never ran"
    );
    (v, pid)
}

fn dump_error(env: &TestEnv, pid: i32) -> String {
    let pid = pid.to_string();
    ckpt(
        env,
        &["dump", "--tree", &pid, "--dir", path_str(&env.img)],
        DUMP_TIMEOUT,
    )
    .assert_error()
}

/// A process of the tree in a UTS, IPC or mount namespace other than the
/// root's cannot come back in one: refused naming the kind; the job runs
/// on.
#[test]
fn tree_spanning_namespaces_is_refused() {
    for (flag, kind) in [("--uts", "uts"), ("--ipc", "ipc"), ("--mount", "mnt")] {
        let env = TestEnv::new(&format!("ns-span-{kind}"));
        let mut kill = Kill::default();
        let (_v, init) = start_unshared(&env, &["--pidns"], &[flag], &mut kill);
        let err = dump_error(&env, init);
        assert!(
            err.contains(&format!("{kind} namespace other than the tree root's")),
            "{err}"
        );
        assert_running_untouched(init, "after a refused dump");
    }
}

/// Network, user and cgroup namespaces of the job's own are refused by
/// name.
#[test]
fn user_and_cgroup_namespaces_are_refused_and_a_network_one_is_recorded() {
    let env = TestEnv::new("ns-net");
    let mut kill = Kill::default();
    let (_net, pid) = start_unshared(&env, &["--utsns"], &["--net"], &mut kill);
    // Dumped, marked as needing `restore --netns` (tests/netns.rs moves
    // such a job), and left running.
    let tree = pid.to_string();
    ckpt(
        &env,
        &["dump", "--tree", &tree, "--dir", path_str(&env.img)],
        DUMP_TIMEOUT,
    )
    .assert_success();
    let net = std::fs::metadata(format!("/proc/{pid}/ns/net")).unwrap();
    assert_eq!(
        show_json(&env)["namespaces"]["net"]["inode"].as_u64(),
        Some(std::os::unix::fs::MetadataExt::ino(&net))
    );
    assert_running_untouched(pid, "after the dump");

    let env = TestEnv::new("ns-user");
    let (_user, pid) = start_unshared(&env, &["--utsns"], &["--user"], &mut kill);
    let err = dump_error(&env, pid);
    assert!(err.contains("user namespace of its own"), "{err}");

    let env = TestEnv::new("ns-cgroup");
    let (_cgroup, pid) = start_unshared(&env, &["--utsns"], &["--cgroup"], &mut kill);
    let err = dump_error(&env, pid);
    assert!(err.contains("cgroup namespace of its own"), "{err}");
    assert_running_untouched(pid, "after a refused dump");
}

/// One image restored twice at once: each copy gets its own PID, UTS, IPC
/// and time namespaces, so both hold their SysV objects under the same ids
/// (impossible in one IPC namespace) and each passes its checks.
#[test]
fn two_copies_run_side_by_side_with_the_same_ids() {
    let env = TestEnv::new("ns-twice");
    let mut kill = Kill::default();
    let (mut v, init) = start(&env, true, &[], "ckpt-ns-twice", &mut kill);
    v.wait_ready();
    let pid = init.to_string();
    ckpt(
        &env,
        &[
            "dump",
            "--tree",
            &pid,
            "--dir",
            path_str(&env.img),
            "--kill",
        ],
        DUMP_TIMEOUT,
    )
    .assert_success();
    v.wait_original_exit(RESULT_TIMEOUT);

    let mut first = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut first);
    let init1 = restored_root_pid(&first);
    kill.0.push(init1);
    let second = spawn_restore(&env, &[]);
    let init2 = restored_root_pid(&second);
    kill.0.push(init2);
    for kind in ["ipc", "uts", "time"] {
        let link = |p: i32| std::fs::read_link(format!("/proc/{p}/ns/{kind}")).unwrap();
        assert_ne!(link(init2), link(init1), "{kind} namespaces of the copies");
        assert_ne!(link(init2), link(std::process::id() as i32), "{kind}");
    }
    // The second copy reports in a work dir of its own, bound over the
    // shared one in its private mount namespace.
    let other = own_work_dir_in(&env, init2);

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
}

/// The pid `ckpt run` (victim `v`) wrote into `pidfile`, once it has.
fn pid_from(v: &Victim, pidfile: &std::path::Path) -> i32 {
    assert!(
        wait_for_file(pidfile, READY_TIMEOUT),
        "ckpt run wrote no pid file: {}",
        v.diag()
    );
    read_to_string_lossy(pidfile).trim().parse().expect("pid")
}
