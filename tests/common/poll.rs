//! Waiting with a deadline, and writing files the way the victims read them.

use super::*;

/// Polls `f` every 10 ms until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(POLL);
    }
}

pub fn wait_for_file(path: &Path, timeout: Duration) -> bool {
    wait_until(timeout, || path.exists())
}

pub fn read_to_string_lossy(path: &Path) -> String {
    fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Creates a file atomically (write tmp, rename), so victims never read a
/// partial one.
pub fn write_atomic(path: &Path, content: &str) {
    let tmp = path.with_extension("harness-tmp");
    fs::write(&tmp, content).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    fs::rename(&tmp, path).unwrap_or_else(|e| panic!("rename to {}: {e}", path.display()));
}

/// Copies `from` to `to` as an executable (mode 0755) through a child
/// `install`, so no descriptor of this process ever writes `to`. Writing it
/// here would race with the other test threads: a child they fork while the
/// write is open holds the file open for writing until it execs, and running
/// the file in that window fails with ETXTBSY ("Text file busy").
pub fn install_executable(from: &Path, to: &Path) {
    let out = Command::new("install")
        .args(["-m", "0755"])
        .arg(from)
        .arg(to)
        .output()
        .unwrap_or_else(|e| panic!("run install for {}: {e}", to.display()));
    assert!(
        out.status.success(),
        "install {} {}: {}",
        from.display(),
        to.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes a script to run (a fake Slurm client, a launcher), executable and
/// safe from the ETXTBSY race [`install_executable`] explains.
pub fn write_executable(path: &Path, text: &str) {
    let src = path.with_extension("harness-src");
    fs::write(&src, text).unwrap_or_else(|e| panic!("write {}: {e}", src.display()));
    install_executable(&src, path);
    fs::remove_file(&src).unwrap_or_else(|e| panic!("remove {}: {e}", src.display()));
}
