//! /proc/PID files and namespace files, opened again by the restored
//! process in its own /proc for the restored process they describe (the
//! same pid: every process of the tree exists, with its memory, before any
//! fd is restored), so what they read is about it and not the one dumped.
//! The pid must be a process of this checkpoint, whatever the image says,
//! and what was opened must be a file of /proc (or a namespace).

use ckpt_image::fd::File;
use ckpt_image::fd::proc::ProcFile;
use ckpt_parasite::remote::Remote;

use super::{Context, FileRestorer, reopen_flags};
use crate::error::{RestoreError, Result};

/// statfs(2) `f_type` of procfs.
const PROC_SUPER_MAGIC: i64 = 0x9fa0;
/// statfs(2) `f_type` of nsfs, where namespace files live.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// /proc/PID files and namespace files.
pub struct Proc;

impl FileRestorer for Proc {
    type Image = ProcFile;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &ProcFile,
        fd: i32,
    ) -> Result<i32> {
        let ours = cx
            .shared
            .images
            .manifest()
            .processes
            .iter()
            .any(|p| p.pid == image.pid);
        let name_ok = image.name.is_empty()
            || image
                .name
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        if !ours || !name_ok {
            return Err(cx.invalid(
                fd,
                &format!(
                    "{}: not a file of a process of this checkpoint",
                    image.path()
                ),
            ));
        }
        let pid = cx.pid();
        let path = image.path();
        let changed = |what: String| RestoreError::fd_changed(pid, fd, &path, what);
        // A namespace file is a magic link of /proc, followed; no other
        // component of /proc/PID/NAME can be a link the user made.
        let flags = if image.is_namespace() {
            reopen_flags(file)
        } else {
            reopen_flags(file) | libc::O_NOFOLLOW
        };
        let got = r
            .open(&path, flags, 0)
            .map_err(|e| changed(super::reg::reopen_failure(e, "", cx.fs_uid())))?;
        let want = if image.is_namespace() {
            NSFS_MAGIC
        } else {
            PROC_SUPER_MAGIC
        };
        let opened = format!("/proc/{pid}/fd/{got}");
        let wrong = match nix::sys::statfs::statfs(opened.as_str()) {
            Ok(fs) if fs.filesystem_type().0 == want => None,
            Ok(_) => Some("what that path opens now is not a file of /proc".to_string()),
            Err(e) => Some(format!("cannot stat the reopened file: {e}")),
        };
        if let Some(what) = wrong {
            let _ = r.close(got);
            return Err(changed(what));
        }
        // Where it was read to, as far as the new contents go.
        if file.pos > 0 && !image.is_namespace() {
            r.call(
                "lseek",
                libc::SYS_lseek,
                [got as u64, file.pos as u64, libc::SEEK_SET as u64, 0, 0, 0],
            )?;
        }
        Ok(got)
    }
}
