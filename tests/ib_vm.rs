//! Real InfiniBand verbs in the SoftRoCE VM (scripts/ib-vm.sh): the RC
//! ping-pong of tests/c/ib/rc_pingpong.c, the future victim of the verbs
//! checkpoint, must carry every message intact over rxe0.
//!
//! This machine's kernel has no RDMA, so the program runs inside a QEMU
//! guest booted with Debian's 6.1 kernel. Missing prerequisites (QEMU, the
//! kernel deb, libibverbs) are installed by the harness; if that fails the
//! test fails with the harness's message rather than skipping.

use std::collections::hash_map::DefaultHasher;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Messages the ping-pong exchanges: each is a round trip through rxe under
/// TCG emulation (~10 ms), so this keeps the test well under a minute.
const MESSAGES: u64 = 300;
/// Boot (~8 s) plus the exchange, with room for a loaded machine.
const VM_TIMEOUT_SECS: u32 = 55;
/// Layout of `struct msg` in rc_pingpong.c.
const PAYLOAD_BYTES: usize = 240;
const FNV_OFFSET: u64 = 0xcbf29ce484222325;
const FNV_PRIME: u64 = 0x100000001b3;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn harness() -> PathBuf {
    workspace().join("scripts/ib-vm.sh")
}

/// Installs what the VM needs and builds its kernel and initramfs (once).
fn setup_vm() {
    let out = Command::new(harness())
        .arg("setup")
        .output()
        .expect("run scripts/ib-vm.sh setup");
    assert!(
        out.status.success(),
        "the SoftRoCE VM harness cannot be set up (scripts/ib-vm.sh setup, needs root \
         and apt for qemu-system-x86, busybox-static, rdma-core, libibverbs-dev and \
         Debian's linux-image-6.1.0-*-amd64): {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Compiles the ping-pong against the host's libibverbs; the guest runs the
/// host tree, so the binary runs there as is.
fn build_pingpong() -> PathBuf {
    let src = workspace().join("tests/c/ib/rc_pingpong.c");
    let text = fs::read(&src).expect("read rc_pingpong.c");
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ckpt-ib");
    fs::create_dir_all(&dir).expect("create ckpt-ib dir");
    let bin = dir.join(format!("rc_pingpong-{:016x}", h.finish()));
    if bin.exists() {
        return bin;
    }
    let tmp = dir.join(format!(".rc_pingpong-{}.tmp", std::process::id()));
    let out = Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&tmp)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "gcc rc_pingpong.c -libverbs failed (libibverbs-dev installed?): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::rename(&tmp, &bin).expect("install rc_pingpong");
    bin
}

fn fnv(mut h: u64, data: &[u8]) -> u64 {
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// The payload of message `seq`, as rc_pingpong.c's fill_payload makes it.
fn payload(seq: u64) -> [u8; PAYLOAD_BYTES] {
    let mut x = seq.wrapping_mul(0x9e3779b97f4a7c15).wrapping_add(1);
    let mut out = [0u8; PAYLOAD_BYTES];
    for b in &mut out {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    out
}

/// The stream checksum both sides must report: every message, computed
/// here independently, folded once as sent and once as echoed.
fn expected_stream_sum(messages: u64) -> u64 {
    let mut sum = FNV_OFFSET;
    for seq in 0..messages {
        let p = payload(seq);
        let mut msg = Vec::with_capacity(16 + PAYLOAD_BYTES);
        msg.extend_from_slice(&seq.to_le_bytes());
        msg.extend_from_slice(&fnv(FNV_OFFSET, &p).to_le_bytes());
        msg.extend_from_slice(&p);
        sum = fnv(sum, &msg);
        sum = fnv(sum, &msg);
    }
    sum
}

/// The value of `key=` in the line of `role` that has it.
fn field(stdout: &str, role: &str, key: &str) -> String {
    let prefix = format!("{role}: ");
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .flat_map(|l| l.split_whitespace())
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= from {role} in:\n{stdout}"))
        .to_string()
}

#[test]
fn rc_pingpong_over_rxe_keeps_the_stream_intact() {
    setup_vm();
    let bin = build_pingpong();
    let out = Command::new(harness())
        .args(["run", "--timeout", &VM_TIMEOUT_SECS.to_string(), "--"])
        .arg(&bin)
        .args(["rxe0", &MESSAGES.to_string()])
        .output()
        .expect("run scripts/ib-vm.sh run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "rc_pingpong in the VM failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");

    let want = format!("{:016x}", expected_stream_sum(MESSAGES));
    for role in ["client", "server"] {
        assert!(
            stdout.contains(&format!("{role}: stream ok")),
            "{role} did not finish:\n{stdout}"
        );
        assert_eq!(field(&stdout, role, "messages"), MESSAGES.to_string());
        assert_eq!(
            field(&stdout, role, "checksum"),
            want,
            "{role}'s message stream differs from what was sent:\n{stdout}"
        );
    }
    // Two real QPs on one device: distinct numbers, and distinct keys.
    let client_qp = field(&stdout, "client", "qp_num");
    let server_qp = field(&stdout, "server", "qp_num");
    assert_ne!(client_qp, server_qp, "{stdout}");
    assert_ne!(
        field(&stdout, "client", "send_lkey"),
        field(&stdout, "client", "recv_lkey"),
        "{stdout}"
    );
}
