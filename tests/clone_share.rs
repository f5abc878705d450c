//! Processes sharing an fd table (`CLONE_FILES`) or their cwd, root and
//! umask (`CLONE_FS`) without being threads (victim: tests/c/clone_share.c).
//! Sharing with the parent comes back shared: the victim checks, after
//! the restore, that opens, closes, dup2s, chdirs and umasks of one show
//! in the others of its table or fs and in no other, and that each has
//! the fds, cwd and umask it had. Any other sharing would come back
//! broken, so the dump refuses it naming both processes, as it refuses
//! two processes sharing one address space (`CLONE_VM`) without being
//! threads.

use crate::common::*;

/// `ckpt dump` exit code for a tree with something it cannot save.
const UNSUPPORTED: i32 = 3;

fn pids(ready: &str) -> Vec<i32> {
    ready
        .split_whitespace()
        .map(|p| p.parse().expect("pid"))
        .collect()
}

/// `kcmp(2)` types: a process's fd table, its cwd, root and umask.
const KCMP_FILES: libc::c_int = 2;
const KCMP_FS: libc::c_int = 3;

/// Whether `a` and `b` hold one kernel object of `kind`.
fn same(a: i32, b: i32, kind: libc::c_int) -> bool {
    // SAFETY: kcmp takes only integers and touches no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, a, b, kind, 0, 0) };
    assert!(
        r >= 0,
        "kcmp pids {a} {b}: {}",
        std::io::Error::last_os_error()
    );
    r == 0
}

fn shared_cycle(test: &str, user: Option<&TestUser>) {
    let env = TestEnv::new(test);
    let mut v = match user {
        Some(u) => Victim::spawn_as(&env, "clone_share", &[], u),
        None => Victim::spawn(&env, "clone_share", &[]),
    };
    let ids = pids(&v.wait_ready());
    assert_eq!(ids.len(), 4, "ready file: {ids:?}");
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("4 processes"), "{}", out.stderr);
    v.reap_killed(std::time::Duration::from_secs(10));
    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    let [root, files, fs, both] = ids[..] else {
        unreachable!()
    };
    // Seen from outside too: exactly the tables shared at the dump are.
    for (pid, shares_files, shares_fs) in
        [(files, true, false), (fs, false, true), (both, true, true)]
    {
        assert_eq!(
            same(root, pid, KCMP_FILES),
            shares_files,
            "restored pid {pid}: fd table shared with pid {root}"
        );
        assert_eq!(
            same(root, pid, KCMP_FS),
            shares_fs,
            "restored pid {pid}: cwd, root and umask shared with pid {root}"
        );
    }
    v.go();
    finish_restore(&v, restore);
}

#[test]
fn fd_table_and_fs_shared_with_the_parent_come_back_shared() {
    shared_cycle("clone-share", None);
}

/// Restored for an ordinary user: the parent's `clone3` with
/// `CLONE_FILES`/`CLONE_FS` needs no privilege of its own.
#[test]
fn fd_table_and_fs_shared_with_the_parent_come_back_shared_for_a_user() {
    shared_cycle("clone-share-user", Some(test_user()));
}

#[test]
fn sharing_between_siblings_is_refused_naming_both_pids() {
    let env = TestEnv::new("clone-share-siblings");
    let mut v = Victim::spawn(&env, "clone_share", &["siblings"]);
    let ids = pids(&v.wait_ready());
    let [_, first, second] = ids[..] else {
        panic!("ready file: {ids:?}");
    };
    let out = dump_outcome(&env, &v, &["--kill"]);
    assert_eq!(out.code(), UNSUPPORTED, "{}", out.stderr);
    for what in ["fd table (CLONE_FILES)", "cwd, root and umask (CLONE_FS)"] {
        let line =
            format!("ckpt: error: pid {second}: {what} shared with pid {first}, not its parent");
        assert!(
            out.stderr.lines().any(|l| l.starts_with(&line)),
            "no line `{line}`: {}",
            out.stderr
        );
    }
    assert!(!env.img.exists(), "refused dump left {}", env.img.display());
    v.assert_unharmed_and_passes("after the refused dump");
}

#[test]
fn memory_shared_without_being_threads_is_refused_naming_both_pids() {
    let env = TestEnv::new("clone-share-vm");
    let mut v = Victim::spawn(&env, "clone_share", &["vm"]);
    let ids = pids(&v.wait_ready());
    let [parent, child] = ids[..] else {
        panic!("ready file: {ids:?}");
    };
    let out = dump_outcome(&env, &v, &["--kill"]);
    assert_eq!(out.code(), UNSUPPORTED, "{}", out.stderr);
    let why = format!("pid {child}: shares its memory with pid {parent} without being a thread");
    assert!(
        out.stderr
            .lines()
            .any(|l| l.starts_with("ckpt: error: ") && l.contains(&why)),
        "no error line with `{why}`: {}",
        out.stderr
    );
    assert!(!env.img.exists(), "refused dump left {}", env.img.display());
    v.assert_unharmed_and_passes("after the refused dump");
}
