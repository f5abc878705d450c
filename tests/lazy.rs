//! `ckpt restore --lazy`: the process runs at once and its private memory
//! comes back on demand through userfaultfd while a page server fills the
//! rest; drops, unmaps, remaps, writes, forks and threads during the fill
//! all see the right memory (victim: tests/c/lazy.c).

use std::time::Duration;

use crate::common::*;

/// The `--json` line of a restore.
fn restore_json(out: &CkptOutput) -> serde_json::Value {
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON on stdout:\n{}", out.stdout));
    serde_json::from_str(line).expect("restore --json prints one JSON value")
}

fn pages_file(env: &TestEnv, pid: i32) -> std::path::PathBuf {
    env.img.join(format!("pages-{pid}.img"))
}

#[test]
fn a_large_patterned_block_is_served_on_demand_and_survives_drops_remaps_forks_and_writes() {
    let env = TestEnv::new("lazy-big");
    let mut v = Victim::spawn(&env, "lazy", &["256", "4"]);
    v.wait_ready();
    dump(&env, &v, &["--kill", "--compress=lz4"]);
    v.reap_killed(Duration::from_secs(10));

    let restore = spawn_restore(&env, &["--lazy", "--json"]);
    v.go();
    let out = finish_restore(&v, restore);
    let json = restore_json(&out);
    let lazy = &json["stats"]["lazy"];
    eprintln!("lazy restore: {lazy}\n{}", out.stderr);
    let running = lazy["running_ms"].as_f64().expect("running_ms");
    let resident = lazy["resident_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("every page became resident: {json}"));
    assert!(
        running < resident,
        "the process ran before its memory was all back: {json}"
    );
    let lazy_bytes = lazy["lazy_bytes"].as_u64().unwrap();
    assert!(
        lazy_bytes >= 240 << 20,
        "the block's pages were served lazily: {json}"
    );
    let served = ["fault_bytes", "background_bytes", "dropped_bytes"]
        .iter()
        .map(|k| lazy[k].as_u64().unwrap())
        .sum::<u64>();
    assert!(
        served >= lazy_bytes,
        "every lazy byte was filled or dropped: {json}"
    );
    assert!(
        lazy["faults"].as_u64().unwrap() > 0,
        "the process faulted pages in: {json}"
    );
    // The victim acts on the top of its block within a poll of go; the
    // background fill, in address order, reaches it last.
    assert!(
        lazy["dropped_bytes"].as_u64().unwrap() >= 8 << 20,
        "madvise and munmap dropped pending data: {json}"
    );
    assert_eq!(
        lazy["forks"].as_u64(),
        Some(1),
        "the fork came while pages were pending: {json}"
    );
    assert!(
        out.stderr.contains("all pages resident after"),
        "{}",
        out.stderr
    );
}

/// Another user's process, raw page data, more threads faulting at once,
/// and the page server left behind as a daemon by `--detach`.
#[test]
fn non_root_threads_fault_concurrently_under_a_detached_server() {
    let env = TestEnv::new("lazy-user");
    let user = test_user();
    env.give_work_to(user);
    let mut v = Victim::spawn_as(&env, "lazy", &["64", "8"], user);
    v.wait_ready();
    dump(&env, &v, &["--kill", "--compress=none"]);
    v.reap_killed(Duration::from_secs(10));

    let stats = env.root.join("stats.json");
    let out = ckpt(
        &env,
        &[
            "restore",
            "--dir",
            path_str(&env.img),
            "--lazy",
            "--detach",
            "--json",
            "--stats-file",
            path_str(&stats),
        ],
        Duration::from_secs(30),
    );
    out.assert_success();
    let json = restore_json(&out);
    assert!(
        json["stats"]["lazy"]["running_ms"].as_f64().is_some(),
        "{json}"
    );
    assert!(
        json["stats"]["lazy"]["lazy_bytes"]
            .as_u64()
            .is_some_and(|b| b >= 48 << 20),
        "the block's raw pages are left to the server: {json}"
    );
    assert!(
        out.stderr.contains("a page server fills the rest"),
        "{}",
        out.stderr
    );
    assert_eq!(
        status_field(v.pid, "Uid")
            .unwrap_or_default()
            .split_whitespace()
            .next(),
        Some(user.uid.to_string().as_str()),
        "the restored process keeps its user"
    );
    v.go();
    assert_eq!(
        v.wait_result(Duration::from_secs(30)),
        "PASS",
        "{}",
        v.diag()
    );
    v.assert_pass();
    // The daemon rewrites the stats file when it is done: the pages it
    // served are counted there.
    let served = || -> Option<u64> {
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&stats).ok()?).ok()?;
        let lazy = &json["lazy"];
        Some(lazy["fault_bytes"].as_u64()? + lazy["background_bytes"].as_u64()?)
    };
    assert!(
        wait_until(Duration::from_secs(20), || served().is_some_and(|b| b > 0)),
        "the page server daemon reported its work: {}",
        std::fs::read_to_string(&stats).unwrap_or_default()
    );
}

/// Flips one byte of the pages file in place (same owner, mode and size).
fn corrupt(pages: &std::path::Path, at: usize) {
    let mut data = std::fs::read(pages).unwrap();
    data[at] ^= 0x5a;
    std::fs::OpenOptions::new()
        .write(true)
        .open(pages)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &data))
        .unwrap();
}

