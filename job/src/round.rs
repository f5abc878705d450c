//! One round of `ckpt job dump|restore`: the job's coordinator, running
//! in this process, and its control connection, which triggers the round
//! before any agent exists and waits for its outcome while watching the
//! agents.

use std::net::{SocketAddr, ToSocketAddrs};
use std::num::TryFromIntError;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ckpt_coord::auth::AuthError;
use ckpt_coord::client::{AgentOptions, ClientError, Link};
use ckpt_coord::protocol::{Message, Role, RoundKind, RoundOver, StatusQuery, Trigger};
use ckpt_coord::store::StoreError;
use ckpt_coord::{CoordConfig, CoordHandle, Secret, ServerError};

use crate::dir::{DirError, JOB_ID, JobDir};
use crate::launch::{Launched, exit_code};

/// How often the round's wait looks at the agents.
const POLL: Duration = Duration::from_millis(100);
/// The control client's name at the coordinator.
const CONTROL_NAME: &str = "ckpt-job";
/// How long the control client tries to reach the in-process coordinator.
const CONTROL_CONNECT: Duration = Duration::from_secs(10);

/// Mode of the scratch state directory of `restore --epoch`.
const PIN_DIR_MODE: u32 = 0o700;

/// This module's results.
type Result<T, E = RoundError> = std::result::Result<T, E>;

/// What went wrong running a round; each names the option, file or
/// agents it is about.
#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    /// `--listen` does not resolve.
    #[error("resolving --listen {listen}")]
    Listen {
        /// The address given.
        listen: String,
        /// Its error.
        #[source]
        source: std::io::Error,
    },
    /// `--listen` resolves to no address.
    #[error("--listen {listen} resolves to nothing")]
    ListenNothing {
        /// The address given.
        listen: String,
    },
    /// The job secret cannot be read.
    #[error("job secret {}", path.display())]
    Secret {
        /// The secret file.
        path: PathBuf,
        /// Its error.
        #[source]
        source: AuthError,
    },
    /// More parts than a coordinator counts.
    #[error("too many parts")]
    TooManyParts(#[source] TryFromIntError),
    /// `--phase-deadline` is no duration.
    #[error("--phase-deadline {secs}: not a duration")]
    PhaseDeadline {
        /// The seconds given.
        secs: f64,
    },
    /// The coordinator did not start.
    #[error("starting the job's coordinator")]
    Coordinator(#[source] ServerError),
    /// The control connection to it failed.
    #[error("connecting to the job's coordinator")]
    Control(#[source] ClientError),
    /// The control connection failed while triggering the round.
    #[error(transparent)]
    Trigger(#[from] ClientError),
    /// Agents exited before the round started.
    #[error("{what}: the round did not start: {failures}")]
    AgentsExited {
        /// `job dump` or `job restore`.
        what: String,
        /// Which agents failed, and how.
        failures: String,
    },
    /// Not every agent registered in time.
    #[error(
        "{what}: the round did not start: {registered} of {expect} agents registered within {secs} s (--register-timeout)"
    )]
    NotRegistered {
        /// `job dump` or `job restore`.
        what: String,
        /// Agents registered.
        registered: u32,
        /// Agents expected.
        expect: u32,
        /// The register timeout, in seconds.
        secs: f64,
    },
    /// The job directory.
    #[error(transparent)]
    Dir(#[from] DirError),
    /// The job's epoch records.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// `--epoch` names no committed epoch.
    #[error("epoch {epoch} is not a committed epoch of the job (see `ckpt job list`)")]
    NotCommitted {
        /// The epoch asked for.
        epoch: u64,
    },
    /// The pinned epoch's state directory cannot be made.
    #[error("{}: cannot create", path.display())]
    PinDir {
        /// The directory.
        path: PathBuf,
        /// Its error.
        #[source]
        source: std::io::Error,
    },
    /// The coordinator link failed while the round ran.
    #[error("{what}: the job's coordinator")]
    Lost {
        /// `job dump` or `job restore`.
        what: String,
        /// Its error.
        #[source]
        source: ClientError,
    },
}

/// The coordinator of one round.
#[derive(Debug, Clone)]
pub struct RoundConfig {
    /// Where it listens (`--listen`).
    pub listen: String,
    /// Seconds every part has to finish each phase (`--phase-deadline`).
    pub phase_deadline: f64,
    /// Where it keeps its epoch records.
    pub state_dir: PathBuf,
    /// How many parts register.
    pub expect: usize,
    /// The round to run.
    pub kind: RoundKind,
    /// Whether its log lines go out (the command's `-v`).
    pub emit_log: bool,
}

/// A coordinator of one round, running in this process, and our control
/// connection to it with the round already triggered.
pub struct Round {
    _coord: CoordHandle,
    link: Link,
    /// The address agents are given.
    pub agent_addr: String,
}

impl Round {
    /// Starts the coordinator for `expect` parts, with its records in
    /// `state_dir`, and triggers a round of `kind` before any agent
    /// exists, so it is that round that starts once every part registered.
    pub fn start(dir: &JobDir, o: &RoundConfig) -> Result<Round> {
        let listen = || o.listen.clone();
        let mut listens = o
            .listen
            .to_socket_addrs()
            .map_err(|source| RoundError::Listen {
                listen: listen(),
                source,
            })?;
        let bind: SocketAddr = listens
            .next()
            .ok_or_else(|| RoundError::ListenNothing { listen: listen() })?;
        let secret = Secret::load_client(&dir.secret_path()).map_err(|source| {
            let path = dir.secret_path();
            RoundError::Secret { path, source }
        })?;
        let expect = u32::try_from(o.expect).map_err(RoundError::TooManyParts)?;
        let mut cfg = CoordConfig::new(bind, JOB_ID, expect, secret.clone());
        cfg.state_dir = Some(o.state_dir.clone());
        cfg.phase_deadline = Duration::try_from_secs_f64(o.phase_deadline)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or(RoundError::PhaseDeadline {
                secs: o.phase_deadline,
            })?;
        cfg.name = "job".to_string();
        cfg.emit_log = o.emit_log;
        let coord = ckpt_coord::spawn(cfg).map_err(RoundError::Coordinator)?;
        let bound = coord.local_addr();
        let agent_addr = if bound.ip().is_unspecified() {
            format!("{}:{}", this_node_host(), bound.port())
        } else {
            bound.to_string()
        };
        let local = SocketAddr::new(
            if bound.ip().is_unspecified() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                bound.ip()
            },
            bound.port(),
        );
        let mut opts = AgentOptions::new(&local.to_string(), JOB_ID, secret, CONTROL_NAME)
            .connect_timeout(CONTROL_CONNECT);
        opts.role = Role::Control;
        opts.expect = 0;
        let mut link = Link::open(&opts).map_err(RoundError::Control)?;
        link.send(&Message::Trigger(Trigger { kind: o.kind }))?;
        // Messages of one connection are handled in order: once the
        // status comes back, the trigger is pending at the coordinator.
        link.send(&Message::StatusQuery(StatusQuery {}))?;
        loop {
            match link.recv(Some(CONTROL_CONNECT), "the coordinator's status")? {
                Message::Status(_) => break,
                m => log::debug!("job: ignoring {m:?} while triggering"),
            }
        }
        log::info!("job: coordinator on {bound}, agents connect to {agent_addr}");
        Ok(Round {
            _coord: coord,
            link,
            agent_addr,
        })
    }

    /// Waits for the round's outcome while watching the agents. The round
    /// starts once every agent registered; if instead an agent exits, or
    /// `register` passes first, the remaining agents (which hold nothing
    /// yet) are stopped and the error says which parts failed or how many
    /// registered. Once the round runs, the coordinator's phase deadline
    /// and disconnect detection decide.
    pub fn wait(
        &mut self,
        what: &str,
        agents: &mut [Launched],
        register: Duration,
    ) -> Result<RoundOver> {
        let deadline = Instant::now() + register;
        // A status query is in flight; its answer says whether a round runs.
        let mut probing = false;
        let mut started = false;
        loop {
            match self.link.recv(Some(POLL), "the round to end") {
                Ok(Message::RoundOver(r)) => return Ok(r),
                Ok(Message::Status(s)) if probing => {
                    probing = false;
                    started = s.running.is_some();
                    let exited = agents.iter().any(|a| a.exit.is_some());
                    if !started && (exited || Instant::now() >= deadline) {
                        // No round runs and none ended: it never started.
                        for a in agents.iter_mut() {
                            a.stop();
                        }
                        let what = what.to_string();
                        if exited {
                            let failures = failures(agents);
                            return Err(RoundError::AgentsExited { what, failures });
                        }
                        return Err(RoundError::NotRegistered {
                            what,
                            registered: s.registered,
                            expect: s.expect,
                            secs: register.as_secs_f64(),
                        });
                    }
                }
                Ok(m) => log::debug!("job: ignoring {m:?}"),
                Err(ClientError::Timeout { .. }) => {}
                Err(source) => {
                    let what = what.to_string();
                    return Err(RoundError::Lost { what, source });
                }
            }
            let before = agents.iter().filter(|a| a.exit.is_some()).count();
            let after = agents
                .iter_mut()
                .map(|a| a.poll())
                .filter(|&exited| exited)
                .count();
            let late = !started && Instant::now() >= deadline;
            if (after > before || late) && !probing {
                self.link.send(&Message::StatusQuery(StatusQuery {}))?;
                probing = true;
            }
        }
    }
}

/// The host name agents on other nodes reach this one by.
fn this_node_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}

