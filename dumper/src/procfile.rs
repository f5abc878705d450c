//! Small readers for the /proc files the dumper needs, with errors that name
//! the pid and file.
//!
//! The `procfs` crate is used where its model is exact (credentials,
//! limits); VMAs and the mm fields are parsed here because procfs drops
//! unknown VmFlags and trims paths, and numbered directories (`fd`, `task`)
//! are listed here because a process that vanishes meanwhile must become
//! [`DumpError::NoProcess`], not a parse error.

use std::path::PathBuf;

use crate::error::{DumpError, Result};

/// `/proc/PID/NAME`.
pub fn path(pid: i32, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{name}"))
}

/// Reads `/proc/PID/NAME` as text.
pub fn read(pid: i32, name: &str) -> Result<String> {
    let p = path(pid, name);
    let bytes = read_sized(&p).map_err(|source| proc_err(pid, p.clone(), source))?;
    String::from_utf8(bytes).map_err(|e| {
        proc_err(
            pid,
            p,
            std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        )
    })
}

/// Reads `/proc/PID/NAME` as bytes.
pub fn read_bytes(pid: i32, name: &str) -> Result<Vec<u8>> {
    let p = path(pid, name);
    read_sized(&p).map_err(|source| proc_err(pid, p, source))
}

/// One open and two reads for most /proc files (see `ckpt_parasite::proc_read`).
fn read_sized(p: &std::path::Path) -> std::io::Result<Vec<u8>> {
    ckpt_parasite::proc_read::read(p)
}

/// What collecting a task reads of `/proc/PID/task/TID`: its `status`
/// (credentials, seccomp) and its `comm`, read once each.
pub struct TaskTexts {
    /// The thread.
    pub tid: i32,
    /// `task/TID/status`.
    pub status: String,
    /// `task/TID/comm`, without its newline.
    pub comm: String,
}

/// [`TaskTexts`] of every task in `tids` of process `pid`, read on the
/// pool's threads: a /proc read costs tens of microseconds, which for
/// thousands of threads was most of their collect (nothing here needs
/// the tracer's thread, unlike ptrace).
pub fn task_texts(pid: i32, tids: &[i32]) -> Result<Vec<TaskTexts>> {
    use rayon::prelude::*;
    tids.par_iter()
        .map(|&tid| {
            Ok(TaskTexts {
                tid,
                status: read(pid, &format!("task/{tid}/status"))?,
                comm: read(pid, &format!("task/{tid}/comm"))?
                    .trim_end_matches('\n')
                    .to_string(),
            })
        })
        .collect()
}

/// Reads the target of the symlink `/proc/PID/NAME`.
pub fn readlink(pid: i32, name: &str) -> Result<String> {
    let p = path(pid, name);
    std::fs::read_link(&p)
        .map(|t| t.to_string_lossy().into_owned())
        .map_err(|source| proc_err(pid, p, source))
}

/// The numeric entries of directory `/proc/PID/NAME` (fds, thread ids),
/// sorted.
pub fn numbered_entries(pid: i32, name: &str) -> Result<Vec<i32>> {
    let dir = path(pid, name);
    let mut out: Vec<i32> = std::fs::read_dir(&dir)
        .map_err(|e| proc_err(pid, dir.clone(), e))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// Maps an I/O error on a /proc file to the right [`DumpError`].
pub fn proc_err(pid: i32, path: PathBuf, source: std::io::Error) -> DumpError {
    match source.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ESRCH) => DumpError::NoProcess { pid },
        Some(libc::EACCES) | Some(libc::EPERM) => DumpError::Permission {
            pid,
            what: format!("reading {}", path.display()),
        },
        _ => DumpError::Proc { pid, path, source },
    }
}

/// Whether process `pid` has `cap` in its effective set (`CapEff` of
/// `/proc/PID/status`).
pub fn has_effective_cap(pid: i32, cap: caps::Capability) -> Result<bool> {
    let status = read(pid, "status")?;
    let eff = status_field(&status, "CapEff")
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .ok_or_else(|| DumpError::Parse {
            pid,
            path: format!("/proc/{pid}/status"),
            what: "no CapEff".into(),
        })?;
    Ok(eff & cap.bitmask() != 0)
}

/// A `Key:\tvalue` field of `/proc/PID/status`.
pub fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        l.strip_prefix(key)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::trim)
    })
}

/// The whitespace-separated fields of `/proc/PID/stat` after the command
/// name, so index 0 is field 3 (`state`) of proc(5).
pub fn stat_fields(pid: i32) -> Result<Vec<u64>> {
    let s = read(pid, "stat")?;
    let rest = s.rsplit_once(')').map(|(_, r)| r).ok_or(DumpError::Parse {
        pid,
        path: "stat".into(),
        what: "no ')'".into(),
    })?;
    // Field 3 is a letter; keep positions by mapping non-numbers to 0.
    Ok(rest
        .split_whitespace()
        .map(|f| f.parse::<i64>().map(|v| v as u64).unwrap_or(0))
        .collect())
}

/// Index into [`stat_fields`] of proc(5) field number `n`.
pub const fn stat_index(n: usize) -> usize {
    n - 3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_status_and_stat() {
        let me = std::process::id() as i32;
        let st = read(me, "status").unwrap();
        assert_eq!(status_field(&st, "Pid"), Some(me.to_string().as_str()));
        let f = stat_fields(me).unwrap();
        // field 4 is ppid
        assert_eq!(f[stat_index(4)] as i32, nix::unistd::getppid().as_raw());
        assert!(matches!(
            read(i32::MAX, "status"),
            Err(DumpError::NoProcess { .. })
        ));
    }
}
