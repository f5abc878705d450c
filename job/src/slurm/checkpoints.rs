//! A single-node job's checkpoint directory: `ckpt-N` directories, the
//! committed one named by `LATEST` (replaced atomically), the old ones
//! pruned.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::budget::TIMING_SUFFIX;
use super::{CKPT_PREFIX, LATEST};

/// What went wrong with a checkpoint directory; each names its file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointsError {
    /// A file operation failed.
    #[error("{}: {step}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was done.
        step: &'static str,
        /// Its error.
        #[source]
        source: std::io::Error,
    },
    /// `LATEST` names something that is no checkpoint.
    #[error("{}: names {name:?}, not a checkpoint directory {CKPT_PREFIX}N", path.display())]
    NotCheckpoint {
        /// `LATEST`.
        path: PathBuf,
        /// What it names.
        name: String,
    },
    /// `LATEST` names a checkpoint that is not there.
    #[error("{}: names {name}, which is not a directory in {}", path.display(), dir.display())]
    NotDir {
        /// `LATEST`.
        path: PathBuf,
        /// What it names.
        name: String,
        /// The checkpoint directory.
        dir: PathBuf,
    },
}

/// An old checkpoint [`prune`] could not remove.
#[derive(Debug)]
pub struct PruneFailure {
    /// Its directory.
    pub path: PathBuf,
    /// Why.
    pub error: std::io::Error,
}

/// This module's results.
type Result<T, E = CheckpointsError> = std::result::Result<T, E>;

/// A `map_err` for a file operation on `path`.
fn io(path: &Path, step: &'static str) -> impl FnOnce(std::io::Error) -> CheckpointsError {
    let path = path.to_path_buf();
    move |source| CheckpointsError::Io { path, step, source }
}

/// The number of a `ckpt-N` directory name.
pub fn number_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(CKPT_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The checkpoint numbers present in `dir`, committed or not.
fn numbers(dir: &Path) -> Result<Vec<u64>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io(dir, "read"))? {
        let e = e.map_err(io(dir, "read"))?;
        if let Some(n) = e.file_name().to_str().and_then(number_of) {
            v.push(n);
        }
    }
    v.sort_unstable();
    Ok(v)
}

/// The number the next checkpoint takes.
pub fn next_number(dir: &Path) -> Result<u64> {
    Ok(numbers(dir)?.last().map_or(1, |n| n + 1))
}

/// The committed checkpoint's name, if `LATEST` names an existing one.
pub fn committed(dir: &Path) -> Result<Option<String>> {
    let path = dir.join(LATEST);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path, "read")(e)),
    };
    let name = text.trim().to_string();
    if number_of(&name).is_none() {
        return Err(CheckpointsError::NotCheckpoint { path, name });
    }
    if !dir.join(&name).is_dir() {
        let dir = dir.to_path_buf();
        return Err(CheckpointsError::NotDir { path, name, dir });
    }
    Ok(Some(name))
}

/// Makes `name` the committed checkpoint: `LATEST` is written aside, synced
/// and renamed over the old one, so a crash leaves either the old or the
/// new checkpoint committed, never none.
pub fn commit(dir: &Path, name: &str) -> Result<()> {
    let tmp = dir.join(format!("{LATEST}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(io(&tmp, "create"))?;
    writeln!(f, "{name}").map_err(io(&tmp, "write"))?;
    f.sync_all().map_err(io(&tmp, "sync"))?;
    std::fs::rename(&tmp, dir.join(LATEST)).map_err(io(&tmp, "rename to LATEST"))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir, "sync"))?;
    Ok(())
}

/// Removes all but the newest `keep` checkpoints (never the committed
/// one); returns the old checkpoints that could not be removed.
pub fn prune(dir: &Path, keep: u32) -> Vec<PruneFailure> {
    let mut failed = Vec::new();
    let Ok(all) = numbers(dir) else {
        return failed;
    };
    let current = committed(dir).ok().flatten();
    let keep = usize::try_from(keep).unwrap_or(usize::MAX);
    for n in all.iter().rev().skip(keep) {
        let name = format!("{CKPT_PREFIX}{n}");
        if current.as_deref() == Some(name.as_str()) {
            continue;
        }
        if let Err(error) = std::fs::remove_dir_all(dir.join(&name)) {
            let path = dir.join(&name);
            failed.push(PruneFailure { path, error });
        }
        let _ = std::fs::remove_file(dir.join(format!("{name}{TIMING_SUFFIX}")));
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_names_the_committed_checkpoint_and_prune_keeps_it() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        assert_eq!(committed(dir).unwrap(), None);
        assert_eq!(next_number(dir).unwrap(), 1);
        for n in 1..=4 {
            std::fs::create_dir(dir.join(format!("{CKPT_PREFIX}{n}"))).unwrap();
        }
        commit(dir, "ckpt-2").unwrap();
        assert_eq!(committed(dir).unwrap().as_deref(), Some("ckpt-2"));
        assert_eq!(next_number(dir).unwrap(), 5);
        assert!(prune(dir, 1).is_empty());
        let mut left: Vec<u64> = numbers(dir).unwrap();
        left.sort_unstable();
        assert_eq!(left, vec![2, 4]);
        std::fs::write(dir.join(LATEST), "ckpt-9\n").unwrap();
        let e = committed(dir).unwrap_err().to_string();
        assert!(e.contains("names ckpt-9, which is not a directory"), "{e}");
        std::fs::write(dir.join(LATEST), "other\n").unwrap();
        assert!(matches!(
            committed(dir),
            Err(CheckpointsError::NotCheckpoint { .. })
        ));
    }
}
