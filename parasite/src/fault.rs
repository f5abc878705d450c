//! Fault injection for tests, after CRIU's `fault-injection.h`: with
//! `CKPT_FAULT=<point>` in its environment, ckpt SIGKILLs itself when it
//! reaches that point, so tests can check that a dumper dying at the worst
//! moment leaves the target running as it was, and a restorer dying
//! mid-rebuild leaves no half-restored process.

/// Places where ckpt can be made to die.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// Dump: right after the tree is seized and stopped.
    AfterSeize,
    /// Dump: with the parasite loaded, after its collection command.
    ParasiteLoaded,
    /// Dump: while page data is being copied.
    DuringPages,
    /// Restore: the address space of the first process is half rebuilt.
    MidRebuild,
    /// Dump: the *target* is SIGKILLed while its pages are copied (by
    /// someone else, as an out-of-memory killer or an impatient user would).
    KillTargetDuringPages,
}

impl FaultPoint {
    /// The value of `CKPT_FAULT` that selects this point.
    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::AfterSeize => "after-seize",
            FaultPoint::ParasiteLoaded => "parasite-loaded",
            FaultPoint::DuringPages => "during-pages",
            FaultPoint::MidRebuild => "restore-mid-rebuild",
            FaultPoint::KillTargetDuringPages => "kill-target-during-pages",
        }
    }
}

fn selected(point: FaultPoint) -> bool {
    std::env::var("CKPT_FAULT").is_ok_and(|v| v == point.name())
}

/// Dies here if `CKPT_FAULT` names this point.
pub fn inject(point: FaultPoint) {
    if selected(point) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

/// SIGKILLs process `pid` here if `CKPT_FAULT` names this point.
pub fn kill_target(point: FaultPoint, pid: i32) {
    if selected(point) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
