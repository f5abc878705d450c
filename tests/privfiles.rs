//! A file opened while the process had more privilege than now: root
//! opens a root-owned 0600 log, drops to the test user for good and keeps
//! writing through the fd (victim: tests/c/privfile.c). Restore reopens it
//! as ckpt itself, since the image is sealed and the file is the very one
//! dumped; a file put in its place since is refused.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use crate::common::*;

/// The log in the test's root-owned directory (not the user's work dir).
fn spawn(env: &TestEnv) -> (Victim, PathBuf) {
    let user = test_user();
    env.give_work_to(user);
    let log = env.root.join("root.log");
    let (uid, gid) = (user.uid.to_string(), user.gid.to_string());
    let mut v = Victim::spawn(env, "privfile", &[path_str(&log), &uid, &gid]);
    v.wait_ready();
    // Its stdout and stderr files, made by root for the victim, become
    // the user's like the rest of the work dir: only the log is root's.
    env.give_work_to(user);
    (v, log)
}

#[test]
fn file_opened_before_dropping_privileges_is_reopened() {
    let env = TestEnv::new("privfile");
    let (mut v, log) = spawn(&env);
    dump_kill_reap(&env, &mut v);
    restore_and_check(&env, &v);
    assert_eq!(fs::read_to_string(&log).unwrap(), "before\nafter\n");
    let m = fs::metadata(&log).unwrap();
    assert_eq!((m.uid(), m.permissions().mode() & 0o7777), (0, 0o600));
}

/// Another root-owned file renamed over the log after the dump is not
/// what the process had: ckpt does not hand it over.
#[test]
fn file_replaced_since_is_not_reopened_with_privilege() {
    let env = TestEnv::new("privfile-replaced");
    let (mut v, log) = spawn(&env);
    dump_kill_reap(&env, &mut v);
    let other = env.root.join("other.log");
    fs::write(&other, "before\n").unwrap();
    fs::set_permissions(&other, fs::Permissions::from_mode(0o600)).unwrap();
    fs::rename(&other, &log).unwrap();
    let err = restore_expect_error(&env);
    for word in ["fd 20", "root.log", "replaced by another file"] {
        assert!(
            err.contains(word),
            "the refusal does not say {word:?}: {err}"
        );
    }
}
