//! Signals: dispositions (handler, flags, sa_mask), the blocked mask and
//! pending signals (standard and queued real-time ones) must survive, and
//! handlers must actually run after restore (victim: tests/c/signals.c).

use std::time::Duration;

use crate::common::*;
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

/// A process flooded with real-time signals from outside while it is
/// dumped: one may arrive between the seize and the freeze, and must be
/// delivered as it would have been (the handler counts it), not fail the
/// dump. Python handles SIGRTMIN+1 and keeps a count in a file.
#[test]
fn dumps_succeed_under_a_flood_of_real_time_signals() {
    let env = TestEnv::new("rt-flood");
    let count = env.work.join("count");
    let script = format!(
        "import os, signal, time\n\
         n = 0\n\
         def on(s, f):\n    global n\n    n += 1\n\
         signal.signal(signal.SIGRTMIN + 1, on)\n\
         open('{ready}', 'w').write('ready')\n\
         while True:\n    time.sleep(0.05)\n    open('{count}.tmp', 'w').write(str(n))\n    os.replace('{count}.tmp', '{count}')\n",
        ready = env.work.join("ready").display(),
        count = count.display(),
    );
    let v = Victim::spawn_program(
        &env,
        std::path::Path::new("/usr/bin/python3"),
        &["-c", &script],
    );
    assert!(
        wait_for_file(&env.work.join("ready"), Duration::from_secs(20)),
        "{}",
        v.diag()
    );
    let rt = libc::SIGRTMIN() + 1;
    let stop = std::sync::atomic::AtomicBool::new(false);
    /// Stops the sender however the dumps end (a failed one panics).
    struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: sigqueue with a plain integer value; the target
                // handles the signal.
                unsafe {
                    libc::sigqueue(
                        v.pid,
                        rt,
                        libc::sigval {
                            sival_ptr: std::ptr::null_mut(),
                        },
                    )
                };
                std::thread::sleep(Duration::from_micros(50));
            }
        });
        for i in 0..15 {
            let dir = env.root.join(format!("d{i}"));
            let pid = v.pid.to_string();
            let out = ckpt(
                &env,
                &["dump", "--tree", &pid, "--dir", path_str(&dir)],
                Duration::from_secs(60),
            );
            out.assert_success();
            std::fs::remove_dir_all(&dir).unwrap();
        }
    });
    let before: u64 = std::fs::read_to_string(&count).unwrap().parse().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let after: u64 = std::fs::read_to_string(&count).unwrap().parse().unwrap();
    assert!(before > 100, "the handler ran for the signals: {before}");
    assert!(after >= before, "the process runs on: {after} < {before}");
}

/// Real-time signals queued several times with payloads, to the process
/// and to single threads, come back in order with their values, codes and
/// senders, each in its own queue, and so does a SIGTRAP pending for the
/// process and one for a thread (victim: tests/c/rtsig.c).
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
        show["processes"][0]["pending_signals"], 5,
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

/// ckpt's parasite ends its commands with a signal the process ignores:
/// dumped twice (once left running, once killed and restored), a process
/// that has two of those signals pending and blocked keeps both pending,
/// and one that handles all three never sees one and keeps its handlers,
/// in every thread (tests/c/quiet.c).
#[test]
fn the_parasites_stop_signals_take_nothing_from_the_process() {
    for mode in ["pending", "caught"] {
        let env = TestEnv::new(&format!("signals-quiet-{mode}"));
        let mut v = Victim::spawn(&env, "quiet", &[mode]);
        v.wait_ready();
        let first = env.root.join("first");
        let pid = v.pid.to_string();
        ckpt(
            &env,
            &["dump", "--tree", &pid, "--dir", path_str(&first)],
            Duration::from_secs(60),
        )
        .assert_success();
        assert!(v.ping(Duration::from_secs(10)), "{mode}: {}", v.diag());
        dump_kill_reap(&env, &mut v);
        restore_and_check(&env, &v);
    }
}
