//! ckpt on another kernel: the counter victim (tests/c/counter.c) dumped
//! and restored inside the QEMU guest of scripts/ib-vm.sh, which runs
//! Debian's 6.1 kernel (no MDWE, no PAGEMAP_SCAN, images on 9p, which
//! cannot map files). The victim checks itself after the restore that its
//! counter went on from memory and its log still appends. This is also
//! where verbs jobs are checkpointed (docs/infiniband.md).

use std::path::Path;

use crate::common::*;

/// Boot, the dump, the restore and the victim's checks under TCG.
const VM_TIMEOUT_SECS: u32 = 90;

/// Run inside the guest; binaries and images live in the shared scratch
/// dir (the guest's /tmp is its own).
const GUEST_SCRIPT: &str = r#"#!/bin/sh
set -u
S=$CKPT_IB_SCRATCH
echo "kernel $(uname -r)"
export CKPT_IMAGE_KEY=$S/key
(umask 077; head -c 32 /dev/urandom >"$CKPT_IMAGE_KEY")
mkdir -p "$S/w"
"$S/counter" "$S/w" </dev/null >/dev/null 2>&1 &
P=$!
i=0
while [ ! -e "$S/w/ready" ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
"$S/ckpt" dump --tree $P --dir "$S/img" --kill || { echo "dump failed"; exit 1; }
wait $P
"$S/ckpt" restore --dir "$S/img" &
R=$!
echo go >"$S/w/go"
wait $R
echo "restore exit $?"
"#;

#[test]
fn dump_and_restore_inside_the_6_1_guest() {
    guest::setup(&[]);
    let scratch = guest::scratch("ckpt-old-kernel.");
    let s = scratch.path();
    guest::copy_executable(Path::new(env!("CARGO_BIN_EXE_ckpt")), &s.join("ckpt"));
    guest::copy_executable(&victim_bin("counter"), &s.join("counter"));
    let out = guest::run(None, s, "guest.sh", GUEST_SCRIPT, VM_TIMEOUT_SECS);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        out.status.success(),
        "guest run failed ({}):\n{all}",
        out.status
    );
    assert!(stdout.contains("kernel 6.1."), "not the 6.1 guest:\n{all}");
    assert!(
        stdout.contains("restore exit 0"),
        "the restored victim did not pass its checks:\n{all}"
    );
}
