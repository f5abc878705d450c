//! The job directory of `ckpt job`: one directory on storage every node
//! sees, holding the job secret, the coordinator's epoch records and every
//! part's root pid, node and images.
//!
//! ```text
//! JOBDIR/secret                 job secret (0600), created by the first `ckpt job` command
//! JOBDIR/lock                   held by a running `ckpt job dump|restore`
//! JOBDIR/coord/job/             epoch records (epoch-<016>.json, .aborted.json, next-epoch)
//! JOBDIR/last-committed         the last committed epoch's number, for scripts
//! JOBDIR/parts/PART/root.pid    host pid of the part's `ckpt run --pidns` init, on its node
//! JOBDIR/parts/PART/node        the node the part runs on now
//! JOBDIR/parts/PART/epoch-E/    the part's images of epoch E
//! ```
//!
//! ckpt runs as root on other users' jobs, so nothing here is trusted as
//! found: every directory and file must belong to us and be writable by
//! nobody else, nothing is opened through a symbolic link, files are
//! replaced by an atomic rename, and every file read back is bounded.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use ckpt_coord::{EpochStore, GlobalManifest, Secret};

/// The coordinator's job id: the job secret is per job directory, so one
/// fixed id serves every job.
pub const JOB_ID: &str = "job";
/// The part's tree root pid file.
const ROOT_PID: &str = "root.pid";
/// The file naming the last committed epoch.
const LAST_COMMITTED: &str = "last-committed";
/// The part's node file.
const NODE: &str = "node";
/// Longest part or node name.
const MAX_NAME: usize = 64;
/// Longest root.pid or node file read back.
const MAX_SMALL_FILE: u64 = 256;
/// Longest abort note read back (its reason is one error line).
const MAX_NOTE: u64 = 64 * 1024;
/// The phases a restart round has and a checkpoint round does not (a
/// checkpoint is committed before its RESUME).
const RESTART_PHASES: [&str; 4] = ["RESTORE", "PUBLISH", "SUBSCRIBE", "RESUME"];
/// Prefix of an epoch's image directory (see `agent::epoch_dir`).
const EPOCH_PREFIX: &str = "epoch-";
/// Permission bits that let someone else change what we trust.
const OTHERS_WRITE: u32 = 0o022;
/// Mode of every directory ckpt creates in the job directory.
const DIR_MODE: u32 = 0o700;
/// Mode of the root.pid and node files (readable, as any pid file).
const FILE_MODE: u32 = 0o644;

/// A checked job directory.
#[derive(Debug, Clone)]
pub struct JobDir {
    root: PathBuf,
}

/// One part of the job as its files say.
#[derive(Debug, Clone)]
pub struct PartInfo {
    /// Part name.
    pub name: String,
    /// The node it runs on (or ran on last).
    pub node: Option<String>,
    /// Host pid of its tree root on that node.
    pub root_pid: Option<i32>,
}

/// What an epoch on disk is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochState {
    /// Committed by the coordinator (its record is intact).
    Committed,
    /// Aborted: the coordinator recorded why.
    Aborted,
    /// Images without a record: a round that is running or died.
    Partial,
}

impl EpochState {
    /// Its name in `ckpt job list`.
    pub fn name(self) -> &'static str {
        match self {
            EpochState::Committed => "committed",
            EpochState::Aborted => "aborted",
            EpochState::Partial => "partial",
        }
    }
}

/// One epoch found on disk (a record, images, or both).
#[derive(Debug, Clone)]
pub struct EpochInfo {
    /// Epoch number.
    pub epoch: u64,
    /// Its state.
    pub state: EpochState,
    /// Whether it is the job's last committed epoch (the one a restore takes).
    pub last_committed: bool,
    /// Commit time, milliseconds since the Unix epoch (committed only).
    pub committed_unix_ms: Option<u64>,
    /// The parts that have an image directory for it.
    pub parts: Vec<String>,
    /// Bytes of images over all parts.
    pub bytes: u64,
}

