//! Restore on another kernel through the vDSO proxy: the clock victim
//! (tests/c/clock.c, a parent and a child) is dumped in the QEMU guest of scripts/ib-vm.sh running
//! Debian's 6.1 kernel and restored in a second guest running Debian's 6.12
//! kernel, whose vDSO differs. The restored process keeps calling the
//! vDSO entry points glibc found at startup: the dumped vDSO, mapped back
//! where it was with a jump to this kernel's vDSO at every function. There
//! it is dumped again (the proxy is plain memory now) and restored on the
//! same kernel, then it checks that clock_gettime, clock_getres,
//! gettimeofday, time and getcpu all work and agree, and the test that the
//! vDSO glibc uses is the proxy, not the kernel's `[vdso]`.
//!
//! Both guests run without ASLR (`setarch -R`), so this kernel's vDSO in
//! the restorer sits exactly where the dumped one was and has to move out
//! of the way first. Then a process dumped on 6.12 is refused on 6.1 by
//! the name of the function 6.1's vDSO lacks (`__vdso_getrandom`).
//!
//! Both sides are guests: the host's CPU has AVX-512, the guests' (TCG)
//! has not, so a host image would be refused in a guest (XCR0).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::*;

/// Each boot, and what runs in it, under TCG.
const VM_TIMEOUT_SECS: u32 = 90;

