//! An MPI launcher under `ckpt slurm` in an allocation of several nodes
//! (`ckpt slurm -- mpirun ...`): the launcher runs once, as the part of the
//! batch script's node, and the daemons it starts on the other nodes
//! through Slurm (Open MPI's `orted`) become the job's other parts, so the
//! whole job is checkpointed and restored as one `ckpt job`.
//!
//! Why a stand-in for `srun`: `mpirun` starts its daemons with `srun`,
//! which stays `mpirun`'s child for the whole job, holding connections to
//! slurmctld and slurmstepd that no checkpoint can save. So the launcher's
//! part finds `srun` on its PATH as ckpt's stand-in instead (this very
//! executable under that name, [`standin`]): it writes the launch it was
//! asked for as a request into the launch directory and waits for its exit
//! status there, holding nothing a checkpoint cannot save. The wrapper
//! (`ckpt slurm`, outside every part) runs each request with the real
//! `srun` ([`Daemons`]) and writes its status back when it ends. The
//! launch agent Open MPI prefixes to the daemon's command
//! (`orte_launch_agent`) is `ckpt job run --uts --ipcns`, which makes each
//! daemon the part of its node, in a UTS namespace named after the node
//! (mpirun finds its own node in the allocation by `gethostname()`, and
//! the parts keep their node's name wherever they are restored) and an IPC
//! namespace of its own (the SysV segments of MPI's shared-memory
//! transports come back with their ids, whatever the node holds).
//!
//! MPICH's `mpiexec` (hydra) is run with its ssh launcher instead, whose
//! program is the stand-in under the name `ssh`: hydra forks the proxy of
//! its own node inside its part (it knows the node by `gethostname()`,
//! hence the UTS namespace again) and asks "ssh" for every other node's,
//! which the wrapper starts with the real srun on that node, as its part,
//! under `ckpt job run --uts --ipcns`.
//!
//! After a restart the stand-in is restored waiting as it was, but the
//! real `srun` is gone: the restored daemons' parts run under `ckpt job
//! restore` instead. The wrapper then writes the request's status once
//! every daemon's part has recorded its exit ([`JobDir::record_exit`]), so
//! `mpirun` sees its daemons end exactly as it would have. A checkpoint
//! that kills the job ends the daemons too: their ends, which are the
//! checkpoint's and not the job's, are never written back ([`Daemons::hold`]).

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::dir::{DirError, JobDir};
use crate::sys::{ChildSignals, child_signals, close_inherited_fds};

/// This module's results.
type Result<T, E = DaemonsError> = std::result::Result<T, E>;

