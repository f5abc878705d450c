//! External resources, CRIU's convention: a pipe to outside the tree (here
//! the victim's stdout, read by the test as a launcher would) is declared
//! with `ckpt dump --external pipe:[INO]`, and at restore the restorer's fd
//! stands in for it with `--inherit-fd fd[N]:pipe:[INO]`: the restored
//! process writes on into the new pipe (victim: tests/c/ticker.c).

mod common;

use std::time::Duration;

use common::*;

#[test]
fn outside_pipe_is_external_and_handed_over_at_restore() {
    let env = TestEnv::new("external");
    let (mut r1, w1) = launcher_pipe();
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
    let (mut r2, w2) = launcher_pipe();
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
    assert_ticks_carry_on(&mut r2, last, &v);
}
