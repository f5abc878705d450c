//! Open files declared external at dump time: the process gets the
//! restorer's fd the user named for the key (`--inherit-fd fd[N]:KEY`),
//! taken with `pidfd_getfd` like a pipe end, so it shares that description.

use ckpt_image::fd::File;
use ckpt_image::fd::external::ExternalFile;

use super::{Context, FileRestorer, take_from};
use crate::error::{RestoreError, Result};
use ckpt_parasite::remote::Remote;

/// Files handed over by the user.
pub struct External;

impl FileRestorer for External {
    type Image = ExternalFile;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        _file: &File,
        image: &ExternalFile,
        fd: i32,
    ) -> Result<i32> {
        let pid = cx.pid();
        let Some(mine) = cx.external_fd(&image.key) else {
            return Err(RestoreError::Host {
                pid,
                what: format!(
                    "fd {fd}: external {key} needs an fd for it: ckpt restore --inherit-fd fd[N]:{key}",
                    key = image.key
                ),
            });
        };
        // The user named the fd; it must be one this command really has.
        if std::fs::symlink_metadata(format!("/proc/self/fd/{mine}")).is_err() {
            return Err(RestoreError::Host {
                pid,
                what: format!(
                    "fd {fd}: --inherit-fd fd[{mine}]:{}: ckpt restore has no fd {mine}",
                    image.key
                ),
            });
        }
        take_from(r, std::process::id() as i32, mine)
    }
}
