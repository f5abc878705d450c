//! The terminal rule: a process whose fds 0-2 were a terminal gets, after
//! restore, whatever `ckpt restore`'s own fds 0-2 are (here: /dev/null and
//! a log file), even though the three shared one open file description
//! (victim: tests/c/counter.c).

use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

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
    let log = terminal_cycle("tty", &[]);
    let notice = log
        .lines()
        .find(|l| l.contains("terminal rebound"))
        .unwrap_or_else(|| panic!("no notice of the rebound terminal on stderr:\n{log}"));
    assert!(
        notice.starts_with("ckpt: pid ")
            && notice.ends_with(" fd 0,1,2: terminal rebound to this command's fds"),
        "{notice}"
    );
    // The victim leads its own session: nothing of it was adopted.
    assert!(!log.contains("adopted"), "{log}");
}

/// `--shell-job` is the explicit opt-in: the same rebinding, silently.
#[test]
fn shell_job_rebinds_silently() {
    let log = terminal_cycle("tty-shell-job", &["--shell-job"]);
    assert!(!log.contains("rebound"), "--shell-job still printed: {log}");
}

/// A session leader whose controlling terminal's master is outside the
/// tree (the test's, as sshd's for a login) is restored without one, and
/// restore says so in one line naming pid, fd and kind; its fds follow the
/// terminal rule (victim: tests/c/ctty_outside.c).
#[test]
fn controlling_terminal_from_outside_is_reported_not_restored() {
    let env = TestEnv::new("tty-ctty-outside");
    let (_master, slave) = openpty();
    let stdio = || Stdio::from(slave.try_clone().unwrap());
    let mut v = Victim::spawn_with(&env, "ctty_outside", &[], stdio(), stdio(), stdio());
    v.wait_ready();
    let pts = std::fs::read_link(format!("/proc/{}/fd/0", v.pid)).unwrap();
    dump(&env, &v, &["--kill"]);
    v.reap_killed(Duration::from_secs(10));
    let log = env.work.join("restore.log");
    let status = env
        .ckpt_command()
        .args(["restore", "--dir", path_str(&env.img), "--detach"])
        .stdin(Stdio::null())
        .stdout(File::create(&log).unwrap())
        .stderr(File::create(&log).unwrap())
        .status()
        .unwrap();
    let text = read_to_string_lossy(&log);
    assert!(status.success(), "restore failed: {text}");
    let want = format!(
        "ckpt: pid {} fd 0: controlling terminal {} (tty) not restored: its master was outside the checkpoint",
        v.pid,
        pts.display()
    );
    assert!(
        text.lines().filter(|l| l.starts_with(&want)).count() == 1,
        "expected one line starting {want:?}:\n{text}"
    );
    v.go();
    v.wait_result(Duration::from_secs(10));
    v.assert_pass();
}

/// Runs a victim on a pty, dumps it (with `--shell-job`, a no-op), restores it with
/// `restore_extra` and fds 0-2 = /dev/null and a log file, checks the
/// victim got those and passes; returns the restore's output.
fn terminal_cycle(test: &str, restore_extra: &[&str]) -> String {
    let env = TestEnv::new(test);
    let (_master, slave) = openpty();
    let stdio = || Stdio::from(slave.try_clone().unwrap());
    let mut v = Victim::spawn_with(&env, "counter", &[], stdio(), stdio(), stdio());
    v.wait_ready();
    let fd1 = std::fs::read_link(format!("/proc/{}/fd/1", v.pid)).unwrap();
    assert!(fd1.to_string_lossy().starts_with("/dev/pts/"), "{fd1:?}");

    // `--shell-job` on dump is accepted (CRIU's) and changes nothing.
    dump(&env, &v, &["--kill", "--shell-job"]);
    v.reap_killed(Duration::from_secs(10));

    let log = env.work.join("restore.log");
    let status = env
        .ckpt_command()
        .args(["restore", "--dir", path_str(&env.img), "--detach"])
        .args(restore_extra)
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
    read_to_string_lossy(&log)
}
