//! Failures: every refused dump or restore must exit non-zero with one
//! `ckpt: error:` line naming the problem, leave a dumped process running
//! untouched, leave no image dir behind, and never leave a half-restored
//! process running.

use std::fs::{self, OpenOptions};
use std::path::Path;
use std::time::Duration;

use crate::common::*;

#[test]
fn dump_of_nonexistent_pid_fails() {
    let env = TestEnv::new("no-pid");
    let pid = unused_pid();
    let out = ckpt(
        &env,
        &[
            "dump",
            "--tree",
            &pid.to_string(),
            "--dir",
            path_str(&env.img),
        ],
        FAIL_TIMEOUT,
    );
    let err = out.assert_error();
    assert!(
        err.contains(&pid.to_string()),
        "error should name pid {pid}: {err}"
    );
    assert!(
        !env.img.exists(),
        "failed dump left the image dir {} behind",
        env.img.display()
    );
}

/// A netlink socket in the middle of a dump (fd 42 in the victim) cannot be dumped: the dump must
/// fail cleanly with one line naming pid, fd and the family, and the
/// victim must not notice anything.
#[test]
fn dump_with_unsupported_fd_fails_and_leaves_victim_alone() {
    let env = TestEnv::new("unsupported-fd");
    let mut v = Victim::spawn(&env, "unsupported", &[]);
    v.wait_ready();

    let err = dump_expect_error(&env, &v);
    assert!(err.contains("fd 42"), "error should name `fd 42`: {err}");
    assert!(
        err.contains("netlink socket"),
        "error should name the socket's family (netlink socket): {err}"
    );
    assert!(
        err.contains(&v.pid.to_string()),
        "error should name pid {}: {err}",
        v.pid
    );
    assert!(
        !env.img.exists(),
        "failed dump left the image dir {} behind",
        env.img.display()
    );

    // Still running its own loop, then passes its own checks (memory, maps,
    // socket, no pending signals, not traced).
    v.assert_unharmed_and_passes("after a failed dump");
}

#[test]
fn dump_into_existing_dir_is_refused() {
    let env = TestEnv::new("existing-dir");
    fs::create_dir(&env.img).expect("create img dir");
    let sentinel = env.img.join("sentinel");
    fs::write(&sentinel, "keep me").expect("write sentinel");

    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    dump_expect_error(&env, &v);

    let entries: Vec<_> = fs::read_dir(&env.img)
        .expect("existing dir must still exist")
        .map(|e| e.expect("dir entry").file_name())
        .collect();
    assert_eq!(
        entries,
        vec![std::ffi::OsString::from("sentinel")],
        "existing dir was modified"
    );
    assert_eq!(fs::read_to_string(&sentinel).unwrap(), "keep me");

    v.assert_unharmed_and_passes("after a refused dump");
}

#[test]
fn restore_from_missing_dir_fails() {
    let env = TestEnv::new("missing-dir");
    let err = restore_expect_error(&env);
    assert!(
        err.contains(path_str(&env.img)) || err.contains("manifest.img"),
        "error should name the missing dir or its manifest.img: {err}"
    );
}

/// Dumps a counter victim with --kill and reaps it; returns the victim.
fn dumped_counter(env: &TestEnv) -> Victim {
    let mut v = Victim::spawn(env, "counter", &[]);
    v.wait_ready();
    dump_kill_reap(env, &mut v);
    v
}

/// Restore must fail naming `file`, and nothing of the victim may run
/// afterwards.  `go` exists from the start, so a victim that was let run
/// even briefly would have written a result file.
fn assert_restore_fails_cleanly(env: &TestEnv, v: &Victim, file: &str) {
    v.go();
    let out = spawn_restore(env, &[]).wait_with(FAIL_TIMEOUT, || v.diag());
    let err = out.assert_error();
    assert!(err.contains(file), "error should name {file}: {err}");
    assert!(
        wait_until(Duration::from_secs(2), || victim_gone(
            v.pid, &v.bin, &v.work
        )),
        "a process for pid {} is left after the failed restore (state {:?}, cmdline {:?})",
        v.pid,
        proc_state(v.pid),
        cmdline_of(v.pid)
    );
    assert!(
        v.result().is_none(),
        "the victim ran from corrupt images: {}",
        v.diag()
    );
}

