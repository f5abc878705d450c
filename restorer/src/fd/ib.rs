//! InfiniBand verbs descriptors: a placeholder on each number until the
//! process's verbs layer, recreating its resources (`crate::ib`), puts
//! the new device's descriptors there.

use ckpt_image::fd::File;
use ckpt_image::fd::ib::IbFile;

use super::{Context, FileRestorer};
use crate::error::Result;
use ckpt_parasite::remote::Remote;

/// Verbs descriptors.
pub struct Ib;

impl FileRestorer for Ib {
    type Image = IbFile;

    fn open(
        &self,
        _cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        _file: &File,
        _image: &IbFile,
        _fd: i32,
    ) -> Result<i32> {
        // Readable by anyone and harmless if the layer never replaces it.
        Ok(r.open("/dev/null", libc::O_RDONLY | libc::O_CLOEXEC, 0)?)
    }
}
