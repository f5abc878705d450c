//! Pipes: the restorer creates each pipe of the tree itself the first time
//! an end is needed, refills the data that was buffered in it, and every
//! process that owned an end takes that end from the restorer with
//! `pidfd_getfd` (run inside it). The restorer's copies close when the
//! restore ends. A stdio pipe to outside the tree follows the terminal
//! rule instead ([`StdioPipe`]).

use std::collections::HashMap;
use std::fs::File as OsFile;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};

use ckpt_image::fd::File;
use ckpt_image::fd::pipe::PipeFile;
use nix::fcntl::{FcntlArg, OFlag, fcntl};

use super::{BoundKind, Context, FileRestorer, set_status_flags, take_from};
use crate::error::{RestoreError, Result};
use ckpt_parasite::remote::Remote;

/// Anonymous pipes.
pub struct Pipe;

/// The restorer's own ends of one pipe.
struct Ends {
    read: OsFile,
    write: OsFile,
}

/// Every pipe created so far, by pipe id.
#[derive(Default)]
struct PipeTable(HashMap<u64, Ends>);

impl FileRestorer for Pipe {
    type Image = PipeFile;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &PipeFile,
        fd: i32,
    ) -> Result<i32> {
        if !cx.state::<PipeTable>().0.contains_key(&image.pipe_id) {
            let ends = create(cx, image, fd)?;
            cx.state::<PipeTable>().0.insert(image.pipe_id, ends);
        }
        let ends = &cx.state::<PipeTable>().0[&image.pipe_id];
        let mine = if file.writable() {
            ends.write.as_raw_fd()
        } else {
            ends.read.as_raw_fd()
        };
        let got = take_from(r, std::process::id() as i32, mine)?;
        set_status_flags(r, got, file.flags)?;
        Ok(got)
    }
}

/// Pipes whose other end was outside the tree, held only as fds 0, 1 and
/// 2: by the terminal rule, each such fd is the restorer's own fd of its
/// number (so a new launcher's pipe takes the old one's place), or
/// `/dev/null` if the restorer has none. Nothing was saved of their data.
pub struct StdioPipe;

impl FileRestorer for StdioPipe {
    type Image = PipeFile;
    // Per fd number, like terminals: `2>&1` shared one description at dump
    // time, but the new launcher may give restore two.
    const PER_FD: bool = true;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        _image: &PipeFile,
        fd: i32,
    ) -> Result<i32> {
        cx.bind_to_restorer(r, file, fd, BoundKind::StdioPipe)
    }
}

/// Creates the pipe with its capacity and buffered data.
fn create(cx: &Context<'_, '_>, image: &PipeFile, fd: i32) -> Result<Ends> {
    let name = ckpt_image::pipe_data_name(image.pipe_id);
    let data = cx.shared.images.read_raw(&name)?;
    if data.len() as u64 > u64::from(image.capacity) {
        return Err(cx.invalid(
            fd,
            &format!(
                "{name} holds {} bytes, more than the pipe's capacity {}",
                data.len(),
                image.capacity
            ),
        ));
    }
    let me = std::process::id() as i32;
    let err = |what: &str, e: std::io::Error| RestoreError::os(me, format!("pipe: {what}"), e);
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| err("pipe2", e.into()))?;
    if image.capacity > 0 {
        fcntl(
            w.as_fd(),
            FcntlArg::F_SETPIPE_SZ(image.capacity as libc::c_int),
        )
        .map_err(|e| err("F_SETPIPE_SZ", e.into()))?;
    }
    let mut w = OsFile::from(w);
    // It fit in a pipe of this size before, so it fits again; never block.
    fcntl(w.as_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(|e| err("F_SETFL", e.into()))?;
    w.write_all(&data).map_err(|e| err("refill", e))?;
    Ok(Ends {
        read: OsFile::from(r),
        write: w,
    })
}