/// Checks that `name` can be a part or node name: a plain file name.
pub fn check_name(what: &str, name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !ok {
        bail!(
            "{what} name {name:?}: must be 1 to {MAX_NAME} letters, digits, '.', '_' or '-', not starting with '.'"
        );
    }
    Ok(())
}

/// Refuses a directory entry that someone else could have planted or can
/// change: a symbolic link, the wrong type, another owner, or group/other
/// write permission.
fn check_ours(path: &Path, meta: &fs::Metadata, dir: bool) -> anyhow::Result<()> {
    let ft = meta.file_type();
    if ft.is_symlink() {
        bail!("{}: a symbolic link, refused", path.display());
    }
    if dir != ft.is_dir() || (!dir && !ft.is_file()) {
        let want = if dir { "a directory" } else { "a regular file" };
        bail!("{}: not {want}, refused", path.display());
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        bail!(
            "{}: owned by uid {}, not by this user (uid {me}), refused",
            path.display(),
            meta.uid()
        );
    }
    if meta.mode() & OTHERS_WRITE != 0 {
        bail!(
            "{}: writable by group or others (mode {:o}), refused",
            path.display(),
            meta.mode() & 0o7777
        );
    }
    Ok(())
}

/// Creates `path` (mode 0700) or checks the existing one is ours.
fn ensure_dir(path: &Path) -> anyhow::Result<()> {
    match fs::DirBuilder::new().mode(DIR_MODE).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = fs::symlink_metadata(path).with_context(|| path.display().to_string())?;
            check_ours(path, &meta, true)
        }
        Err(e) => Err(e).with_context(|| format!("{}: cannot create", path.display())),
    }
}

/// Reads a small file of ours, never through a symbolic link, at most
/// [`MAX_SMALL_FILE`] bytes; `None` if it does not exist.
fn read_small(path: &Path) -> anyhow::Result<Option<String>> {
    let f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("{}: cannot open", path.display())),
    };
    let meta = f.metadata().with_context(|| path.display().to_string())?;
    check_ours(path, &meta, false)?;
    let mut text = String::new();
    f.take(MAX_SMALL_FILE)
        .read_to_string(&mut text)
        .with_context(|| format!("{}: read", path.display()))?;
    if meta.len() > MAX_SMALL_FILE {
        bail!(
            "{}: {} bytes, longer than the {MAX_SMALL_FILE} it may be, refused",
            path.display(),
            meta.len()
        );
    }
    Ok(Some(text.trim().to_string()))
}

/// Replaces `path` with `content` atomically: a new temporary file (never
/// through a symbolic link) renamed over it.
fn write_atomic(path: &Path, content: &str) -> anyhow::Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(
        ".{}.tmp.{}",
        name.unwrap_or_default(),
        std::process::id()
    ));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .with_context(|| format!("{}: cannot create", tmp.display()))?;
    writeln!(f, "{content}")
        .and_then(|()| f.sync_all())
        .with_context(|| format!("{}: write", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("{}: rename", path.display()))
}

/// The epoch number of an image directory name (`epoch-E`), if it is one.
fn epoch_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(EPOCH_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether the abort note at `path` is of a restart round: aborted in one
/// of the phases only a restart has (the coordinator writes the phase).
fn is_restart_note(path: &Path) -> bool {
    let Ok(f) = File::open(path) else {
        return false;
    };
    let mut text = String::new();
    if f.take(MAX_NOTE).read_to_string(&mut text).is_err() {
        return false;
    }
    let phase = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("phase")?.as_str().map(str::to_string));
    phase.is_some_and(|p| RESTART_PHASES.contains(&p.as_str()))
}

/// Bytes of the regular files under `path` (symbolic links not followed).
fn tree_bytes(path: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.is_file() {
        return meta.len();
    }
    if !meta.is_dir() {
        return 0;
    }
    fs::read_dir(path)
        .map(|d| d.flatten().map(|e| tree_bytes(&e.path())).sum())
        .unwrap_or(0)
}

