//! The ckpt service: how an ordinary user checkpoints and restores their
//! own processes.
//!
//! Tracing another process, recreating one with a chosen pid and reading
//! the site's image key all need root. Instead of giving the `ckpt` binary
//! capabilities (its whole command line, environment and every code path
//! would then run privileged for any user, and CAP_SYS_PTRACE reaches every
//! process on the node), a root service on each node (`ckpt serve`) takes
//! requests on a Unix socket. A non-root `ckpt dump`, `restore`, `show`,
//! or `run` with a namespace, sends its arguments, working directory and
//! stdio there (and its environment, for the job `run` starts)
//! ([`client`]); the service learns who asks from the kernel
//! (`SO_PEERCRED`, `SO_PEERGROUPS`), never from the request, and runs the
//! same `ckpt` as a worker that acts for that user ([`worker`]): the
//! images it writes and reads are the user's, sealed with a key of the
//! user's own derived from the site's, every process it dumps or restores
//! must be the user's without capabilities, and it refuses what it cannot
//! bound for a user (action scripts, other keys, namespaces named by path);
//! a job `run` starts for the user is the user's. The design and its limits: docs/security.md, "Users
//! checkpointing their own jobs".

mod cgroup;
pub mod client;
pub mod serve;
mod wire;
pub mod worker;

use std::path::PathBuf;

/// Where the service listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/ckpt/ckpt.sock";
/// Overrides [`DEFAULT_SOCKET`] for the client.
pub const SOCKET_ENV: &str = "CKPT_SERVICE_SOCKET";

/// Why the service cannot do what a user asked; each is a permission
/// problem with the way to solve it in the message.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// No service answers, so a user cannot do what needs root.
    #[error(
        "ckpt {command} needs root to trace and recreate processes; run it as root, or have the site run the ckpt service on this node (`ckpt serve` as root) so users can checkpoint their own jobs (no service at {}: {reason})",
        socket.display()
    )]
    Unavailable {
        /// The subcommand.
        command: &'static str,
        /// The socket tried.
        socket: PathBuf,
        /// Why it could not be reached.
        reason: String,
    },
    /// A request asks for something the service does not do for users.
    #[error("{what} is not available through the ckpt service (it acts as root for you); {hint}")]
    NotForUsers {
        /// The command or flag.
        what: String,
        /// What to do instead.
        hint: &'static str,
    },
    /// The service runs as many requests as it takes.
    #[error("{}: the ckpt service is busy; try again later", socket.display())]
    Busy {
        /// The service's socket.
        socket: PathBuf,
    },
    /// `ckpt serve` run without root.
    #[error("ckpt serve must run as root (it traces and restores processes for users)")]
    NotRoot,
}

/// Signals that pass from a client to its worker: the ones a terminal or
/// a scheduler sends to stop a command or warn it (the client forwards
/// them, the service delivers only these).
pub const PASSED_SIGNALS: [nix::sys::signal::Signal; 6] = [
    nix::sys::signal::Signal::SIGINT,
    nix::sys::signal::Signal::SIGTERM,
    nix::sys::signal::Signal::SIGHUP,
    nix::sys::signal::Signal::SIGQUIT,
    nix::sys::signal::Signal::SIGUSR1,
    nix::sys::signal::Signal::SIGUSR2,
];

/// The socket the client uses.
pub fn socket_path() -> PathBuf {
    std::env::var_os(SOCKET_ENV)
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_SOCKET), PathBuf::from)
}
