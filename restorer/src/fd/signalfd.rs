//! signalfd objects, created inside the process with their signal mask.

use ckpt_image::fd::File;
use ckpt_image::fd::signalfd::SignalfdFile;

use super::{Context, FileRestorer};
use crate::error::Result;
use ckpt_parasite::remote::Remote;

/// signalfds.
pub struct Signalfd;

/// Size of the kernel's sigset_t, which `signalfd4` checks.
const KERNEL_SIGSET_SIZE: u64 = 8;

/// `signalfd4`'s fd argument asking for a new signalfd.
const NEW_SIGNALFD: i64 = -1;

/// Argument slot of the scratch area for the mask.
const SLOT_MASK: u64 = 0;

impl FileRestorer for Signalfd {
    type Image = SignalfdFile;

    fn open(
        &self,
        _cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &SignalfdFile,
        _fd: i32,
    ) -> Result<i32> {
        let flags = libc::SFD_CLOEXEC | (file.flags as i32 & libc::SFD_NONBLOCK);
        let mask = r.put(SLOT_MASK, &image.sigmask.to_ne_bytes())?;
        let got = r.call(
            "signalfd4",
            libc::SYS_signalfd4,
            [
                NEW_SIGNALFD as u64,
                mask,
                KERNEL_SIGSET_SIZE,
                flags as u64,
                0,
                0,
            ],
        )? as i32;
        Ok(got)
    }
}