#[test]
fn restore_from_truncated_pages_fails() {
    restore_from_damaged_pages_fails("truncated-pages", |pages| {
        let len = fs::metadata(pages).expect("pages image").len();
        OpenOptions::new()
            .write(true)
            .open(pages)
            .and_then(|f| f.set_len(len / 2))
            .expect("truncate pages image");
    });
}

/// Dumps the counter victim, lets `damage` spoil its page data image, and checks that
/// restore refuses it cleanly, naming that image.
fn restore_from_damaged_pages_fails(test: &str, damage: impl FnOnce(&Path)) {
    let env = TestEnv::new(test);
    let v = dumped_counter(&env);
    let name = format!("pages-{}.img", v.pid);
    damage(&env.img.join(&name));
    assert_restore_fails_cleanly(&env, &v, &name);
}

/// Flips the bits `mask` of the byte in the middle of `path`, keeping its size.
fn flip_middle_byte(path: &Path, mask: u8) {
    let mut bytes = fs::read(path).expect("read image");
    let mid = bytes.len() / 2;
    bytes[mid] ^= mask;
    fs::write(path, &bytes).expect("write image");
}

/// One byte of page data changed, size kept: the page data is verified as
/// it is copied into the stopped process, and the mismatch kills the tree
/// before it runs.
#[test]
fn restore_from_pages_with_a_flipped_byte_fails() {
    restore_from_damaged_pages_fails("flipped-pages", |pages| flip_middle_byte(pages, 0x01));
}

/// One byte changed near the end of a pages file of several read windows:
/// the windows before it are already copied into the stopped process when
/// the bad block is met, and the restore still fails cleanly.
#[test]
fn restore_from_pages_damaged_in_a_late_window_fails() {
    let env = TestEnv::new("late-damage");
    let mut v = Victim::spawn(&env, "lazy", &["48", "1"]);
    v.wait_ready();
    dump(&env, &v, &["--kill", "--compress=none"]);
    v.reap_killed(Duration::from_secs(10));
    let name = format!("pages-{}.img", v.pid);
    let path = env.img.join(&name);
    let mut bytes = fs::read(&path).expect("read pages image");
    assert!(bytes.len() > 40 << 20, "{} bytes", bytes.len());
    let at = bytes.len() - 4096;
    bytes[at] ^= 0x10;
    fs::write(&path, &bytes).expect("write pages image");
    assert_restore_fails_cleanly(&env, &v, &name);
}

#[test]
fn restore_from_tampered_manifest_fails() {
    let env = TestEnv::new("tampered-manifest");
    let v = dumped_counter(&env);
    flip_middle_byte(&env.img.join("manifest.img"), 0xff);
    assert_restore_fails_cleanly(&env, &v, "manifest.img");
}

/// Restoring while the original still runs under the pid must fail with
/// `pid N is in use` and must not disturb that process.
#[test]
fn restore_refuses_pid_held_by_live_process() {
    let env = TestEnv::new("pid-in-use");
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    dump(&env, &v, &["--leave-running"]);

    let out = spawn_restore(&env, &[]).wait_with(FAIL_TIMEOUT, || v.diag());
    let err = out.assert_error();
    let want = format!("pid {} is in use", v.pid);
    assert!(err.contains(&want), "error should say {want:?}: {err}");

    v.assert_unharmed_and_passes("after the refused restore");
}

