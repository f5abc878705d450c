//! memfds held by fds. The memfd is the shared memory object the restorer
//! created for its mappings (`crate::shmem`), or creates now: the process
//! takes the restorer's fd of it (`pidfd_getfd`) and reopens that through
//! `/proc/self/fd/N` with the dumped access mode and status flags (a
//! magic link, so without O_NOFOLLOW; the permission check is the
//! process's own, with its filesystem identity), so its description is its
//! own, with its own offset, as at dump time. Seals come last, once every
//! process is rebuilt.

use ckpt_image::fd::File;
use ckpt_image::fd::memfd::MemfdFile;

use super::{Context, FileRestorer, reopen_flags, take_from};
use crate::error::Result;
use ckpt_parasite::remote::Remote;

/// memfds.
pub struct Memfd;

impl FileRestorer for Memfd {
    type Image = MemfdFile;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &MemfdFile,
        fd: i32,
    ) -> Result<i32> {
        if !cx.shared.shmem.has(image.shmem_id) {
            return Err(cx.invalid(fd, &format!("no shared memory object {}", image.shmem_id)));
        }
        let images = cx.shared.images;
        let mine = cx.shared.shmem.fd(images, image.shmem_id, true, None)?;
        let taken = take_from(r, std::process::id() as i32, mine)?;
        let opened = r.open(&format!("/proc/self/fd/{taken}"), reopen_flags(file), 0);
        r.close(taken)?;
        let got = opened?;
        r.call(
            "lseek",
            libc::SYS_lseek,
            [got as u64, file.pos as u64, libc::SEEK_SET as u64, 0, 0, 0],
        )?;
        Ok(got)
    }
}
