//! The `--coord` side of `ckpt dump` and `ckpt restore`: their options,
//! and running a step of a phase as this node's part. The agent itself
//! (the coordinator link, the phase bookkeeping, the address and
//! InfiniBand exchanges) is `ckpt_job::agent`.

use std::path::PathBuf;

use ckpt_job::agent::JoinOptions;
pub use ckpt_job::agent::{NodeMove, Session, epoch_dir, route_source};

/// The `--coord` options shared by `ckpt dump` and `ckpt restore`.
#[derive(clap::Args, Debug, Clone)]
pub struct CoordOpts {
    /// Take part in a coordinated checkpoint (dump) or restart (restore) of
    /// a multi-node job as this node's agent of the `ckpt coord` at ADDR
    /// (`host:port`, or `unix:PATH` for its `--listen-unix` socket on this
    /// node).
    #[arg(long = "coord", value_name = "ADDR", requires = "job")]
    pub addr: Option<String>,
    /// Job id, as given to `ckpt coord --job` (with --coord).
    #[arg(long, requires = "addr")]
    pub job: Option<String>,
    /// This node's name in the job, unique within it (with --coord; default:
    /// the host name).
    #[arg(long, requires = "addr")]
    pub node: Option<String>,
    /// The job secret file (hex, mode 0600) (with --coord; default:
    /// /var/lib/ckpt/coord/JOB.secret). CKPT_COORD_SECRET overrides it.
    #[arg(long, value_name = "PATH", requires = "addr")]
    pub secret_file: Option<PathBuf>,
}

impl CoordOpts {
    /// Whether this run is coordinated.
    pub fn enabled(&self) -> bool {
        self.addr.is_some()
    }

    /// How the agent joins the coordinator.
    pub fn join(&self) -> anyhow::Result<JoinOptions> {
        let (Some(addr), Some(job)) = (&self.addr, &self.job) else {
            anyhow::bail!("--coord needs --job");
        };
        Ok(JoinOptions {
            addr: addr.clone(),
            job: job.clone(),
            node: self.node.clone(),
            secret_file: self.secret_file.clone(),
        })
    }
}

/// Joins the coordinator of `o` with `intent`. For a user of the ckpt
/// service the job secret is read and a `unix:` coordinator's socket
/// connected to with the user's own rights: the secret must be a file
/// they can read (theirs, 0600), the socket one they could connect to.
/// What the coordinator can then ask of this process concerns only the
/// user's own processes and files (every one is checked as the caller's).
pub fn join(o: &CoordOpts, intent: ckpt_coord::protocol::Intent) -> anyhow::Result<Session> {
    let join = o.join()?;
    Ok(ckpt_image::caller::with_caller_rights(|| {
        Session::connect(&join, intent)
    })??)
}

/// Running this node's part of the current phase.
pub trait Local {
    /// Runs this node's part of the current phase; a failure is reported to
    /// the coordinator (which aborts the epoch for every node) and returned
    /// naming node, epoch and phase, its chain kept for the report's
    /// classification.
    fn local<T, E>(&mut self, r: Result<T, E>) -> anyhow::Result<T>
    where
        E: Into<anyhow::Error>;
}

impl Local for Session {
    fn local<T, E>(&mut self, r: Result<T, E>) -> anyhow::Result<T>
    where
        E: Into<anyhow::Error>,
    {
        r.map_err(|e| {
            let e = e.into();
            self.fail(&format!("{e:#}"));
            e.context(self.at())
        })
    }
}
