//! Errors of a restore. Every variant names the pid and the file or object.

use std::path::PathBuf;

use ckpt_image::ImageError;
use ckpt_parasite::ParasiteError;

/// Why a restore failed. No restored process is left behind in any case.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The images are missing, truncated, tampered with or inconsistent.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// The pid is held by a live process.
    #[error(
        "pid {pid} is in use by a running process ({comm}); stop that process, restore on another node, or restore into a PID namespace of its own with `ckpt restore --pidns` (a job started under `ckpt run --pidns` always is)"
    )]
    PidInUse {
        /// The pid.
        pid: i32,
        /// What holds it.
        comm: String,
    },
    /// Acting for a caller, the checkpoint asks for more than the caller has.
    #[error(
        "pid {pid} {what}: the ckpt service restores only what its caller ({caller}) could run"
    )]
    NotCallers {
        /// The pid.
        pid: i32,
        /// What it asks for.
        what: String,
        /// The caller.
        caller: String,
    },
    /// The pid stayed held by a dying process for too long.
    #[error(
        "pid {pid} is still held by a zombie or an exiting process after {secs} s (a zombie's parent must reap it)"
    )]
    PidWaitTimeout {
        /// The pid.
        pid: i32,
        /// How long ckpt waited.
        secs: u64,
    },
    /// This machine cannot run what the images hold.
    #[error("{dir}: cannot restore here: {what}")]
    Incompatible {
        /// The checkpoint.
        dir: PathBuf,
        /// Why.
        what: String,
    },
    /// The network namespace named with `--netns` cannot be used.
    #[error("--netns {path}: {what}")]
    NetNamespace {
        /// The path given.
        path: PathBuf,
        /// Why.
        what: String,
    },
    /// The mount namespace named with `--mntns` cannot be used.
    #[error("--mntns {path}: {what}")]
    MntNamespace {
        /// The path given.
        path: PathBuf,
        /// Why.
        what: String,
    },
    /// The process's verbs layer could not recreate its InfiniBand state.
    #[error("pid {pid}: InfiniBand restart: {what}")]
    Ib {
        /// The pid being restored.
        pid: i32,
        /// What went wrong.
        what: String,
    },
    /// A thread of a process died while the process was being restored
    /// (the whole process is killed with it).
    #[error("pid {pid}: thread {tid} died while the process was being restored ({how})")]
    ThreadDied {
        /// The process (its host pid).
        pid: i32,
        /// The thread (its host tid).
        tid: i32,
        /// How it died.
        how: String,
    },
    /// A rank's link to its PMIx server cannot be made again here.
    #[error(
        "pid {pid} fd {fd}: cannot reconnect the rank to the PMIx server of this job step: {source}"
    )]
    Pmix {
        /// The pid being restored.
        pid: i32,
        /// The fd of the link.
        fd: i32,
        /// Why.
        source: crate::pmix::PmixError,
    },
    /// This kernel or address space cannot host the process as dumped.
    #[error("pid {pid}: cannot restore here: {what}")]
    Host {
        /// The pid being restored.
        pid: i32,
        /// Why.
        what: String,
    },
    /// The dumped vDSO cannot be redirected to this kernel's.
    #[error("pid {pid}: {source}")]
    Vdso {
        /// The pid being restored.
        pid: i32,
        /// What is wrong.
        #[source]
        source: crate::vdso::VdsoError,
    },
    /// A file the process used is gone or changed since the dump.
    #[error("pid {pid}: {path}: {what}")]
    File {
        /// The pid.
        pid: i32,
        /// The file.
        path: String,
        /// What is wrong.
        what: String,
    },
    /// A file the process had open or mapped is not the one it had: gone,
    /// replaced, changed, or not openable with the process's own
    /// credentials.
    #[error("pid {pid}: {at}: {path}: {what}")]
    Changed {
        /// The pid.
        pid: i32,
        /// Which fd or mapping of the process.
        at: FileUse,
        /// The file.
        path: String,
        /// What differs.
        what: String,
    },
    /// A system call of the restorer itself failed.
    #[error("pid {pid}: {op}: {source}")]
    Os {
        /// The pid being restored.
        pid: i32,
        /// What was being done.
        op: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Rebuilding the process from inside failed.
    #[error(transparent)]
    Parasite(#[from] ParasiteError),
    /// A SysV IPC object cannot be recreated here.
    #[error("{object}: {what}")]
    Ipc {
        /// The object, as `SysV semaphore set id 3 (key 0x1234)`.
        object: String,
        /// Why.
        what: String,
    },
}

/// Where a process used a file: which fd, or which mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileUse {
    /// Fd number N.
    Fd(i32),
    /// The mapping at these addresses.
    Mapping {
        /// First address.
        start: u64,
        /// One past the last address.
        end: u64,
    },
}

impl std::fmt::Display for FileUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileUse::Fd(fd) => write!(f, "fd {fd}"),
            FileUse::Mapping { start, end } => write!(f, "mapping {start:#x}-{end:#x}"),
        }
    }
}

/// Shorthand.
pub type Result<T> = std::result::Result<T, RestoreError>;

impl RestoreError {
    /// Wraps an OS error with the pid and operation.
    pub fn os(pid: i32, op: impl Into<String>, source: std::io::Error) -> Self {
        RestoreError::Os {
            pid,
            op: op.into(),
            source,
        }
    }

    /// The file behind fd `fd` of `pid` is not the one the process had.
    pub fn fd_changed(pid: i32, fd: i32, path: impl Into<String>, what: String) -> Self {
        RestoreError::Changed {
            pid,
            at: FileUse::Fd(fd),
            path: path.into(),
            what,
        }
    }

    /// VMA `v` of `pid`'s mm image is invalid.
    pub(crate) fn vma(pid: i32, v: &ckpt_image::mm::Vma, what: &str) -> Self {
        RestoreError::Image(ImageError::Invalid {
            path: ckpt_image::mm_name(pid).into(),
            what: format!("VMA {:#x}-{:#x}: {what}", v.start, v.end),
        })
    }
}

impl RestoreError {
    /// The error, naming process `pid` when it is the death of another of
    /// its tasks: a user knows the process, not its threads' ids.
    pub(crate) fn of_process(self, pid: i32) -> RestoreError {
        match self {
            RestoreError::Parasite(ParasiteError::Died { pid: tid, how }) if tid != pid => {
                RestoreError::ThreadDied { pid, tid, how }
            }
            // A thread killed between two ptrace requests is found gone by
            // the next one.
            RestoreError::Parasite(ParasiteError::Ptrace {
                pid: tid,
                op,
                source: nix::errno::Errno::ESRCH,
            }) if tid != pid => RestoreError::ThreadDied {
                pid,
                tid,
                how: format!("gone at ptrace {op}"),
            },
            // Its memory read or written as it dies: the mm is gone.
            RestoreError::Parasite(ParasiteError::Mem {
                pid: tid, op, addr, ..
            }) if tid != pid && ckpt_parasite::proc_read::leaving(tid) => {
                RestoreError::ThreadDied {
                    pid,
                    tid,
                    how: format!("gone at a memory {op} at {addr:#x}"),
                }
            }
            other => other,
        }
    }
}
