//! Directories: an fd of a directory removed while open, a removed
//! working directory, and a process of the tree that chroot()ed into a
//! subdirectory (victim: tests/c/dirs.c).

use crate::common::*;

/// A removed directory held open (opendir) comes back as an empty removed
/// directory with its owner and mode; an O_PATH fd of a kept one beside
/// it is reopened as usual.
#[test]
fn removed_directory_fd_survives() {
    standard_cycle("dirs-removed", "dirs", &["removed"]);
}

/// A process whose working directory was removed is restored in an empty
/// removed directory of the same name.
#[test]
fn removed_working_directory_survives() {
    standard_cycle("dirs-cwd", "dirs", &["cwd"]);
}

/// A child that chroot()ed into a subdirectory keeps that root and its
/// working directory inside it.
#[test]
fn chrooted_child_keeps_its_root() {
    standard_cycle("dirs-chroot", "dirs", &["chroot"]);
}

/// A root directory removed under a chrooted child cannot be come back
/// to: the dump is refused naming it, and the tree runs on.
#[test]
fn removed_root_directory_is_refused() {
    let env = TestEnv::new("dirs-chroot-removed");
    let mut v = Victim::spawn(&env, "dirs", &["chroot-removed"]);
    v.wait_ready();
    let err = dump_expect_error(&env, &v);
    for word in ["root directory", "/jail", "removed"] {
        assert!(
            err.contains(word),
            "the refusal does not say {word:?}: {err}"
        );
    }
    v.assert_unharmed_and_passes("after a refused dump");
}

/// As the test user, the removed directory and working directory are made
/// again by the user's own identity and come back the user's.
#[test]
fn removed_directories_of_a_user_survive() {
    for mode in ["removed", "cwd"] {
        let env = TestEnv::new(&format!("dirs-user-{mode}"));
        let mut v = Victim::spawn_as(&env, "dirs", &[mode], test_user());
        v.wait_ready();
        dump_kill_reap(&env, &mut v);
        restore_and_check(&env, &v);
    }
}
