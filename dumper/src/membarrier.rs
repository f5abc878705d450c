//! A process's membarrier registrations (`membarrier(2)`): the expedited
//! commands it registered for, without which the matching barrier fails
//! with EPERM. They belong to the address space and have no /proc file:
//! asked inside the process (`MEMBARRIER_CMD_GET_REGISTRATIONS`, 6.3+).

use ckpt_parasite::{Infection, ParasiteError};

use crate::error::Result;

/// `MEMBARRIER_CMD_GET_REGISTRATIONS`.
const CMD_GET_REGISTRATIONS: u64 = 1 << 9;

/// The `MEMBARRIER_CMD_REGISTER_*` bits the process registered.
pub fn ask(inf: &Infection<'_>) -> Result<u32> {
    match inf.syscall(
        "membarrier(MEMBARRIER_CMD_GET_REGISTRATIONS)",
        libc::SYS_membarrier,
        [CMD_GET_REGISTRATIONS, 0, 0, 0, 0, 0],
    ) {
        Ok(mask) => Ok(mask as u32),
        // A kernel without the command (before 6.3) or without membarrier:
        // no registration can be seen, and none is kept.
        Err(ParasiteError::RemoteSyscall {
            errno: nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS,
            ..
        }) => Ok(0),
        Err(e) => Err(e.into()),
    }
}
