//! Job-control-stopped processes (state T) are dumped and come back
//! stopped: only SIGCONT lets them run, their parent's waitpid(WUNTRACED)
//! reports the stop with its signal, and they continue where they were,
//! taking then the signals sent to them while stopped.
//! A process held by another tracer (a debugger) is refused by name
//! (victim: tests/c/stopped.c).

use std::time::Duration;

use crate::common::*;

/// The two pids the victim wrote in its ready file.
fn pair(ready: &str) -> (i32, i32) {
    let mut it = ready.split_whitespace().map(|p| p.parse::<i32>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

fn assert_stopped(pid: i32, context: &str) {
    // Let go, a task passes through the kernel's signal path into its
    // group stop: a moment, not a state to catch.
    assert!(
        wait_until(Duration::from_secs(5), || proc_state(pid) == Some('T')),
        "{context}: pid {pid} is not job-control stopped (state {:?})",
        proc_state(pid)
    );
    assert_eq!(
        tracer_pid(pid),
        Some(0),
        "{context}: pid {pid} still traced"
    );
}

fn stopped_cycle(test: &str, user: Option<&TestUser>) {
    let env = TestEnv::new(test);
    let mut v = match user {
        Some(u) => Victim::spawn_as(&env, "stopped", &[], u),
        None => Victim::spawn(&env, "stopped", &[]),
    };
    let (a, b) = pair(&v.wait_ready());
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("3 processes"), "{}", out.stderr);
    v.reap_killed(Duration::from_secs(10));
    // `ckpt show` says which were stopped, and by what.
    let show = show_json(&env);
    let stop_of = |pid: i32| {
        show["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == pid)
            .map(|p| p["job_stop"].clone())
    };
    assert_eq!(
        stop_of(a),
        Some("SIGTSTP".into()),
        "A's job stop in `ckpt show`"
    );
    assert_eq!(
        stop_of(b),
        Some("SIGSTOP".into()),
        "B's job stop in `ckpt show`"
    );
    assert_eq!(
        stop_of(v.pid),
        Some(serde_json::Value::Null),
        "the root was running"
    );
    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    // Rebuilt and let go, the two children are stopped, not traced.
    for pid in [a, b] {
        assert_stopped(pid, "after restore");
    }
    v.go();
    finish_restore(&v, restore);
}

#[test]
fn stopped_children_come_back_stopped() {
    stopped_cycle("stopped-root", None);
}

#[test]
fn stopped_children_of_a_user_come_back_stopped() {
    stopped_cycle("stopped-user", Some(test_user()));
}

/// A dump that leaves the tree running leaves the stopped ones stopped.
#[test]
fn dump_leaves_stopped_children_stopped() {
    let env = TestEnv::new("stopped-leave");
    let mut v = Victim::spawn(&env, "stopped", &[]);
    let (a, b) = pair(&v.wait_ready());
    dump(&env, &v, &[]);
    assert_stopped(a, "after a dump without --kill");
    assert_stopped(b, "after a dump without --kill");
    v.assert_unharmed_and_passes("after a dump without --kill");
}

#[test]
fn process_under_a_debugger_is_refused_by_name() {
    let env = TestEnv::new("stopped-traced");
    let mut v = Victim::spawn(&env, "stopped", &["traced"]);
    let (x, y) = pair(&v.wait_ready());
    let err = dump_expect_error(&env, &v);
    assert!(
        err.contains(&format!(
            "pid {x}: process traced by pid {y} (stp-tracer; detach it first)"
        )),
        "{err}"
    );
    assert_eq!(tracer_pid(x), Some(y), "the debugger lost its tracee");
    v.assert_unharmed_and_passes("after a refused dump");
}

/// A stopped process with signals pending (one it handles, one it
/// blocks) is dumped and comes back stopped with both still pending; on
/// SIGCONT it takes the handled one once, where it stopped.
#[test]
fn stopped_with_signals_pending_comes_back_with_them() {
    let env = TestEnv::new("stopped-pending");
    let mut v = Victim::spawn(&env, "stopped", &["pending"]);
    let c: i32 = v.wait_ready().trim().parse().unwrap();
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("2 processes"), "{}", out.stderr);
    v.reap_killed(Duration::from_secs(10));
    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    assert_stopped(c, "after restore");
    v.go();
    finish_restore(&v, restore);
}

/// A dump that leaves the tree running leaves the signals of a stopped
/// process pending and the process stopped.
#[test]
fn dump_leaves_pending_signals_of_a_stopped_process() {
    let env = TestEnv::new("stopped-pending-leave");
    let mut v = Victim::spawn(&env, "stopped", &["pending"]);
    let c: i32 = v.wait_ready().trim().parse().unwrap();
    dump(&env, &v, &[]);
    assert_stopped(c, "after a dump without --kill");
    v.assert_unharmed_and_passes("after a dump without --kill");
}
