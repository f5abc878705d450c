//! ckpt on a real verbs job: tests/c/ib/rc_pingpong.c (two processes, RC
//! send/receive over rxe0, every message checked by both sides) in the
//! SoftRoCE VM of scripts/ib-vm.sh.
//!
//! - Without the verbs layer, `ckpt dump` refuses the job by name and the
//!   job finishes its stream untouched.
//! - Started with `ckpt run --ib`, the job is dumped with `--kill` in the
//!   middle of its stream, restored, and finishes it: both sides report
//!   the same stream checksum as a run that was never interrupted, and
//!   the dump reports the layer's drain. (The device gives the recreated
//!   QPs new numbers; ib-state/shadow/tests/rxe.rs shows the program never
//!   sees them.)
//!
//! A missing harness prerequisite fails the test with the harness's
//! message; it never skips.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// Boot, a reference run, a refused dump, and the dumped and restored run
/// under TCG.
const VM_TIMEOUT_SECS: u32 = 240;
/// Round trips per run: about 8 s of ping-pong under TCG, so the dump
/// (2 s in) lands in the middle.
const MESSAGES: u32 = 600;

const GUEST_SCRIPT: &str = r#"#!/bin/sh
S=$CKPT_IB_SCRATCH
cd "$S"
export CKPT_IMAGE_KEY=$S/key
(umask 077; head -c 32 /dev/urandom >"$CKPT_IMAGE_KEY")
./rc_pingpong rxe0 MESSAGES >ref.out 2>&1; echo "reference exit $?"

./rc_pingpong rxe0 MESSAGES >plain.out 2>&1 </dev/null &
P=$!
sleep 2
./ckpt dump --tree $P --dir plain-img >refused.out 2>&1; echo "plain dump exit $?"
wait $P; echo "plain job exit $?"

CKPT_IB_LAYER=$S/libckpt_ibverbs.so ./ckpt run --ib -- ./rc_pingpong rxe0 MESSAGES >job.out 2>&1 </dev/null &
P=$!
sleep 2
./ckpt -v dump --tree $P --dir img --kill >dump.out 2>&1; echo "dump exit $?"
wait $P
./ckpt show img >show.out 2>&1
./ckpt -v restore --dir img >restore.out 2>&1; echo "restore exit $?"
"#;

/// libckpt_ibverbs.so beside the ckpt binary; built if a narrower
/// `cargo test` did not build it.
fn shadow_library() -> PathBuf {
    let dir = Path::new(CKPT).parent().expect("target dir").to_path_buf();
    let lib = dir.join("libckpt_ibverbs.so");
    if !lib.exists() {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-p", "ckpt-ib-shadow"]);
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        let out = cmd.output().expect("run cargo build -p ckpt-ib-shadow");
        assert!(
            out.status.success(),
            "cargo build -p ckpt-ib-shadow: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(lib.exists(), "{} not built", lib.display());
    lib
}

fn copy_executable(from: &Path, to: &Path) {
    fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    fs::set_permissions(to, fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// The stream checksums both sides reported.
fn checksums(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.contains("stream ok"))
        .filter_map(|l| l.split("checksum=").nth(1).map(str::to_string))
        .collect()
}

#[test]
fn a_verbs_job_is_dumped_mid_stream_and_finishes_it_after_restore() {
    let setup = Command::new(workspace().join("scripts/ib-vm.sh"))
        .arg("setup")
        .output()
        .expect("run scripts/ib-vm.sh setup");
    assert!(
        setup.status.success(),
        "scripts/ib-vm.sh setup: {}",
        String::from_utf8_lossy(&setup.stderr).trim()
    );
    // Under /var/tmp: the guest sees the host's tree but not its /tmp.
    let scratch = tempfile::Builder::new()
        .prefix("ckpt-ib-ckpt.")
        .tempdir_in("/var/tmp")
        .expect("scratch dir");
    let s = scratch.path();
    copy_executable(Path::new(CKPT), &s.join("ckpt"));
    fs::copy(shadow_library(), s.join("libckpt_ibverbs.so")).expect("copy the layer");
    let cc = Command::new("gcc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(s.join("rc_pingpong"))
        .arg(workspace().join("tests/c/ib/rc_pingpong.c"))
        .arg("-libverbs")
        .output()
        .expect("run gcc");
    assert!(
        cc.status.success(),
        "gcc rc_pingpong.c -libverbs: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let script = s.join("guest.sh");
    fs::write(
        &script,
        GUEST_SCRIPT.replace("MESSAGES", &MESSAGES.to_string()),
    )
    .expect("write guest script");
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = Command::new(workspace().join("scripts/ib-vm.sh"))
        .args([
            "run",
            "--timeout",
            &VM_TIMEOUT_SECS.to_string(),
            "--scratch",
        ])
        .arg(s)
        .arg("--")
        .arg(&script)
        .output()
        .expect("run scripts/ib-vm.sh run");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let read = |name: &str| fs::read_to_string(s.join(name)).unwrap_or_default();
    let mut all = format!(
        "vm stdout:\n{stdout}\nvm stderr:\n{}\n",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [
        "ref.out",
        "plain.out",
        "refused.out",
        "job.out",
        "dump.out",
        "show.out",
        "restore.out",
    ] {
        all.push_str(&format!("--- {f}\n{}", read(f)));
    }
    assert!(out.status.success(), "{all}");

    let reference = checksums(&read("ref.out"));
    assert!(
        stdout.contains("reference exit 0") && reference.len() == 2 && reference[0] == reference[1],
        "the uninterrupted run: {all}"
    );

    // Without the layer: refused by name, the job untouched.
    let refused = read("refused.out");
    assert!(
        !stdout.contains("plain dump exit 0")
            && refused.contains("verbs device without the verbs layer")
            && refused.contains("ckpt run --ib"),
        "{all}"
    );
    assert!(
        stdout.contains("plain job exit 0") && checksums(&read("plain.out")) == reference,
        "the job a refused dump left: {all}"
    );

    // With it: dumped mid-stream, restored, the stream completes intact.
    let dump = read("dump.out");
    assert!(
        stdout.contains("dump exit 0") && dump.contains("verbs drained") && dump.contains("killed"),
        "{all}"
    );
    assert!(
        read("show.out").contains("verbs /dev/infiniband/uverbs"),
        "{all}"
    );
    let restore = read("restore.out");
    assert!(
        stdout.contains("restore exit 0") && restore.contains("recreated and reconnected"),
        "{all}"
    );
    let job = read("job.out");
    assert_eq!(
        checksums(&job),
        reference,
        "the restored job's stream differs from the uninterrupted one: {all}"
    );
    // Dumped mid-stream: the job had not finished when it was killed (its
    // two "stream ok" lines come from the restored processes).
    assert!(!dump.contains("no such process"), "{all}");
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}
