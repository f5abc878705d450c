//! A process's membarrier registrations, made again inside it: the
//! expedited barriers it registered for work after the restore as before
//! (without the registration they fail with EPERM).

use ckpt_image::task::Core;
use ckpt_parasite::remote::Remote;

use crate::error::{RestoreError, Result};

/// The registration commands, in the order they are made again: each
/// `MEMBARRIER_CMD_REGISTER_*` bit is its own command.
const REGISTRATIONS: [(u32, &str); 4] = [
    (
        1 << 2,
        "membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED)",
    ),
    (
        1 << 4,
        "membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)",
    ),
    (
        1 << 6,
        "membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE)",
    ),
    (
        1 << 8,
        "membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ)",
    ),
];

/// Registers the process (the leader `r` stands for) for what the image
/// says it was registered.
pub fn restore(r: &Remote<'_>, core: &Core) -> Result<()> {
    let wanted = core.membarrier_registrations;
    let known = REGISTRATIONS.iter().fold(0, |m, (bit, _)| m | bit);
    if wanted & !known != 0 {
        return Err(RestoreError::Image(ckpt_image::ImageError::Invalid {
            path: ckpt_image::core_name(core.pid).into(),
            what: format!("membarrier registrations {wanted:#x}: unknown bits"),
        }));
    }
    for (bit, name) in REGISTRATIONS.iter().filter(|(bit, _)| wanted & bit != 0) {
        r.call(name, libc::SYS_membarrier, [u64::from(*bit), 0, 0, 0, 0, 0])?;
    }
    Ok(())
}