/// Whether `pid` is a ckpt PID-namespace init: its executable is this
/// very ckpt (same file) and it is PID 1 of a namespace below ours. A
/// root.pid naming anything else is never dumped.
pub fn is_ckpt_init(pid: i32) -> anyhow::Result<bool> {
    let exe = match fs::metadata(format!("/proc/{pid}/exe")) {
        Ok(m) => m,
        Err(_) => return Ok(false),
    };
    let me = fs::metadata("/proc/self/exe").context("/proc/self/exe")?;
    if (exe.dev(), exe.ino()) != (me.dev(), me.ino()) {
        return Ok(false);
    }
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let nspid: Vec<&str> = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    Ok(nspid.len() >= 2 && nspid.last() == Some(&"1"))
}

impl JobDir {
    /// Opens JOBDIR, creating it (0700) and the job secret (0600) if this
    /// is the job's first command. Refuses a directory that is not ours.
    pub fn create_or_open(root: &Path) -> anyhow::Result<JobDir> {
        let root = std::path::absolute(root)
            .with_context(|| format!("job directory {}", root.display()))?;
        if let Some(parent) = root.parent()
            && !parent.is_dir()
        {
            bail!(
                "job directory {}: its parent {} is not a directory",
                root.display(),
                parent.display()
            );
        }
        ensure_dir(&root)?;
        let dir = JobDir { root };
        ensure_dir(&dir.root.join("parts"))?;
        ensure_dir(&dir.coord_state_dir())?;
        dir.store()?;
        // The secret: load_or_create makes it O_EXCL 0600, and refuses an
        // existing one others can read.
        Secret::load_or_create(&dir.secret_path())
            .with_context(|| format!("job secret {}", dir.secret_path().display()))?;
        let meta = fs::symlink_metadata(dir.secret_path())?;
        check_ours(&dir.secret_path(), &meta, false)?;
        Ok(dir)
    }