/// A file the process had mapped changed after the dump: restore must refuse
/// (naming the file) rather than map different contents.
#[test]
fn restore_refuses_changed_mapped_file() {
    let env = TestEnv::new("changed-mapping");
    let mut v = Victim::spawn(&env, "memory", &[]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let mapped = env.work.join("private.bin");
    let mut f = OpenOptions::new()
        .append(true)
        .open(&mapped)
        .expect("open private.bin");
    std::io::Write::write_all(&mut f, b"changed").expect("append");
    drop(f);
    assert_restore_fails_cleanly(&env, &v, "private.bin");
}

/// Unmounts the small tmpfs even when an assertion fails.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A full disk fails the dump with a clear error; the process keeps
/// running untouched and no partial checkpoint (nor its temporary
/// directory) is left. Raw pages: compressed, the counter's would fit.
#[test]
fn dump_to_full_disk_fails_cleanly() {
    dump_to_full_disk("full-disk", &["counter"], "64k", &["--compress=none"]);
}

/// The same when the disk fills while LZ4 blocks are appended by the
/// writer thread (32 MiB of pages that LZ4 halves, a 2 MiB file system).
#[test]
fn compressed_dump_to_full_disk_fails_cleanly() {
    dump_to_full_disk("full-disk-lz4", &["lazy", "32"], "2m", &["--compress=lz4"]);
}

/// Dumps victim `victim[0]` (arguments `victim[1..]`) into a tmpfs of
/// `size` with `extra` options, which must fail for want of space.
fn dump_to_full_disk(test: &str, victim: &[&str], size: &str, extra: &[&str]) {
    let env = TestEnv::new(test);
    let small = env.work.join("small");
    fs::create_dir(&small).unwrap();
    let ok = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size}"),
            "ckpt-test",
            path_str(&small),
        ])
        .status()
        .expect("run mount");
    assert!(ok.success(), "cannot mount a tmpfs for the test");
    let _mount = Mount(small.clone());

    let mut v = Victim::spawn(&env, victim[0], &victim[1..]);
    v.wait_ready();
    let dir = small.join("img");
    let pid = v.pid.to_string();
    let mut args = vec!["dump", "--tree", &pid, "--dir", path_str(&dir)];
    args.extend_from_slice(extra);
    let out = ckpt(&env, &args, DUMP_TIMEOUT);
    let err = out.assert_error();
    assert!(
        err.contains("No space left on device"),
        "error should say the disk is full: {err}"
    );
    assert!(
        err.contains(&v.pid.to_string()),
        "error should name the pid: {err}"
    );
    assert_eq!(
        fs::read_dir(&small).unwrap().count(),
        0,
        "a failed dump left files behind in {}",
        small.display()
    );
    v.assert_unharmed_and_passes("after a dump to a full disk");
}

#[test]
fn dump_of_kernel_thread_is_refused_by_name() {
    let env = TestEnv::new("kthread");
    // pid 2 is kthreadd on every Linux system.
    let err = ckpt(
        &env,
        &["dump", "--tree", "2", "--dir", path_str(&env.img)],
        FAIL_TIMEOUT,
    )
    .assert_error();
    assert!(
        err.contains("pid 2") && err.contains("kernel thread"),
        "error should name pid 2 as a kernel thread: {err}"
    );
    assert!(!env.img.exists(), "failed dump left {}", env.img.display());
}

/// A target killed by someone else while it is frozen: the dump fails
/// naming its death (not a short read), and leaves no image dir.
#[test]
fn target_killed_mid_dump_is_named() {
    let env = TestEnv::new("target-killed");
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    let out = faulty_dump_command(&env, &v, "kill-target-during-pages", &[])
        .output()
        .expect("run ckpt");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "dump of a dying target succeeded");
    assert!(
        err.contains(&format!("pid {} exited during the dump", v.pid)),
        "error should say the target exited during the dump: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one error line: {err}");
    assert!(!env.img.exists(), "failed dump left {}", env.img.display());
    v.reap_killed(Duration::from_secs(10));
}

/// `ckpt restore --detach` as PID 1 of a fresh PID namespace would end the
/// namespace (and the restored tree) as it exits: refused up front.
#[test]
fn detached_restore_as_namespace_init_is_refused() {
    let env = TestEnv::new("pidns-init");
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let out = std::process::Command::new("unshare")
        .args(["--pid", "--fork", CKPT, "restore", "--detach", "--dir"])
        .arg(&env.img)
        .env("CKPT_IMAGE_KEY", env.image_key())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run unshare");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "detached restore as init succeeded: {err}"
    );
    assert!(
        err.contains("PID 1 of its PID namespace") && err.contains("--detach"),
        "error should explain the namespace init: {err}"
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{}", v.pid)).exists()
            || fs::read_to_string(format!("/proc/{}/cmdline", v.pid))
                .is_ok_and(|c| !c.contains("counter")),
        "nothing may be restored"
    );
}
