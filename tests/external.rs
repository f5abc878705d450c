//! External resources, CRIU's convention: a pipe to outside the tree (here
//! the victim's stdout, read by the test as a launcher would) is declared
//! with `ckpt dump --external pipe:[INO]`, and at restore the restorer's fd
//! stands in for it with `--inherit-fd fd[N]:pipe:[INO]`: the restored
//! process writes on into the new pipe (victim: tests/c/ticker.c).

use std::time::Duration;

use crate::common::*;

#[test]
fn outside_pipe_is_external_and_handed_over_at_restore() {
    let env = TestEnv::new("external");
    let (mut r1, w1) = launcher_pipe();
    let mut v = spawn_ticker(&env, std::process::Stdio::from(w1));
    let key = stdout_key(&v);
    assert!(key.starts_with("pipe:["), "{key}");

    let out = dump(&env, &v, &["--kill", "--external", &key]);
    assert!(out.stderr.contains("1 processes"), "{}", out.stderr);
    v.reap_killed(Duration::from_secs(10));
    let last = last_tick_before_dump(&mut r1);

    // No fd named for it: a clear error naming the option.
    let err = restore_expect_error(&env);
    assert!(
        err.contains(&format!("--inherit-fd fd[N]:{key}")),
        "error should name the option: {err}"
    );

    // Hand over a new pipe as restore's fd 1.
    let (mut r2, w2) = launcher_pipe();
    restore_inheriting_stdout(&env, &key, w2);
    assert_ticks_carry_on(&mut r2, last, &v);
}
