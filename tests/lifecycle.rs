//! Lifecycle: restoring the same images twice, restoring over a zombie that
//! still holds the pid, --detach, exit-status propagation, --leave-running
//! and `ckpt check` (victim: tests/c/counter.c unless noted).

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::thread::sleep;
use std::time::Duration;

use crate::common::*;
use nix::sys::signal::Signal;

fn log_values(work: &Path) -> Vec<u64> {
    read_to_string_lossy(&work.join("counter.log"))
        .lines()
        .map(|l| {
            l.parse()
                .unwrap_or_else(|_| panic!("bad counter.log line {l:?}"))
        })
        .collect()
}

/// The log lines from index `from` on must read start, start+1, ... (at
/// least `min_len` of them): the counter resumed exactly where it was dumped
/// instead of restarting or skipping.
fn assert_continues(values: &[u64], from: usize, start: u64, min_len: usize, what: &str) {
    let seg = &values[from.min(values.len())..];
    assert!(
        seg.len() >= min_len,
        "{what}: only {} new counter.log lines (want >= {min_len}): {seg:?}",
        seg.len()
    );
    for (i, v) in seg.iter().enumerate() {
        assert_eq!(
            *v,
            start + i as u64,
            "{what}: counter.log line {} is {v}, want {} (segment {:?}...)",
            from + i,
            start + i as u64,
            &seg[..seg.len().min(10)]
        );
    }
}

/// Dump the counter with --kill and return the counter value it was dumped at.
fn counter_dumped(env: &TestEnv, v: &mut Victim) -> u64 {
    assert_eq!(v.wait_ready().trim(), "20", "counter ready value");
    dump_kill_reap(env, v);
    let values = log_values(&env.work);
    assert_continues(&values, 0, 1, 20, "original run");
    *values.last().expect("log not empty")
}

/// Restore in the foreground, let the restored counter tick a while, go, and
/// check both PASS and the log continuation from index `from`.
fn restore_counter_once(env: &TestEnv, v: &Victim, dumped_at: u64, what: &str, extra: &[&str]) {
    let from = log_values(&env.work).len();
    let mut restore = spawn_restore(env, extra);
    wait_restored_and_running(v, &mut restore);
    assert!(
        wait_until(Duration::from_secs(5), || log_values(&env.work).len()
            >= from + 5),
        "{what}: restored counter is not counting\n{}",
        v.diag()
    );
    v.go();
    finish_restore(v, restore);
    assert_continues(&log_values(&env.work), from, dumped_at + 1, 5, what);
}

#[test]
fn same_images_restore_twice() {
    let env = TestEnv::new("twice");
    let mut v = Victim::spawn(&env, "counter", &[]);
    let dumped_at = counter_dumped(&env, &mut v);

    restore_counter_once(&env, &v, dumped_at, "first restore", &[]);
    assert!(
        wait_until(Duration::from_secs(5), || victim_gone(
            v.pid, &v.bin, &v.work
        )),
        "first restored instance still present after its restore exited"
    );
    // The images must not have been consumed or modified by the first restore.
    assert_images(&env.img, v.pid);
    v.clear_protocol_files();
    // The first restored instance appended to its log: a changed file is
    // refused unless the user says it may change (it is append-only).
    let log = env.work.join("counter.log");
    restore_counter_once(
        &env,
        &v,
        dumped_at,
        "second restore",
        &["--allow-changed", path_str(&log)],
    );
}

#[test]
fn restore_waits_for_zombie_holding_the_pid() {
    let env = TestEnv::new("zombie");
    let mut v = Victim::spawn(&env, "counter", &[]);
    assert_eq!(v.wait_ready().trim(), "20");
    dump(&env, &v, &["--kill"]);
    // Deliberately not reaped: the pid stays held by our zombie child.
    let mut zombie = v.take_child();
    assert!(
        wait_until(Duration::from_secs(10), || proc_state(v.pid) == Some('Z')),
        "victim did not become a zombie after dump --kill (state {:?})",
        proc_state(v.pid)
    );

    let mut restore = spawn_restore(&env, &[]);
    let wanted = format!("waiting for pid {}", v.pid);
    let said_waiting = wait_until(Duration::from_secs(10), || {
        restore.stderr_now().contains(&wanted) || restore.try_status().is_some()
    });
    assert!(
        said_waiting && restore.stderr_now().contains(&wanted),
        "restore should report {wanted:?} while a zombie holds the pid; stderr:\n{}",
        restore.stderr_now()
    );
    sleep(Duration::from_millis(1500));
    assert!(
        restore.try_status().is_none(),
        "restore gave up while the zombie still held the pid; stderr:\n{}",
        restore.stderr_now()
    );
    assert_eq!(
        proc_state(v.pid),
        Some('Z'),
        "pid {} changed while restore was waiting",
        v.pid
    );

    let status = zombie.wait().expect("reap zombie");
    assert!(
        status.signal().is_some(),
        "original should have been killed by dump --kill, but exited with {status}"
    );
    v.go();
    finish_restore(&v, restore);
}