/// What went wrong launching an MPI launcher's daemons; each names the
/// file, request or word.
#[derive(Debug, thiserror::Error)]
pub enum DaemonsError {
    /// The stand-in runs outside a `ckpt slurm` launcher's part.
    #[error(
        "this srun is ckpt's stand-in for an MPI launcher under `ckpt slurm` ({LAUNCH_DIR_VAR} is not set); run the real srun"
    )]
    NotUnderWrapper,
    /// The ssh stand-in was asked for something other than a hydra proxy.
    #[error(
        "ssh (ckpt's stand-in) runs only MPICH's hydra_pmi_proxy on a node of the job (`-x NODE hydra_pmi_proxy ...`), not `{argv}`"
    )]
    NotAProxy {
        /// The command asked for.
        argv: String,
    },
    /// The stand-in was asked for something other than the daemons'
    /// launch `ckpt slurm` set up.
    #[error(
        "srun (ckpt's stand-in) runs only the MPI launcher's daemons through the launch agent `{agent}`, not `{argv}`: start other steps outside the application"
    )]
    NotTheDaemons {
        /// The launch agent expected.
        agent: String,
        /// The command asked for.
        argv: String,
    },
    /// A word or variable that is not UTF-8 text.
    #[error("srun (ckpt's stand-in): {what} is not UTF-8 text, refused")]
    NotText {
        /// The word or variable.
        what: String,
    },
    /// A path the launch agent would split at a space.
    #[error("{}: the path of an MPI launch agent must not contain white space", path.display())]
    SpaceInPath {
        /// The path.
        path: PathBuf,
    },
    /// Every request number is taken.
    #[error("{}: already {MAX_REQUESTS} launches, refused", dir.display())]
    TooManyRequests {
        /// The launch directory.
        dir: PathBuf,
    },
    /// A request or status file that does not say what it should.
    #[error("{}: {what}", path.display())]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
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
    /// The job directory.
    #[error(transparent)]
    Dir(#[from] DirError),
    /// The real srun is not on PATH.
    #[error("srun is not on PATH (besides ckpt's stand-in in {})", standin.display())]
    NoSrun {
        /// The stand-in's directory, left out of the search.
        standin: PathBuf,
    },
    /// The path of this very ckpt is unknown.
    #[error("cannot find the ckpt executable")]
    OwnExe(#[source] std::io::Error),
    /// The wrapper's launch thread did not start.
    #[error("cannot start the thread that launches the MPI daemons")]
    Thread(#[source] std::io::Error),
}

/// A `map_err` for a file operation on `path`.
fn io(path: &Path, step: &'static str) -> impl FnOnce(std::io::Error) -> DaemonsError {
    let path = path.to_path_buf();
    move |source| DaemonsError::Io { path, step, source }
}

/// The variable that leads the stand-in to the launch directory.
pub const LAUNCH_DIR_VAR: &str = "CKPT_SLURM_LAUNCH";
/// The name the stand-in answers to for Open MPI.
const SRUN: &str = "srun";
/// The name the stand-in answers to for MPICH's hydra.
const SSH: &str = "ssh";
/// The launch directory, relative to `ckpt slurm`'s `DIR`.
const LAUNCH_SUBDIR: &str = "launch";
/// The stand-in's directory in the launch directory, first on the
/// launcher's PATH.
const BIN_SUBDIR: &str = "bin";
/// The file naming the launcher's part.
const LAUNCHER_PART: &str = "launcher-part";
/// Suffix of a request file (`N.req`).
const REQUEST_SUFFIX: &str = ".req";
/// Suffix of a request's status file (`N.exit`).
const EXIT_SUFFIX: &str = ".exit";
/// Most launches a job makes (Open MPI makes one; each MPI_Comm_spawn
/// onto new nodes one more).
const MAX_REQUESTS: u32 = 64;
/// Longest request read back (the launcher's whole environment).
const MAX_REQUEST: u64 = 1 << 20;
/// Longest status file read back.
const MAX_STATUS: u64 = 64;
/// How often the stand-in looks for its status, and the wrapper for
/// requests and ends.
const POLL: Duration = Duration::from_millis(100);
/// Hydra's launcher, its program, and whether it forks the proxy of its
/// own node itself.
const HYDRA_LAUNCHER_VAR: &str = "HYDRA_LAUNCHER";
const HYDRA_LAUNCHER_EXEC_VAR: &str = "HYDRA_LAUNCHER_EXEC";
const HYDRA_AUTOFORK_VAR: &str = "HYDRA_LAUNCHER_AUTOFORK";
/// The daemon hydra starts on every other node.
const HYDRA_PROXY: &str = "hydra_pmi_proxy";
/// Open MPI's launch agent: the words the daemon's command starts with.
const OMPI_AGENT_VAR: &str = "OMPI_MCA_orte_launch_agent";
/// The daemon Open MPI 4 starts on every other node.
const OMPI_DAEMON: &str = "orted";
/// srun's option that lets a step share the batch step's resources.
const OVERLAP: &str = "--overlap";

/// Settings that keep an Open MPI job's state where a checkpoint can take
/// it and a restore on other nodes can give it back, each with why; the
/// user's own setting wins.
const OMPI_SETTINGS: [(&str, &str); 4] = [
    // No hwloc topology file shared at a fixed address, which a restored
    // reader would follow into another writer's layout.
    ("OMPI_MCA_rtc_hwloc_vmhole", "none"),
    // PMIx data held by the server (in the part), not in files mapped
    // from a node-local session directory.
    ("PMIX_MCA_gds", "hash"),
    // The session directory on tmpfs, whose files a dump saves.
    ("OMPI_MCA_orte_tmpdir_base", "/dev/shm"),
    // A timer instead of the debugger-attach FIFO mpirun keeps open.
    ("OMPI_MCA_orte_debugger_check_rate", "3600"),
];

/// Which MPI launcher the application is: how its daemons are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// Open MPI's `mpirun` (ORTE): `srun` runs the launch agent + `orted`.
    OpenMpi,
    /// MPICH's `mpiexec` (hydra): "ssh" runs `hydra_pmi_proxy` per node.
    Hydra,
}

impl std::fmt::Display for Flavor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Flavor::OpenMpi => "Open MPI",
            Flavor::Hydra => "MPICH (hydra)",
        })
    }
}

impl Flavor {
    /// The launcher `program` (the application's first word) is, if it is
    /// one: told by its name, after following the links on PATH
    /// (`mpirun` is whichever MPI the system's alternatives chose). A
    /// launcher whose file is plainly `mpirun` or `mpiexec` is hydra when
    /// hydra's proxy lies beside it: MPICH installed by pip has its
    /// `mpiexec` and `mpirun` as copies of `mpiexec.hydra`, not links.
    pub fn of(program: &OsStr) -> Option<Flavor> {
        let name = |p: &Path| p.file_name().and_then(OsStr::to_str).map(str::to_string);
        let given = name(Path::new(program))?;
        if !GENERIC_LAUNCHERS.contains(&given.as_str()) && Flavor::named(&given).is_none() {
            return None;
        }
        let launcher = find_on_path(program).and_then(|p| std::fs::canonicalize(p).ok());
        let flavor = launcher
            .as_deref()
            .and_then(name)
            .and_then(|resolved| Flavor::named(&resolved))
            .or_else(|| Flavor::named(&given))
            .unwrap_or_else(|| {
                let beside_proxy = launcher
                    .as_deref()
                    .and_then(Path::parent)
                    .is_some_and(|dir| is_executable(&dir.join(HYDRA_PROXY)));
                if beside_proxy {
                    Flavor::Hydra
                } else {
                    Flavor::OpenMpi
                }
            });
        Some(flavor)
    }

