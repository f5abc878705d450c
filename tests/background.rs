//! `ckpt dump --background`: the tree is frozen only to save what must be
//! saved frozen and to write-protect private memory; it runs on while that
//! memory is saved, and the image is still the memory of the freeze
//! instant. Victim: tests/c/background.c, whose writer threads rewrite
//! their memory generation after generation and check, before every
//! write, that the page still holds the previous generation: a page saved
//! after the freeze (or torn) fails that check after the restore.

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

/// Dumps the running writers in the background with `compress`, checks
/// the figures, kills the original and restores: the restored writers
/// find the freeze instant in every page.
fn background_cycle(test: &str, compress: &str, user: Option<&TestUser>) {
    let env = TestEnv::new(test);
    let mut v = match user {
        Some(u) => Victim::spawn_as(&env, "background", &[], u),
        None => Victim::spawn(&env, "background", &[]),
    };
    v.wait_ready();
    let out = dump(&env, &v, &["--background", compress, "--json"]);
    let report: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let stats = &report["stats"];
    let bg = &stats["background"];
    let planned = stats["pages_planned_bytes"].as_u64().unwrap();
    let in_background = bg["bytes"].as_u64().unwrap();
    // 72 MiB of the writers' memory is private anonymous: saved running.
    assert!(
        in_background >= 72 << 20 && in_background <= planned,
        "{in_background} of {planned} bytes saved in the background: {report}"
    );
    assert!(
        bg["copy_ms"].as_f64().unwrap() > 0.0 && stats["frozen_ms"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    // The tree runs again: the original's writers carry on unharmed.
    assert_running_untouched(v.pid, "after a background dump");
    assert!(v.ping(Duration::from_secs(10)), "{}", v.diag());

    v.send(nix::sys::signal::Signal::SIGKILL);
    v.reap_killed(Duration::from_secs(10));
    restore_and_check(&env, &v);
}

#[test]
fn background_dump_keeps_the_freeze_instant_lz4() {
    background_cycle("background-lz4", "--compress=lz4", None);
}

#[test]
fn background_dump_keeps_the_freeze_instant_raw() {
    background_cycle("background-raw", "--compress=none", None);
}

/// The userfaultfd of a process whose user may not create one that also
/// catches the kernel's own writes: ckpt hands it `/dev/userfaultfd`.
#[test]
fn background_dump_of_another_users_job() {
    background_cycle("background-user", "--compress=lz4", Some(test_user()));
}

/// Memory the job unmaps before it is saved is lost to the snapshot: the
/// dump fails naming the range, no checkpoint is left, the job goes on.
#[test]
fn memory_unmapped_before_it_is_saved_fails_the_dump_only() {
    let env = TestEnv::new("background-unmap");
    let mut v = Victim::spawn(&env, "background", &["unmapper"]);
    v.wait_ready();
    let gate = env.root.join("gate");
    let reached = env.root.join("gate.reached");
    let pid = v.pid.to_string();
    let cmd = CkptCmd::spawn_with_env(
        &env,
        &[
            "dump",
            "--tree",
            &pid,
            "--dir",
            path_str(&env.img),
            "--background",
        ],
        &[
            ("CKPT_FAULT", Path::new("pause:during-background")),
            ("CKPT_FAULT_GATE", &gate),
        ],
    );
    assert!(
        wait_for_file(&reached, Duration::from_secs(60)),
        "ckpt never reached the background copy: {}",
        cmd.stderr_now()
    );
    // The tree runs: it can unmap now, while ckpt holds its first chunks.
    write_atomic(&v.path("unmap"), "unmap");
    assert!(
        wait_for_file(&v.path("unmapped"), Duration::from_secs(20)),
        "the victim could not unmap: {}",
        v.diag()
    );
    fs::write(&gate, "go").unwrap();
    let out = cmd.wait_with(Duration::from_secs(60), || v.diag());
    let err = out.assert_error();
    assert!(
        err.contains(&format!("pid {}", v.pid))
            && err.contains("was unmapped before the background dump saved it"),
        "{err}"
    );
    assert!(
        !env.img.exists(),
        "a failed dump left {}",
        env.img.display()
    );
    v.assert_unharmed_and_passes("after a failed background dump");
}

/// ckpt SIGKILLed in the middle of the background copy: the kernel drops
/// the write protection with ckpt's userfaultfd, no writer stays blocked,
/// and the job's memory is its own.
#[test]
fn dumper_killed_during_the_background_copy_leaves_the_job_running() {
    let env = TestEnv::new("background-killed");
    let mut v = Victim::spawn(&env, "background", &[]);
    v.wait_ready();
    let status = faulty_dump_command(&env, &v, "during-background", &["--background"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(
        !env.img.exists(),
        "a killed dump left {}",
        env.img.display()
    );
    v.assert_unharmed_and_passes("after ckpt died mid-copy");
}

/// `--background` with `--kill` makes no sense (the job would run on only
/// to be killed): refused before anything is frozen.
#[test]
fn background_with_kill_is_refused() {
    let env = TestEnv::new("background-kill");
    let mut v = Victim::spawn(&env, "background", &[]);
    v.wait_ready();
    let err = dump_outcome(&env, &v, &["--background", "--kill"]).assert_error();
    assert!(err.contains("--kill"), "{err}");
    v.assert_unharmed_and_passes("after a refused dump");
}
