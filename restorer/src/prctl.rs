//! prctl state and memory locks, in two steps around the credentials.
//!
//! Before the credentials drop (the restorer's privileges): the child
//! subreaper flag, THP disable, the locked ranges (`mlock2`, not bounded
//! by RLIMIT_MEMLOCK for root: the dumped process held these locks within
//! its own limit) and `mlockall(MCL_FUTURE)`.
//!
//! After the credentials (a change of ids resets both dumpable and every
//! thread's parent-death signal): dumpable, each thread's parent-death
//! signal, and MDWE last, since it cannot be undone and the memory is
//! already rebuilt.

use ckpt_image::task::{Core, Prctl};
use ckpt_parasite::Tracee;
use ckpt_parasite::remote::Remote;

use crate::error::{RestoreError, Result};

/// Highest signal number.
const MAX_SIGNAL: u32 = 64;
/// `PR_SET_DUMPABLE` accepts SUID_DUMP_DISABLE (0) and SUID_DUMP_USER (1).
const MAX_DUMPABLE: u32 = 1;
/// `mlock2` flag: lock pages as they are faulted in.
const MLOCK_ONFAULT: u64 = 1;
/// `mlockall` flags.
const MCL_FUTURE: u64 = 2;
/// `mlockall` flag: lock future pages as they are faulted in.
const MCL_ONFAULT: u64 = 4;
/// Bound on locked ranges: the kernel's default `vm.max_map_count`.
const MAX_LOCKED_RANGES: usize = 65_530;
/// Page size the ranges must be aligned to.
const PAGE: u64 = 4096;
/// Bit 0 of `PR_GET_THP_DISABLE`: THP is disabled; the bits above are the
/// flags it was disabled with.
const THP_DISABLED: u32 = 1;

fn invalid(pid: i32, what: String) -> RestoreError {
    RestoreError::Image(ckpt_image::ImageError::Invalid {
        path: ckpt_image::core_name(pid).into(),
        what,
    })
}

/// Checks the process-wide values, naming the process.
fn validate(pid: i32, p: &Prctl) -> Result<()> {
    if p.dumpable > MAX_DUMPABLE {
        return Err(invalid(pid, format!("dumpable {}", p.dumpable)));
    }
    if p.pdeath_sig > MAX_SIGNAL {
        return Err(invalid(
            pid,
            format!("parent-death signal {}", p.pdeath_sig),
        ));
    }
    if p.locked.len() > MAX_LOCKED_RANGES {
        return Err(invalid(pid, format!("{} locked ranges", p.locked.len())));
    }
    for l in &p.locked {
        if l.start >= l.end || l.start % PAGE != 0 || l.end % PAGE != 0 {
            return Err(invalid(
                pid,
                format!("locked range {:#x}-{:#x}", l.start, l.end),
            ));
        }
    }
    Ok(())
}

/// The part that needs the restorer's privileges, in the leader behind `r`.
pub fn restore_before_creds(r: &Remote<'_>, core: &Core) -> Result<()> {
    let Some(p) = &core.prctl else { return Ok(()) };
    validate(core.pid, p)?;
    if p.child_subreaper {
        r.call(
            "prctl(PR_SET_CHILD_SUBREAPER)",
            libc::SYS_prctl,
            [libc::PR_SET_CHILD_SUBREAPER as u64, 1, 0, 0, 0, 0],
        )?;
    }
    if p.thp_disable & THP_DISABLED != 0 {
        let flags = p.thp_disable & !THP_DISABLED;
        r.call(
            "prctl(PR_SET_THP_DISABLE)",
            libc::SYS_prctl,
            [libc::PR_SET_THP_DISABLE as u64, 1, flags as u64, 0, 0, 0],
        )?;
    }
    for l in &p.locked {
        let flags = if l.onfault { MLOCK_ONFAULT } else { 0 };
        r.call(
            "mlock2",
            libc::SYS_mlock2,
            [l.start, l.end - l.start, flags, 0, 0, 0],
        )?;
    }
    if p.mlock_future {
        let onfault = if p.mlock_future_onfault {
            MCL_ONFAULT
        } else {
            0
        };
        r.call(
            "mlockall(MCL_FUTURE)",
            libc::SYS_mlockall,
            [MCL_FUTURE | onfault, 0, 0, 0, 0, 0],
        )?;
    }
    Ok(())
}

/// The part a change of credentials would undo, after it: dumpable, every
/// thread's parent-death signal (the leader behind `r`, then `threads`,
/// which follow `core.threads`), and MDWE.
pub fn restore_after_creds(r: &Remote<'_>, threads: &[Tracee], core: &Core) -> Result<()> {
    let Some(p) = &core.prctl else { return Ok(()) };
    r.call(
        "prctl(PR_SET_DUMPABLE)",
        libc::SYS_prctl,
        [libc::PR_SET_DUMPABLE as u64, p.dumpable as u64, 0, 0, 0, 0],
    )?;
    set_pdeath_sig(r, p.pdeath_sig)?;
    for (t, tc) in threads.iter().zip(&core.threads) {
        if let Some(tp) = &tc.prctl {
            if tp.pdeath_sig > MAX_SIGNAL {
                return Err(invalid(
                    core.pid,
                    format!("thread {}: parent-death signal {}", tc.tid, tp.pdeath_sig),
                ));
            }
            set_pdeath_sig(&Remote { t, base: r.base }, tp.pdeath_sig)?;
        }
    }
    if p.mdwe != 0 {
        r.call(
            "prctl(PR_SET_MDWE)",
            libc::SYS_prctl,
            [libc::PR_SET_MDWE as u64, p.mdwe as u64, 0, 0, 0, 0],
        )?;
    }
    Ok(())
}

fn set_pdeath_sig(r: &Remote<'_>, sig: u32) -> Result<()> {
    if sig != 0 {
        r.call(
            "prctl(PR_SET_PDEATHSIG)",
            libc::SYS_prctl,
            [libc::PR_SET_PDEATHSIG as u64, sig as u64, 0, 0, 0, 0],
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ckpt_image::task::LockedRange;

    #[test]
    fn bad_values_are_refused() {
        assert!(validate(1, &Prctl::default()).is_ok());
        let range = |start, end| LockedRange {
            start,
            end,
            onfault: false,
        };
        for bad in [
            Prctl {
                dumpable: 2,
                ..Default::default()
            },
            Prctl {
                pdeath_sig: 65,
                ..Default::default()
            },
            Prctl {
                locked: vec![range(0x2000, 0x1000)],
                ..Default::default()
            },
            Prctl {
                locked: vec![range(0x1001, 0x2000)],
                ..Default::default()
            },
        ] {
            assert!(validate(1, &bad).is_err(), "{bad:?}");
        }
    }
}
