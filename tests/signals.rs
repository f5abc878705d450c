//! Signals: dispositions (handler, flags, sa_mask), the blocked mask and
//! pending signals (standard and queued real-time ones) must survive, and
//! handlers must actually run after restore (victim: tests/c/signals.c).

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

/// Bit of signal `sig` in a /proc/PID/status mask.
fn bit(sig: i32) -> u64 {
    1u64 << (sig - 1)
}

const MASK_FIELDS: &[&str] = &["SigBlk", "SigIgn", "SigCgt", "ShdPnd", "SigPnd"];

fn masks(pid: i32) -> Vec<(&'static str, Option<u64>)> {
    MASK_FIELDS
        .iter()
        .map(|f| (*f, sig_mask_field(pid, f)))
        .collect()
}

#[test]
fn signal_state_survives_and_handlers_run() {
    let env = TestEnv::new("signals");
    let mut v = Victim::spawn(&env, "signals", &[]);
    v.wait_ready();

    // SIGTERM is blocked in the victim: it must stay pending across the dump.
    v.send(Signal::SIGTERM);
    let term = bit(libc::SIGTERM);
    assert!(
        wait_until(Duration::from_secs(2), || {
            sig_mask_field(v.pid, "ShdPnd").is_some_and(|m| m & term != 0)
        }),
        "SIGTERM not pending in the victim before the dump: {:?}",
        masks(v.pid)
    );
    let before = masks(v.pid);

    dump_kill_reap(&env, &mut v);
    let mut restore = spawn_restore(&env, &[]);
    v.go();

    // Stage 1: the victim compared its whole signal state.
    let stage1 = v.path("stage1");
    let reported = wait_until(RESTORE_TIMEOUT, || {
        stage1.exists() || restore.try_status().is_some()
    });
    assert!(
        reported && stage1.exists(),
        "restored victim never reported stage 1\nrestore stderr:\n{}\n{}",
        restore.stderr_now(),
        v.diag()
    );
    let stage1_text = read_to_string_lossy(&stage1);
    if stage1_text != "ok" {
        // The victim already wrote its FAIL result and exits; report that.
        finish_restore(&v, restore);
        panic!("victim stage 1 failed: {stage1_text}");
    }
    // The same state seen from outside (taken before any new signal).
    assert_eq!(
        masks(v.pid),
        before,
        "signal masks in /proc/{}/status differ after restore",
        v.pid
    );

    // Stage 2: handlers must run with correct siginfo, sa_mask and flags.
    for sig in [Signal::SIGUSR1, Signal::SIGUSR2, Signal::SIGHUP] {
        v.send(sig);
    }
    write_atomic(&v.path("go2"), &std::process::id().to_string());
    finish_restore(&v, restore);
}

/// Real-time signals queued several times with payloads, to the process
/// and to single threads, come back in order with their values, codes and
/// senders, each in its own queue (victim: tests/c/rtsig.c).
fn rt_cycle(test: &str, user: Option<&TestUser>) {
    let env = TestEnv::new(test);
    let mut v = match user {
        Some(u) => Victim::spawn_as(&env, "rtsig", &[], u),
        None => Victim::spawn(&env, "rtsig", &[]),
    };
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let show = show_json(&env);
    assert_eq!(
        show["processes"][0]["pending_signals"], 4,
        "process-wide and main thread's pending signals in `ckpt show`"
    );
    restore_and_check(&env, &v);
}

#[test]
fn queued_rt_signals_to_process_and_threads_survive() {
    rt_cycle("signals-rt", None);
}

#[test]
fn queued_rt_signals_of_a_user_survive() {
    rt_cycle("signals-rt-user", Some(test_user()));
}
