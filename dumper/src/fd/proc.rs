//! Files and directories of /proc/PID (stat, maps, fd/, ...) and namespace files (`ns/net`,
//! read as `net:[INODE]`) of processes of the tree: saved as the process
//! and name they describe, to be opened again for the restored process.
//! One of a process that is gone, outside the tree, or seen through a
//! /proc of another pid namespace is refused by name.

use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::proc::ProcFile;

use super::{Blobs, FdParams, FileDumper, TreeFiles};
use crate::error::{Blocker, DumpError, Result};

/// statfs(2) `f_type` of procfs.
const PROC_SUPER_MAGIC: i64 = 0x9fa0;
/// statfs(2) `f_type` of nsfs, where namespace files live.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// /proc/PID files and namespace files.
pub struct Proc;

impl FileDumper for Proc {
    fn name(&self) -> &'static str {
        "proc"
    }

    fn description(&self) -> &'static str {
        "files and directories of /proc/PID and namespace files (/proc/PID/ns/*) of processes of the tree, opened again for the restored process"
    }

    fn claims(&self, p: &FdParams) -> bool {
        // Files and directories (/proc/PID, /proc/PID/fd); an O_PATH fd
        // of /proc is `reg`'s.
        let kind = p.meta.mode() & libc::S_IFMT;
        if p.is_o_path() || (kind != libc::S_IFREG && kind != libc::S_IFDIR) {
            return false;
        }
        // Files of /proc that describe no process (meminfo, sys/...)
        // stay `reg`'s, reopened by path.
        match filesystem(p) {
            Some(PROC_SUPER_MAGIC) => proc_path(&p.link).is_some(),
            Some(NSFS_MAGIC) => kind == libc::S_IFREG,
            _ => false,
        }
    }

    fn collect(&self, p: &FdParams, _file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        if filesystem(p) == Some(NSFS_MAGIC) {
            return namespace_file(p);
        }
        let Some((pid, name)) = proc_path(&p.link) else {
            return Err(p.unsupported(&format!("{}: a /proc file of no process", p.link)));
        };
        // The path's pid is this /proc's: the file must be what ckpt's own
        // /proc names so, or it was opened through a /proc of another pid
        // namespace, or its process is gone (and the pid maybe reused).
        let same = std::fs::metadata(&p.link)
            .is_ok_and(|m| (m.dev(), m.ino()) == (p.meta.dev(), p.meta.ino()));
        if !same {
            let why = if std::path::Path::new(&format!("/proc/{pid}")).exists() {
                format!(
                    "not the file that path names now (a /proc of another pid namespace, \
                     or process {pid} is gone and its pid reused)"
                )
            } else {
                format!("process {pid} is gone")
            };
            return Err(p.unsupported(&format!("{}: {why}", p.link)));
        }
        Ok(Kind::Proc(ProcFile {
            pid,
            name: name.to_string(),
        }))
    }

    fn check_tree(&self, tree: &TreeFiles) -> Result<()> {
        let mut refused = Vec::new();
        for h in tree.holders() {
            let Some(Kind::Proc(pf)) = &tree.file(h.file_id).kind else {
                continue;
            };
            if !tree.tables.iter().any(|(pid, _)| *pid == pf.pid) {
                refused.push(Blocker {
                    pid: h.pid,
                    what: format!(
                        "fd {}: {} describes pid {}, which is not a process of the dumped tree",
                        h.fd,
                        pf.path(),
                        pf.pid
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

/// statfs(2) `f_type` of the file behind the fd.
fn filesystem(p: &FdParams) -> Option<i64> {
    nix::sys::statfs::statfs(&p.proc_path())
        .ok()
        .map(|fs| fs.filesystem_type().0)
}

/// `/proc/PID/NAME` split into PID and NAME (empty for `/proc/PID`).
fn proc_path(link: &str) -> Option<(i32, &str)> {
    let rest = link.strip_prefix("/proc/")?;
    let (pid, name) = match rest.split_once('/') {
        None => (rest, ""),
        Some((_, "")) => return None,
        Some(split) => split,
    };
    let pid = pid.parse().ok().filter(|&pid: &i32| pid > 0)?;
    Some((pid, name))
}

/// A namespace file (`net:[4026531840]`) of a namespace the holder is in:
/// saved as its `/proc/PID/ns/TYPE`.
fn namespace_file(p: &FdParams) -> Result<Kind> {
    let Some(kind) = p
        .link
        .split_once(":[")
        .map(|(kind, _)| kind)
        .filter(|k| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
    else {
        return Err(p.unsupported(&format!("namespace file {}", p.link)));
    };
    let name = format!("ns/{kind}");
    let own = std::fs::metadata(format!("/proc/{}/{name}", p.pid))
        .is_ok_and(|m| (m.dev(), m.ino()) == (p.meta.dev(), p.meta.ino()));
    if !own {
        return Err(p.unsupported(&format!(
            "namespace file {} of a namespace the process is not in",
            p.link
        )));
    }
    Ok(Kind::Proc(ProcFile { pid: p.pid, name }))
}

#[cfg(test)]
mod tests {
    use super::proc_path;

    #[test]
    fn proc_paths_split_into_pid_and_name() {
        assert_eq!(proc_path("/proc/12/stat"), Some((12, "stat")));
        assert_eq!(
            proc_path("/proc/12/task/13/maps"),
            Some((12, "task/13/maps"))
        );
        assert_eq!(proc_path("/proc/meminfo"), None);
        assert_eq!(proc_path("/proc/sys/kernel/pid_max"), None);
        assert_eq!(proc_path("/proc/12"), Some((12, "")));
        assert_eq!(proc_path("/proc/12/fd"), Some((12, "fd")));
        assert_eq!(proc_path("/proc/12/"), None);
    }
}
