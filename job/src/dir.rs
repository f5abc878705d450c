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

use ckpt_coord::auth::AuthError;
use ckpt_coord::store::StoreError;
use ckpt_coord::{EpochStore, GlobalManifest, Secret};

/// This module's results.
type Result<T, E = DirError> = std::result::Result<T, E>;

/// The coordinator's job id: the job secret is per job directory, so one
/// fixed id serves every job.
pub const JOB_ID: &str = "job";
/// The part's tree root pid file.
const ROOT_PID: &str = "root.pid";
/// The file naming the last committed epoch.
const LAST_COMMITTED: &str = "last-committed";
/// The part's node file.
const NODE: &str = "node";
/// The part's exit file: how its tree ended last on its node.
const EXIT: &str = "exit";
/// Longest part or node name.
const MAX_NAME: usize = 64;
/// Longest root.pid or node file read back.
const MAX_SMALL_FILE: u64 = 256;
/// Longest abort note read back (its reason is one error line).
const MAX_NOTE: u64 = 64 * 1024;
/// The phases a restart round has and a checkpoint round does not (a
/// checkpoint is committed before its RESUME).
const RESTART_PHASES: [&str; 4] = ["RESTORE", "PUBLISH", "SUBSCRIBE", "RESUME"];
/// Prefix of an epoch's image directory (see [`crate::agent::epoch_dir`]).
const EPOCH_PREFIX: &str = "epoch-";
/// Permission bits that let someone else change what we trust.
const OTHERS_WRITE: u32 = 0o022;
/// Mode of every directory ckpt creates in the job directory.
const DIR_MODE: u32 = 0o700;
/// Mode of the root.pid and node files (readable, as any pid file).
const FILE_MODE: u32 = 0o644;

/// What went wrong with the job directory; each names the file, part or
/// pid it is about.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// A part or node name that cannot be a plain file name.
    #[error(
        "{what} name {name:?}: must be 1 to {MAX_NAME} letters, digits, '.', '_' or '-', not starting with '.'"
    )]
    BadName {
        /// `part` or `node`.
        what: &'static str,
        /// The name refused.
        name: String,
    },
    /// A symbolic link where a file or directory of ours belongs.
    #[error("{}: a symbolic link, refused", path.display())]
    SymLink {
        /// The link.
        path: PathBuf,
    },
    /// Something other than the directory or regular file expected.
    #[error("{}: not {want}, refused", path.display())]
    WrongType {
        /// The entry.
        path: PathBuf,
        /// `a directory` or `a regular file`.
        want: &'static str,
    },
    /// An entry another user owns.
    #[error("{}: owned by uid {uid}, not by this user (uid {me}), refused", path.display())]
    NotOurs {
        /// The entry.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// The effective uid ckpt runs as.
        me: u32,
    },
    /// An entry group or others may write.
    #[error("{}: writable by group or others (mode {mode:o}), refused", path.display())]
    OthersWrite {
        /// The entry.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A file operation failed.
    #[error("{}", io_text(path, step))]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was done (empty: looking at it).
        step: &'static str,
        /// Its error.
        #[source]
        source: std::io::Error,
    },
    /// The job directory itself cannot be resolved or looked at.
    #[error("job directory {}", path.display())]
    Root {
        /// The job directory as given.
        path: PathBuf,
        /// Its error.
        #[source]
        source: std::io::Error,
    },
    /// The job directory's parent is missing.
    #[error("job directory {}: its parent {} is not a directory", root.display(), parent.display())]
    NoParent {
        /// The job directory.
        root: PathBuf,
        /// Its parent.
        parent: PathBuf,
    },
    /// A small file longer than it may be.
    #[error("{}: {len} bytes, longer than the {MAX_SMALL_FILE} it may be, refused", path.display())]
    TooLong {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// A root.pid file that holds no pid.
    #[error("{}: {text:?} is not a pid, refused", path.display())]
    NotAPid {
        /// The file.
        path: PathBuf,
        /// What it holds.
        text: String,
    },
    /// An exit file that holds no exit code.
    #[error("{}: {text:?} is not an exit code, refused", path.display())]
    NotAnExit {
        /// The file.
        path: PathBuf,
        /// What it holds.
        text: String,
    },
    /// A part without a root.pid file.
    #[error("part {part}: {} missing: the part was not started with `ckpt job run`", path.display())]
    NoRootPid {
        /// The part.
        part: String,
        /// Its root.pid file.
        path: PathBuf,
    },
    /// A root.pid naming something other than a running ckpt init.
    #[error(
        "part {part}: pid {pid} from {} is not a running ckpt init (`ckpt job run`) on this node, refused",
        path.display()
    )]
    NotCkptInit {
        /// The part.
        part: String,
        /// The pid recorded.
        pid: i32,
        /// Its root.pid file.
        path: PathBuf,
    },
    /// A part's node file that holds no node name.
    #[error("part {part}")]
    PartNode {
        /// The part.
        part: String,
        /// Why the name was refused.
        #[source]
        source: Box<DirError>,
    },
    /// The job secret cannot be created or read.
    #[error("job secret {}", path.display())]
    Secret {
        /// The secret file.
        path: PathBuf,
        /// Its error.
        #[source]
        source: AuthError,
    },
    /// The coordinator's epoch records cannot be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Pruning an epoch's record or images failed.
    #[error("pruning epoch {epoch}: {}", path.display())]
    Prune {
        /// The epoch.
        epoch: u64,
        /// The record or image directory.
        path: PathBuf,
        /// Its error.
        #[source]
        source: std::io::Error,
    },
    /// Another `ckpt job dump|restore` holds the job lock. The errno is
    /// part of the message (it says why the lock was not had) rather than
    /// a cause below it.
    #[error(
        "{}: {errno}: another `ckpt job dump` or `ckpt job restore` runs on this job",
        path.display()
    )]
    Locked {
        /// The lock file.
        path: PathBuf,
        /// The flock error.
        errno: nix::Error,
    },
}

