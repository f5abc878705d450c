//! epoll instances come back with every registration (events, data,
//! EPOLLET, a fired or armed EPOLLONESHOT), their targets resolved to open
//! files even when the registered fd number was closed after a dup, and
//! shared across fork (victim: tests/c/epoll.c).

use crate::common::*;
use ckpt_image::fd::epoll::EpollFile;
use ckpt_image::fd::{FdTable, Files, file::Kind};
use ckpt_image::{ImageKind, header};

/// The fd the victim dup'ed its MOVED target to before closing the
/// registered number (tests/c/epoll.c).
const MOVED_FD: i32 = 40;
/// Registrations the victim makes.
const TARGETS: usize = 8;

fn read_meta<M: prost::Message + Default>(env: &TestEnv, name: &str, kind: ImageKind) -> M {
    let path = env.img.join(name);
    header::decode(kind, &path, &std::fs::read(&path).expect("read image")).expect("decode")
}

#[test]
fn epoll_targets_events_and_sharing_survive() {
    let env = TestEnv::new("epoll");
    let mut v = Victim::spawn(&env, "epoll", &[]);
    v.wait_ready();
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("2 processes"), "{}", out.stderr);
    v.reap_killed(std::time::Duration::from_secs(10));

    // Parent and child each hold the epoll (fork copies the table): two
    // fds, one open file.
    let json = show_json(&env);
    let mut ids: Vec<u64> = fds_of_kind(&json, "epoll")
        .into_iter()
        .map(|f| f["file_id"].as_u64().expect("file_id"))
        .collect();
    assert_eq!(ids.len(), 2, "parent and child hold the epoll: {json}");
    ids.dedup();
    assert_eq!(
        ids.len(),
        1,
        "the two epoll fds should be one open file: {json}"
    );

    // Every registration names an open file of the checkpoint, the one
    // registered under a since-closed number the file of its dup.
    let files: Files = read_meta(&env, ckpt_image::FILES_NAME, ImageKind::Files);
    let epoll: &EpollFile = files
        .files
        .iter()
        .find_map(|f| match &f.kind {
            Some(Kind::Epoll(e)) => Some(e),
            _ => None,
        })
        .expect("an epoll in files.img");
    assert_eq!(epoll.targets.len(), TARGETS, "{epoll:?}");
    let mut kinds: Vec<&str> = epoll
        .targets
        .iter()
        .map(|t| {
            let target = files.get(t.file_id).expect("target is a file of the image");
            target.kind_name()
        })
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    assert_eq!(
        kinds,
        ["eventfd", "pipe", "timerfd", "unix"],
        "kinds of the registered files: {epoll:?}"
    );
    let table: FdTable = read_meta(&env, &ckpt_image::fds_name(v.pid), ImageKind::FdTable);
    let moved = table
        .fds
        .iter()
        .find(|f| f.fd == MOVED_FD)
        .expect("fd 40 in the parent's table");
    assert!(
        epoll
            .targets
            .iter()
            .any(|t| t.file_id == moved.file_id && t.fd != MOVED_FD),
        "the target registered before the dup should be fd {MOVED_FD}'s file: {epoll:?} {table:?}"
    );

    restore_and_check(&env, &v);
}

/// An epoll that watches other epolls (as UCX, under MPICH, builds them):
/// the inner epolls come back with their targets before the outer one
/// adds them, whatever their fd numbers, and readiness flows through both
/// levels after restore (tests/c/epoll_nested.c checks it from inside).
#[test]
fn epoll_inside_an_epoll_survives() {
    let env = TestEnv::new("epoll-nested");
    let mut v = Victim::spawn(&env, "epoll_nested", &[]);
    v.wait_ready();
    dump(&env, &v, &["--kill"]);
    v.reap_killed(std::time::Duration::from_secs(10));
    restore_and_check(&env, &v);
}
