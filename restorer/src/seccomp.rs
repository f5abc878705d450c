//! Seccomp modes and filters, reinstalled in each thread.
//!
//! Filters must hold from the moment the program runs again, yet every
//! remote syscall the restorer still runs in the thread after installing
//! them (credentials, timers, unmapping the scratch area) would be
//! filtered, and installing without no_new_privs needs CAP_SYS_ADMIN,
//! which the credential change takes away. Both are resolved the way the
//! kernel offers for checkpoint/restore: the restorer suspends seccomp
//! for the tracee (`PTRACE_O_SUSPEND_SECCOMP`, inherited by the threads
//! it clones) before installing anything, installs the filters while the
//! thread still has the restorer's privileges, and the kernel lifts the
//! suspension when ckpt detaches, which is the moment the thread resumes.
//! So the filters are in force exactly from the program's first
//! instruction, whatever order the restorer works in.
//!
//! Threads that share the oldest part of their chains (inherited at
//! clone) get it installed once in the leader before the threads are
//! cloned, so they share the kernel's filter objects as before (a later
//! `SECCOMP_FILTER_FLAG_TSYNC` by the program needs that); each thread then
//! adds the rest of its own chain, oldest first.

use ckpt_image::seccomp::{MODE_FILTER, MODE_STRICT, Seccomp};
use ckpt_image::task::Core;
use ckpt_parasite::Tracee;
use ckpt_parasite::remote::Remote;

use crate::error::{RestoreError, Result};

/// `SECCOMP_SET_MODE_STRICT`.
const SET_MODE_STRICT: u64 = 0;
/// `SECCOMP_SET_MODE_FILTER`.
const SET_MODE_FILTER: u64 = 1;
/// Size of `struct sock_fprog` (u16 length, padding, pointer).
const SOCK_FPROG_LEN: usize = 16;

/// What the leader installed before cloning the threads.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shared {
    /// Number of the oldest filters every thread has in common.
    filters: usize,
}

fn every_thread(core: &Core) -> impl Iterator<Item = Option<&Seccomp>> {
    std::iter::once(core.seccomp.as_ref()).chain(core.threads.iter().map(|t| t.seccomp.as_ref()))
}

/// In the leader, before its threads are cloned: suspends seccomp for the
/// process if any thread has it and installs the filters all threads
/// share.
pub fn install_shared(r: &Remote<'_>, core: &Core) -> Result<Shared> {
    if every_thread(core).all(|s| s.is_none()) {
        return Ok(Shared::default());
    }
    r.t.suspend_seccomp().map_err(|e| RestoreError::Host {
        pid: core.pid,
        what: format!("restoring seccomp needs PTRACE_O_SUSPEND_SECCOMP (CAP_SYS_ADMIN): {e}"),
    })?;
    let chains: Option<Vec<&[u32]>> = every_thread(core)
        .map(|s| s.filter(|s| s.mode == MODE_FILTER).map(|s| &s.filters[..]))
        .collect();
    let Some(chains) = chains else {
        return Ok(Shared::default());
    };
    let first = chains[0];
    let filters = (0..first.len())
        .take_while(|&i| chains.iter().all(|c| c.get(i) == Some(&first[i])))
        .count();
    install_filters(r, core, &first[..filters])?;
    Ok(Shared { filters })
}

/// In the leader and in each of `threads` (after they are cloned, before
/// the credentials drop): the rest of each thread's chain, or strict mode.
pub fn install_own(r: &Remote<'_>, threads: &[Tracee], core: &Core, shared: Shared) -> Result<()> {
    install_thread(r, core, core.seccomp.as_ref(), shared)?;
    for (t, tc) in threads.iter().zip(&core.threads) {
        let tr = Remote { t, base: r.base };
        install_thread(&tr, core, tc.seccomp.as_ref(), shared)?;
    }
    Ok(())
}

fn install_thread(r: &Remote<'_>, core: &Core, s: Option<&Seccomp>, shared: Shared) -> Result<()> {
    match s {
        None => Ok(()),
        Some(s) if s.mode == MODE_STRICT => {
            r.call(
                "seccomp(SECCOMP_SET_MODE_STRICT)",
                libc::SYS_seccomp,
                [SET_MODE_STRICT, 0, 0, 0, 0, 0],
            )?;
            Ok(())
        }
        Some(s) => install_filters(r, core, &s.filters[shared.filters.min(s.filters.len())..]),
    }
}

/// Installs `chain` (indexes into the validated filter table), oldest
/// first, from a temporary mapping: a filter may be up to 32 KiB, more
/// than the scratch area holds.
fn install_filters(r: &Remote<'_>, core: &Core, chain: &[u32]) -> Result<()> {
    let Some(longest) = chain
        .iter()
        .map(|&i| core.seccomp_filters[i as usize].insns.len())
        .max()
    else {
        return Ok(());
    };
    let len = (SOCK_FPROG_LEN + longest).next_multiple_of(ckpt_image::PAGE_SIZE as usize) as u64;
    let at = r.call(
        "mmap (seccomp filter)",
        libc::SYS_mmap,
        [
            0,
            len,
            (libc::PROT_READ | libc::PROT_WRITE) as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
            u64::MAX,
            0,
        ],
    )?;
    let installed = (|| {
        for &i in chain {
            let f = &core.seccomp_filters[i as usize];
            let prog = at + SOCK_FPROG_LEN as u64;
            let mut fprog = (f.len_insns() as u64).to_le_bytes().to_vec();
            fprog.extend(prog.to_le_bytes());
            r.t.write_mem(at, &fprog)?;
            r.t.write_mem(prog, &f.insns)?;
            r.call(
                "seccomp(SECCOMP_SET_MODE_FILTER)",
                libc::SYS_seccomp,
                [SET_MODE_FILTER, f.flags, at, 0, 0, 0],
            )?;
        }
        Ok(())
    })();
    r.call(
        "munmap (seccomp filter)",
        libc::SYS_munmap,
        [at, len, 0, 0, 0, 0],
    )?;
    installed
}
