//! A FIFO (named pipe) between a process and its child, with data buffered
//! in it at dump time: both ends are reopened by path with their access
//! mode, status flags and capacity, and every byte arrives after restore,
//! in order (victim: tests/c/fifo.c). A FIFO that is gone at restore time
//! fails the restore by name; ckpt never creates it.

mod common;

use std::time::Duration;

use common::*;

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
    let show = ckpt(&env, &["show", path_str(&env.img), "--json"], FAIL_TIMEOUT);
    show.assert_success();
    let json: serde_json::Value = serde_json::from_str(show.stdout.trim()).expect("show --json");
    let fifos = json["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .flat_map(|p| p["fds"].as_array().cloned().unwrap_or_default())
        .filter(|f| f["kind"] == "fifo")
        .count();
    assert_eq!(fifos, 2, "writer and reader each hold one end: {json}");

    // Gone at restore time: a clear error, and nothing is created.
    let fifo = v.path("fifo");
    let moved = v.path("fifo.moved");
    std::fs::rename(&fifo, &moved).unwrap();
    let out = ckpt(
        &env,
        &["restore", "--dir", path_str(&env.img)],
        FAIL_TIMEOUT,
    );
    let err = out.assert_error();
    assert!(
        err.contains("FIFO is gone") && err.contains("fifo"),
        "error should say the FIFO is gone: {err}"
    );
    assert!(!fifo.exists(), "restore created the FIFO");
    std::fs::rename(&moved, &fifo).unwrap();

    restore_and_check(&env, &v);
}
