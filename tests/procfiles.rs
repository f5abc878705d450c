//! /proc files a process holds open: its own stat and maps, a child's
//! maps and its network namespace, reopened for the restored processes;
//! one of a process gone since is refused (victim: tests/c/procfiles.c).

use crate::common::*;

/// After restore the fds read what the restored processes' own /proc
/// files read (the victim compares them with fresh opens).
#[test]
fn proc_files_describe_the_restored_processes() {
    standard_cycle("procfiles-own", "procfiles", &["own"]);
}

/// A /proc/PID file of a process reaped since cannot be reopened for
/// anything: the dump is refused naming it, and the process runs on.
#[test]
fn proc_file_of_a_gone_process_is_refused() {
    let env = TestEnv::new("procfiles-gone");
    let mut v = Victim::spawn(&env, "procfiles", &["gone"]);
    v.wait_ready();
    let err = dump_expect_error(&env, &v);
    for word in ["fd 24", "/stat", "gone"] {
        assert!(
            err.contains(word),
            "the refusal does not say {word:?}: {err}"
        );
    }
    v.assert_unharmed_and_passes("after a refused dump");
}

/// A /proc/PID file of a process outside the tree would describe another
/// process after restore: refused naming it, and the process runs on.
#[test]
fn proc_file_of_a_process_outside_the_tree_is_refused() {
    let env = TestEnv::new("procfiles-outside");
    let mut v = Victim::spawn(&env, "procfiles", &["outside"]);
    v.wait_ready();
    let err = dump_expect_error(&env, &v);
    for word in ["fd 24", "/proc/1/stat", "not a process of the dumped tree"] {
        assert!(
            err.contains(word),
            "the refusal does not say {word:?}: {err}"
        );
    }
    v.assert_unharmed_and_passes("after a refused dump");
}
