//! External resources, CRIU's convention: a pipe to outside the tree (here
//! the victim's stdout, read by the test as a launcher would) is declared
//! with `ckpt dump --external pipe:[INO]`, and at restore the restorer's fd
//! stands in for it with `--inherit-fd fd[N]:pipe:[INO]`: the restored
//! process writes on into the new pipe (victim: tests/c/ticker.c).

mod common;

use std::time::Duration;

use common::*;

fn nonblocking(f: &std::fs::File) {
    nix::fcntl::fcntl(
        f,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .expect("O_NONBLOCK");
}

#[test]
fn outside_pipe_is_external_and_handed_over_at_restore() {
    let env = TestEnv::new("external");
    let (r1, w1) = nix::unistd::pipe().unwrap();
    let mut r1 = std::fs::File::from(r1);
    nonblocking(&r1);
    let mut v = Victim::spawn_with(
        &env,
        "ticker",
        &[],
        std::process::Stdio::null(),
        std::process::Stdio::from(w1),
        std::process::Stdio::null(),
    );
    v.wait_ready();
    let key = std::fs::read_link(format!("/proc/{}/fd/1", v.pid))
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(key.starts_with("pipe:["), "{key}");

    let out = dump(&env, &v, &["--kill", "--external", &key]);
    assert!(out.stderr.contains("1 processes"), "{}", out.stderr);
    v.reap_killed(Duration::from_secs(10));
    let before = read_ticks(&mut r1, Duration::from_millis(100));
    let last = *before.last().expect("ticks before the dump");

    // No fd named for it: a clear error naming the option.
    let out = ckpt(
        &env,
        &["restore", "--dir", path_str(&env.img)],
        FAIL_TIMEOUT,
    );
    let err = out.assert_error();
    assert!(
        err.contains(&format!("--inherit-fd fd[N]:{key}")),
        "error should name the option: {err}"
    );

    // Hand over a new pipe as restore's fd 1.
    let (r2, w2) = nix::unistd::pipe().unwrap();
    let mut r2 = std::fs::File::from(r2);
    nonblocking(&r2);
    let status = env
        .ckpt_command()
        .args([
            "restore",
            "--detach",
            "--dir",
            path_str(&env.img),
            "--inherit-fd",
        ])
        .arg(format!("fd[1]:{key}"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(w2))
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run restore");
    assert!(status.success(), "restore with --inherit-fd failed");
    let after = read_ticks(&mut r2, Duration::from_millis(500));
    assert!(!after.is_empty(), "no ticks in the handed-over pipe");
    assert_eq!(
        after[0],
        last + 1,
        "ticks should carry on from {last}: {after:?}"
    );
    v.go();
    assert_eq!(
        v.wait_result(Duration::from_secs(10)),
        "PASS",
        "{}",
        v.diag()
    );
}
