//! Pipes: the restorer creates each pipe of the tree itself the first time
//! an end is needed, refills the data that was buffered in it, and every
//! process that owned an end takes that end from the restorer with
//! `pidfd_getfd` (run inside it). The restorer's copies close when the
//! restore ends. A stdio pipe to outside the tree is kept when the
//! process outside that held it still does (and no new launcher gave
//! restore a stream of its own for that fd), else follows the terminal
//! rule ([`StdioPipe`]).

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
/// 2. If the process outside that held the pipe at dump time still lives
/// and holds it (a child of make reading its parent's pipe, restored while
/// make waits), the fd is that very pipe again, data and all, unless the
/// restorer's own fd of that number is a pipe or socket (a new launcher's,
/// which takes the old one's place) or the user handed that fd over
/// (`--inherit-fd`). Else, by the terminal rule, each such fd is the
/// restorer's own fd of its number, or `/dev/null` if the restorer has
/// none. Nothing was saved of their data.
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
        image: &PipeFile,
        fd: i32,
    ) -> Result<i32> {
        if cx.launcher_gave(fd) {
            return cx.bind_to_restorer(r, file, fd, BoundKind::StdioPipe);
        }
        let Some((peer_fd, pipe)) = reopen_from_peer(image, file, cx.fs_uid()) else {
            return cx.bind_to_restorer(r, file, fd, BoundKind::StdioPipe);
        };
        let got = take_from(r, std::process::id() as i32, pipe.as_raw_fd())?;
        set_status_flags(r, got, file.flags)?;
        (cx.shared.options.notice)(&format!(
            "pid {} fd {fd}: pipe to outside the tree kept: pid {} still holds it (its fd {peer_fd}), so it is not bound to this command's fd {fd}",
            cx.pid, image.peer_pid
        ));
        Ok(got)
    }
}

/// The pipe of `image` opened anew through the fd of the process outside
/// the tree that held it at dump time, if that process (same pid, same
/// start time) still holds it: its fd number and the restorer's new
/// description, with `file`'s access mode. Opening `/proc/PID/fd/N` of a
/// pipe gives a new description of the same pipe, either end. Only a
/// peer of the process's own user (`uid`; any for root) lends it: the
/// restorer opens it with its own rights, which a user's restore must not
/// extend to another user's process.
fn reopen_from_peer(image: &PipeFile, file: &File, uid: Option<u32>) -> Option<(i32, OsFile)> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let pid = image.peer_pid;
    if pid <= 0 {
        return None;
    }
    let peer_uid = std::fs::metadata(format!("/proc/{pid}")).ok()?.uid();
    if !matches!(uid, Some(u) if u == 0 || u == peer_uid) {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 of proc(5), the 20th after the command name.
    let start: u64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    if start != image.peer_start_time {
        return None;
    }
    let name = format!("pipe:[{}]", image.pipe_id);
    let peer_fd = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == name.as_str()))?
        .file_name()
        .to_str()?
        .parse::<i32>()
        .ok()?;
    let access = file.flags as i32 & libc::O_ACCMODE;
    std::fs::OpenOptions::new()
        .read(access != libc::O_WRONLY)
        .write(access != libc::O_RDONLY)
        // Never wait for a peer here: with none, the terminal rule applies.
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(format!("/proc/{pid}/fd/{peer_fd}"))
        .ok()
        .map(|f| (peer_fd, f))
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
