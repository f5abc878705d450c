//! Seccomp state of a process's threads (`Core::seccomp`,
//! `ThreadCore::seccomp`, `Core::seccomp_filters`): bounds every reader
//! checks before a filter reaches the kernel.
//!
//! The messages are defined in `image/proto/task.proto`.

pub use crate::pb::{Seccomp, SeccompFilter};

use crate::error::ImageError;
use crate::pb::Core;

/// `SECCOMP_MODE_STRICT`: only read, write, _exit and sigreturn.
pub const MODE_STRICT: u32 = 1;
/// `SECCOMP_MODE_FILTER`: classic BPF filters decide.
pub const MODE_FILTER: u32 = 2;
/// Size of one `struct sock_filter` instruction.
pub const INSN_SIZE: usize = 8;
/// `BPF_MAXINSNS`: the kernel's limit on one filter's length.
pub const MAX_INSNS: usize = 4096;
/// The kernel's `MAX_INSNS_PER_PATH`: the instructions of a thread's whole
/// chain, each filter counting 4 more for its overhead.
pub const MAX_PATH_INSNS: usize = 32768;
/// Per-filter overhead the kernel adds when it bounds a chain.
const FILTER_OVERHEAD_INSNS: usize = 4;
/// `SECCOMP_FILTER_FLAG_LOG`, the only install flag the kernel reports back.
pub const FLAG_LOG: u64 = 1 << 1;

/// Classic BPF `BPF_RET | BPF_K`: return a constant.
const BPF_RET_K: u16 = 0x06;
/// `SECCOMP_RET_ACTION_FULL`: the action part of a filter's verdict.
const RET_ACTION_FULL: u32 = 0xffff_0000;
/// `SECCOMP_RET_USER_NOTIF`: hand the syscall to a supervisor.
pub const RET_USER_NOTIF: u32 = 0x7fc0_0000;

impl SeccompFilter {
    /// Number of instructions.
    pub fn len_insns(&self) -> usize {
        self.insns.len() / INSN_SIZE
    }

    /// Whether the program can answer "ask the user-space supervisor"
    /// (`SECCOMP_RET_USER_NOTIF`): its listener cannot be checkpointed.
    pub fn notifies_user(&self) -> bool {
        self.insns.chunks_exact(INSN_SIZE).any(|i| {
            let code = u16::from_le_bytes([i[0], i[1]]);
            let k = u32::from_le_bytes([i[4], i[5], i[6], i[7]]);
            code == BPF_RET_K && k & RET_ACTION_FULL == RET_USER_NOTIF
        })
    }
}

impl Seccomp {
    /// The mode's name, as errors and `ckpt show` print it.
    pub fn mode_name(&self) -> &'static str {
        match self.mode {
            MODE_STRICT => "strict",
            MODE_FILTER => "filter",
            _ => "unknown",
        }
    }
}

/// Checks every thread's seccomp state of `core` against the kernel's
/// bounds and the filter table.
pub fn validate(core: &Core) -> Result<(), ImageError> {
    let invalid = |what: String| ImageError::Invalid {
        path: crate::core_name(core.pid).into(),
        what,
    };
    for (i, f) in core.seccomp_filters.iter().enumerate() {
        if f.insns.is_empty() || f.insns.len() % INSN_SIZE != 0 || f.len_insns() > MAX_INSNS {
            return Err(invalid(format!(
                "seccomp filter {i}: {} bytes is not 1..={MAX_INSNS} instructions",
                f.insns.len()
            )));
        }
        if f.flags & !FLAG_LOG != 0 {
            return Err(invalid(format!(
                "seccomp filter {i}: unknown flags {:#x}",
                f.flags
            )));
        }
    }
    let threads = std::iter::once((core.pid, core.seccomp.as_ref()))
        .chain(core.threads.iter().map(|t| (t.tid, t.seccomp.as_ref())));
    for (tid, s) in threads {
        let Some(s) = s else { continue };
        match s.mode {
            MODE_STRICT if s.filters.is_empty() => {}
            MODE_FILTER if !s.filters.is_empty() => {}
            m => {
                return Err(invalid(format!(
                    "thread {tid}: seccomp mode {m} with {} filters",
                    s.filters.len()
                )));
            }
        }
        let mut path = 0;
        for &ix in &s.filters {
            let f = core
                .seccomp_filters
                .get(ix as usize)
                .ok_or_else(|| invalid(format!("thread {tid}: no seccomp filter {ix}")))?;
            path += f.len_insns() + FILTER_OVERHEAD_INSNS;
        }
        if path > MAX_PATH_INSNS {
            return Err(invalid(format!(
                "thread {tid}: seccomp chain of {path} instructions exceeds {MAX_PATH_INSNS}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ret(k: u32) -> Vec<u8> {
        let mut i = BPF_RET_K.to_le_bytes().to_vec();
        i.extend([0, 0]);
        i.extend(k.to_le_bytes());
        i
    }

    #[test]
    fn bounds_and_indexes_are_checked() {
        let allow = SeccompFilter {
            insns: ret(0x7fff_0000),
            flags: 0,
        };
        let mut core = Core {
            pid: 7,
            seccomp: Some(Seccomp {
                mode: MODE_FILTER,
                filters: vec![0],
            }),
            seccomp_filters: vec![allow.clone()],
            ..Default::default()
        };
        validate(&core).unwrap();
        core.seccomp.as_mut().unwrap().filters = vec![1];
        assert!(
            validate(&core)
                .unwrap_err()
                .to_string()
                .contains("no seccomp filter 1")
        );
        core.seccomp.as_mut().unwrap().filters = vec![0];
        core.seccomp_filters[0].insns = vec![0; (MAX_INSNS + 1) * INSN_SIZE];
        assert!(validate(&core).is_err());
        core.seccomp_filters[0] = allow;
        core.seccomp.as_mut().unwrap().filters = vec![0; 7000];
        assert!(validate(&core).unwrap_err().to_string().contains("exceeds"));
    }

    #[test]
    fn user_notification_is_recognised() {
        let f = SeccompFilter {
            insns: [ret(0x7fff_0000), ret(RET_USER_NOTIF)].concat(),
            flags: 0,
        };
        assert!(f.notifies_user());
        let f = SeccompFilter {
            insns: ret(0x0005_0001),
            flags: 0,
        };
        assert!(!f.notifies_user());
    }
}
