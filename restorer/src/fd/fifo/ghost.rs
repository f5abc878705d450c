//! FIFOs unlinked while open. The first description restored makes the
//! FIFO again, by the rules of `fd/create.rs` (mode 0600 until the
//! recorded owner is set, the mode last): the process itself (with its filesystem identity) makes a
//! FIFO at a new name in the directory the FIFO was in, opened without
//! following a link, opens it without following a link, checks it is the
//! FIFO it made (a FIFO of its own user, one link), and unlinks the name.
//! The restorer keeps a copy of that description; every other
//! description of the same FIFO, in any process, is opened from it
//! through `/proc/self/fd` of a copy lent to the process, never by a
//! path.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::File;
use ckpt_image::fd::fifo::FifoFile;
use ckpt_parasite::remote::Remote;

use super::{ACCESS_MODE, Settle, finish};
use crate::error::{RestoreError, Result};
use crate::fd::{Context, take_from};
use crate::identity::PERMISSION_BITS;
use crate::sys;

/// The FIFOs made again, by data image (one per FIFO): the restorer's copy
/// of the first description.
#[derive(Default)]
struct Made(HashMap<String, OwnedFd>);

/// Names tried before giving up (another file already at each).
const NAME_TRIES: u32 = 16;

/// Opens one description of the unlinked FIFO `image` in the process.
pub(super) fn open(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    file: &File,
    image: &FifoFile,
    fd: i32,
) -> Result<i32> {
    let dumped_access = file.flags as i32 & ACCESS_MODE;
    let first_access = if dumped_access == libc::O_RDONLY {
        libc::O_RDONLY
    } else {
        libc::O_RDWR
    };
    let made = cx
        .state::<Made>()
        .0
        .get(&image.data)
        .map(AsRawFd::as_raw_fd);
    let got = match made {
        Some(copy) => reopen(r, copy, first_access)?,
        None => make(cx, r, image, first_access)?,
    };
    finish(cx, r, file, image, got, dumped_access).map_err(|e| match e {
        Settle::Mismatch(what) => RestoreError::fd_changed(cx.pid(), fd, &image.path, what),
        Settle::Failed(e) => e,
    })
}

/// A new description of a FIFO made already, opened by the process from
/// the restorer's copy `copy`.
fn reopen(r: &Remote<'_>, copy: i32, access: i32) -> Result<i32> {
    let lent = take_from(r, std::process::id() as i32, copy)?;
    let got = r.open(
        &format!("/proc/self/fd/{lent}"),
        access | libc::O_NONBLOCK | libc::O_CLOEXEC,
        0,
    );
    r.close(lent)?;
    Ok(got?)
}

/// Makes the FIFO again at a new name in its directory, opens it with
/// `access`, gives it the recorded owner and mode, and unlinks the name.
fn make(cx: &mut Context<'_, '_>, r: &Remote<'_>, image: &FifoFile, access: i32) -> Result<i32> {
    let pid = cx.pid();
    let err = |what: String| RestoreError::File {
        pid,
        path: image.path.clone(),
        what: format!("FIFO unlinked while open: {what}"),
    };
    let p = std::path::Path::new(&image.path);
    let Some(parent) = p.parent().and_then(|d| d.to_str()) else {
        return Err(err("no directory to make it again in".into()));
    };
    let dir = r
        .open(
            parent,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        )
        .map_err(|e| err(format!("cannot open its directory: {e}")))?;
    let made = make_in(cx, r, image, dir, access, &err);
    let _ = r.close(dir);
    made
}

fn make_in(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    image: &FifoFile,
    dir: i32,
    access: i32,
    err: &dyn Fn(String) -> RestoreError,
) -> Result<i32> {
    let mut name = None;
    for i in 0..NAME_TRIES {
        let n = format!(".ckpt-fifo-{}-{}-{i}", std::process::id(), image.ino);
        let at = r.put_path(0, &n)?;
        match r.call(
            "mknodat (FIFO unlinked while open)",
            libc::SYS_mknodat,
            [dir as u64, at, u64::from(libc::S_IFIFO | 0o600), 0, 0, 0],
        ) {
            Ok(_) => {
                name = Some(n);
                break;
            }
            Err(ckpt_parasite::ParasiteError::RemoteSyscall {
                errno: nix::errno::Errno::EEXIST,
                ..
            }) => continue,
            Err(e) => return Err(err(format!("cannot make it again: {e}"))),
        }
    }
    let Some(name) = name else {
        return Err(err(format!(
            "cannot make it again: {NAME_TRIES} temporary names taken"
        )));
    };
    // Opened through the directory fd, the name itself never followed.
    let got = r.open(
        &format!("/proc/self/fd/{dir}/{name}"),
        access | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        0,
    );
    let at = r.put_path(0, &name)?;
    let unlinked = r.call(
        "unlinkat (FIFO unlinked while open)",
        libc::SYS_unlinkat,
        [dir as u64, at, 0, 0, 0, 0],
    );
    let got = got.map_err(|e| err(format!("cannot open the FIFO it made: {e}")))?;
    let checked = check_and_own(cx, got, image, err).and_then(|copy| {
        unlinked.map_err(|e| err(format!("cannot unlink the FIFO it made: {e}")))?;
        Ok(copy)
    });
    match checked {
        Ok(copy) => {
            cx.state::<Made>().0.insert(image.data.clone(), copy);
            Ok(got)
        }
        Err(e) => {
            let _ = r.close(got);
            Err(e)
        }
    }
}

/// Checks the process's fd `got` is the FIFO it just made (a FIFO of its
/// own filesystem user, no one else's swapped in), then gives it the
/// recorded owner, group and mode; returns the restorer's copy of it.
fn check_and_own(
    cx: &Context<'_, '_>,
    got: i32,
    image: &FifoFile,
    err: &dyn Fn(String) -> RestoreError,
) -> Result<OwnedFd> {
    let pid = cx.pid();
    let copy =
        sys::take_fd(pid, got).map_err(|e| RestoreError::os(pid, "pidfd_getfd (FIFO)", e))?;
    let exact = format!("/proc/self/fd/{}", copy.as_raw_fd());
    let meta = std::fs::metadata(&exact).map_err(|e| err(format!("cannot stat it: {e}")))?;
    let owner = cx.fs_uid().unwrap_or(0);
    if meta.mode() & libc::S_IFMT != libc::S_IFIFO || meta.uid() != owner {
        return Err(err(
            "the name made was replaced before it was opened (not the process's own FIFO)".into(),
        ));
    }
    if (meta.uid(), meta.gid()) != (image.uid, image.gid) {
        std::os::unix::fs::fchown(&copy, Some(image.uid), Some(image.gid))
            .map_err(|e| err(format!("cannot give it its owner: {e}")))?;
    }
    std::fs::set_permissions(
        &exact,
        std::os::unix::fs::PermissionsExt::from_mode(image.mode & PERMISSION_BITS),
    )
    .map_err(|e| err(format!("cannot set its mode: {e}")))?;
    Ok(copy)
}
