//! The QEMU guests of scripts/ib-vm.sh, for tests that run ckpt on
//! another kernel or on a verbs device.

use super::*;

/// Runs `scripts/ib-vm.sh ARGS`.
pub fn ib_vm(args: &[&str]) -> std::process::Output {
    Command::new(workspace().join("scripts/ib-vm.sh"))
        .args(args)
        .output()
        .expect("run scripts/ib-vm.sh")
}

/// `scripts/ib-vm.sh setup ARGS...`, or the test fails with the
/// harness's message (a missing prerequisite never skips a test).
pub fn setup(args: &[&str]) {
    let mut all = vec!["setup"];
    all.extend_from_slice(args);
    let out = ib_vm(&all);
    assert!(
        out.status.success(),
        "scripts/ib-vm.sh {}: {}",
        all.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// A scratch directory the guest shares writable (under /var/tmp: the
/// guest sees the host's tree but not its /tmp).
pub fn scratch(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/var/tmp")
        .expect("scratch dir")
}

/// Copies a binary into the scratch directory, executable.
pub fn copy_executable(from: &Path, to: &Path) {
    super::install_executable(from, to);
}

/// Writes `script` to `scratch/name` and boots the guest of `kernel` (a
/// series such as "6.12", or the default 6.1) on it; its output.
pub fn run(
    kernel: Option<&str>,
    scratch: &Path,
    name: &str,
    script: &str,
    timeout_secs: u32,
) -> std::process::Output {
    let path = scratch.join(name);
    super::write_executable(&path, script);
    let timeout = timeout_secs.to_string();
    let mut args = vec!["run"];
    if let Some(k) = kernel {
        args.extend(["--kernel", k]);
    }
    let s = scratch.to_str().expect("utf-8 scratch path");
    let p = path.to_str().expect("utf-8 script path");
    args.extend(["--timeout", &timeout, "--scratch", s, "--", p]);
    ib_vm(&args)
}
