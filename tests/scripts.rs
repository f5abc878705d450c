//! Action scripts (`--action-script`): called at every phase, in order,
//! with CRIU's environment, and a failing one aborts the operation: a dump
//! leaves the victim unharmed and no images, a restore kills the tree
//! (victim: tests/c/counter.c).

use std::path::{Path, PathBuf};

use crate::common::*;

/// Writes an executable `/bin/sh` script `name` under the test's root that
/// appends one line per call to `log` and then runs `tail`.
fn script(env: &TestEnv, name: &str, log: &Path, tail: &str) -> PathBuf {
    let path = env.root.join(name);
    let body = format!(
        "#!/bin/sh\n\
         state=$(awk '/^State:/ {{print $2}}' /proc/${{CKPT_PID:-0}}/status 2>/dev/null)\n\
         echo \"$CKPT_SCRIPT_ACTION $CRTOOLS_SCRIPT_ACTION ${{CKPT_PID:-none}} ${{state:-none}} \
         $CKPT_IMAGES_DIR $(readlink /proc/$$/fd/0)\" >> {log}\n\
         {tail}\n",
        log = log.display()
    );
    write_executable(&path, &body);
    path
}

/// The lines the script logged: (phase, CRIU's name, pid, state, dir, stdin).
fn calls(log: &Path) -> Vec<Vec<String>> {
    read_to_string_lossy(log)
        .lines()
        .map(|l| l.split(' ').map(str::to_string).collect())
        .collect()
}

#[test]
fn scripts_run_at_every_phase_with_criu_environment() {
    let env = TestEnv::new("scripts-order");
    let log = env.root.join("calls.log");
    let hook = script(&env, "hook.sh", &log, "exit 0");
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    dump(&env, &v, &["--kill", "--action-script", path_str(&hook)]);
    v.reap_killed(std::time::Duration::from_secs(10));

    let restore = spawn_restore(&env, &["--action-script", path_str(&hook)]);
    v.go();
    finish_restore(&v, restore);

    let pid = v.pid.to_string();
    let dir = path_str(&env.img);
    let got = calls(&log);
    let phases: Vec<&str> = got.iter().map(|c| c[0].as_str()).collect();
    assert_eq!(
        phases,
        [
            "pre-dump",
            "post-dump",
            "pre-restore",
            "post-restore",
            "pre-resume"
        ],
        "{got:?}"
    );
    for c in &got {
        assert_eq!(c[1], c[0], "CRTOOLS_SCRIPT_ACTION: {c:?}");
        assert_eq!(c[4], dir, "CKPT_IMAGES_DIR: {c:?}");
        assert_eq!(c[5], "/dev/null", "stdin: {c:?}");
    }
    // The root pid where it is known; the tree frozen/stopped (traced)
    // after the dump and between rebuild and resume.
    assert_eq!(got[0][2], pid);
    assert_eq!(got[1][2..4], [pid.clone(), "t".into()], "{:?}", got[1]);
    assert_eq!(got[2][2], "none", "pre-restore has no pid yet");
    assert_eq!(got[3][2..4], [pid.clone(), "t".into()], "{:?}", got[3]);
    assert_eq!(got[4][2..4], [pid, "t".into()], "{:?}", got[4]);
}

#[test]
fn failing_pre_dump_script_aborts_the_dump() {
    let env = TestEnv::new("scripts-pre-dump");
    let log = env.root.join("calls.log");
    let veto = script(&env, "veto.sh", &log, "exit 3");
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    let out = dump_outcome(&env, &v, &["--kill", "--action-script", path_str(&veto)]);
    let err = out.assert_error();
    assert!(
        err.contains(path_str(&veto)) && err.contains("pre-dump") && err.contains("exit status: 3"),
        "{err}"
    );
    assert_eq!(calls(&log).len(), 1, "later phases ran");
    assert!(!env.img.exists(), "vetoed dump left {}", env.img.display());
    v.assert_unharmed_and_passes("after a vetoed dump");
}

#[test]
fn failing_post_dump_script_removes_the_images_and_thaws() {
    let env = TestEnv::new("scripts-post-dump");
    let log = env.root.join("calls.log");
    let veto = script(
        &env,
        "veto.sh",
        &log,
        "[ \"$CKPT_SCRIPT_ACTION\" = post-dump ] && exit 1; exit 0",
    );
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    let out = dump_outcome(&env, &v, &["--kill", "--action-script", path_str(&veto)]);
    let err = out.assert_error();
    assert!(err.contains("post-dump"), "{err}");
    assert!(!env.img.exists(), "vetoed dump left {}", env.img.display());
    v.assert_unharmed_and_passes("after a dump vetoed at post-dump");
}

#[test]
fn failing_post_restore_script_kills_the_tree() {
    let env = TestEnv::new("scripts-post-restore");
    let log = env.root.join("calls.log");
    let veto = script(
        &env,
        "veto.sh",
        &log,
        "[ \"$CKPT_SCRIPT_ACTION\" = post-restore ] && exit 1; exit 0",
    );
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let out = spawn_restore(&env, &["--action-script", path_str(&veto)]).wait(RESTORE_TIMEOUT);
    let err = out.assert_error();
    assert!(
        err.contains(path_str(&veto)) && err.contains("post-restore"),
        "{err}"
    );
    let phases: Vec<String> = calls(&log).into_iter().map(|c| c[0].clone()).collect();
    assert_eq!(phases, ["pre-restore", "post-restore"]);
    assert!(
        wait_until(FAIL_TIMEOUT, || !pid_exists(v.pid)),
        "restored tree still runs after a vetoed restore: {}",
        v.diag()
    );
}