/// Guest A (6.1): start the victim at a pid above anything guest B's boot
/// and restore take, and dump it.
const DUMP_SCRIPT: &str = r#"#!/bin/sh
set -u
S=$CKPT_IB_SCRATCH
echo "kernel $(uname -r)"
export CKPT_IMAGE_KEY=$S/key
echo 5000 >/proc/sys/kernel/ns_last_pid
mkdir -p "$S/w"
setarch -R "$S/clock" "$S/w" </dev/null >/dev/null 2>&1 &
P=$!
echo "$P" >"$S/pid"
i=0
while [ ! -e "$S/w/ready" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
[ -e "$S/w/ready" ] || { echo "victim not ready"; exit 1; }
grep -E '\[(vdso|vvar)' "/proc/$P/maps" | sed 's/^/dumped: /'
"$S/ckpt" dump --tree "$P" --dir "$S/img" --kill || { echo "dump failed"; exit 1; }
wait "$P"
echo "dump exit 0"
"#;

/// Guest B (6.12): restore (the proxy), dump the restored process again,
/// restore that (same kernel), let it check itself.
const RESTORE_SCRIPT: &str = r#"#!/bin/sh
set -u
S=$CKPT_IB_SCRATCH
echo "kernel $(uname -r)"
export CKPT_IMAGE_KEY=$S/key
P=$(cat "$S/pid")
setarch -R "$S/ckpt" restore -vv --log-file "$S/restore1.log" --pidfile "$S/running" --dir "$S/img" 2>/dev/null &
R=$!
i=0
while [ ! -s "$S/running" ] && kill -0 "$R" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
grep 'vDSO' "$S/restore1.log" | sed 's/^/log: /'
[ -s "$S/running" ] || { wait "$R"; echo "restore failed: $?"; tail -n 5 "$S/restore1.log"; exit 1; }
grep -E '\[(vdso|vvar)' "/proc/$P/maps" | sed 's/^/restored: /'
"$S/ckpt" dump --tree "$P" --dir "$S/img2" --kill || { echo "second dump failed"; exit 1; }
wait "$R"
echo "second dump exit 0"
"$S/ckpt" restore --dir "$S/img2" &
R=$!
echo go >"$S/w/go"
wait $R
echo "restore exit $?"
echo "result: $(cat "$S/w/result" 2>/dev/null)"
echo "vdso: $(cat "$S/w/vdso" 2>/dev/null)"
# The other way: dumped here, for guest C (6.1), whose vDSO lacks
# __vdso_getrandom.
echo 6000 >/proc/sys/kernel/ns_last_pid
mkdir -p "$S/w3"
"$S/clock" "$S/w3" </dev/null >/dev/null 2>&1 &
P=$!
echo "$P" >"$S/pid3"
i=0
while [ ! -e "$S/w3/ready" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
"$S/ckpt" dump --tree "$P" --dir "$S/img3" --kill || { echo "third dump failed"; exit 1; }
wait "$P"
echo "third dump exit 0"
"#;

/// Guest C (6.1): the 6.12 image is refused by name.
const REFUSE_SCRIPT: &str = r#"#!/bin/sh
set -u
S=$CKPT_IB_SCRATCH
echo "kernel $(uname -r)"
export CKPT_IMAGE_KEY=$S/key
"$S/ckpt" restore --dir "$S/img3" 2>"$S/refused.err"
echo "restore exit $?"
cat "$S/refused.err"
P=$(cat "$S/pid3")
[ -e "/proc/$P" ] && echo "pid $P left behind"
exit 0
"#;

/// Boots the guest of `kernel` (a series, or None for the default 6.1) on
/// the shared scratch dir `s` and runs `script` there; returns its output.
fn run_guest(kernel: Option<&str>, s: &Path, name: &str, script: &str) -> (String, String) {
    let out = guest::run(kernel, s, name, script, VM_TIMEOUT_SECS);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{name}: guest run failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

#[test]
fn restored_on_6_12_what_6_1_dumped() {
    guest::setup(&[]);
    guest::setup(&["--kernel", "6.12"]);
    let scratch = guest::scratch("ckpt-vdso-proxy.");
    let s = scratch.path();
    guest::copy_executable(Path::new(env!("CARGO_BIN_EXE_ckpt")), &s.join("ckpt"));
    guest::copy_executable(&victim_bin("clock"), &s.join("clock"));
    // One image key for both guests.
    let mut key = [0u8; 32];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
        .expect("random key");
    fs::write(s.join("key"), key).expect("write key");
    fs::set_permissions(s.join("key"), fs::Permissions::from_mode(0o600)).expect("chmod key");

    let (a, a_err) = run_guest(None, s, "dump.sh", DUMP_SCRIPT);
    let a_all = format!("stdout:\n{a}\nstderr:\n{a_err}");
    assert!(a.contains("kernel 6.1."), "not the 6.1 guest:\n{a_all}");
    assert!(a.contains("dump exit 0"), "the dump failed:\n{a_all}");

    let (b, b_err) = run_guest(Some("6.12"), s, "restore.sh", RESTORE_SCRIPT);
    let all = format!("guest A:\n{a_all}\nguest B stdout:\n{b}\nguest B stderr:\n{b_err}");
    assert!(b.contains("kernel 6.12."), "not the 6.12 guest:\n{all}");
    assert_eq!(
        b.matches("vDSO proxy at").count(),
        2,
        "the restore did not map a vDSO proxy in each of the two processes:\n{all}"
    );
    // Without ASLR the restorer's own vDSO is where the dumped one was.
    assert!(
        b.contains("vvar and vDSO moved from"),
        "this kernel's vDSO was not moved out of the dumped one's way:\n{all}"
    );
    assert!(
        b.contains("second dump exit 0"),
        "the restored process could not be dumped again:\n{all}"
    );
    assert!(
        b.contains("restore exit 0") && b.contains("result: PASS"),
        "the restored victim did not pass its checks:\n{all}"
    );
    assert!(
        b.contains("named=0"),
        "glibc's vDSO is not the proxy after the restore:\n{all}"
    );
    assert!(
        b.contains("third dump exit 0"),
        "the dump on 6.12 failed:\n{all}"
    );

    // 6.12's vDSO exports __vdso_getrandom, 6.1's does not: refused.
    let (c, c_err) = run_guest(None, s, "refuse.sh", REFUSE_SCRIPT);
    let all = format!("{all}\nguest C stdout:\n{c}\nguest C stderr:\n{c_err}");
    assert!(c.contains("kernel 6.1."), "not the 6.1 guest:\n{all}");
    assert!(
        !c.contains("restore exit 0") && !c.contains("left behind"),
        "the 6.12 image was restored on 6.1:\n{all}"
    );
    assert!(
        c.contains("vDSO symbol __vdso_getrandom missing on this kernel"),
        "not refused by the missing symbol's name:\n{all}"
    );
}
