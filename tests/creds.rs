//! Credentials per thread: ids that differ between threads (raw
//! setresuid in one thread), fs ids apart from the effective ones, the
//! bounding and ambient sets, securebits with a locked bit, and
//! no_new_privs, each checked from inside the restored threads (victim:
//! tests/c/creds.c) and against /proc from outside.

use crate::common::*;

/// The credential lines of every thread's status, by tid.
fn thread_creds(pid: i32) -> Vec<(String, Vec<String>)> {
    const FIELDS: &[&str] = &[
        "Uid:",
        "Gid:",
        "Groups:",
        "CapInh:",
        "CapPrm:",
        "CapEff:",
        "CapBnd:",
        "CapAmb:",
        "NoNewPrivs:",
    ];
    thread_status_lines(pid, FIELDS)
}

#[test]
fn per_thread_credentials_caps_securebits_and_no_new_privs_survive() {
    let env = TestEnv::new("creds");
    let user = test_user();
    let (uid, gid) = (user.uid.to_string(), user.gid.to_string());
    let mut v = Victim::spawn(&env, "creds", &[&uid, &gid]);
    v.wait_ready();
    let before = thread_creds(v.pid);
    assert_eq!(before.len(), 4, "main and three workers: {before:?}");
    let uid_line = |t: &(String, Vec<String>)| t.1[0].clone();
    assert_ne!(
        uid_line(&before[0]),
        uid_line(&before[1]),
        "worker 0 should have its own uids: {before:?}"
    );
    check_cycle(
        &env,
        &mut v,
        before,
        &[
            "securebits 0x",
            "no_new_privs",
            "fsuid 12345",
            "ambient caps 0x400",
        ],
    );
}

#[test]
fn per_thread_no_new_privs_survives_as_user() {
    let env = TestEnv::new("creds-user");
    let mut v = Victim::spawn_as(&env, "creds", &["user"], test_user());
    v.wait_ready();
    let before = thread_creds(v.pid);
    let nnp = |t: &(String, Vec<String>)| t.1.last().cloned().unwrap_or_default();
    assert_eq!(
        before.iter().map(nnp).collect::<Vec<_>>(),
        [
            "NoNewPrivs:\t1",
            "NoNewPrivs:\t0",
            "NoNewPrivs:\t0",
            "NoNewPrivs:\t0"
        ],
        "only the main thread has no_new_privs: {before:?}"
    );
    check_cycle(&env, &mut v, before, &["no_new_privs"]);
}

/// Dump, kill, check `ckpt show` names `show_wants`, restore, and compare
/// every thread's credentials from outside before the victim checks its
/// own.
fn check_cycle(
    env: &TestEnv,
    v: &mut Victim,
    before: Vec<(String, Vec<String>)>,
    show_wants: &[&str],
) {
    dump_kill_reap(env, v);
    let show = ckpt(env, &["show", path_str(&env.img)], FAIL_TIMEOUT);
    show.assert_success();
    for want in show_wants {
        assert!(
            show.stdout.contains(want),
            "ckpt show lacks {want:?}:\n{}",
            show.stdout
        );
    }
    let mut restore = spawn_restore(env, &[]);
    wait_restored_and_running(v, &mut restore);
    assert_eq!(
        thread_creds(v.pid),
        before,
        "credentials of some thread changed"
    );
    v.go();
    finish_restore(v, restore);
}
