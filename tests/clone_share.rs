//! Processes sharing an fd table (`CLONE_FILES`) or their cwd, root and
//! umask (`CLONE_FS`) without being threads (victim: tests/c/clone_share.c,
//! whose own checks also cover the sharing after a restore). A restore
//! would give each process tables of its own and break the sharing
//! silently, so the dump refuses the tree: one line per sharing process,
//! naming it, what it shares and the process it shares it with, and the
//! tree runs on unharmed.

use crate::common::*;

/// `ckpt dump` exit code for a tree with something it cannot save.
const UNSUPPORTED: i32 = 3;

#[test]
fn sharing_an_fd_table_or_fs_info_is_refused_naming_both_pids() {
    let env = TestEnv::new("clone-share");
    let mut v = Victim::spawn(&env, "clone_share", &[]);
    let ids: Vec<i32> = v
        .wait_ready()
        .split_whitespace()
        .map(|p| p.parse().expect("pid"))
        .collect();
    let [root, files, fs, both] = ids[..] else {
        panic!("ready file: {ids:?}");
    };
    let out = dump_outcome(&env, &v, &["--kill"]);
    assert_eq!(out.code(), UNSUPPORTED, "{}", out.stderr);
    let refused = |pid: i32, what: &str| {
        out.stderr.lines().any(|l| {
            l.starts_with(&format!("ckpt: error: pid {pid}: "))
                && l.contains(what)
                && l.contains(&format!("shared with pid {root} "))
        })
    };
    const FILES: &str = "fd table (CLONE_FILES)";
    const FS: &str = "cwd, root and umask (CLONE_FS)";
    for (pid, what) in [(files, FILES), (both, FILES), (fs, FS), (both, FS)] {
        assert!(
            refused(pid, what),
            "no line refusing pid {pid}'s {what}: {}",
            out.stderr
        );
    }
    // Each shares one thing only: the other is its own.
    assert!(!refused(files, FS), "{}", out.stderr);
    assert!(!refused(fs, FILES), "{}", out.stderr);
    assert!(!env.img.exists(), "refused dump left {}", env.img.display());
    v.assert_unharmed_and_passes("after the refused dump");
}