    /// The launcher a file name says, if it says one MPI's.
    fn named(file_name: &str) -> Option<Flavor> {
        const OPEN_MPI: [&str; 3] = ["mpirun.openmpi", "mpiexec.openmpi", "orterun"];
        const HYDRA: [&str; 3] = ["mpiexec.hydra", "mpiexec.mpich", "mpirun.mpich"];
        if OPEN_MPI.contains(&file_name) {
            Some(Flavor::OpenMpi)
        } else if HYDRA.contains(&file_name) {
            Some(Flavor::Hydra)
        } else {
            None
        }
    }
}

/// Launcher names every MPI uses: Open MPI's unless hydra's proxy is
/// beside the file.
const GENERIC_LAUNCHERS: [&str; 2] = ["mpirun", "mpiexec"];

/// `program` as `execvp` finds it.
fn find_on_path(program: &OsStr) -> Option<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Some(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
}

/// Whether `p` is an executable regular file.
fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// How a launch reaches the stand-in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// As `srun` (Open MPI).
    Srun,
    /// As `ssh` (hydra).
    Ssh,
}

impl Via {
    fn name(self) -> &'static str {
        match self {
            Via::Srun => SRUN,
            Via::Ssh => SSH,
        }
    }

    fn from_name(name: &str) -> Option<Via> {
        [Via::Srun, Via::Ssh].into_iter().find(|v| v.name() == name)
    }
}

/// The stand-in this process was started as (`argv[0]` named `srun` or
/// `ssh`), if it was.
pub fn invoked_as_standin(argv0: &OsStr) -> Option<Via> {
    Path::new(argv0)
        .file_name()
        .and_then(OsStr::to_str)
        .and_then(Via::from_name)
}

/// The launch directory of a `ckpt slurm` job: requests, their statuses,
/// and the stand-in's directory.
#[derive(Debug, Clone)]
pub struct LaunchDir {
    path: PathBuf,
}

impl LaunchDir {
    /// The launch directory of `ckpt slurm`'s `DIR` (whether it exists or
    /// not).
    pub fn of(dir: &Path) -> LaunchDir {
        LaunchDir {
            path: dir.join(LAUNCH_SUBDIR),
        }
    }

    /// Creates it (0700) with the stand-in, a link to this executable, for
    /// the first run of a launcher whose part is `part`; a previous run's
    /// requests and statuses are removed.
    pub fn create(dir: &Path, part: &str) -> Result<LaunchDir> {
        let me = std::env::current_exe().map_err(DaemonsError::OwnExe)?;
        let launch = LaunchDir::of(dir);
        let _ = std::fs::remove_dir_all(&launch.path);
        let bin = launch.bin();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&bin)
            .map_err(io(&bin, "cannot create"))?;
        for via in [Via::Srun, Via::Ssh] {
            let standin = bin.join(via.name());
            std::os::unix::fs::symlink(&me, &standin).map_err(io(&standin, "cannot create"))?;
        }
        write_file(&launch.path.join(LAUNCHER_PART), part)?;
        Ok(launch)
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stand-in's directory.
    fn bin(&self) -> PathBuf {
        self.path.join(BIN_SUBDIR)
    }

    /// The launcher's part, as its first run recorded it.
    pub fn launcher_part(&self) -> Result<Option<String>> {
        read_file(&self.path.join(LAUNCHER_PART), MAX_STATUS)
    }

    fn request_path(&self, n: u32) -> PathBuf {
        self.path.join(format!("{n}{REQUEST_SUFFIX}"))
    }

    fn exit_path(&self, n: u32) -> PathBuf {
        self.path.join(format!("{n}{EXIT_SUFFIX}"))
    }

