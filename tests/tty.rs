//! The terminal rule: a process whose fds 0-2 were a terminal gets, after
//! restore, whatever `ckpt restore`'s own fds 0-2 are (here: /dev/null and
//! a log file), even though the three shared one open file description
//! (victim: tests/c/counter.c).

mod common;

use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::Stdio;
use std::time::Duration;

use common::*;

/// A new pty pair: (master, slave).
fn openpty() -> (OwnedFd, OwnedFd) {
    let (mut m, mut s) = (-1, -1);
    // SAFETY: openpty writes two fds into our locals; name, termios and
    // winsize are optional (null).
    let rc = unsafe {
        libc::openpty(
            &mut m,
            &mut s,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both fds were just returned by openpty and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)) }
}

#[test]
fn terminal_fds_follow_the_restorer() {
    let env = TestEnv::new("tty");
    let (_master, slave) = openpty();
    let stdio = || Stdio::from(slave.try_clone().unwrap());
    let mut v = Victim::spawn_with(&env, "counter", &[], stdio(), stdio(), stdio());
    v.wait_ready();
    let fd1 = std::fs::read_link(format!("/proc/{}/fd/1", v.pid)).unwrap();
    assert!(fd1.to_string_lossy().starts_with("/dev/pts/"), "{fd1:?}");

    dump_kill_reap(&env, &mut v);

    let log = env.work.join("restore.log");
    let status = env
        .ckpt_command()
        .args(["restore", "--dir", path_str(&env.img), "--detach"])
        .stdin(Stdio::null())
        .stdout(File::create(&log).unwrap())
        .stderr(File::create(&log).unwrap())
        .status()
        .unwrap();
    assert!(
        status.success(),
        "restore failed: {}",
        read_to_string_lossy(&log)
    );
    let link = |fd: i32| std::fs::read_link(format!("/proc/{}/fd/{fd}", v.pid)).unwrap();
    assert_eq!(link(0).to_string_lossy(), "/dev/null");
    assert_eq!(link(1), log);
    assert_eq!(link(2), log);

    assert!(
        v.ping(RESTORE_TIMEOUT),
        "restored victim does not run: {}",
        v.diag()
    );
    v.go();
    v.wait_result(Duration::from_secs(10));
    v.assert_pass();
}
