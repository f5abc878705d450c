//! Pipes whose both ends are in the dumped tree. The data buffered in a
//! pipe is copied without consuming it: ckpt opens another read end through
//! `/proc/PID/fd/N`, `tee`s the buffer into a pipe of its own and reads that.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

use ckpt_image::files::{FdEntry, FdKind, Files, PipeData, Pipes};
use nix::fcntl::{FcntlArg, SpliceFFlags, fcntl, tee};

use super::FdParams;
use crate::error::{DumpError, Result};
use crate::procfile;

/// Describes one end of a pipe.
pub fn dump_pipe(p: &FdParams) -> FdEntry {
    let mut e = p.entry(FdKind::Pipe);
    e.pipe_id = p.meta.ino();
    e
}

/// Checks every pipe of the tree has both ends in it and saves what is
/// buffered in each. `procs` is in tree order.
pub fn collect(procs: &[(i32, &Files)]) -> Result<Pipes> {
    // pipe id -> (first (pid, fd) seen, has a read end, has a write end)
    let mut seen: BTreeMap<u64, ((i32, i32), bool, bool)> = BTreeMap::new();
    for (pid, files) in procs {
        for e in files.fds.iter().filter(|e| e.kind == FdKind::Pipe as i32) {
            let writes = e.flags & libc::O_ACCMODE as u32 == libc::O_WRONLY as u32;
            let entry = seen
                .entry(e.pipe_id)
                .or_insert(((*pid, e.fd), false, false));
            if writes {
                entry.2 = true;
            } else {
                entry.1 = true;
            }
        }
    }
    let mut out = Pipes::default();
    for (id, ((pid, fd), reads, writes)) in seen {
        if !(reads && writes) {
            return Err(DumpError::Unsupported {
                pid,
                what: format!(
                    "fd {fd}: pipe whose other end is outside the dumped tree (dump the process at the other end too)"
                ),
            });
        }
        out.pipes.push(read_buffered(pid, fd, id)?);
    }
    Ok(out)
}

fn read_buffered(pid: i32, fd: i32, id: u64) -> Result<PipeData> {
    let link = procfile::path(pid, &format!("fd/{fd}"));
    let err = |what: &str, e: std::io::Error| DumpError::Proc {
        pid,
        path: format!("{} ({what})", link.display()).into(),
        source: e,
    };
    let src = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&link)
        .map_err(|e| err("reopen pipe", e))?;
    let size =
        fcntl(src.as_fd(), FcntlArg::F_GETPIPE_SZ).map_err(|e| err("F_GETPIPE_SZ", e.into()))?;
    let (mut rd, wr) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
            .map_err(|e| err("pipe2", e.into()))
            .map(|(r, w)| (std::fs::File::from(r), w))?;
    fcntl(wr.as_fd(), FcntlArg::F_SETPIPE_SZ(size)).map_err(|e| err("F_SETPIPE_SZ", e.into()))?;
    let copied = match tee(
        src.as_fd(),
        wr.as_fd(),
        size as usize,
        SpliceFFlags::SPLICE_F_NONBLOCK,
    ) {
        Ok(n) => n,
        // Nothing buffered.
        Err(nix::errno::Errno::EAGAIN) => 0,
        Err(e) => return Err(err("tee", e.into())),
    };
    drop(wr);
    let mut data = Vec::with_capacity(copied);
    rd.read_to_end(&mut data).map_err(|e| err("read copy", e))?;
    Ok(PipeData {
        id,
        size: size as u32,
        data,
    })
}