    /// The requests on record, by number.
    fn requests(&self) -> Vec<u32> {
        let mut out: Vec<u32> = std::fs::read_dir(&self.path)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| {
                        let name = e.file_name();
                        name.to_str()?.strip_suffix(REQUEST_SUFFIX)?.parse().ok()
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_unstable();
        out
    }

    /// Request `n`'s status, once the wrapper wrote it.
    fn exit_of(&self, n: u32) -> Result<Option<u8>> {
        let path = self.exit_path(n);
        let Some(text) = read_file(&path, MAX_STATUS)? else {
            return Ok(None);
        };
        text.parse().map(Some).map_err(|_| DaemonsError::BadFile {
            path,
            what: format!("{text:?} is not an exit status"),
        })
    }

    /// Forgets every status written: a restore brings back stand-ins whose
    /// daemons run again, whatever became of them after the checkpoint.
    pub fn forget_exits(&self) -> Result<()> {
        for n in self.requests() {
            let path = self.exit_path(n);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io(&path, "cannot remove")(e));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// What the launcher's part adds to its environment for `flavor`: the
    /// stand-in first on PATH and the way to this directory; for Open MPI
    /// its launch agent (`ckpt job run` in the job directory `jobdir`) and
    /// [`OMPI_SETTINGS`] the user did not set; for hydra the ssh launcher
    /// through the stand-in. Returns the variables and a note of what was
    /// set, for the job's output.
    pub fn launcher_env(
        &self,
        flavor: Flavor,
        jobdir: &Path,
    ) -> Result<(Vec<(OsString, OsString)>, String)> {
        let mut path = self.bin().into_os_string();
        if let Some(old) = std::env::var_os("PATH") {
            path.push(":");
            path.push(old);
        }
        let mut vars: Vec<(OsString, OsString)> = vec![
            ("PATH".into(), path),
            (LAUNCH_DIR_VAR.into(), self.path.clone().into_os_string()),
        ];
        let mut set: Vec<(String, String)> = Vec::new();
        match flavor {
            Flavor::OpenMpi => {
                let agent = agent_words(jobdir)?
                    .iter()
                    .map(|w| w.to_string_lossy().into_owned())
                    .chain([OMPI_DAEMON.to_string()])
                    .collect::<Vec<_>>()
                    .join(" ");
                set.push((OMPI_AGENT_VAR.into(), agent));
                for (k, v) in OMPI_SETTINGS {
                    if std::env::var_os(k).is_none() {
                        set.push((k.into(), v.into()));
                    }
                }
            }
            Flavor::Hydra => {
                let ssh = self.bin().join(SSH);
                set.push((HYDRA_LAUNCHER_VAR.into(), SSH.into()));
                set.push((HYDRA_LAUNCHER_EXEC_VAR.into(), ssh.display().to_string()));
                set.push((HYDRA_AUTOFORK_VAR.into(), "1".into()));
            }
        }
        let note = set
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        vars.extend(set.into_iter().map(|(k, v)| (k.into(), v.into())));
        Ok((vars, note))
    }
}

/// The words a daemon's command is prefixed with to make it its node's
/// part: `ckpt job run --dir JOBDIR --uts --ipcns --`, a node of its
/// own as far as host name and SysV objects go. Open MPI splits its launch
/// agent at spaces, so neither path may hold one.
fn agent_words(jobdir: &Path) -> Result<Vec<OsString>> {
    let me = std::env::current_exe().map_err(DaemonsError::OwnExe)?;
    for p in [&me, &jobdir.to_path_buf()] {
        if p.as_os_str().as_bytes().iter().any(u8::is_ascii_whitespace) {
            return Err(DaemonsError::SpaceInPath { path: p.clone() });
        }
    }
    let mut words: Vec<OsString> = vec![me.into_os_string()];
    words.extend(["job", "run", "--dir"].map(OsString::from));
    words.push(jobdir.as_os_str().to_owned());
    words.extend(["--uts", "--ipcns", "--"].map(OsString::from));
    Ok(words)
}

/// Writes `content` to `path` atomically (a temporary file renamed over
/// it), never through a symbolic link.
fn write_file(path: &Path, content: &str) -> Result<()> {
    let tmp = temp_beside(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(io(&tmp, "cannot create"))?;
    f.write_all(content.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(io(&tmp, "cannot write"))?;
    std::fs::rename(&tmp, path).map_err(io(path, "cannot rename into place"))
}

/// A temporary name beside `path`, unique to this process.
fn temp_beside(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.tmp.{}", std::process::id()))
}

/// Reads a small text file, never through a symbolic link, at most
/// `limit` bytes; `None` if it does not exist.
fn read_file(path: &Path, limit: u64) -> Result<Option<String>> {
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path, "cannot open")(e)),
    };
    let len = f.metadata().map_err(io(path, "cannot look at"))?.len();
    if len > limit {
        return Err(DaemonsError::BadFile {
            path: path.to_path_buf(),
            what: format!("{len} bytes, more than {limit}"),
        });
    }
    let mut text = String::new();
    f.take(limit)
        .read_to_string(&mut text)
        .map_err(io(path, "cannot read"))?;
    Ok(Some(text.trim().to_string()))
}

/// A launch the stand-in was asked for: srun's arguments, environment and
/// working directory, as the launcher gave them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Request {
    /// How it came.
    via: Via,
    /// The stand-in's arguments (without its name), verbatim: Open MPI
    /// quotes its `-mca` values and expects them back as they were.
    args: Vec<String>,
    /// The whole environment, `NAME=value`.
    env: Vec<String>,
    /// The working directory.
    cwd: PathBuf,
}

/// A word as text, or the error naming it.
fn text(word: &OsStr, what: impl FnOnce() -> String) -> Result<String> {
    word.to_str()
        .map(str::to_string)
        .ok_or_else(|| DaemonsError::NotText { what: what() })
}

impl Request {
    /// The request of this process: its arguments `args`, its environment
    /// and working directory.
    fn capture(via: Via, args: &[OsString]) -> Result<Request> {
        let args = args
            .iter()
            .enumerate()
            .map(|(i, a)| text(a, || format!("argument {}", i + 1)))
            .collect::<Result<Vec<_>>>()?;
        let env = std::env::vars_os()
            .map(|(k, v)| {
                let name = k.to_string_lossy().into_owned();
                let mut kv = k;
                kv.push("=");
                kv.push(v);
                text(&kv, || format!("variable {name}"))
            })
            .collect::<Result<Vec<_>>>()?;
        let cwd = std::env::current_dir().map_err(io(Path::new("."), "cannot resolve"))?;
        Ok(Request {
            via,
            args,
            env,
            cwd,
        })
    }

