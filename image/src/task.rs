//! Per-process state that is not memory or files: registers, signals,
//! credentials, limits and the mm fields the kernel keeps about the
//! address space.
//!
//! The messages are defined in `image/proto/task.proto`; this module gives
//! them their Rust path.

pub use crate::pb::{
    AltStack, ControllingTerminal, Core, Creds, GpRegs, ITimer, JobStop, LockedRange, MmFields,
    PendingSignal, Prctl, RemovedDir, Rlimit, RobustList, Rseq, Sched, SharedWithParent, SigAction,
    ThreadCore,
};