/// A pages file changed after the dump. Each 4 MiB block is checked
/// against its sealed SHA-256 before anything of it reaches the process:
/// a bad block among what is copied before the process runs refuses the
/// restore; a bad block among what is served later kills the process
/// before the server copies from it. Either way the error names the file
/// and the victim never gets to check (let alone use) a bad page.
#[test]
fn a_corrupt_pages_file_never_reaches_the_process() {
    let env = TestEnv::new("lazy-corrupt");
    let mut v = Victim::spawn(&env, "lazy", &["32", "1"]);
    v.wait_ready();
    dump(&env, &v, &["--kill", "--compress=none"]);
    v.reap_killed(Duration::from_secs(10));
    let pages = pages_file(&env, v.pid);
    let len = std::fs::metadata(&pages).unwrap().len() as usize;
    let names_file = |err: &str| err.contains(&format!("pages-{}.img", v.pid));

    // The first block holds the program's own written data pages (a file
    // mapping, copied before the process runs).
    corrupt(&pages, 0);
    let out = ckpt(
        &env,
        &["restore", "--dir", path_str(&env.img), "--lazy"],
        Duration::from_secs(30),
    );
    let err = out.assert_error();
    eprintln!("{err}");
    assert!(names_file(&err), "the error names the pages file: {err}");
    assert!(!pid_exists(v.pid), "nothing of the process runs");
    corrupt(&pages, 0);

    // The middle lies in the block of 32 MiB, served lazily: the process
    // runs (without go it only waits), the background fill meets the bad
    // block, and the process is killed before anything of it is copied.
    corrupt(&pages, len / 2);
    let out = ckpt(
        &env,
        &["restore", "--dir", path_str(&env.img), "--lazy"],
        Duration::from_secs(30),
    );
    let err = out.assert_error();
    eprintln!("{err}");
    assert!(names_file(&err), "the error names the pages file: {err}");
    assert!(
        err.contains("checksum mismatch") && err.contains("killed"),
        "{err}"
    );
    assert!(
        wait_until(Duration::from_secs(10), || !pid_exists(v.pid)),
        "the process was killed"
    );
    assert!(
        v.result().is_none(),
        "the victim never checked: {}",
        v.diag()
    );
}

/// Without a working userfaultfd (here /dev/userfaultfd is /dev/null in
/// the restore's mount namespace), `--lazy` refuses in one line and the
/// process never runs; the checkpoint still restores eagerly.
#[test]
fn without_a_userfaultfd_lazy_restore_refuses_by_name() {
    let env = TestEnv::new("lazy-nouffd");
    let mut v = Victim::spawn(&env, "lazy", &["32", "1"]);
    v.wait_ready();
    dump(&env, &v, &["--kill"]);
    v.reap_killed(Duration::from_secs(10));

    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind /dev/null /dev/userfaultfd && exec "$0" "$@""#)
        .arg(env!("CARGO_BIN_EXE_ckpt"))
        .args(["restore", "--dir", path_str(&env.img), "--lazy"])
        .env("CKPT_IMAGE_KEY", env.image_key())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run unshare");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let err = stderr
        .lines()
        .find(|l| l.starts_with("ckpt: error:"))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    eprintln!("{err}");
    assert!(
        err.contains("--lazy needs a userfaultfd") && err.contains(&format!("pid {}", v.pid)),
        "{err}"
    );
    assert!(!pid_exists(v.pid), "nothing of the process runs");
    restore_and_check(&env, &v);
}

/// Every kind of mapping of the memory victim (read-only and inaccessible
/// anonymous memory, private file pages, shared memory, sparse regions),
/// and a process tree whose children inherit private pages: the parts that
/// stay eager and the lazily served ones come back byte for byte. aio
/// contexts come back too, their rings never served lazily.
#[test]
fn every_mapping_kind_and_a_tree_come_back_under_lazy() {
    for (name, compress) in [
        ("memory", "--compress=lz4"),
        ("tree", "--compress=none"),
        ("aio", "--compress=lz4"),
    ] {
        let env = TestEnv::new(&format!("lazy-{name}"));
        let mut v = Victim::spawn(&env, name, &[]);
        v.wait_ready();
        dump(&env, &v, &["--kill", compress]);
        v.reap_killed(Duration::from_secs(10));
        let restore = spawn_restore(&env, &["--lazy"]);
        v.go();
        let out = finish_restore(&v, restore);
        assert!(
            out.stderr.contains("running after"),
            "{name}: {}",
            out.stderr
        );
    }
}

/// The process is killed while its pages are still being filled: the
/// server notices (pidfd), stops, and `ckpt restore` ends with the
/// process's status instead of waiting for a fill that cannot end.
#[test]
fn a_process_killed_during_the_fill_ends_the_service() {
    let env = TestEnv::new("lazy-killed");
    let mut v = Victim::spawn(&env, "lazy", &["128", "1"]);
    v.wait_ready();
    dump(&env, &v, &["--kill", "--compress=lz4"]);
    v.reap_killed(Duration::from_secs(10));

    let mut restore = spawn_restore(&env, &["--lazy", "--json"]);
    wait_restored_and_running(&v, &mut restore);
    v.send(nix::sys::signal::Signal::SIGKILL);
    let out = restore.wait_with(Duration::from_secs(20), || v.diag());
    eprintln!("{}", out.stderr);
    assert_eq!(out.code(), 128 + 9, "{}", out.stderr);
    let json = restore_json(&out);
    assert!(
        json["stats"]["lazy"]["running_ms"].as_f64().is_some(),
        "{json}"
    );
    assert!(
        out.stderr.contains("all pages resident after")
            || out.stderr.contains("ended before all pages were resident"),
        "{}",
        out.stderr
    );
}
