//! A process's membarrier registrations (`membarrier(2)`): the expedited
//! commands it registered for, without which the matching barrier fails
//! with EPERM. They belong to the address space and have no /proc file:
//! asked inside the process (`MEMBARRIER_CMD_GET_REGISTRATIONS`, 6.3+).

use ckpt_parasite::ParasiteError;

use crate::error::Result;

/// The `MEMBARRIER_CMD_REGISTER_*` bits the process registered, from the
/// answer the parasite's collection command got (`ret`).
pub fn registrations(pid: i32, ret: i64) -> Result<u32> {
    match ckpt_parasite::check_ret(pid, "membarrier(MEMBARRIER_CMD_GET_REGISTRATIONS)", ret) {
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
