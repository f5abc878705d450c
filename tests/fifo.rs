//! A FIFO (named pipe) between a process and its child, with data buffered
//! in it at dump time: both ends are reopened by path with their access
//! mode, status flags and capacity, and every byte arrives after restore,
//! in order (victim: tests/c/fifo.c). A FIFO that is gone at restore time
//! fails the restore by name; ckpt never creates it. With only the write
//! end in the tree, a reader outside reopens the FIFO by path and finds the
//! buffered data there.

use std::time::Duration;

use crate::common::*;

/// The raw images holding FIFO data, with their sizes.
fn fifo_images(img: &std::path::Path) -> Vec<(String, u64)> {
    std::fs::read_dir(img)
        .expect("read image dir")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("fifo-")
                .then(|| (name, e.metadata().map(|m| m.len()).unwrap_or(0)))
        })
        .collect()
}

#[test]
fn fifo_between_parent_and_child_keeps_its_data() {
    let env = TestEnv::new("fifo");
    let mut v = Victim::spawn(&env, "fifo", &[]);
    v.wait_ready();
    // Let data pile up in the FIFO (the reader takes less than it gets).
    std::thread::sleep(Duration::from_millis(300));
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("2 processes"), "{}", out.stderr);
    v.reap_killed(Duration::from_secs(10));

    let images = fifo_images(&env.img);
    assert_eq!(images.len(), 1, "one data image for one FIFO: {images:?}");
    assert!(images[0].1 > 0, "no data buffered at dump time: {images:?}");
    let json = show_json(&env);
    let fifos = fds_of_kind(&json, "fifo").len();
    assert_eq!(fifos, 2, "writer and reader each hold one end: {json}");

    // Gone at restore time: a clear error, and nothing is created.
    let fifo = v.path("fifo");
    let moved = v.path("fifo.moved");
    std::fs::rename(&fifo, &moved).unwrap();
    let err = restore_expect_error(&env);
    assert!(
        err.contains("FIFO is gone") && err.contains("fifo"),
        "error should say the FIFO is gone: {err}"
    );
    assert!(!fifo.exists(), "restore created the FIFO");
    std::fs::rename(&moved, &fifo).unwrap();

    restore_and_check(&env, &v);
}

/// Opens the FIFO's read end without waiting for a writer.
fn open_reader(path: &std::path::Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .expect("open FIFO reader")
}

/// Only the write end in the tree (the job's stdout is a FIFO its reader,
/// outside, opened by path): what the job wrote and nobody read yet is put
/// back into the FIFO, and a new reader that reopens it by path gets every
/// line from the first, in order, then the job's new ones
/// (victim: tests/c/ticker.c).
#[test]
fn fifo_with_reader_outside_keeps_its_data() {
    let env = TestEnv::new("fifo-outside");
    let fifo = env.work.join("out.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let reader = open_reader(&fifo);
    let writer = std::fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .expect("open FIFO writer");
    let mut v = spawn_ticker(&env, std::process::Stdio::from(writer));
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("1 processes"), "{}", out.stderr);
    v.reap_killed(Duration::from_secs(10));
    // The last opener leaving discards the old buffer: only the restore can
    // bring those lines back.
    drop(reader);
    let mut reader = open_reader(&fifo);

    let restore = spawn_restore(&env, &[]);
    let got = read_ticks(&mut reader, Duration::from_millis(800));
    assert!(got.len() > 20, "too few ticks after restore: {got:?}");
    let expected: Vec<u64> = (1..=got.len() as u64).collect();
    assert_eq!(got, expected, "every tick from 1, in order, once");
    v.go();
    finish_restore(&v, restore);
}

/// A FIFO unlinked while open, held O_RDWR and O_RDONLY by a process and
/// O_WRONLY by its child, with data buffered: made again in its directory
/// and unlinked, one FIFO for the three ends, each with its access mode,
/// the data back, the path still gone and no temporary name left; a
/// linked FIFO held only O_RDWR keeps its data (victim mode `ghost`). As
/// root and as an ordinary user.
#[test]
fn an_unlinked_fifo_comes_back_unlinked_with_its_data() {
    let env = TestEnv::new("fifo-ghost");
    let mut v = Victim::spawn(&env, "fifo", &["ghost"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let json = show_json(&env);
    let fifos = fds_of_kind(&json, "fifo");
    let unlinked: Vec<serde_json::Value> = fifos
        .iter()
        .filter(|f| {
            f["object"]
                .as_str()
                .is_some_and(|o| o.contains("(unlinked)"))
        })
        .cloned()
        .collect();
    assert_eq!(
        file_ids(&unlinked).len(),
        3,
        "three open ends unlinked: {json}"
    );
    assert_eq!(
        file_ids(&fifos).len(),
        4,
        "and one of a linked FIFO: {json}"
    );
    restore_and_check(&env, &v);
}

#[test]
fn an_unprivileged_users_unlinked_fifo_comes_back() {
    let env = TestEnv::new("fifo-ghost-user");
    let mut v = Victim::spawn_as(&env, "fifo", &["ghost"], test_user());
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    restore_and_check(&env, &v);
}
