//! Fault injection for tests, after CRIU's `fault-injection.h`: with
//! `CKPT_FAULT=<point>` in its environment the dumper SIGKILLs itself when
//! it reaches that point, so tests can check the target survives a dumper
//! that dies at the worst moments.

/// Places in a dump where the dumper can be made to die.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// Right after the target is seized and stopped.
    AfterSeize,
    /// With the parasite loaded, after its collection command.
    ParasiteLoaded,
    /// While page data is being copied.
    DuringPages,
}

impl FaultPoint {
    fn name(self) -> &'static str {
        match self {
            FaultPoint::AfterSeize => "after-seize",
            FaultPoint::ParasiteLoaded => "parasite-loaded",
            FaultPoint::DuringPages => "during-pages",
        }
    }
}

/// Dies here if `CKPT_FAULT` names this point.
pub fn inject(point: FaultPoint) {
    if std::env::var("CKPT_FAULT").is_ok_and(|v| v == point.name()) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}
