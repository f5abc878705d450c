//! Scheduling and prctl state survives dump + kill + restore, checked by
//! the victim itself (tests/c/sched.c): per thread nice / policy with
//! SCHED_RESET_ON_FORK / priority, CPU affinity, I/O priority, timer slack
//! and name (two threads with different values); per process
//! oom_score_adj, THP disable, child subreaper, dumpable, personality and
//! memory locks; and a child's parent-death signal, which still fires when
//! its restored parent exits. As root (privileged values) and as the
//! unprivileged test user. Memory-deny-write-execute and SCHED_DEADLINE
//! are refused by name, the victim running on unharmed.

use std::time::Duration;

use crate::common::*;

/// How long the child may take to get its parent-death signal.
const PDEATH_TIMEOUT: Duration = Duration::from_secs(10);

fn cycle(env: &TestEnv, mut v: Victim) {
    v.wait_ready();
    dump_kill_reap(env, &mut v);
    // The original child may have seen its parent die first.
    let _ = std::fs::remove_file(v.path("pdeath"));

    let json = show_json(env);
    let sched = json["processes"][0]["sched"].to_string();
    assert!(
        sched.contains("sched-worker") && sched.contains("cpus 0") && sched.contains("cpus 1"),
        "ckpt show names both threads' CPUs: {json}"
    );
    assert!(
        json["processes"][0]["prctl"]
            .to_string()
            .contains("child subreaper"),
        "{json}"
    );

    restore_and_check(env, &v);
    assert!(
        wait_for_file(&v.path("pdeath"), PDEATH_TIMEOUT),
        "the restored child got no SIGUSR1 when its parent exited: {}",
        v.diag()
    );
}

#[test]
fn privileged_scheduling_and_prctl_state_survive() {
    let env = TestEnv::new("sched-root");
    let v = Victim::spawn(&env, "sched", &["root"]);
    cycle(&env, v);
}

#[test]
fn unprivileged_scheduling_and_prctl_state_survive() {
    let env = TestEnv::new("sched-user");
    let v = Victim::spawn_as(&env, "sched", &["user"], test_user());
    cycle(&env, v);
}

#[test]
fn memory_deny_write_execute_is_refused_by_name() {
    let env = TestEnv::new("sched-mdwe");
    let mut v = Victim::spawn(&env, "sched", &["mdwe"]);
    v.wait_ready();
    let err = dump_expect_error(&env, &v);
    assert!(
        err.contains(&format!("pid {}", v.pid)) && err.contains("PR_SET_MDWE"),
        "{err}"
    );
    v.assert_unharmed_and_passes("after the refused dump");
}

#[test]
fn sched_deadline_is_refused_by_name() {
    let env = TestEnv::new("sched-deadline");
    let mut v = Victim::spawn(&env, "sched", &["deadline"]);
    v.wait_ready();
    let err = dump_expect_error(&env, &v);
    assert!(
        err.contains(&format!("pid {}: thread ", v.pid)) && err.contains("SCHED_DEADLINE"),
        "{err}"
    );
    v.assert_unharmed_and_passes("after the refused dump");
}

/// The audit login uid a login set comes back for the process and its
/// thread (tests/c/loginuid.c), though the restore's own is another (never
/// set here).
#[test]
fn loginuid_comes_back() {
    standard_cycle("sched-loginuid", "loginuid", &[]);
}

/// membarrier registrations come back: the expedited barriers the process
/// registered for still work and GET_REGISTRATIONS reports the same set
/// (tests/c/membarrier.c).
#[test]
fn membarrier_registrations_come_back() {
    standard_cycle("sched-membarrier", "membarrier", &[]);
}
