//! Terminals, by the terminal rule: fd 0, 1 or 2 is connected to whatever
//! `ckpt restore`'s own fd of that number is (the process inherited the
//! restorer's table), so the program's output appears where restore runs;
//! any other number only if the user passed it with `--inherit-fd N`, and
//! 0-2 of a restorer of another user only if they are streams or the
//! process's user's files (`Context::foreign_stdio`). Else,
//! or if the restorer has no fd N, `/dev/null`: the restorer's other fds
//! (its images, whatever root had open when it ran it) never reach the
//! process. This holds for every fd even when several shared one
//! description at dump time (0, 1 and 2 usually do).

use ckpt_image::fd::File;
use ckpt_image::fd::tty::TtyFile;

use super::{BoundKind, Context, FileRestorer};
use crate::error::Result;
use ckpt_parasite::remote::Remote;

/// Terminals.
pub struct Tty;

impl FileRestorer for Tty {
    type Image = TtyFile;
    const PER_FD: bool = true;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        _image: &TtyFile,
        fd: i32,
    ) -> Result<i32> {
        cx.bind_to_restorer(r, file, fd, BoundKind::Terminal)
    }
}