/// `path` or `path: step`.
fn io_text(path: &Path, step: &str) -> String {
    if step.is_empty() {
        path.display().to_string()
    } else {
        format!("{}: {step}", path.display())
    }
}

/// A `map_err` for a file operation on `path`.
fn io(path: &Path, step: &'static str) -> impl FnOnce(std::io::Error) -> DirError {
    let path = path.to_path_buf();
    move |source| DirError::Io { path, step, source }
}

/// A checked job directory.
#[derive(Debug, Clone)]
pub struct JobDir {
    root: PathBuf,
}

/// How a part's tree ended, as its node recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartExit {
    /// Its exit code, as a shell reports it (128 + signal if killed).
    pub code: i32,
    /// When it was recorded.
    pub at: std::time::SystemTime,
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
pub fn check_name(what: &'static str, name: &str) -> Result<(), DirError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !ok {
        return Err(DirError::BadName {
            what,
            name: name.to_string(),
        });
    }
    Ok(())
}

/// Refuses a directory entry that someone else could have planted or can
/// change: a symbolic link, the wrong type, another owner, or group/other
/// write permission.
fn check_ours(path: &Path, meta: &fs::Metadata, dir: bool) -> Result<(), DirError> {
    let ft = meta.file_type();
    let path = path.to_path_buf();
    if ft.is_symlink() {
        return Err(DirError::SymLink { path });
    }
    if dir != ft.is_dir() || (!dir && !ft.is_file()) {
        let want = if dir { "a directory" } else { "a regular file" };
        return Err(DirError::WrongType { path, want });
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        let uid = meta.uid();
        return Err(DirError::NotOurs { path, uid, me });
    }
    if meta.mode() & OTHERS_WRITE != 0 {
        let mode = meta.mode() & 0o7777;
        return Err(DirError::OthersWrite { path, mode });
    }
    Ok(())
}

/// Creates `path` (mode 0700) or checks the existing one is ours.
fn ensure_dir(path: &Path) -> Result<(), DirError> {
    match fs::DirBuilder::new().mode(DIR_MODE).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = fs::symlink_metadata(path).map_err(io(path, ""))?;
            check_ours(path, &meta, true)
        }
        Err(e) => Err(io(path, "cannot create")(e)),
    }
}