    /// Checks that it is the daemons' launch `ckpt slurm` set up: for
    /// srun, the launch agent's command in its environment; for ssh, a
    /// hydra proxy on one node.
    fn check(&self) -> Result<()> {
        match self.via {
            Via::Srun => {
                let agent = self
                    .env
                    .iter()
                    .find_map(|kv| kv.strip_prefix(OMPI_AGENT_VAR)?.strip_prefix('='))
                    .unwrap_or_default();
                if !self.starts_agent(agent) {
                    return Err(DaemonsError::NotTheDaemons {
                        agent: agent.to_string(),
                        argv: self.args.join(" "),
                    });
                }
            }
            Via::Ssh => {
                if self.ssh_node().is_none() {
                    return Err(DaemonsError::NotAProxy {
                        argv: self.args.join(" "),
                    });
                }
            }
        }
        Ok(())
    }

    /// For hydra's `ssh -x NODE "PROXY" ARGS...`: the node, if the command
    /// is a hydra proxy.
    fn ssh_node(&self) -> Option<&str> {
        let [x, node, program, ..] = self.args.as_slice() else {
            return None;
        };
        let program = program.trim_matches('"');
        let is_proxy = Path::new(program).file_name() == Some(OsStr::new(HYDRA_PROXY));
        (x == "-x" && is_proxy && crate::dir::check_name("node", node).is_ok())
            .then_some(node.as_str())
    }

    /// The parts its daemons are (after a restore, the request has ended
    /// when they have): hydra's proxy is its node's part; Open MPI's one
    /// srun starts every part but the launcher's (`None`).
    fn parts(&self) -> Option<Vec<String>> {
        self.ssh_node().map(|n| vec![n.to_string()])
    }

    /// Whether it starts the launch agent's command (the agent's words in
    /// a row, after srun's options): only the daemons' launch goes through.
    fn starts_agent(&self, agent: &str) -> bool {
        let words: Vec<&str> = agent.split_whitespace().collect();
        !words.is_empty()
            && self
                .args
                .windows(words.len())
                .any(|w| w == words.as_slice())
    }

    fn to_json(&self) -> String {
        serde_json::json!({
            "via": self.via.name(),
            "args": self.args,
            "env": self.env,
            "cwd": self.cwd.to_string_lossy(),
        })
        .to_string()
    }

    fn from_json(path: &Path, text: &str) -> Result<Request> {
        let bad = |what: &str| DaemonsError::BadFile {
            path: path.to_path_buf(),
            what: what.to_string(),
        };
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
        let strings = |key: &str| -> Result<Vec<String>> {
            v[key]
                .as_array()
                .ok_or_else(|| bad(&format!("no {key} list")))?
                .iter()
                .map(|s| {
                    s.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| bad(&format!("{key}: not a string")))
                })
                .collect()
        };
        let via = v["via"]
            .as_str()
            .and_then(Via::from_name)
            .ok_or_else(|| bad("no via"))?;
        Ok(Request {
            via,
            args: strings("args")?,
            env: strings("env")?,
            cwd: PathBuf::from(v["cwd"].as_str().ok_or_else(|| bad("no cwd"))?),
        })
    }

    /// The real srun running it: the launcher's environment exactly, with
    /// [`OVERLAP`] (the batch step holds the allocation's resources), the
    /// job's stdout and stderr, no other fd, and a process group of its
    /// own (Slurm's signals to the batch script are the wrapper's). A
    /// hydra proxy runs as `agent` (`ckpt job run`) on its node, its
    /// command through a shell as ssh would run it.
    fn command(&self, srun: &Path, agent: &[OsString]) -> Command {
        let mut cmd = Command::new(srun);
        if !self.args.iter().any(|a| a == OVERLAP) {
            cmd.arg(OVERLAP);
        }
        match self.ssh_node() {
            Some(node) => {
                cmd.args(["--nodes=1", "--ntasks=1", "--mpi=none"])
                    .arg(format!("--nodelist={node}"))
                    .args(agent)
                    .args(["/bin/sh", "-c"])
                    .arg(self.args[2..].join(" "));
            }
            None => {
                cmd.args(&self.args);
            }
        }
        cmd.env_clear()
            .envs(self.env.iter().filter_map(|kv| kv.split_once('=')))
            .current_dir(&self.cwd)
            .stdin(Stdio::null())
            .process_group(0);
        close_inherited_fds(&mut cmd);
        child_signals(&mut cmd, ChildSignals::None);
        cmd
    }
}

/// The stand-in (`srun` or `ssh` for the launcher, as `via` says):
/// records the launch it is asked for with `args` (its arguments) as the
/// next request and waits until the wrapper writes the launch's exit
/// status, which it returns.
pub fn standin(via: Via, args: &[OsString]) -> Result<u8> {
    let dir = std::env::var_os(LAUNCH_DIR_VAR).ok_or(DaemonsError::NotUnderWrapper)?;
    let launch = LaunchDir {
        path: PathBuf::from(dir),
    };
    let request = Request::capture(via, args)?;
    request.check()?;
    let n = launch.submit(&request)?;
    log::info!("{} stand-in: launch {n} recorded", via.name());
    loop {
        if let Some(code) = launch.exit_of(n)? {
            return Ok(code);
        }
        std::thread::sleep(POLL);
    }
}

