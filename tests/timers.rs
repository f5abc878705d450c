//! POSIX timers come back with their ids, clocks, signals and values, and
//! the time they had left: a periodic CLOCK_MONOTONIC timer keeps firing
//! with its si_value and si_timerid, a one-shot CLOCK_REALTIME timer fires
//! once after restore, a timer aimed at one thread signals that thread; a
//! timer on a thread's CPU clock is refused (victim: tests/c/timers.c).

use std::time::Duration;

use crate::common::*;

#[test]
fn posix_timers_keep_ids_and_fire_after_restore() {
    let env = TestEnv::new("timers");
    let mut v = Victim::spawn_as(&env, "timers", &[], test_user());
    v.wait_ready();
    dump(&env, &v, &["--kill"]);
    v.reap_killed(Duration::from_secs(10));

    let json = show_json(&env);
    let timers: Vec<String> = json["processes"][0]["posix_timers"]
        .as_array()
        .expect("posix_timers")
        .iter()
        .map(|t| t.as_str().expect("string").to_string())
        .collect();
    assert_eq!(timers.len(), 3, "{json}");
    // Ids 1, 2 and 3: timer 0 was deleted.
    assert!(
        timers[0].starts_with("timer 1 clock 1 notify signal signo 34 value 0x5eed,")
            && timers[0].ends_with("every 50000000 ns"),
        "{timers:?}"
    );
    assert!(
        timers[1].starts_with("timer 2 clock 0 notify signal signo 35 value 0x")
            && timers[1].ends_with("every 0 ns")
            && !timers[1].contains("next in 0 ns"),
        "the one-shot timer should be armed at dump: {timers:?}"
    );

    assert!(
        timers[2].starts_with("timer 3 clock 1 notify signal signo 36 value 0x0 to thread ")
            && timers[2].ends_with("every 50000000 ns"),
        "{timers:?}"
    );

    restore_and_check(&env, &v);
}

#[test]
fn timer_on_a_thread_cpu_clock_is_refused() {
    let env = TestEnv::new("timers-threadcpu");
    let mut v = Victim::spawn(&env, "timers", &["threadcpu"]);
    v.wait_ready();
    let line = dump_expect_error(&env, &v);
    for w in [&v.pid.to_string(), "POSIX timer 4 on clock -"] {
        assert!(line.contains(w), "error should name {w:?}: {line}");
    }
    v.assert_unharmed_and_passes("after a dump refused for a thread CPU clock timer");
}