/// Reads a small file of ours, never through a symbolic link, at most
/// [`MAX_SMALL_FILE`] bytes; `None` if it does not exist.
fn read_small(path: &Path) -> Result<Option<String>> {
    let f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path, "cannot open")(e)),
    };
    let meta = f.metadata().map_err(io(path, ""))?;
    check_ours(path, &meta, false)?;
    let mut text = String::new();
    f.take(MAX_SMALL_FILE)
        .read_to_string(&mut text)
        .map_err(io(path, "read"))?;
    if meta.len() > MAX_SMALL_FILE {
        return Err(DirError::TooLong {
            path: path.to_path_buf(),
            len: meta.len(),
        });
    }
    Ok(Some(text.trim().to_string()))
}

/// Replaces `path` with `content` atomically: a new temporary file (never
/// through a symbolic link) renamed over it.
fn write_atomic(path: &Path, content: &str) -> Result<(), DirError> {
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
        .map_err(io(&tmp, "cannot create"))?;
    writeln!(f, "{content}")
        .and_then(|()| f.sync_all())
        .map_err(io(&tmp, "write"))?;
    fs::rename(&tmp, path).map_err(io(path, "rename"))
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
pub fn is_ckpt_init(pid: i32) -> Result<bool> {
    let exe = match fs::metadata(format!("/proc/{pid}/exe")) {
        Ok(m) => m,
        Err(_) => return Ok(false),
    };
    let me = fs::metadata("/proc/self/exe").map_err(io(Path::new("/proc/self/exe"), ""))?;
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
    pub fn create_or_open(root: &Path) -> Result<JobDir> {
        let root = std::path::absolute(root).map_err(|source| DirError::Root {
            path: root.to_path_buf(),
            source,
        })?;
        if let Some(parent) = root.parent()
            && !parent.is_dir()
        {
            return Err(DirError::NoParent {
                parent: parent.to_path_buf(),
                root,
            });
        }
        ensure_dir(&root)?;
        let dir = JobDir { root };
        ensure_dir(&dir.root.join("parts"))?;
        ensure_dir(&dir.coord_state_dir())?;
        dir.store()?;
        // The secret: load_or_create makes it O_EXCL 0600, and refuses an
        // existing one others can read.
        Secret::load_or_create(&dir.secret_path()).map_err(|source| DirError::Secret {
            path: dir.secret_path(),
            source,
        })?;
        let meta = fs::symlink_metadata(dir.secret_path()).map_err(io(&dir.secret_path(), ""))?;
        check_ours(&dir.secret_path(), &meta, false)?;
        Ok(dir)
    }

    /// Opens an existing JOBDIR (for reading only).
    pub fn open(root: &Path) -> Result<JobDir> {
        let resolve = |source| DirError::Root {
            path: root.to_path_buf(),
            source,
        };
        let root = std::path::absolute(root).map_err(resolve)?;
        let meta = fs::symlink_metadata(&root).map_err(|source| DirError::Root {
            path: root.clone(),
            source,
        })?;
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
    pub fn mark_last_committed(&self, epoch: u64) -> Result<(), DirError> {
        write_atomic(&self.root.join(LAST_COMMITTED), &epoch.to_string())
    }

    /// The epoch records.
    pub fn store(&self) -> Result<EpochStore> {
        let dir = self.coord_state_dir().join(JOB_ID);
        ensure_dir(&dir)?;
        Ok(EpochStore::open(&self.coord_state_dir(), JOB_ID)?)
    }

    /// A part's directory (its agent's checkpoint root).
    pub fn part_dir(&self, part: &str) -> PathBuf {
        self.root.join("parts").join(part)
    }

    /// Creates (or checks: ours, not a symbolic link) a part's directory.
    pub fn ensure_part(&self, part: &str) -> Result<PathBuf> {
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
    pub fn set_node(&self, part: &str, node: &str) -> Result<(), DirError> {
        check_name("node", node)?;
        write_atomic(&self.part_dir(part).join(NODE), node)
    }

    /// The node `part` runs on, as recorded.
    pub fn node_of(&self, part: &str) -> Result<Option<String>> {
        let node = read_small(&self.part_dir(part).join(NODE))?;
        if let Some(n) = &node {
            check_name("node", n).map_err(|e| DirError::PartNode {
                part: part.to_string(),
                source: Box::new(e),
            })?;
        }
        Ok(node)
    }

    /// Records that `part`'s tree ended with `code` on this node (`ckpt job
    /// run`, or a restore's agent, once the tree exits): what a launcher
    /// waiting for its daemons learns from.
    pub fn record_exit(&self, part: &str, code: i32) -> Result<(), DirError> {
        write_atomic(&self.part_dir(part).join(EXIT), &code.to_string())
    }

    /// Forgets how `part` ended before (it starts or is restored again).
    pub fn clear_exit(&self, part: &str) -> Result<(), DirError> {
        let path = self.part_dir(part).join(EXIT);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&path, "remove")(e)),
            _ => Ok(()),
        }
    }

    /// How `part`'s tree ended last, if it is recorded.
    pub fn exit_of(&self, part: &str) -> Result<Option<PartExit>> {
        let path = self.part_dir(part).join(EXIT);
        let Some(text) = read_small(&path)? else {
            return Ok(None);
        };
        let at = fs::metadata(&path)
            .and_then(|m| m.modified())
            .map_err(io(&path, ""))?;
        match text.parse::<i32>() {
            Ok(code) => Ok(Some(PartExit { code, at })),
            Err(_) => Err(DirError::NotAnExit { path, text }),
        }
    }

    /// The recorded root pid of `part`, if any (not checked against the
    /// running system: see [`JobDir::checked_root`]).
    pub fn root_of(&self, part: &str) -> Result<Option<i32>> {
        let path = self.root_pid_path(part);
        let Some(text) = read_small(&path)? else {
            return Ok(None);
        };
        match text.parse::<i32>() {
            Ok(pid) if pid > 1 => Ok(Some(pid)),
            _ => Err(DirError::NotAPid { path, text }),
        }
    }

    /// The root pid of `part` to dump on this node: recorded, alive, and a
    /// ckpt PID-namespace init.
    pub fn checked_root(&self, part: &str) -> Result<i32> {
        let path = self.root_pid_path(part);
        let part = part.to_string();
        let Some(pid) = self.root_of(&part)? else {
            return Err(DirError::NoRootPid { part, path });
        };
        if !is_ckpt_init(pid)? {
            return Err(DirError::NotCkptInit { part, pid, path });
        }
        Ok(pid)
    }

    /// Every part, sorted by name (the order `--nodes` lists follow).
    pub fn parts(&self) -> Result<Vec<PartInfo>> {
        let dir = self.root.join("parts");
        let mut names: Vec<String> = match fs::read_dir(&dir) {
            Ok(d) => d
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| check_name("part", n).is_ok())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io(&dir, "")(e)),
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
    fn committed(&self) -> Result<BTreeMap<u64, GlobalManifest>> {
        let store = self.store()?;
        let mut out = BTreeMap::new();
        let entries = fs::read_dir(store.dir()).map_err(io(store.dir(), ""))?;
        for e in entries.flatten() {
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
    fn abort_notes(&self) -> Result<Vec<(u64, bool)>> {
        let store = self.store()?;
        let entries = fs::read_dir(store.dir()).map_err(io(store.dir(), ""))?;
        Ok(entries
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
    fn aborted(&self) -> Result<Vec<u64>> {
        Ok(self
            .abort_notes()?
            .into_iter()
            .filter(|&(_, restart)| !restart)
            .map(|(epoch, _)| epoch)
            .collect())
    }

    /// Image directories on disk: epoch → (part → path).
    fn image_dirs(&self) -> Result<BTreeMap<u64, BTreeMap<String, PathBuf>>> {
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
    pub fn epochs(&self) -> Result<Vec<EpochInfo>> {
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
    pub fn prune(&self, keep: usize, finished: u64) -> Result<Vec<u64>> {
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
            fs::remove_file(&record).map_err(|source| DirError::Prune {
                epoch,
                path: record.clone(),
                source,
            })?;
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
                fs::remove_dir_all(path).map_err(|source| DirError::Prune {
                    epoch,
                    path: path.clone(),
                    source,
                })?;
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
    pub fn lock(&self) -> Result<nix::fcntl::Flock<File>> {
        let path = self.root.join("lock");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(io(&path, "cannot open"))?;
        check_ours(&path, &f.metadata().map_err(io(&path, ""))?, false)?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, errno)| DirError::Locked { path, errno })
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