impl LaunchDir {
    /// Records `request` under the first free number, atomically (a
    /// complete file linked into place, never replacing one).
    fn submit(&self, request: &Request) -> Result<u32> {
        let tmp = temp_beside(&self.request_path(0));
        write_file(&tmp, &request.to_json())?;
        let result = (1..=MAX_REQUESTS)
            .find_map(|n| match std::fs::hard_link(&tmp, self.request_path(n)) {
                Ok(()) => Some(Ok(n)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => None,
                Err(e) => Some(Err(io(&self.request_path(n), "cannot create")(e))),
            })
            .unwrap_or_else(|| {
                Err(DaemonsError::TooManyRequests {
                    dir: self.path.clone(),
                })
            });
        let _ = std::fs::remove_file(&tmp);
        result
    }

    fn request(&self, n: u32) -> Result<Request> {
        let path = self.request_path(n);
        let text = read_file(&path, MAX_REQUEST)?.ok_or_else(|| DaemonsError::BadFile {
            path: path.clone(),
            what: "missing".to_string(),
        })?;
        Request::from_json(&path, &text)
    }

    /// The real srun: the first on PATH that is not the stand-in.
    pub fn real_srun(&self) -> Result<PathBuf> {
        let bin = self.bin();
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .filter(|d| !d.as_os_str().is_empty() && *d != bin)
            .map(|d| d.join(SRUN))
            .find(|p| is_executable(p))
            .ok_or(DaemonsError::NoSrun { standin: bin })
    }
}

/// How the wrapper serves the launcher's requests.
#[derive(Debug, Clone)]
pub enum Serve {
    /// The first run: each request is run with this real srun.
    Fresh {
        /// The real srun.
        srun: PathBuf,
        /// The job directory, whose `ckpt job run` a hydra proxy runs under.
        jobdir: PathBuf,
    },
    /// After a restore that started at `since`: the daemons already run
    /// again, restored as the parts of the job directory other than the
    /// launcher's; a request waiting for its status gets it when they have
    /// all ended.
    Restored {
        /// The job directory.
        jobdir: JobDir,
        /// When the restore started (an exit recorded before is the
        /// checkpoint's).
        since: SystemTime,
    },
}

/// Whether the daemons' ends may be written back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Yes.
    Open,
    /// Not now: a checkpoint is running, which may end them.
    Held,
    /// Never: a checkpoint ended them, the job is requeued.
    Closed,
}

/// What the wrapper and its launch thread share.
struct Shared {
    launch: LaunchDir,
    hold: Mutex<Hold>,
    stop: AtomicBool,
}

