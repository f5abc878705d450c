//! Errors of controlling a task from outside. Every variant names the pid.

use nix::errno::Errno;

/// A ptrace, wait or remote-execution step failed.
#[derive(Debug, thiserror::Error)]
pub enum ParasiteError {
    /// A ptrace request failed.
    #[error("pid {pid}: ptrace {op}: {source}")]
    Ptrace {
        /// The task.
        pid: i32,
        /// The request.
        op: &'static str,
        /// The errno.
        #[source]
        source: Errno,
    },
    /// The task is already traced by someone else.
    #[error("pid {pid} is already being traced by pid {tracer}")]
    AlreadyTraced {
        /// The task.
        pid: i32,
        /// Its tracer.
        tracer: i32,
    },
    /// The task exited or was killed while under control.
    #[error("pid {pid} exited while being controlled ({how})")]
    Died {
        /// The task.
        pid: i32,
        /// Exit status or signal.
        how: String,
    },
    /// The task stopped for a reason other than the expected one.
    #[error("pid {pid}: unexpected stop while {what}: {status}")]
    UnexpectedStop {
        /// The task.
        pid: i32,
        /// What ckpt was doing.
        what: &'static str,
        /// The wait status.
        status: String,
    },
    /// Reading or writing the task's memory failed.
    #[error("pid {pid}: {op} memory at {addr:#x}+{len}: {source}")]
    Mem {
        /// The task.
        pid: i32,
        /// "open", "read" or "write".
        op: &'static str,
        /// Remote address.
        addr: u64,
        /// Length.
        len: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A syscall executed inside the task returned an error.
    #[error("pid {pid}: remote {name}: {errno}")]
    RemoteSyscall {
        /// The task.
        pid: i32,
        /// Syscall name.
        name: &'static str,
        /// The errno it returned.
        errno: Errno,
    },
    /// A file opened inside the task could not be opened.
    #[error("pid {pid}: {path}: cannot open: {errno}")]
    RemoteOpen {
        /// The task.
        pid: i32,
        /// The path.
        path: String,
        /// The errno open returned.
        errno: Errno,
    },
    /// The parasite blob reported a failure.
    #[error("pid {pid}: parasite command {cmd} failed: {errno}")]
    Command {
        /// The task.
        pid: i32,
        /// The command number.
        cmd: u32,
        /// The errno it returned.
        errno: Errno,
    },
    /// A userfaultfd of the task could not be made or used.
    #[error("pid {pid}: userfaultfd: {what}: {errno}")]
    Userfault {
        /// The task.
        pid: i32,
        /// The step that failed.
        what: &'static str,
        /// The errno it returned.
        errno: Errno,
    },
    /// No place for the parasite in the task's address space.
    #[error("pid {pid}: {what}")]
    Layout {
        /// The task.
        pid: i32,
        /// What is missing.
        what: String,
    },
}

/// Shorthand.
pub type Result<T> = std::result::Result<T, ParasiteError>;