    /// Opens an existing JOBDIR (for reading only).
    pub fn open(root: &Path) -> anyhow::Result<JobDir> {
        let root = std::path::absolute(root)
            .with_context(|| format!("job directory {}", root.display()))?;
        let meta = fs::symlink_metadata(&root)
            .with_context(|| format!("job directory {}", root.display()))?;
        check_ours(&root, &meta, true)?;
        Ok(JobDir { root })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// The job secret file.
    pub fn secret_path(&self) -> PathBuf {
        self.root.join("secret")
    }

    /// The coordinator's state directory (its records are in `JOB_ID/`).
    pub fn coord_state_dir(&self) -> PathBuf {
        self.root.join("coord")
    }

    /// Marks `epoch` as the last committed one for scripts (`ckpt job`
    /// itself goes by the coordinator's records, which this follows).
    pub fn mark_last_committed(&self, epoch: u64) -> anyhow::Result<()> {
        write_atomic(&self.root.join(LAST_COMMITTED), &epoch.to_string())
    }

    /// The epoch records.
    pub fn store(&self) -> anyhow::Result<EpochStore> {
        let dir = self.coord_state_dir().join(JOB_ID);
        ensure_dir(&dir)?;
        Ok(EpochStore::open(&self.coord_state_dir(), JOB_ID)?)
    }

    /// A part's directory (its agent's checkpoint root).
    pub fn part_dir(&self, part: &str) -> PathBuf {
        self.root.join("parts").join(part)
    }

    /// Creates (or checks: ours, not a symbolic link) a part's directory.
    pub fn ensure_part(&self, part: &str) -> anyhow::Result<PathBuf> {
        check_name("part", part)?;
        ensure_dir(&self.root.join("parts"))?;
        let dir = self.part_dir(part);
        ensure_dir(&dir)?;
        Ok(dir)
    }

    /// Where a part's root pid is written.
    pub fn root_pid_path(&self, part: &str) -> PathBuf {
        self.part_dir(part).join(ROOT_PID)
    }

    /// Records the node `part` runs on now.
    pub fn set_node(&self, part: &str, node: &str) -> anyhow::Result<()> {
        check_name("node", node)?;
        write_atomic(&self.part_dir(part).join(NODE), node)
    }

    /// The node `part` runs on, as recorded.
    pub fn node_of(&self, part: &str) -> anyhow::Result<Option<String>> {
        let node = read_small(&self.part_dir(part).join(NODE))?;
        if let Some(n) = &node {
            check_name("node", n).with_context(|| format!("part {part}"))?;
        }
        Ok(node)
    }

    /// The recorded root pid of `part`, if any (not checked against the
    /// running system: see [`JobDir::checked_root`]).
    pub fn root_of(&self, part: &str) -> anyhow::Result<Option<i32>> {
        let path = self.root_pid_path(part);
        let Some(text) = read_small(&path)? else {
            return Ok(None);
        };
        match text.parse::<i32>() {
            Ok(pid) if pid > 1 => Ok(Some(pid)),
            _ => bail!("{}: {text:?} is not a pid, refused", path.display()),
        }
    }

    /// The root pid of `part` to dump on this node: recorded, alive, and a
    /// ckpt PID-namespace init.
    pub fn checked_root(&self, part: &str) -> anyhow::Result<i32> {
        let path = self.root_pid_path(part);
        let Some(pid) = self.root_of(part)? else {
            bail!(
                "part {part}: {} missing: the part was not started with `ckpt job run`",
                path.display()
            );
        };
        if !is_ckpt_init(pid)? {
            bail!(
                "part {part}: pid {pid} from {} is not a running ckpt init (`ckpt job run`) on this node, refused",
                path.display()
            );
        }
        Ok(pid)
    }

    /// Every part, sorted by name (the order `--nodes` lists follow).
    pub fn parts(&self) -> anyhow::Result<Vec<PartInfo>> {
        let dir = self.root.join("parts");
        let mut names: Vec<String> = match fs::read_dir(&dir) {
            Ok(d) => d
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| check_name("part", n).is_ok())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e).with_context(|| dir.display().to_string()),
        };
        names.sort();
        names
            .into_iter()
            .map(|name| {
                Ok(PartInfo {
                    node: self.node_of(&name)?,
                    root_pid: self.root_of(&name)?,
                    name,
                })
            })
            .collect()
    }

    /// The committed epochs' records, by epoch (damaged ones left out).
    fn committed(&self) -> anyhow::Result<BTreeMap<u64, GlobalManifest>> {
        let store = self.store()?;
        let mut out = BTreeMap::new();
        for e in fs::read_dir(store.dir())?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(epoch) = name
                .strip_suffix(".json")
                .and_then(epoch_of)
                .filter(|_| !name.ends_with(".aborted.json"))
            else {
                continue;
            };
            if let Some(m) = store.load(epoch) {
                out.insert(epoch, m);
            }
        }
        Ok(out)
    }

    /// The coordinator's abort notes: (round, whether it was a restart).
    fn abort_notes(&self) -> anyhow::Result<Vec<(u64, bool)>> {
        let store = self.store()?;
        Ok(fs::read_dir(store.dir())?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let round = epoch_of(name.strip_suffix(".aborted.json")?)?;
                Some((round, is_restart_note(&e.path())))
            })
            .collect())
    }

    /// Checkpoint epochs with an abort record (restart rounds, which take
    /// their numbers from the same counter, are no epochs of images).
    fn aborted(&self) -> anyhow::Result<Vec<u64>> {
        Ok(self
            .abort_notes()?
            .into_iter()
            .filter(|&(_, restart)| !restart)
            .map(|(epoch, _)| epoch)
            .collect())
    }

    /// Image directories on disk: epoch → (part → path).
    fn image_dirs(&self) -> anyhow::Result<BTreeMap<u64, BTreeMap<String, PathBuf>>> {
        let mut out: BTreeMap<u64, BTreeMap<String, PathBuf>> = BTreeMap::new();
        for p in self.parts()? {
            let dir = self.part_dir(&p.name);
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(epoch) = epoch_of(&name) {
                    out.entry(epoch)
                        .or_default()
                        .insert(p.name.clone(), e.path());
                }
            }
        }
        Ok(out)
    }

    /// Every epoch on disk, oldest first.
    pub fn epochs(&self) -> anyhow::Result<Vec<EpochInfo>> {
        let committed = self.committed()?;
        let aborted = self.aborted()?;
        let images = self.image_dirs()?;
        let last = committed.keys().next_back().copied();
        let mut all: Vec<u64> = committed
            .keys()
            .chain(aborted.iter())
            .chain(images.keys())
            .copied()
            .collect();
        all.sort_unstable();
        all.dedup();
        Ok(all
            .into_iter()
            .map(|epoch| {
                let parts = images.get(&epoch).cloned().unwrap_or_default();
                let state = if committed.contains_key(&epoch) {
                    EpochState::Committed
                } else if aborted.contains(&epoch) {
                    EpochState::Aborted
                } else {
                    EpochState::Partial
                };
                EpochInfo {
                    epoch,
                    last_committed: Some(epoch) == last,
                    committed_unix_ms: committed.get(&epoch).map(|m| m.committed_unix_ms),
                    bytes: parts.values().map(|p| tree_bytes(p)).sum(),
                    parts: parts.into_keys().collect(),
                    state,
                }
            })
            .collect())
    }

    /// The retention rule, applied with the job lock held after a round
    /// whose epoch is `finished` (every epoch up to it is over): keeps the
    /// newest `keep` committed epochs (the last committed always), removes
    /// the other committed ones (record first, so no record ever names
    /// missing images, then images) and every image directory of an epoch
    /// up to `finished` that was not committed. Returns the epochs removed.
    pub fn prune(&self, keep: usize, finished: u64) -> anyhow::Result<Vec<u64>> {
        let keep = keep.max(1);
        let committed = self.committed()?;
        let kept: Vec<u64> = committed.keys().rev().take(keep).copied().collect();
        let oldest_kept = kept.last().copied().unwrap_or(0);
        let store = self.store()?;
        let images = self.image_dirs()?;
        let mut removed = Vec::new();
        for &epoch in committed.keys() {
            if kept.contains(&epoch) {
                continue;
            }
            let record = store.dir().join(format!("epoch-{epoch:016}.json"));
            fs::remove_file(&record)
                .with_context(|| format!("pruning epoch {epoch}: {}", record.display()))?;
            removed.push(epoch);
        }
        for (&epoch, parts) in &images {
            let drop = if committed.contains_key(&epoch) {
                !kept.contains(&epoch)
            } else {
                // Never the images of a round that may still be running.
                epoch <= finished
            };
            if !drop {
                continue;
            }
            for path in parts.values() {
                fs::remove_dir_all(path)
                    .with_context(|| format!("pruning epoch {epoch}: {}", path.display()))?;
            }
            if !removed.contains(&epoch) {
                removed.push(epoch);
            }
        }
        // Abort notes older than everything kept have nothing left to explain.
        for (epoch, _) in self.abort_notes()? {
            if epoch < oldest_kept {
                let note = store.dir().join(format!("epoch-{epoch:016}.aborted.json"));
                let _ = fs::remove_file(note);
            }
        }
        removed.sort_unstable();
        Ok(removed)
    }

    /// Takes the job lock: one `ckpt job dump|restore` at a time per job
    /// directory. Released when the returned file is dropped.
    pub fn lock(&self) -> anyhow::Result<nix::fcntl::Flock<File>> {
        let path = self.root.join("lock");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .with_context(|| format!("{}: cannot open", path.display()))?;
        check_ours(&path, &f.metadata()?, false)?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
            anyhow::anyhow!(
                "{}: {e}: another `ckpt job dump` or `ckpt job restore` runs on this job",
                path.display()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_epoch_directories() {
        for ok in ["a", "node-01", "n1.cluster", "rank_3"] {
            assert!(check_name("part", ok).is_ok(), "{ok}");
        }
        let long = "x".repeat(MAX_NAME + 1);
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", long.as_str()] {
            assert!(check_name("part", bad).is_err(), "{bad:?}");
        }
        assert_eq!(epoch_of("epoch-12"), Some(12));
        for not in ["epoch-", "epoch-3.tmp.77", "epoch--1", "epoch-1a", "ckpt-1"] {
            assert_eq!(epoch_of(not), None, "{not}");
        }
    }

    fn commit(dir: &JobDir, epoch: u64, parts: &[&str]) {
        for p in parts {
            let images = dir.ensure_part(p).unwrap().join(format!("epoch-{epoch}"));
            fs::create_dir(&images).unwrap();
            fs::write(images.join("manifest.img"), b"12345").unwrap();
        }
        let m = GlobalManifest {
            job: JOB_ID.into(),
            epoch,
            committed_unix_ms: epoch * 1000,
            nodes: Vec::new(),
        };
        dir.store().unwrap().commit(&m).unwrap();
    }

    #[test]
    fn prune_keeps_the_newest_and_drops_unfinished_only_when_over() {
        let t = tempfile::tempdir().unwrap();
        let dir = JobDir::create_or_open(&t.path().join("job")).unwrap();
        for e in 1..=3 {
            commit(&dir, e, &["a", "b"]);
        }
        // Epoch 4 aborted (a left images behind), epoch 5 still running.
        fs::create_dir(dir.part_dir("a").join("epoch-4")).unwrap();
        dir.store()
            .unwrap()
            .record_abort(4, ckpt_coord::Phase::Dump, "b", "no")
            .unwrap();
        fs::create_dir(dir.part_dir("b").join("epoch-5")).unwrap();
        // Restart round 6 aborted: no epoch of images, not listed.
        dir.store()
            .unwrap()
            .record_abort(6, ckpt_coord::Phase::Restore, "a", "no images")
            .unwrap();
        let states: Vec<(u64, EpochState, bool)> = dir
            .epochs()
            .unwrap()
            .iter()
            .map(|e| (e.epoch, e.state, e.last_committed))
            .collect();
        assert_eq!(
            states,
            vec![
                (1, EpochState::Committed, false),
                (2, EpochState::Committed, false),
                (3, EpochState::Committed, true),
                (4, EpochState::Aborted, false),
                (5, EpochState::Partial, false),
            ]
        );
        assert_eq!(dir.prune(2, 4).unwrap(), vec![1, 4]);
        let left: Vec<(u64, Vec<String>)> = dir
            .epochs()
            .unwrap()
            .into_iter()
            .map(|e| (e.epoch, e.parts))
            .collect();
        let ab = vec!["a".to_string(), "b".to_string()];
        assert_eq!(
            left,
            vec![
                (2, ab.clone()),
                (3, ab),
                (4, vec![]),
                (5, vec!["b".to_string()])
            ]
        );
        assert!(dir.store().unwrap().load(1).is_none());
        // keep 0 still keeps the last committed.
        assert_eq!(dir.prune(0, 5).unwrap(), vec![2, 5]);
        assert_eq!(
            dir.epochs().unwrap().first().map(|e| (e.epoch, e.bytes)),
            Some((3, 10))
        );
    }

    #[test]
    fn a_second_lock_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let dir = JobDir::create_or_open(&t.path().join("job")).unwrap();
        let held = dir.lock().unwrap();
        let e = dir.lock().unwrap_err().to_string();
        assert!(e.contains("another `ckpt job dump`"), "{e}");
        drop(held);
        dir.lock().unwrap();
    }
}
