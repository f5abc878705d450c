//! Seccomp: a process's stacked filters (order kept: the newest filter's
//! errno wins), a thread's own extra filter, and a strict-mode child still
//! hold after restore, checked from inside (victim: tests/c/seccomp.c),
//! as root without no_new_privs and as an unprivileged user with it. A
//! user-notification filter is refused by name and leaves the process
//! running with its filters.

use crate::common::*;

/// `Seccomp:` and `Seccomp_filters:` of every thread of `pid`.
fn seccomp_of(pid: i32) -> Vec<(String, String)> {
    thread_status_lines(pid, &["Seccomp:", "Seccomp_filters:"])
        .into_iter()
        .map(|(_, lines)| {
            let field = |k: &str| {
                lines
                    .iter()
                    .find_map(|l| l.strip_prefix(k))
                    .unwrap_or("")
                    .trim()
                    .to_string()
            };
            (field("Seccomp:"), field("Seccomp_filters:"))
        })
        .collect()
}

fn child_of(pid: i32) -> i32 {
    let children = read_to_string_lossy(std::path::Path::new(&format!(
        "/proc/{pid}/task/{pid}/children"
    )));
    children
        .split_whitespace()
        .next()
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("pid {pid} has no child"))
}

fn filters_and_strict_mode_survive(test: &str, user: Option<&TestUser>, args: &[&str]) {
    let env = TestEnv::new(test);
    let mut v = match user {
        Some(u) => Victim::spawn_as(&env, "seccomp", args, u),
        None => Victim::spawn(&env, "seccomp", args),
    };
    v.wait_ready();
    let child = child_of(v.pid);
    let filter = |n: &str| ("2".to_string(), n.to_string());
    let before = seccomp_of(v.pid);
    assert_eq!(before, [filter("2"), filter("3")], "main and worker");
    assert_eq!(seccomp_of(child)[0].0, "1", "the child is in strict mode");

    dump_kill_reap(&env, &mut v);
    let show = ckpt(&env, &["show", path_str(&env.img)], FAIL_TIMEOUT);
    show.assert_success();
    for want in [
        "seccomp filter (2 filters",
        "seccomp filter (3 filters",
        "seccomp strict",
    ] {
        assert!(
            show.stdout.contains(want),
            "show lacks {want:?}:\n{}",
            show.stdout
        );
    }

    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    assert_eq!(seccomp_of(v.pid), before, "seccomp of the threads changed");
    assert_eq!(seccomp_of(child)[0].0, "1", "the child left strict mode");
    v.go();
    finish_restore(&v, restore);
}

#[test]
fn filters_and_strict_mode_survive_as_root() {
    filters_and_strict_mode_survive("seccomp-root", None, &[]);
}

#[test]
fn filters_with_no_new_privs_survive_as_user() {
    filters_and_strict_mode_survive("seccomp-user", Some(test_user()), &["nnp"]);
}

#[test]
fn user_notification_filter_is_refused() {
    let env = TestEnv::new("seccomp-notify");
    let mut v = Victim::spawn(&env, "seccomp", &["notify"]);
    v.wait_ready();
    let err = dump_expect_error(&env, &v);
    assert!(
        err.contains(&format!("pid {}", v.pid)) && err.contains("SECCOMP_RET_USER_NOTIF"),
        "{err}"
    );
    // Seccomp was suspended only while traced: the filters hold again.
    v.assert_unharmed_and_passes("after the refused dump");
}