/// The wrapper's side: a thread that runs the launcher's requests and
/// writes their statuses back.
pub struct Daemons {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Where the thread's warnings go (one line each).
pub type ThreadWarn = fn(&str);

impl Daemons {
    /// Starts serving `launch`'s requests as `how` says.
    pub fn serve(launch: LaunchDir, how: Serve, warn: ThreadWarn) -> Result<Daemons> {
        let shared = Arc::new(Shared {
            launch,
            hold: Mutex::new(Hold::Open),
            stop: AtomicBool::new(false),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("mpi-daemons".into())
            .spawn(move || match how {
                Serve::Fresh { srun, jobdir } => serve_fresh(&s, &srun, &jobdir, warn),
                Serve::Restored { jobdir, since } => serve_restored(&s, &jobdir, since, warn),
            })
            .map_err(DaemonsError::Thread)?;
        Ok(Daemons {
            shared,
            thread: Some(thread),
        })
    }

    /// Holds every daemon's end back while a checkpoint runs (one that
    /// kills the job ends them).
    pub fn hold(&self) {
        *self.shared.lock() = Hold::Held;
    }

    /// After the checkpoint: `ended_job` (it killed the job, which is
    /// requeued) drops the held ends for good; otherwise they are written.
    pub fn release(&self, ended_job: bool) {
        *self.shared.lock() = if ended_job { Hold::Closed } else { Hold::Open };
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Hold> {
        self.hold.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes request `n`'s status unless held; returns whether it is
    /// settled (written, or dropped for good).
    fn settle(&self, n: u32, code: u8, warn: ThreadWarn) -> bool {
        let hold = self.lock();
        match *hold {
            Hold::Held => false,
            Hold::Closed => true,
            Hold::Open => {
                if let Err(e) = write_file(&self.launch.exit_path(n), &code.to_string()) {
                    warn(&format!("MPI daemons' launch {n} ended with {code}: {e}"));
                }
                true
            }
        }
    }
}

/// A shell's view of a child's end: its code, or 128 + its signal.
fn status_code(status: std::process::ExitStatus) -> u8 {
    u8::try_from(ckpt_restorer::run::exit_code(status)).unwrap_or(u8::MAX)
}

/// The first run: runs every new request with `srun` and writes its status
/// when that srun ends.
fn serve_fresh(s: &Shared, srun: &Path, jobdir: &Path, warn: ThreadWarn) {
    let agent = match agent_words(jobdir) {
        Ok(a) => a,
        Err(e) => {
            warn(&format!("MPI daemons cannot be launched: {e}"));
            return;
        }
    };
    let mut started: Vec<u32> = Vec::new();
    let mut running: Vec<(u32, Child)> = Vec::new();
    let mut ended: Vec<(u32, u8)> = Vec::new();
    while !s.stop.load(Ordering::Relaxed) {
        for n in s.launch.requests() {
            if started.contains(&n) {
                continue;
            }
            started.push(n);
            let child = s.launch.request(n).and_then(|r| {
                r.command(srun, &agent)
                    .spawn()
                    .map_err(io(srun, "cannot run"))
            });
            match child {
                Ok(c) => running.push((n, c)),
                Err(e) => {
                    warn(&format!("MPI daemons' launch {n}: {e}"));
                    ended.push((n, 1));
                }
            }
        }
        running.retain_mut(|(n, c)| match c.try_wait() {
            Ok(Some(status)) => {
                ended.push((*n, status_code(status)));
                false
            }
            Ok(None) => true,
            Err(e) => {
                warn(&format!("MPI daemons' launch {n}: waiting for srun: {e}"));
                ended.push((*n, 1));
                false
            }
        });
        ended.retain(|&(n, code)| !s.settle(n, code, warn));
        std::thread::sleep(POLL);
    }
}

/// After a restore: a request without a status gets the worst exit of its
/// daemons' parts once each has recorded one since the restore started.
fn serve_restored(s: &Shared, jobdir: &JobDir, since: SystemTime, warn: ThreadWarn) {
    let mut settled: Vec<u32> = Vec::new();
    while !s.stop.load(Ordering::Relaxed) {
        for n in s.launch.requests() {
            if settled.contains(&n) || !matches!(s.launch.exit_of(n), Ok(None)) {
                continue;
            }
            match request_ended(s, jobdir, n, since) {
                Ok(Some(code)) => {
                    if s.settle(n, code, warn) {
                        settled.push(n);
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    warn(&format!("MPI daemons' launch {n}: {e}"));
                    settled.push(n);
                }
            }
        }
        std::thread::sleep(POLL);
    }
}

/// The worst exit of request `n`'s daemons' parts, once all have ended
/// since `since`.
fn request_ended(s: &Shared, jobdir: &JobDir, n: u32, since: SystemTime) -> Result<Option<u8>> {
    let parts = match s.launch.request(n)?.parts() {
        Some(p) => p,
        None => {
            let launcher = s.launch.launcher_part()?;
            jobdir
                .parts()?
                .into_iter()
                .map(|p| p.name)
                .filter(|p| Some(p) != launcher.as_ref())
                .collect()
        }
    };
    let mut worst = 0u8;
    for p in parts {
        match jobdir.exit_of(&p)? {
            Some(e) if e.at >= since => {
                worst = worst.max(u8::try_from(e.code).unwrap_or(u8::MAX));
            }
            _ => return Ok(None),
        }
    }
    Ok(Some(worst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launchers_are_told_by_their_name() {
        for open_mpi in ["/usr/bin/mpirun.openmpi", "orterun", "mpiexec.openmpi"] {
            assert_eq!(
                Flavor::of(OsStr::new(open_mpi)),
                Some(Flavor::OpenMpi),
                "{open_mpi}"
            );
        }
        for hydra in ["mpiexec.hydra", "/usr/bin/mpiexec.mpich", "mpirun.mpich"] {
            assert_eq!(
                Flavor::of(OsStr::new(hydra)),
                Some(Flavor::Hydra),
                "{hydra}"
            );
        }
        for no in ["srun", "./ring", "mpirun-wrapper", "python3"] {
            assert_eq!(Flavor::of(OsStr::new(no)), None, "{no}");
        }
        assert_eq!(
            invoked_as_standin(OsStr::new("/x/launch/bin/srun")),
            Some(Via::Srun)
        );
        assert_eq!(invoked_as_standin(OsStr::new("ssh")), Some(Via::Ssh));
        assert_eq!(invoked_as_standin(OsStr::new("ckpt")), None);
    }

    #[test]
    fn a_plain_mpiexec_is_hydra_when_hydra_proxy_is_beside_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let install = |dir: &str, files: &[&str]| {
            let bin = tmp.path().join(dir);
            std::fs::create_dir(&bin).expect("bin dir");
            for f in files {
                let path = bin.join(f);
                std::fs::write(&path, "#!/bin/sh\n").expect("launcher file");
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                    .expect("chmod");
            }
            bin
        };
        // MPICH as pip installs it: mpiexec and mpirun are copies of
        // mpiexec.hydra.
        let pip = install("pip", &["mpiexec", "mpirun", "hydra_pmi_proxy"]);
        // Open MPI 5 built from source: a plain mpirun, no proxy.
        let ompi = install("ompi", &["mpirun", "mpiexec"]);
        // A bin of both MPIs (Debian's /usr/bin): the name decides.
        let both = install("both", &["orterun", "mpiexec.hydra", "hydra_pmi_proxy"]);
        std::os::unix::fs::symlink("orterun", both.join("mpirun")).expect("mpirun link");
        std::os::unix::fs::symlink("mpiexec.hydra", both.join("mpiexec")).expect("mpiexec link");
        for (launcher, flavor) in [
            (pip.join("mpiexec"), Flavor::Hydra),
            (pip.join("mpirun"), Flavor::Hydra),
            (ompi.join("mpirun"), Flavor::OpenMpi),
            (ompi.join("mpiexec"), Flavor::OpenMpi),
            (both.join("mpirun"), Flavor::OpenMpi),
            (both.join("mpiexec"), Flavor::Hydra),
        ] {
            assert_eq!(
                Flavor::of(launcher.as_os_str()),
                Some(flavor),
                "{}",
                launcher.display()
            );
        }
        assert_eq!(Flavor::of(pip.join("hydra_pmi_proxy").as_os_str()), None);
    }

    #[test]
    fn a_hydra_proxy_runs_on_its_node_as_its_part() {
        let r = Request {
            via: Via::Ssh,
            args: [
                "-x",
                "n2",
                "\"/usr/bin/hydra_pmi_proxy\"",
                "--control-port",
                "127.0.0.1:5",
                "--proxy-id",
                "1",
            ]
            .map(String::from)
            .to_vec(),
            env: Vec::new(),
            cwd: "/".into(),
        };
        r.check().expect("a proxy");
        assert_eq!(r.parts(), Some(vec!["n2".to_string()]));
        let agent: Vec<OsString> = ["ckpt", "job", "run", "--uts", "--"]
            .map(OsString::from)
            .to_vec();
        let cmd = r.command(Path::new("/s/srun"), &agent);
        let args: Vec<&OsStr> = cmd.get_args().collect();
        assert!(args.contains(&OsStr::new("--nodelist=n2")), "{args:?}");
        assert_eq!(
            args.last().copied(),
            Some(OsStr::new(
                "\"/usr/bin/hydra_pmi_proxy\" --control-port 127.0.0.1:5 --proxy-id 1"
            ))
        );
        let mut other = r.clone();
        other.args[2] = "/bin/bash".into();
        assert!(matches!(other.check(), Err(DaemonsError::NotAProxy { .. })));
        other.args[2] = "hydra_pmi_proxy".into();
        other.args[1] = "../n2".into();
        assert!(matches!(other.check(), Err(DaemonsError::NotAProxy { .. })));
    }

    #[test]
    fn only_the_agents_launch_is_a_request() {
        let r = Request {
            via: Via::Srun,
            args: [
                "--ntasks=1",
                "/c/ckpt",
                "job",
                "run",
                "--dir",
                "/d",
                "--uts",
                "--",
                "orted",
                "-mca",
                "ess",
                "\"slurm\"",
            ]
            .map(String::from)
            .to_vec(),
            env: vec!["A=b=c".into()],
            cwd: "/w".into(),
        };
        assert!(r.starts_agent("/c/ckpt job run --dir /d --uts -- orted"));
        assert!(!r.starts_agent("/c/ckpt job run --dir /other --uts -- orted"));
        assert!(!r.starts_agent(""));
        let back = Request::from_json(Path::new("r"), &r.to_json()).expect("parse");
        assert_eq!(back, r);
    }

    #[test]
    fn requests_take_the_next_number_and_statuses_are_forgotten() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let launch = LaunchDir::of(tmp.path());
        std::fs::create_dir(launch.path()).expect("mkdir");
        let r = Request {
            via: Via::Srun,
            args: vec!["x".into()],
            env: Vec::new(),
            cwd: "/".into(),
        };
        assert_eq!(launch.submit(&r).expect("first"), 1);
        assert_eq!(launch.submit(&r).expect("second"), 2);
        assert_eq!(launch.requests(), [1, 2]);
        assert_eq!(launch.request(2).expect("read"), r);
        write_file(&launch.exit_path(1), "0").expect("status");
        assert_eq!(launch.exit_of(1).expect("status"), Some(0));
        launch.forget_exits().expect("forget");
        assert_eq!(launch.exit_of(1).expect("status"), None);
    }

    #[test]
    fn a_held_end_is_written_only_when_released_and_never_after_a_killing_checkpoint() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let launch = LaunchDir::of(tmp.path());
        std::fs::create_dir(launch.path()).expect("mkdir");
        let s = Shared {
            launch: launch.clone(),
            hold: Mutex::new(Hold::Held),
            stop: AtomicBool::new(false),
        };
        let warn: ThreadWarn = |m| panic!("{m}");
        assert!(!s.settle(1, 3, warn));
        assert_eq!(launch.exit_of(1).expect("status"), None);
        *s.lock() = Hold::Open;
        assert!(s.settle(1, 3, warn));
        assert_eq!(launch.exit_of(1).expect("status"), Some(3));
        *s.lock() = Hold::Closed;
        assert!(s.settle(2, 137, warn));
        assert_eq!(launch.exit_of(2).expect("status"), None);
    }
}
