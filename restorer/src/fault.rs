//! Fault injection for tests (see the dumper's `fault.rs`): with
//! `CKPT_FAULT=<point>` the restorer SIGKILLs itself there, so tests can
//! check that no half-restored process survives it.

/// Places in a restore where the restorer can be made to die.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// The address space of the first process is half rebuilt.
    MidRebuild,
}

impl FaultPoint {
    fn name(self) -> &'static str {
        match self {
            FaultPoint::MidRebuild => "restore-mid-rebuild",
        }
    }
}

/// Dies here if `CKPT_FAULT` names this point.
pub fn inject(point: FaultPoint) {
    if std::env::var("CKPT_FAULT").is_ok_and(|v| v == point.name()) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}