/// "part a on node n1 exited with 3; ..." for the agents that failed.
fn failures(agents: &[Launched]) -> String {
    let v: Vec<String> = agents
        .iter()
        .filter_map(|a| {
            let s = a.exit?;
            (!s.success()).then(|| format!("{} exited with {}", a.label, exit_code(s)))
        })
        .collect();
    if v.is_empty() {
        "no agent registered".to_string()
    } else {
        format!("{} (its error is above)", v.join("; "))
    }
}

/// A coordinator state directory holding only epoch E's record, so the
/// restart round restores E rather than the last committed epoch (the
/// job's own records are left alone). Removed on drop.
#[derive(Debug)]
pub struct EpochPin {
    /// The directory.
    dir: PathBuf,
}

impl EpochPin {
    /// Pins committed epoch `epoch` of `job`.
    pub fn new(job: &JobDir, epoch: u64) -> Result<EpochPin> {
        let store = job.store()?;
        let Some(m) = store.load(epoch) else {
            return Err(RoundError::NotCommitted { epoch });
        };
        let dir = job
            .coord_state_dir()
            .join(format!(".restore-{epoch}.{}", std::process::id()));
        let pin = EpochPin { dir };
        std::fs::DirBuilder::new()
            .mode(PIN_DIR_MODE)
            .create(&pin.dir)
            .map_err(|source| RoundError::PinDir {
                path: pin.dir.clone(),
                source,
            })?;
        ckpt_coord::EpochStore::open(&pin.dir, JOB_ID)?.commit(&m)?;
        Ok(pin)
    }

    /// The state directory a restart round of the pinned epoch runs with.
    pub fn state_dir(&self) -> &std::path::Path {
        &self.dir
    }
}

impl Drop for EpochPin {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