#[test]
fn restore_detach_leaves_process_running() {
    let env = TestEnv::new("detach");
    let mut v = Victim::spawn(&env, "counter", &[]);
    let dumped_at = counter_dumped(&env, &mut v);
    let from = log_values(&env.work).len();

    let out = CkptCmd::spawn(&env, &["restore", "--dir", path_str(&env.img), "--detach"]);
    let restore_pid = out.pid();
    let out = out.wait_with(RESTORE_TIMEOUT, || v.diag());
    out.assert_success();

    let state = proc_state(v.pid);
    assert!(
        matches!(state, Some('R' | 'S' | 'D')),
        "restored pid {} not running after --detach returned (state {state:?})\nstderr:\n{}",
        v.pid,
        out.stderr
    );
    let ppid = ppid_of(v.pid).expect("ppid");
    assert!(
        ppid != std::process::id() as i32 && ppid != restore_pid,
        "detached process should be reparented, but its parent is {ppid} \
         (test {}, restore {restore_pid})",
        std::process::id()
    );
    assert_eq!(
        tracer_pid(v.pid),
        Some(0),
        "detached process is still traced"
    );
    // The victim led its own session (and process group) before the dump.
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", v.pid)).unwrap();
    let after_comm: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    assert_eq!(
        (after_comm[2], after_comm[3]),
        (v.pid.to_string().as_str(), v.pid.to_string().as_str()),
        "restored session leader lost its process group / session"
    );

    assert!(
        v.ping(RESTORE_TIMEOUT),
        "detached victim does not run its loop: {}",
        v.diag()
    );
    v.go();
    v.wait_result(RESTORE_TIMEOUT);
    v.assert_pass();
    assert!(
        wait_until(Duration::from_secs(10), || victim_gone(
            v.pid, &v.bin, &v.work
        ) || proc_state(v.pid)
            == Some('Z')),
        "detached victim did not exit after PASS (state {:?})",
        proc_state(v.pid)
    );
    assert_continues(
        &log_values(&env.work),
        from,
        dumped_at + 1,
        1,
        "detached restore",
    );
}

#[test]
fn restore_exits_with_victims_exit_code() {
    let env = TestEnv::new("exit-code");
    let mut v = Victim::spawn(&env, "counter", &[]);
    counter_dumped(&env, &mut v);
    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    write_atomic(&v.path("go"), "exit 7");
    let out = restore.wait_with(RESTORE_TIMEOUT, || v.diag());
    assert_eq!(
        out.status.code(),
        Some(7),
        "restore should exit with the victim's code 7, got {}\nstderr:\n{}",
        out.status,
        out.stderr
    );
}

#[test]
fn restore_exits_128_plus_signal_when_victim_killed() {
    let env = TestEnv::new("exit-signal");
    let mut v = Victim::spawn(&env, "counter", &[]);
    counter_dumped(&env, &mut v);
    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    v.send(Signal::SIGTERM);
    let out = restore.wait_with(RESTORE_TIMEOUT, || v.diag());
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGTERM),
        "restore should exit 128+SIGTERM when the victim dies of SIGTERM, got {}\nstderr:\n{}",
        out.status,
        out.stderr
    );
}

#[test]
fn dump_leave_running_flag_keeps_counting() {
    let env = TestEnv::new("leave-running");
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    dump(&env, &v, &["--leave-running"]);
    assert_running_untouched(v.pid, "after --leave-running dump");
    let n = log_values(&env.work).len();
    assert!(
        wait_until(Duration::from_secs(5), || log_values(&env.work).len()
            >= n + 5),
        "victim stopped counting after --leave-running dump: {}",
        v.diag()
    );
    v.go();
    let status = v.wait_original_exit(RESTORE_TIMEOUT);
    assert_eq!(status.code(), Some(0), "original failed: {}", v.diag());
    v.assert_pass();
    // Counting never skipped or restarted in the original.
    assert_continues(&log_values(&env.work), 0, 1, 25, "original after dump");
}

#[test]
fn check_reports_success() {
    let env = TestEnv::new("check");
    ckpt(&env, &["check"], FAIL_TIMEOUT).assert_success();
    let out = ckpt(&env, &["check", "--json"], FAIL_TIMEOUT);
    out.assert_success();
    let json: serde_json::Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("`ckpt check --json` is not JSON ({e}):\n{}", out.stdout));
    assert!(
        json.is_object(),
        "`ckpt check --json` should print an object: {json}"
    );
}
