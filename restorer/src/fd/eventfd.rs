//! eventfd(2) objects, created inside the process with their counter and
//! mode.

use ckpt_image::fd::File;
use ckpt_image::fd::eventfd::EventfdFile;

use super::{Context, FileRestorer};
use crate::error::Result;
use ckpt_parasite::remote::Remote;

/// eventfds.
pub struct Eventfd;

/// `EFD_SEMAPHORE` (the other eventfd2 flags are O_NONBLOCK and O_CLOEXEC).
const EFD_SEMAPHORE: u64 = 1;

impl FileRestorer for Eventfd {
    type Image = EventfdFile;

    fn open(
        &self,
        _cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &EventfdFile,
        _fd: i32,
    ) -> Result<i32> {
        let mut flags = (libc::O_CLOEXEC | (file.flags as i32 & libc::O_NONBLOCK)) as u64;
        if image.semaphore {
            flags |= EFD_SEMAPHORE;
        }
        // eventfd2 takes an unsigned int; a larger counter is added by a
        // write of the whole 64-bit value.
        let initval = u32::try_from(image.count).unwrap_or(0);
        let got = r.call(
            "eventfd2",
            libc::SYS_eventfd2,
            [u64::from(initval), flags, 0, 0, 0, 0],
        )? as i32;
        if u64::from(initval) != image.count {
            let buf = r.put(0, &image.count.to_ne_bytes())?;
            r.call(
                "write (eventfd counter)",
                libc::SYS_write,
                [got as u64, buf, 8, 0, 0, 0],
            )?;
        }
        Ok(got)
    }
}
