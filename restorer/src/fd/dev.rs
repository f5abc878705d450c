//! Stateless character devices, reopened by path.

use ckpt_image::fd::File;
use ckpt_image::fd::dev::DevFile;

use super::{Context, FileRestorer, reopen_flags};
use crate::error::Result;
use ckpt_parasite::remote::Remote;

/// `/dev/null`, `zero`, `full`, `random`, `urandom`.
pub struct Dev;

impl FileRestorer for Dev {
    type Image = DevFile;

    fn open(
        &self,
        _cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &DevFile,
        _fd: i32,
    ) -> Result<i32> {
        Ok(r.open(&image.path, reopen_flags(file), 0)?)
    }
}
