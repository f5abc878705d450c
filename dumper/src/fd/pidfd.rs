//! pidfds: the process they refer to (`Pid:` of `/proc/PID/fdinfo`), which
//! must be a process of the tree or an unreaped (zombie) child of one
//! (restored with the same pid, then opened again with `pidfd_open`), or
//! one already reaped (`Pid: -1`: it refers to no process any more, and
//! comes back as a pidfd of another process that exited and was reaped).
//! A pidfd of a process outside the tree or in another pid namespace
//! (`Pid: 0`) is refused by name.

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::pidfd::PidfdFile;

use super::{Blobs, FdParams, FileDumper, TreeFiles};
use crate::error::{Blocker, DumpError, Result};
use crate::procfile;

/// `anon_inode:[pidfd]`.
pub struct Pidfd;

/// What fdinfo's `Pid:` says of a process that has exited and was reaped.
const REAPED: i32 = -1;
/// What fdinfo's `Pid:` says of a process outside the reader's pid
/// namespace.
const OTHER_NAMESPACE: i32 = 0;

impl FileDumper for Pidfd {
    fn name(&self) -> &'static str {
        "pidfd"
    }

    fn description(&self) -> &'static str {
        "pidfds of processes of the tree, with PIDFD_NONBLOCK and PIDFD_THREAD, and of processes already reaped"
    }

    fn claims(&self, p: &FdParams) -> bool {
        p.link == "anon_inode:[pidfd]"
    }

    fn collect(&self, p: &FdParams, _file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        let field = p.info_field("Pid")?;
        let pid: i32 = field.trim().parse().map_err(|_| DumpError::Parse {
            pid: p.pid,
            path: format!("fdinfo/{}", p.fd),
            what: format!("Pid: {field} is not a number"),
        })?;
        match pid {
            REAPED => Ok(Kind::Pidfd(PidfdFile {
                pid: 0,
                reaped: true,
            })),
            OTHER_NAMESPACE => Err(p.unsupported("pidfd of a process in another pid namespace")),
            pid => Ok(Kind::Pidfd(PidfdFile { pid, reaped: false })),
        }
    }

    fn check_tree(&self, tree: &TreeFiles) -> Result<()> {
        let mut refused = Vec::new();
        for h in tree.holders() {
            let Some(Kind::Pidfd(pf)) = &tree.file(h.file_id).kind else {
                continue;
            };
            if pf.reaped {
                continue;
            }
            let live = tree.tables.iter().any(|(pid, _)| *pid == pf.pid);
            if !live && !zombie_child_of(tree, pf.pid) {
                refused.push(Blocker {
                    pid: h.pid,
                    what: format!(
                        "fd {}: pidfd of pid {}, which is not a process (or unreaped child) of the dumped tree",
                        h.fd, pf.pid
                    ),
                });
            }
        }
        if refused.is_empty() {
            Ok(())
        } else {
            Err(DumpError::Blocked { blockers: refused })
        }
    }
}

/// `pid` is a zombie whose parent is in the tree: the dump records it (its
/// parent has not reaped it, and cannot while frozen) and restore makes it
/// again before any fd is restored.
fn zombie_child_of(tree: &TreeFiles, pid: i32) -> bool {
    let Ok(status) = procfile::read(pid, "status") else {
        return false;
    };
    let zombie = procfile::status_field(&status, "State").is_some_and(|s| s.starts_with('Z'));
    let ppid = procfile::status_field(&status, "PPid").and_then(|p| p.trim().parse::<i32>().ok());
    zombie && ppid.is_some_and(|pp| tree.tables.iter().any(|(p, _)| *p == pp))
}
