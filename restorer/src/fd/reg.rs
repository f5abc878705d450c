//! Regular files and directories, reopened by path with their flags and
//! offset. An unlinked file is recreated from its ghost image next to the
//! original path, opened, and unlinked again.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use ckpt_image::fd::File;
use ckpt_image::fd::reg::RegFile;

use super::{Context, FileRestorer, reopen_flags};
use crate::error::{RestoreError, Result};
use ckpt_parasite::remote::Remote;

/// Regular files and directories.
pub struct Reg;

impl FileRestorer for Reg {
    type Image = RegFile;

    fn open(
        &self,
        cx: &mut Context<'_>,
        r: &Remote<'_>,
        file: &File,
        image: &RegFile,
        _fd: i32,
    ) -> Result<i32> {
        let mut flags = reopen_flags(file);
        if image.is_dir() {
            flags |= libc::O_DIRECTORY;
        }
        let got = match &image.ghost {
            None => r.open(&image.path, flags, 0)?,
            Some(ghost) => {
                let path = recreate_ghost(cx, image, ghost)?;
                let got = r.open(&path.display().to_string(), flags, 0);
                let _ = std::fs::remove_file(&path);
                cx.state::<GhostCleanup>().0.retain(|p| *p != path);
                got?
            }
        };
        r.call(
            "lseek",
            libc::SYS_lseek,
            [got as u64, file.pos as u64, libc::SEEK_SET as u64, 0, 0, 0],
        )?;
        Ok(got)
    }
}

/// Removes ghost files still linked if the restore fails halfway.
#[derive(Default)]
struct GhostCleanup(Vec<PathBuf>);

impl Drop for GhostCleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Writes the ghost image next to the original path and returns the path
/// the process should open.
fn recreate_ghost(cx: &mut Context<'_>, image: &RegFile, ghost: &str) -> Result<PathBuf> {
    let pid = cx.pid();
    let data = cx.images.read_raw(ghost)?;
    let mut path = PathBuf::from(&image.path);
    if path.symlink_metadata().is_ok() {
        path = PathBuf::from(format!("{}.ckpt-ghost.{}", image.path, std::process::id()));
    }
    let file_err = |what: String| RestoreError::File {
        pid,
        path: path.display().to_string(),
        what,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(image.mode & 0o7777)
        .open(&path)
        .map_err(|err| file_err(format!("cannot recreate unlinked file: {err}")))?;
    cx.state::<GhostCleanup>().0.push(path.clone());
    f.write_all(&data)
        .map_err(|err| file_err(format!("cannot write unlinked file's contents: {err}")))?;
    Ok(path)
}
