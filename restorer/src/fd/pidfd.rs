//! pidfds, opened again inside the process with `pidfd_open` on the same
//! pid: every process of the tree, zombies included, is forked with its
//! dumped pid before any fd is restored, so the target exists. The pid must
//! be a process of this checkpoint, whatever the image says. A pidfd of a
//! process already reaped refers to no process: it comes back as a pidfd
//! of a child the restorer makes, which exits and is reaped at once, handed
//! to the process (readable, nothing to wait for, no one to signal, as
//! before). PIDFD_THREAD is not kept for it: it means nothing once the
//! process is gone.

use std::os::fd::AsRawFd;

use ckpt_image::fd::File;
use ckpt_image::fd::pidfd::PidfdFile;

use super::{Context, FileRestorer};
use crate::error::Result;
use ckpt_parasite::remote::Remote;

/// pidfds.
pub struct Pidfd;

/// The `pidfd_open` flags that are file flags of the pidfd:
/// PIDFD_NONBLOCK (O_NONBLOCK) and PIDFD_THREAD (O_EXCL).
const PIDFD_FLAGS: u32 = (libc::O_NONBLOCK | libc::O_EXCL) as u32;

impl FileRestorer for Pidfd {
    type Image = PidfdFile;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &PidfdFile,
        fd: i32,
    ) -> Result<i32> {
        if image.reaped {
            let nonblock = file.flags & libc::O_NONBLOCK as u32 != 0;
            let mine = crate::sys::reaped_pidfd(nonblock).map_err(|e| {
                crate::error::RestoreError::os(cx.pid(), format!("fd {fd}: a reaped pidfd"), e)
            })?;
            return super::take_from(r, std::process::id() as i32, mine.as_raw_fd());
        }
        let ours = cx
            .shared
            .images
            .manifest()
            .processes
            .iter()
            .any(|p| p.pid == image.pid);
        if !ours {
            return Err(cx.invalid(
                fd,
                &format!(
                    "pidfd of pid {}, not a process of this checkpoint",
                    image.pid
                ),
            ));
        }
        let got = r.call(
            "pidfd_open",
            libc::SYS_pidfd_open,
            [
                image.pid as u64,
                u64::from(file.flags & PIDFD_FLAGS),
                0,
                0,
                0,
                0,
            ],
        )?;
        Ok(got as i32)
    }
}
