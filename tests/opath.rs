//! `O_PATH` fds of a file and of a symbolic link (`O_PATH | O_NOFOLLOW`)
//! come back with their flags, naming the same file or link; one of a
//! link unlinked since is refused (victim: tests/c/opath.c).

use crate::common::*;

#[test]
fn o_path_fds_of_a_file_and_a_link_survive() {
    let env = TestEnv::new("opath");
    let mut v = Victim::spawn(&env, "opath", &[]);
    v.wait_ready();
    dump(&env, &v, &["--kill"]);
    v.reap_killed(std::time::Duration::from_secs(10));
    restore_and_check(&env, &v);
}

/// A symbolic link removed since its `O_PATH | O_NOFOLLOW` open cannot be
/// reopened: the dump is refused naming it, and the process runs on.
#[test]
fn o_path_fd_of_an_unlinked_link_is_refused() {
    let env = TestEnv::new("opath-unlinked");
    let mut v = Victim::spawn(&env, "opath", &["unlinked"]);
    v.wait_ready();
    let err = dump_expect_error(&env, &v);
    assert!(err.contains("unlinked symbolic link"), "{err}");
    v.assert_unharmed_and_passes("after a refused dump");
}
