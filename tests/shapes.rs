//! Tree shapes: sessions and process groups whose leader exited or is a
//! zombie, members reparented to a child subreaper. After restore every
//! member has its session, group and parent again, the zombies their
//! statuses, and no helper process is left (victim: tests/c/shapes.c).

use std::time::Duration;

use crate::common::*;

fn pids(ready: &str) -> Vec<i32> {
    ready
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

/// The root's children, from /proc.
fn children(pid: i32) -> Vec<i32> {
    let mut out: Vec<i32> = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    out.sort_unstable();
    out
}

fn shapes_cycle(test: &str, user: Option<&TestUser>, args: &[&str]) {
    let env = TestEnv::new(test);
    let mut v = match user {
        Some(u) => Victim::spawn_as(&env, "shapes", args, u),
        None => Victim::spawn(&env, "shapes", args),
    };
    let ids = pids(&v.wait_ready());
    let mut tree: Vec<i32> = ids[..7].to_vec();
    tree.sort_unstable();
    assert_eq!(
        children(v.pid),
        tree,
        "the victim's children before the dump"
    );
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("8 processes"), "{}", out.stderr);
    v.reap_killed(Duration::from_secs(10));
    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    // Exactly the dumped children: no helper stayed, none is a zombie.
    assert_eq!(children(v.pid), tree, "the restored victim's children");
    for exited in &ids[7..] {
        assert!(!pid_exists(*exited), "helper pid {exited} left behind");
    }
    v.go();
    finish_restore(&v, restore);
}

#[test]
fn sessions_and_groups_without_leaders_come_back() {
    shapes_cycle("shapes-root", None, &[]);
}

#[test]
fn sessions_and_groups_without_leaders_come_back_for_a_user() {
    shapes_cycle("shapes-user", Some(test_user()), &[]);
}

/// The root keeps its PR_SET_CHILD_SUBREAPER flag too (restored with the
/// other prctl attributes, `restorer/src/prctl.rs`), so later orphans
/// still come to it.
#[test]
fn subreaper_flag_is_kept() {
    shapes_cycle("shapes-subreaper", None, &["subreaper"]);
}

/// Sixteen sessions led by zombies, each with a member. Every zombie
/// leader first serves as the helper its member is forked through (with
/// `CLONE_PARENT`, which the kernel reports to ptrace as a clone event):
/// its own exit must still be collected by ckpt, or the root could never
/// reap it and would hang in `waitpid` after restore.
#[test]
fn many_sessions_led_by_zombies_come_back_reapable() {
    let env = TestEnv::new("shapes-many");
    let mut v = Victim::spawn(&env, "shapes", &["many"]);
    let ids = pids(&v.wait_ready());
    assert_eq!(ids.len(), 32, "16 members and their zombie leaders");
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("33 processes"), "{}", out.stderr);
    v.reap_killed(Duration::from_secs(10));
    restore_and_check(&env, &v);
}

/// A session whose leader lives in the tree but is not the member's
/// ancestor cannot be rebuilt: refused by name, tree unharmed.
#[test]
fn session_of_a_live_non_ancestor_is_refused() {
    let env = TestEnv::new("shapes-live");
    let mut v = Victim::spawn(&env, "shapes", &["live"]);
    let ids = pids(&v.wait_ready());
    let (a, c) = (ids[0], ids[1]);
    let err = dump_expect_error(&env, &v);
    assert!(
        err.contains(&format!(
            "pid {c}: session {a}: its leader pid {a} is in the tree but not an ancestor of this process"
        )),
        "{err}"
    );
    v.assert_unharmed_and_passes("after a refused dump");
}
