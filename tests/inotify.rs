//! inotify instances come back with every watch at its wd, with its mask,
//! on the same directory and file: events arrive with the right wd and
//! names, nothing stray is queued, numbering goes on (victim:
//! tests/c/inotify.c); fanotify groups come back with their marks, an
//! ordinary user's is refused by name (victim: tests/c/fanotify.c). A
//! watched inode whose name is gone comes back through its file handle if
//! another name is left, and is refused by name otherwise.

use std::time::Duration;

use crate::common::*;

#[test]
fn watches_keep_their_wds_and_deliver_events() {
    let env = TestEnv::new("inotify");
    let mut v = Victim::spawn_as(&env, "inotify", &[], test_user());
    v.wait_ready();
    dump(&env, &v, &["--kill"]);
    v.reap_killed(Duration::from_secs(10));

    let json = show_json(&env);
    let fds = fds_of_kind(&json, "inotify");
    assert_eq!(fds.len(), 1, "{json}");
    let object = fds[0]["object"].as_str().expect("object");
    let dir = v.path("dir");
    let file = v.path("file");
    for w in [
        format!("wd 2 mask 0x300 {}", dir.display()),
        format!("wd 3 mask 0xa {}", file.display()),
    ] {
        assert!(object.contains(&w), "{w:?} missing: {object}");
    }
    assert!(!object.contains("wd 1 "), "removed watch saved: {object}");

    restore_and_check(&env, &v);
}

#[test]
fn watch_on_a_deleted_file_is_refused_by_name() {
    let env = TestEnv::new("inotify-deleted");
    let mut v = Victim::spawn(&env, "inotify", &["deleted"]);
    v.wait_ready();
    let line = dump_expect_error(&env, &v);
    for w in [&v.pid.to_string(), "fd 10", "inotify watch wd 4"] {
        assert!(line.contains(w), "error should name {w:?}: {line}");
    }
    v.assert_unharmed_and_passes("after a dump refused for a deleted watched file");
}

/// A watched file whose watched name was removed while another name of
/// it stays: no path reaches it through the name the kernel gives, yet the
/// inode lives, so the watch comes back through its file handle and
/// delivers events of writes through the other name.
#[test]
fn watch_on_a_file_with_another_name_left_comes_back() {
    let env = TestEnv::new("inotify-linked");
    let mut v = Victim::spawn(&env, "inotify", &["linked"]);
    v.wait_ready();
    dump(&env, &v, &["--kill"]);
    v.reap_killed(Duration::from_secs(10));
    let json = show_json(&env);
    let object = fds_of_kind(&json, "inotify")[0]["object"]
        .as_str()
        .expect("object")
        .to_string();
    // Saved under the name it had: only its handle reaches it.
    let gone = format!("wd 4 mask 0x2 {} (deleted)", v.path("gone").display());
    assert!(object.contains(&gone), "{gone:?} missing: {object}");
    restore_and_check(&env, &v);
}

/// Events queued and not read cannot be queued again: the dump says how
/// many bytes are dropped, and the restored instance starts empty.
#[test]
fn queued_events_are_dropped_with_a_warning() {
    let env = TestEnv::new("inotify-queued");
    let mut v = Victim::spawn(&env, "inotify", &["queued"]);
    v.wait_ready();
    let out = dump(&env, &v, &["--kill"]);
    assert!(
        out.stderr.contains(&format!(
            "pid {}: fd 10: 32 bytes of inotify events not read yet are dropped",
            v.pid
        )),
        "{}",
        out.stderr
    );
    v.reap_killed(Duration::from_secs(10));
    restore_and_check(&env, &v);
}

/// A fanotify group comes back with its flags and inode and mount marks
/// (the restore checks each in fdinfo): writing
/// the watched file and opening a child of the watched directory deliver
/// their events to the restored group (victim: tests/c/fanotify.c).
#[test]
fn fanotify_group_keeps_its_marks_and_delivers_events() {
    let env = TestEnv::new("fanotify");
    let mut v = Victim::spawn(&env, "fanotify", &[]);
    v.wait_ready();
    dump(&env, &v, &["--kill"]);
    v.reap_killed(Duration::from_secs(10));

    let json = show_json(&env);
    let fds = fds_of_kind(&json, "fanotify");
    assert_eq!(fds.len(), 1, "{json}");
    let object = fds[0]["object"].as_str().expect("object");
    for w in [
        format!(
            "inode mark mask 0xa ignored 0x0 {}",
            v.path("file").display()
        ),
        format!(
            "inode mark mask 0x8000020 ignored 0x0 {}",
            v.path("dir").display()
        ),
        "mount mark mask 0x0 ignored 0x1 ".to_string(),
    ] {
        assert!(object.contains(&w), "{w:?} missing: {object}");
    }

    restore_and_check(&env, &v);
}

/// An ordinary user's group (the unprivileged kind) would come back with
/// the privileges fanotify_init lends only to CAP_SYS_ADMIN: refused by name.
#[test]
fn fanotify_of_an_ordinary_user_is_refused_by_name() {
    let env = TestEnv::new("fanotify-user");
    let mut v = Victim::spawn_as(&env, "fanotify", &["user"], test_user());
    v.wait_ready();
    let line = dump_expect_error(&env, &v);
    for w in [&v.pid.to_string(), "fd 10", "fanotify", "CAP_SYS_ADMIN"] {
        assert!(line.contains(w), "error should name {w:?}: {line}");
    }
    v.assert_unharmed_and_passes("after a dump refused for fanotify");
}
