//! A dumper that dies (SIGKILL, no chance to clean up) at the worst moments
//! leaves the target running as it was: the kernel detaches it, and if the
//! parasite was loaded its rescue path `rt_sigreturn`s it home
//! (parasite/src/fault.rs lists the points; victim: tests/c/counter.c). A
//! restorer that dies leaves no half-restored process behind.

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

fn dumper_killed_at(point: &str) {
    dumper_killed_in(point, "counter");
}

fn dumper_killed_in(point: &str, victim: &str) {
    let env = TestEnv::new(&format!("killed-{point}"));
    let mut v = Victim::spawn(&env, victim, &[]);
    v.wait_ready();
    let status = faulty_dump_command(&env, &v, point, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "{point}: the dumper should have killed itself, got {status:?}"
    );
    assert!(
        !env.img.exists(),
        "{point}: a dumper killed mid-dump left {}",
        env.img.display()
    );

    // The victim keeps counting from where it was and passes its own check.
    assert!(
        v.original_exited().is_none(),
        "{point}: victim died with its dumper: {}",
        v.diag()
    );
    assert!(
        wait_until(Duration::from_secs(5), || tracer_pid(v.pid) == Some(0)),
        "{point}: victim still traced"
    );
    assert!(
        v.ping(Duration::from_secs(10)),
        "{point}: victim does not answer\n{}",
        v.diag()
    );
    assert_running_untouched(v.pid, point);
    v.go();
    v.wait_result(Duration::from_secs(10));
    v.assert_pass();
}

#[test]
fn dumper_killed_right_after_seize() {
    dumper_killed_at("after-seize");
}

/// The leader is set to run the collection command without syscall stops
/// when the dumper dies: untraced, it runs the blob to its end, where the
/// signal it stops itself with is one it ignores, dropped by the kernel,
/// and the rescue path takes it home.
#[test]
fn dumper_killed_with_the_leader_in_the_parasite() {
    dumper_killed_at("leader-in-parasite");
}

#[test]
fn dumper_killed_with_parasite_loaded() {
    dumper_killed_at("parasite-loaded");
}

/// A worker thread is inside the parasite area, with its own rescue frame,
/// while the leader waits parked on its own registers: both go home
/// (tests/c/threads.c checks each worker's registers, mask, TLS and name).
#[test]
fn dumper_killed_with_a_thread_in_the_parasite() {
    dumper_killed_in("thread-in-parasite", "threads");
}

#[test]
fn dumper_killed_while_copying_pages() {
    dumper_killed_at("during-pages");
}

/// A restorer SIGKILLed halfway through rebuilding a tree leaves nothing
/// running: ptrace's exit-kill takes every half-built process with it.
#[test]
fn restorer_killed_mid_rebuild_leaves_nothing() {
    let env = TestEnv::new("killed-restorer");
    let mut v = Victim::spawn(&env, "tree", &[]);
    v.wait_ready();
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("4 processes"), "{}", out.stderr);
    let show = ckpt(&env, &["show", "--json", path_str(&env.img)], DUMP_TIMEOUT);
    let j: serde_json::Value = serde_json::from_str(&show.assert_success().stdout).unwrap();
    let pids: Vec<i32> = j["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_i64().unwrap() as i32)
        .collect();
    assert_eq!(pids.len(), 4);
    v.reap_killed(Duration::from_secs(10));
    // go exists from the start: a restored victim that ran would answer.
    v.go();
    let status = env
        .ckpt_command()
        .args(["restore", "--dir", path_str(&env.img)])
        .env("CKPT_FAULT", "restore-mid-rebuild")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(
        wait_until(Duration::from_secs(5), || victim_gone(
            v.pid, &v.bin, &v.work
        )),
        "a half-restored process {} survived its restorer (state {:?})",
        v.pid,
        proc_state(v.pid)
    );
    assert!(
        v.result().is_none(),
        "a half-restored victim ran: {}",
        v.diag()
    );
}
