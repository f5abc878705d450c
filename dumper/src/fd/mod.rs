//! The fd table: walks `/proc/PID/fd`, asks each kind's module to describe
//! its fds, and refuses (naming pid, fd and kind) anything not supported.

mod dev;
pub mod pipe;
mod reg;

use std::os::unix::fs::MetadataExt;

use ckpt_image::files::{FdEntry, FdKind, Files};

use crate::error::{DumpError, Result};
use crate::procfile;
use crate::sys;

/// Contents of an unlinked file to be written as a ghost image.
pub struct Ghost {
    /// Image file name.
    pub name: String,
    /// The file's bytes.
    pub data: Vec<u8>,
}

/// What an fd's `/proc` entries say about it.
pub struct FdParams {
    /// The process.
    pub pid: i32,
    /// The fd number.
    pub fd: i32,
    /// `readlink /proc/PID/fd/N`.
    pub link: String,
    /// `stat /proc/PID/fd/N` (the open file itself).
    pub meta: std::fs::Metadata,
    /// `flags:` of fdinfo (octal open flags, O_CLOEXEC included).
    pub flags: u32,
    /// `pos:` of fdinfo.
    pub pos: i64,
}

impl FdParams {
    /// An "unsupported" error for this fd.
    pub fn unsupported(&self, kind: &str) -> DumpError {
        DumpError::Unsupported {
            pid: self.pid,
            what: format!("fd {}: {kind}", self.fd),
        }
    }

    fn entry(&self, kind: FdKind) -> FdEntry {
        FdEntry {
            fd: self.fd,
            kind: kind as i32,
            path: self.link.clone(),
            flags: self.flags & !(libc::O_CLOEXEC as u32),
            cloexec: self.flags & libc::O_CLOEXEC as u32 != 0,
            pos: self.pos,
            mode: self.meta.mode(),
            ghost: String::new(),
            description: self.fd as u64,
            size: self.meta.size(),
            owner_pid: 0,
            pipe_id: 0,
        }
    }
}

/// Collects the fd table of a frozen process; unlinked files' contents go
/// to `ghosts`.
pub fn collect(pid: i32, ghosts: &mut Vec<Ghost>) -> Result<Files> {
    let dir = procfile::path(pid, "fd");
    let mut fds: Vec<i32> = std::fs::read_dir(&dir)
        .map_err(|s| procfile::proc_err(pid, dir.clone(), s))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    let mut out = Files::default();
    for fd in fds {
        let p = params(pid, fd)?;
        let entry = if p.link.starts_with("anon_inode:") {
            let kind = p.link.trim_start_matches("anon_inode:");
            return Err(p.unsupported(kind.trim_matches(|c| c == '[' || c == ']')));
        } else {
            match p.meta.mode() & libc::S_IFMT {
                libc::S_IFREG => reg::dump_regular(&p, ghosts)?,
                libc::S_IFDIR => p.entry(FdKind::Directory),
                libc::S_IFCHR => dev::dump_char(&p)?,
                libc::S_IFIFO if p.link.starts_with("pipe:") => pipe::dump_pipe(&p),
                libc::S_IFIFO => return Err(p.unsupported("named pipe (FIFO)")),
                libc::S_IFSOCK => return Err(p.unsupported("socket")),
                libc::S_IFBLK => return Err(p.unsupported("block device")),
                _ => return Err(p.unsupported(&format!("file type of {}", p.link))),
            }
        };
        out.fds.push(entry);
    }
    share_descriptions(pid, &mut out)?;
    Ok(out)
}

fn params(pid: i32, fd: i32) -> Result<FdParams> {
    let link = procfile::readlink(pid, &format!("fd/{fd}"))?;
    let lp = procfile::path(pid, &format!("fd/{fd}"));
    let meta = std::fs::metadata(&lp).map_err(|s| procfile::proc_err(pid, lp, s))?;
    let info = procfile::read(pid, &format!("fdinfo/{fd}"))?;
    let field = |k: &str| procfile::status_field(&info, k).unwrap_or("0").to_string();
    let bad = |what: &str| DumpError::Parse {
        pid,
        path: format!("fdinfo/{fd}"),
        what: what.into(),
    };
    Ok(FdParams {
        pid,
        fd,
        link,
        meta,
        flags: u32::from_str_radix(&field("flags"), 8).map_err(|_| bad("flags"))?,
        pos: field("pos").parse().map_err(|_| bad("pos"))?,
    })
}

/// Across a tree: marks fds of later processes (children) that share an
/// open file description with an fd of an earlier one (usually inherited
/// over fork), so restore takes it from that process instead of opening the
/// file again — which would split the shared offset. `procs` is in tree
/// order, parents first.
pub fn share_across(procs: &mut [(i32, &mut Files)]) -> Result<()> {
    for i in 1..procs.len() {
        let (earlier, rest) = procs.split_at_mut(i);
        let (pid, files) = &mut rest[0];
        for e in files.fds.iter_mut() {
            if e.description != e.fd as u64 || e.kind == FdKind::Tty as i32 {
                continue;
            }
            'owners: for (opid, ofiles) in earlier.iter() {
                for o in ofiles.fds.iter() {
                    // Only an fd that owns its description locally can be the source.
                    if o.owner_pid != 0 || o.path != e.path || o.kind != e.kind {
                        continue;
                    }
                    let same = sys::same_file_description_of(*opid, o.fd, *pid, e.fd).map_err(
                        |source| DumpError::Proc {
                            pid: *pid,
                            path: format!("kcmp pid {opid} fd {} / fd {}", o.fd, e.fd).into(),
                            source,
                        },
                    )?;
                    if same {
                        e.owner_pid = *opid;
                        e.description = o.description;
                        e.ghost.clear();
                        break 'owners;
                    }
                }
            }
        }
        // Local dups of an fd that now comes from another process follow it.
        let moved: Vec<(u64, i32, u64)> = files
            .fds
            .iter()
            .filter(|e| e.owner_pid != 0)
            .map(|e| (e.fd as u64, e.owner_pid, e.description))
            .collect();
        for e in files.fds.iter_mut().filter(|e| e.owner_pid == 0) {
            if let Some((_, owner, desc)) = moved
                .iter()
                .find(|m| m.0 == e.description && e.description != e.fd as u64)
            {
                e.owner_pid = *owner;
                e.description = *desc;
                e.ghost.clear();
            }
        }
    }
    Ok(())
}

/// Marks fds that share one open file description (dup'ed), so restore
/// dups them instead of opening twice.
fn share_descriptions(pid: i32, files: &mut Files) -> Result<()> {
    for i in 0..files.fds.len() {
        for j in 0..i {
            let (a, b) = (&files.fds[j], &files.fds[i]);
            if a.description != a.fd as u64 || a.path != b.path || a.kind != b.kind {
                continue;
            }
            let same =
                sys::same_file_description(pid, a.fd, b.fd).map_err(|source| DumpError::Proc {
                    pid,
                    path: format!("kcmp fd {} fd {}", a.fd, b.fd).into(),
                    source,
                })?;
            if same {
                files.fds[i].description = files.fds[j].fd as u64;
                files.fds[i].ghost = files.fds[j].ghost.clone();
                break;
            }
        }
    }
    Ok(())
}
