//! Durable epoch records.
//!
//! An epoch is committed by one atomic rename: the global manifest is written to a temp
//! file, fsynced, renamed to `epoch-<E>.json` and the directory fsynced. A coordinator that
//! dies at any point leaves either no `epoch-<E>.json` (E never happened, E-1 stays the
//! valid checkpoint) or a complete one; leftover temp files are ignored on load. Each record
//! carries a crc32c of its manifest so a damaged file is skipped rather than trusted.
//!
//! Epoch numbers are never reused: the next number is kept in `next-epoch`, advanced
//! durably before a round starts, so an aborted epoch's partial images can never be
//! confused with a later epoch of the same number.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Errors reading or writing epoch records.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file operation failed.
    #[error("epoch store {path}: {op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// Path involved.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A record could not be encoded.
    #[error("epoch {epoch}: cannot encode the manifest: {source}")]
    Encode {
        /// Epoch.
        epoch: u64,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
}

/// One node's part of a committed checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeManifest {
    /// Node name.
    pub node: String,
    /// Image directory on that node.
    pub image_dir: String,
    /// crc32c of the node's own image manifest.
    pub manifest_crc32c: u32,
}

/// The global manifest of a committed epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobalManifest {
    /// Job id.
    pub job: String,
    /// Epoch.
    pub epoch: u64,
    /// Commit time, milliseconds since the Unix epoch.
    pub committed_unix_ms: u64,
    /// Every node's part, sorted by node name.
    pub nodes: Vec<NodeManifest>,
}

#[derive(Serialize, Deserialize)]
struct Record {
    format: u32,
    crc32c: u32,
    manifest: GlobalManifest,
}

#[derive(Serialize)]
struct AbortRecord<'a> {
    job: &'a str,
    epoch: u64,
    phase: String,
    node: &'a str,
    reason: &'a str,
}

/// The directory holding one job's epoch records.
#[derive(Debug, Clone)]
pub struct EpochStore {
    dir: PathBuf,
    job: String,
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io { op, path, source }
}

impl EpochStore {
    /// Opens (creating if needed) `<state_dir>/<job>/`.
    pub fn open(state_dir: &Path, job: &str) -> Result<EpochStore, StoreError> {
        let dir = state_dir.join(job);
        fs::create_dir_all(&dir).map_err(io("create directory", &dir))?;
        Ok(EpochStore {
            dir,
            job: job.to_string(),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn epoch_path(&self, epoch: u64) -> PathBuf {
        self.dir.join(format!("epoch-{epoch:016}.json"))
    }

    /// Writes `bytes` to `name` atomically and durably.
    fn write_atomic(&self, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let dst = self.dir.join(name);
        let mut f = File::create(&tmp).map_err(io("create temp file", &tmp))?;
        f.write_all(bytes).map_err(io("write temp file", &tmp))?;
        f.sync_all().map_err(io("fsync temp file", &tmp))?;
        drop(f);
        fs::rename(&tmp, &dst).map_err(io("rename into place", &dst))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io("fsync directory", &self.dir))?;
        Ok(())
    }

    /// Durably commits an epoch. Only after this returns is the epoch the valid checkpoint.
    pub fn commit(&self, manifest: &GlobalManifest) -> Result<(), StoreError> {
        let epoch = manifest.epoch;
        let body =
            serde_json::to_vec(manifest).map_err(|source| StoreError::Encode { epoch, source })?;
        let rec = Record {
            format: 1,
            crc32c: crc32c::crc32c(&body),
            manifest: manifest.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&rec)
            .map_err(|source| StoreError::Encode { epoch, source })?;
        let name = self
            .epoch_path(epoch)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.write_atomic(&name, &bytes)
    }

    /// Best-effort note of why an epoch was aborted, for the operator.
    pub fn record_abort(
        &self,
        epoch: u64,
        phase: crate::protocol::Phase,
        node: &str,
        reason: &str,
    ) -> Result<(), StoreError> {
        let rec = AbortRecord {
            job: &self.job,
            epoch,
            phase: phase.to_string(),
            node,
            reason,
        };
        let bytes = serde_json::to_vec_pretty(&rec)
            .map_err(|source| StoreError::Encode { epoch, source })?;
        self.write_atomic(&format!("epoch-{epoch:016}.aborted.json"), &bytes)
    }

    /// Reserves the next epoch number durably and returns it. `last_committed` is what
    /// the caller loaded at startup; passing it avoids re-reading every manifest.
    pub fn next_epoch(&self, last_committed: Option<u64>) -> Result<u64, StoreError> {
        let path = self.dir.join("next-epoch");
        let stored = fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(1);
        let last = last_committed.unwrap_or(0);
        let epoch = stored.max(last + 1);
        self.write_atomic("next-epoch", format!("{}\n", epoch + 1).as_bytes())?;
        Ok(epoch)
    }

    /// Loads one committed epoch, `None` if absent or damaged.
    pub fn load(&self, epoch: u64) -> Option<GlobalManifest> {
        let bytes = fs::read(self.epoch_path(epoch)).ok()?;
        let rec: Record = serde_json::from_slice(&bytes).ok()?;
        let body = serde_json::to_vec(&rec.manifest).ok()?;
        (rec.format == 1 && crc32c::crc32c(&body) == rec.crc32c && rec.manifest.epoch == epoch)
            .then_some(rec.manifest)
    }

    /// The newest intact committed epoch.
    pub fn last_committed(&self) -> Result<Option<GlobalManifest>, StoreError> {
        let mut epochs: Vec<u64> = fs::read_dir(&self.dir)
            .map_err(io("read directory", &self.dir))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_prefix("epoch-")?
                    .strip_suffix(".json")?
                    .parse::<u64>()
                    .ok()
            })
            .collect();
        epochs.sort_unstable();
        Ok(epochs.into_iter().rev().find_map(|e| self.load(e)))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A one-node manifest of `epoch` (also the writer thread's tests').
    pub(crate) fn manifest(epoch: u64) -> GlobalManifest {
        GlobalManifest {
            job: "j".into(),
            epoch,
            committed_unix_ms: 1,
            nodes: vec![NodeManifest {
                node: "n0".into(),
                image_dir: "/i".into(),
                manifest_crc32c: 5,
            }],
        }
    }

    #[test]
    fn commit_load_and_damage() {
        let d = tempfile::tempdir().unwrap();
        let s = EpochStore::open(d.path(), "j").unwrap();
        assert_eq!(s.last_committed().unwrap(), None);
        assert_eq!(s.next_epoch(None).unwrap(), 1);
        s.commit(&manifest(1)).unwrap();
        assert_eq!(s.next_epoch(Some(1)).unwrap(), 2);
        s.commit(&manifest(2)).unwrap();
        assert_eq!(s.last_committed().unwrap().unwrap().epoch, 2);
        // A crash mid-commit leaves only a temp file: it must not count.
        fs::write(s.dir().join(".epoch-0000000000000003.json.tmp"), b"{").unwrap();
        assert_eq!(s.last_committed().unwrap().unwrap().epoch, 2);
        // A damaged record is skipped, falling back to the previous epoch.
        let p = s.epoch_path(2);
        let text = fs::read_to_string(&p).unwrap().replace("/i", "/x");
        fs::write(&p, text).unwrap();
        assert_eq!(s.last_committed().unwrap().unwrap().epoch, 1);
        // Numbers are never reused, even after an abort.
        assert_eq!(s.next_epoch(Some(1)).unwrap(), 3);
        assert_eq!(s.next_epoch(None).unwrap(), 4);
    }
}
