//! Reading what a checkpoint and a victim say: `ckpt show --json`, and the
//! ticks a victim writes through a pipe.

use super::*;

/// `ckpt show --json` of the test's checkpoint.
pub fn show_json(env: &TestEnv) -> serde_json::Value {
    let show = ckpt(env, &["show", path_str(&env.img), "--json"], FAIL_TIMEOUT);
    show.assert_success();
    serde_json::from_str(show.stdout.trim()).expect("show --json prints one JSON value")
}

/// Every fd of file kind `kind` in `show` (from [`show_json`]), all
/// processes together, as `ckpt show --json` describes them.
pub fn fds_of_kind(show: &serde_json::Value, kind: &str) -> Vec<serde_json::Value> {
    show["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .flat_map(|p| p["fds"].as_array().cloned().unwrap_or_default())
        .filter(|f| f["kind"] == kind)
        .collect()
}

/// The distinct open-file ids of `fds` (from [`fds_of_kind`]).
pub fn file_ids(fds: &[serde_json::Value]) -> Vec<u64> {
    let mut ids: Vec<u64> = fds
        .iter()
        .map(|f| f["file_id"].as_u64().expect("file_id"))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The "tick N" numbers readable from `r` (non-blocking) within `wait`;
/// the ticker victims write such lines.
pub fn read_ticks(r: &mut File, wait: Duration) -> Vec<u64> {
    use std::io::Read;
    let mut text = String::new();
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match r.read(&mut buf) {
            Ok(n) if n > 0 => text.push_str(&String::from_utf8_lossy(&buf[..n])),
            // EOF of a FIFO without writer yet, or nothing yet: wait.
            Ok(_) => sleep(POLL),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => sleep(POLL),
            Err(e) => panic!("read ticks: {e}"),
        }
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("tick ")?.parse().ok())
        .collect()
}

/// A launcher's pipe for a ticker victim's stdout: (read end, non-blocking,
/// for [`read_ticks`]; write end, to hand to the victim or to restore).
pub fn launcher_pipe() -> (File, std::os::fd::OwnedFd) {
    let (r, w) = nix::unistd::pipe().expect("pipe");
    nix::fcntl::fcntl(
        &r,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .expect("O_NONBLOCK");
    (File::from(r), w)
}

/// The ticker victim (tests/c/ticker.c), ready, with `stdout` (a
/// launcher's pipe, socket or FIFO) as its stdout and /dev/null as its
/// stdin and stderr.
pub fn spawn_ticker(env: &TestEnv, stdout: Stdio) -> Victim {
    let mut v = Victim::spawn_with(env, "ticker", &[], Stdio::null(), stdout, Stdio::null());
    v.wait_ready();
    v
}

/// What the victim's stdout is, as /proc names it (`pipe:[INO]`,
/// `socket:[INO]`): the key `--external` and `--inherit-fd` take.
pub fn stdout_key(v: &Victim) -> String {
    fs::read_link(format!("/proc/{}/fd/1", v.pid))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// The last tick a ticker wrote into its old launcher's `r` before it was
/// dumped (and killed); there must be one.
pub fn last_tick_before_dump(r: &mut File) -> u64 {
    let before = read_ticks(r, Duration::from_millis(100));
    *before.last().expect("ticks before the dump")
}

/// `ckpt restore --detach --inherit-fd fd[1]:KEY` with `stdout` (a new
/// launcher's end) as its fd 1, standing in for the external `key`; the
/// restore must succeed.
pub fn restore_inheriting_stdout(env: &TestEnv, key: &str, stdout: std::os::fd::OwnedFd) {
    let status = env
        .ckpt_command()
        .args([
            "restore",
            "--detach",
            "--dir",
            path_str(&env.img),
            "--inherit-fd",
        ])
        .arg(format!("fd[1]:{key}"))
        .stdin(Stdio::null())
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::null())
        .status()
        .expect("run restore");
    assert!(status.success(), "restore with --inherit-fd failed");
}

/// After a restore under a new launcher reading `r`: the ticker's lines
/// carry on from `last`, and after go the victim passes.
pub fn assert_ticks_carry_on(r: &mut File, last: u64, v: &Victim) {
    let after = read_ticks(r, Duration::from_millis(500));
    assert!(!after.is_empty(), "no ticks in the new launcher's pipe");
    assert_eq!(
        after[0],
        last + 1,
        "ticks should carry on from {last}: {after:?}"
    );
    v.go_and_pass();
}

/// The outside_pipe victim: its stdin is a pipe whose write end (returned,
/// keep it open) stays with the test, outside the tree; the victim moves
/// it to fd 10, where the stdio rule does not cover it.
pub fn spawn_with_outside_pipe(env: &TestEnv) -> (Victim, std::os::fd::OwnedFd) {
    let (r, w) = nix::unistd::pipe().expect("pipe");
    let mut v = Victim::spawn_with(
        env,
        "outside_pipe",
        &[],
        Stdio::from(r),
        Stdio::null(),
        Stdio::null(),
    );
    v.wait_ready();
    (v, w)
}
