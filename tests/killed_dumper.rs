//! A dumper that dies (SIGKILL, no chance to clean up) at the worst moments
//! leaves the target running as it was: the kernel detaches it, and if the
//! parasite was loaded its rescue path `rt_sigreturn`s it home
//! (dumper/src/fault.rs lists the points; victim: tests/c/counter.c).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

fn dumper_killed_at(point: &str) {
    let env = TestEnv::new(&format!("killed-{point}"));
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    let status = Command::new(CKPT)
        .args([
            "dump",
            "--tree",
            &v.pid.to_string(),
            "--dir",
            path_str(&env.img),
        ])
        .env("CKPT_FAULT", point)
        .stdin(Stdio::null())
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

#[test]
fn dumper_killed_with_parasite_loaded() {
    dumper_killed_at("parasite-loaded");
}

#[test]
fn dumper_killed_while_copying_pages() {
    dumper_killed_at("during-pages");
}
