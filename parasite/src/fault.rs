//! Fault injection for tests, after CRIU's `fault-injection.h`: with
//! `CKPT_FAULT=<point>` in its environment, ckpt SIGKILLs itself when it
//! reaches that point, so tests can check that a dumper dying at the worst
//! moment leaves the target running as it was, and a restorer dying
//! mid-rebuild leaves no half-restored process.
//!
//! With `CKPT_FAULT=pause:<point>` and `CKPT_FAULT_GATE=<path>`, ckpt instead
//! creates `<path>.reached` at that point and waits (at most
//! [`PAUSE_LIMIT`]) until `<path>` exists, so a test can change the world at
//! exactly that moment (e.g. swap a directory for a symlink) and let ckpt go on.

use std::time::{Duration, Instant};

/// The longest a paused ckpt waits for its gate before going on anyway.
pub const PAUSE_LIMIT: Duration = Duration::from_secs(60);

/// Places where ckpt can be made to die.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// Dump: right after the tree is seized and stopped.
    AfterSeize,
    /// Dump: the leader is about to run the parasite's collection command
    /// without syscall stops (registers set, not resumed yet): a dead
    /// dumper leaves it to run the blob untraced, to the end.
    LeaderInParasite,
    /// Dump: with the parasite loaded, after its collection command.
    ParasiteLoaded,
    /// Dump: a thread other than the leader is inside the parasite area
    /// (stopped at the exit of a syscall it ran there).
    ThreadInParasite,
    /// Dump: while page data is being copied.
    DuringPages,
    /// Dump with `--background`: everything saved frozen is captured and
    /// the rest write-protected; the thaw (after a coordinator's CAPTURE
    /// barrier) is next.
    BeforeThaw,
    /// Dump with `--background`: the tree runs again and its pages are
    /// being saved, a chunk read and unprotected.
    DuringBackground,
    /// Restore: the address space of the first process is half rebuilt.
    MidRebuild,
    /// Restore: a process's other threads exist, held stopped, and its
    /// rebuild goes on (timers, credentials, registers): where a test
    /// kills the process, as an out-of-memory killer or an admin might.
    RestoreThreadsCreated,
    /// Dump: the *target* is SIGKILLed while its pages are copied (by
    /// someone else, as an out-of-memory killer or an impatient user would).
    KillTargetDuringPages,
    /// Dump: every image is written, the manifest and the rename are next.
    BeforeCommit,
    /// Dump with `--kill`: the checkpoint is committed, the kill is next.
    BeforeKill,
}

impl FaultPoint {
    /// The value of `CKPT_FAULT` that selects this point.
    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::AfterSeize => "after-seize",
            FaultPoint::LeaderInParasite => "leader-in-parasite",
            FaultPoint::ParasiteLoaded => "parasite-loaded",
            FaultPoint::ThreadInParasite => "thread-in-parasite",
            FaultPoint::DuringPages => "during-pages",
            FaultPoint::BeforeThaw => "before-thaw",
            FaultPoint::DuringBackground => "during-background",
            FaultPoint::MidRebuild => "restore-mid-rebuild",
            FaultPoint::RestoreThreadsCreated => "restore-threads-created",
            FaultPoint::KillTargetDuringPages => "kill-target-during-pages",
            FaultPoint::BeforeCommit => "before-commit",
            FaultPoint::BeforeKill => "before-kill",
        }
    }
}

/// `CKPT_FAULT`, read once: injection points sit in the page-copy loop,
/// which should not look up the environment for every chunk.
fn setting() -> Option<&'static str> {
    static SETTING: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    SETTING
        .get_or_init(|| std::env::var("CKPT_FAULT").ok())
        .as_deref()
}

fn selected(point: FaultPoint) -> bool {
    setting() == Some(point.name())
}

/// Dies here if `CKPT_FAULT` names this point; pauses here if it names
/// `pause:` and this point.
pub fn inject(point: FaultPoint) {
    let Some(v) = setting() else {
        return;
    };
    if v == point.name() {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
    if v.strip_prefix("pause:") == Some(point.name())
        && let Some(gate) = std::env::var_os("CKPT_FAULT_GATE")
    {
        let gate = std::path::PathBuf::from(gate);
        let mut reached = gate.clone().into_os_string();
        reached.push(".reached");
        let _ = std::fs::write(&reached, point.name());
        let until = Instant::now() + PAUSE_LIMIT;
        while !gate.exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// SIGKILLs process `pid` here if `CKPT_FAULT` names this point.
pub fn kill_target(point: FaultPoint, pid: i32) {
    if selected(point) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        // The kill has landed once the task is a zombie (or gone); a test
        // of "killed during the dump" must not race the kernel's exit path.
        for _ in 0..KILL_SETTLE_POLLS {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            if matches!(state, None | Some('Z' | 'X')) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// How long (in 10 ms polls) [`kill_target`] waits for the kill to land.
const KILL_SETTLE_POLLS: u32 = 300;
