//! timerfds come back on their clock with their remaining time (relative:
//! from restore; absolute: the same deadline), interval, settime flags,
//! pending expirations, status and fd flags, shared by a dup and across
//! fork (victim: tests/c/timerfd.c, which measures the timers itself).

use std::time::Duration;

use crate::common::*;

/// Time between dump and restore: long enough that an absolute deadline
/// restored as relative time (or a relative one as absolute) visibly moves.
const SAVED_FOR: Duration = Duration::from_millis(1500);

#[test]
fn timerfd_times_ticks_and_sharing_survive() {
    let env = TestEnv::new("timerfd");
    let mut v = Victim::spawn(&env, "timerfd", &[]);
    v.wait_ready();
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("2 processes"), "{}", out.stderr);
    v.reap_killed(Duration::from_secs(10));

    // Parent and child each hold P, its dup, O, R and X: ten fds, four
    // open files.
    let json = show_json(&env);
    let fds = fds_of_kind(&json, "timerfd");
    assert_eq!(
        fds.len(),
        10,
        "parent and child hold 5 timerfd fds each: {json}"
    );
    assert_eq!(
        file_ids(&fds).len(),
        4,
        "10 timerfd fds should be 4 open files: {json}"
    );
    let objects: Vec<&str> = fds.iter().filter_map(|f| f["object"].as_str()).collect();
    for want in [
        "timerfd monotonic in ",
        "timerfd boottime in ",
        "timerfd realtime deadline ",
    ] {
        assert!(
            objects.iter().any(|o| o.starts_with(want)),
            "no `{want}...` in ckpt show: {objects:?}"
        );
    }
    assert!(
        objects.iter().any(|o| o.contains(" every 1.000000000s")),
        "no 1 s interval in ckpt show: {objects:?}"
    );
    assert!(
        objects.iter().any(|o| o.ends_with("cancel-on-set ticks 0")),
        "no cancel-on-set in ckpt show: {objects:?}"
    );
    assert!(
        objects
            .iter()
            .any(|o| o == &"timerfd monotonic disarmed ticks 1"),
        "no expired timer with 1 tick in ckpt show: {objects:?}"
    );

    std::thread::sleep(SAVED_FOR);
    restore_and_check(&env, &v);
}
