//! This node's agent in a coordinated checkpoint or restart (`ckpt dump
//! --coord`, `ckpt restore --coord`, and `ckpt job`'s agents): the
//! connection to the coordinator and the phase bookkeeping both commands
//! share. The commands themselves run the engine's phases between the
//! barriers.
//!
//! Every error this module returns names this node, the epoch (once the
//! coordinator has started one) and the phase, so a failed job's log says at
//! once where it broke.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ckpt_coord::auth::AuthError;
use ckpt_coord::client::{Agent, AgentOptions, ClientError, Directive, Step};
use ckpt_coord::protocol::{Intent, Phase, PhaseInfo};
use ckpt_coord::{Endpoint, Secret};
use ckpt_restorer::{AddressConflict, AddressMap};

/// Where the root coordinator keeps the job secret unless told otherwise
/// (`ckpt coord --state-dir`'s default).
const DEFAULT_STATE_DIR: &str = "/var/lib/ckpt/coord";

/// This module's results.
type Result<T, E = AgentError> = std::result::Result<T, E>;

/// What went wrong in this node's part of a round; each names the node
/// and, once known, the epoch and phase.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The job secret cannot be read.
    #[error("node {node}: reading job {job}'s secret {}", path.display())]
    Secret {
        /// This node.
        node: String,
        /// The job.
        job: String,
        /// The secret file.
        path: PathBuf,
        /// Its error.
        #[source]
        source: AuthError,
    },
    /// Connecting or registering with the coordinator failed.
    #[error("node {node}: joining job {job} at coordinator {addr}")]
    Join {
        /// This node.
        node: String,
        /// The job.
        job: String,
        /// The coordinator's address.
        addr: String,
        /// Its error.
        #[source]
        source: Box<ClientError>,
    },
    /// The coordinator started a phase this node did not expect.
    #[error("{at}")]
    OutOfStep {
        /// "node N: epoch E: PHASE".
        at: String,
        /// What the coordinator started and what was expected.
        #[source]
        source: UnexpectedPhase,
    },
    /// The epoch was aborted because a node (possibly this one) failed.
    #[error("node {node}: epoch {epoch} aborted in {phase}: node {failed} failed: {reason}")]
    Aborted {
        /// This node.
        node: String,
        /// The epoch.
        epoch: u64,
        /// The phase it was aborted in.
        phase: Phase,
        /// The node that failed.
        failed: String,
        /// Why, as that node said.
        reason: String,
    },
    /// The coordinator link failed during an epoch.
    #[error("epoch {epoch}: {phase}")]
    LinkInEpoch {
        /// The epoch.
        epoch: u64,
        /// The phase this node was in.
        phase: Phase,
        /// The link's error (it names this node).
        #[source]
        source: Box<ClientError>,
    },
    /// The coordinator link failed before the round began.
    #[error("waiting for {phase}")]
    LinkWaiting {
        /// The phase waited for.
        phase: Phase,
        /// The link's error (it names this node).
        #[source]
        source: Box<ClientError>,
    },
    /// This node's own addresses do not make one map.
    #[error("{at}: this node's addresses")]
    OwnAddresses {
        /// "node N: epoch E: PHASE".
        at: String,
        /// The conflict.
        #[source]
        source: AddressConflict,
    },
    /// A peer published addresses that do not parse.
    #[error("{at}: node {peer} published malformed addresses {text:?}")]
    MalformedAddresses {
        /// "node N: epoch E: PHASE".
        at: String,
        /// The peer.
        peer: String,
        /// What it published.
        text: String,
    },
    /// A peer's addresses conflict with the map so far.
    #[error("{at}: addresses of node {peer}")]
    PeerAddresses {
        /// "node N: epoch E: PHASE".
        at: String,
        /// The peer.
        peer: String,
        /// The conflict.
        #[source]
        source: AddressConflict,
    },
    /// `--peers` with a coordinator on a Unix socket: no route to learn
    /// this node's address from.
    #[error(
        "--peers needs a TCP coordinator address (host:port) to find this node's address from, not the Unix socket {coordinator}"
    )]
    UnixCoordinator {
        /// The coordinator's address.
        coordinator: String,
    },
    /// The coordinator's address does not resolve.
    #[error("resolving coordinator address {coordinator}")]
    Resolve {
        /// The coordinator's address.
        coordinator: String,
        /// Its error.
        #[source]
        source: std::io::Error,
    },
    /// The coordinator's address resolves to nothing.
    #[error("coordinator address {coordinator}: no address")]
    NoAddress {
        /// The coordinator's address.
        coordinator: String,
    },
    /// The socket to find this node's address cannot be had.
    #[error("a socket to find this node's address")]
    Socket(#[source] std::io::Error),
    /// No route to the coordinator.
    #[error("no route to coordinator {target}")]
    NoRoute {
        /// The coordinator's address.
        target: SocketAddr,
        /// Its error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel would not say this node's address.
    #[error("this node's address")]
    OwnAddress(#[source] std::io::Error),
}

/// The coordinator started a phase other than the ones this node waits for.
#[derive(Debug, thiserror::Error)]
#[error("coordinator started {got}, expected {want}")]
pub struct UnexpectedPhase {
    /// The phase started.
    pub got: Phase,
    /// The phases expected, "A or B".
    pub want: String,
}

/// How this node joins a job's coordinator.
#[derive(Debug, Clone)]
pub struct JoinOptions {
    /// The coordinator's address (`host:port` or `unix:PATH`).
    pub addr: String,
    /// The job id.
    pub job: String,
    /// This node's name in the job (default: the host name).
    pub node: Option<String>,
    /// The job secret file (default: the root coordinator's state
    /// directory's `JOB.secret`).
    pub secret_file: Option<PathBuf>,
}

/// The host name, the default node name.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "node".to_string())
}

/// The image directory of `epoch` under a node's checkpoint root.
pub fn epoch_dir(root: &Path, epoch: u64) -> PathBuf {
    root.join(format!("epoch-{epoch}"))
}

/// A registered agent and where it is in the round.
pub struct Session {
    agent: Agent,
    node: String,
    /// The round's epoch, once its first phase started.
    epoch: Option<u64>,
    /// The phase this node is in (or waits for).
    phase: Phase,
}

impl Session {
    /// Connects, authenticates and registers with `intent`: the round starts
    /// once every node of the job registered with the same intent (or an
    /// operator triggers it).
    pub fn connect(o: &JoinOptions, intent: Intent) -> Result<Session> {
        let (addr, job) = (o.addr.as_str(), o.job.as_str());
        let node = o.node.clone().unwrap_or_else(host_name);
        let path = o
            .secret_file
            .clone()
            .unwrap_or_else(|| Path::new(DEFAULT_STATE_DIR).join(format!("{job}.secret")));
        let secret = match Secret::load_client(&path) {
            Ok(s) => s,
            Err(source) => {
                let (node, job) = (node.clone(), job.to_string());
                return Err(AgentError::Secret {
                    node,
                    job,
                    path,
                    source,
                });
            }
        };
        let opts = AgentOptions::new(addr, job, secret, &node).intent(intent);
        let agent = Agent::connect_with(&opts).map_err(|e| AgentError::Join {
            node: node.clone(),
            job: job.to_string(),
            addr: addr.to_string(),
            source: Box::new(e),
        })?;
        log::info!(
            "node {node}: registered with coordinator {addr} for job {job} ({intent:?}), last committed epoch {:?}",
            agent.last_committed()
        );
        Ok(Session {
            agent,
            node,
            epoch: None,
            phase: Phase::Register,
        })
    }

    /// "node N: epoch E: PHASE" (or "node N: PHASE" before the round began).
    pub fn at(&self) -> String {
        match self.epoch {
            Some(e) => format!("node {}: epoch {e}: {}", self.node, self.phase),
            None => format!("node {}: {}", self.node, self.phase),
        }
    }

    /// Blocks until the coordinator starts `phase`.
    pub fn wait(&mut self, phase: Phase) -> Result<Step> {
        self.wait_any(&[phase])
    }

    /// Blocks until the coordinator starts one of `phases`.
    pub fn wait_any(&mut self, phases: &[Phase]) -> Result<Step> {
        let d = self.agent.next_directive(None).map_err(|e| self.lost(e))?;
        match d {
            Directive::Phase(s) if phases.contains(&s.phase) => {
                self.epoch = Some(s.epoch);
                self.phase = s.phase;
                log::info!("{}: started", self.at());
                Ok(s)
            }
            Directive::Phase(s) => {
                self.epoch = Some(s.epoch);
                let got = s.phase;
                let want: Vec<String> = phases.iter().map(Phase::to_string).collect();
                let source = UnexpectedPhase {
                    got,
                    want: want.join(" or "),
                };
                // A coordinator out of step with us cannot be followed: make
                // it abort the epoch for everyone.
                self.fail(&source.to_string());
                let at = self.at();
                Err(AgentError::OutOfStep { at, source })
            }
            Directive::Abort {
                epoch,
                phase,
                node,
                reason,
            } => Err(self.aborted(epoch, phase, &node, &reason)),
        }
    }

    /// The epoch was aborted because `node` failed (possibly this one).
    fn aborted(&self, epoch: u64, phase: Phase, node: &str, reason: &str) -> AgentError {
        AgentError::Aborted {
            node: self.node.clone(),
            epoch,
            phase,
            failed: node.to_string(),
            reason: reason.to_string(),
        }
    }

    /// An error of the coordinator link (lost, refused, aborted) with where
    /// this node was.
    fn lost(&self, e: ClientError) -> AgentError {
        match e {
            ClientError::Aborted {
                epoch,
                phase,
                node,
                reason,
            } => self.aborted(epoch, phase, &node, &reason),
            // The client's own errors already name this node.
            e => {
                let source = Box::new(e);
                match self.epoch {
                    Some(epoch) => AgentError::LinkInEpoch {
                        epoch,
                        phase: self.phase,
                        source,
                    },
                    None => AgentError::LinkWaiting {
                        phase: self.phase,
                        source,
                    },
                }
            }
        }
    }

    /// Reports this node finished the current phase.
    pub fn done(&mut self, info: PhaseInfo) -> Result<()> {
        let phase = self.phase;
        self.agent
            .report_done(phase, info)
            .map_err(|e| self.lost(e))?;
        log::info!("{}: done", self.at());
        Ok(())
    }

    /// Tells the coordinator this node failed the current phase (best
    /// effort: if the coordinator is gone the epoch dies anyway). `reason`
    /// is the bare cause, its whole chain on one line: the coordinator adds
    /// node, epoch and phase. A caller running its part of a phase reports
    /// a failure here, then returns it under [`Session::at`].
    pub fn fail(&mut self, reason: &str) {
        let phase = self.phase;
        if let Err(le) = self.agent.report_failed(phase, reason) {
            log::warn!("{}: cannot report the failure: {le}", self.at());
        }
    }
}

/// Key under which node NODE publishes where its addresses moved.
fn ib_key(node: &str) -> String {
    format!("ckpt.ib.{node}")
}

fn addresses_key(node: &str) -> String {
    format!("ckpt.addresses.{node}")
}

/// One line of the address exchange: the addresses a node's part was
/// reachable at when it was dumped, and the address of the node that
/// restores it now. As text, `OLD[,OLD...]>NEW`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMove {
    /// The dumped part's addresses (those of the new address's family).
    pub from: BTreeSet<IpAddr>,
    /// The restoring node's address.
    pub to: IpAddr,
}

/// The most addresses one node may publish (a value is bounded like
/// everything read from another party).
const MAX_NODE_ADDRESSES: usize = 64;

impl NodeMove {
    fn encode(&self) -> String {
        let from: Vec<String> = self.from.iter().map(IpAddr::to_string).collect();
        format!("{}>{}", from.join(","), self.to)
    }

    fn decode(s: &str) -> Option<NodeMove> {
        let (from, to) = s.split_once('>')?;
        let from: BTreeSet<IpAddr> = if from.is_empty() {
            BTreeSet::new()
        } else {
            from.split(',')
                .map(|a| a.parse().ok())
                .collect::<Option<_>>()?
        };
        (from.len() <= MAX_NODE_ADDRESSES).then_some(())?;
        Some(NodeMove {
            from,
            to: to.parse().ok()?,
        })
    }

    /// Adds this node's pairs to `map`.
    fn add_to(&self, map: &mut AddressMap) -> Result<(), AddressConflict> {
        self.from
            .iter()
            .try_for_each(|&old| map.insert(old, self.to))
    }
}

/// The address this node reaches `coordinator` from: the node's address
/// in the job's network (a connected UDP socket sends nothing; the kernel
/// only picks the route and the source address).
pub fn route_source(coordinator: &str) -> Result<IpAddr> {
    let named = || coordinator.to_string();
    if Endpoint::is_unix(coordinator) {
        return Err(AgentError::UnixCoordinator {
            coordinator: named(),
        });
    }
    let mut targets = coordinator
        .to_socket_addrs()
        .map_err(|source| AgentError::Resolve {
            coordinator: named(),
            source,
        })?;
    let target = targets.next().ok_or_else(|| AgentError::NoAddress {
        coordinator: named(),
    })?;
    let any: IpAddr = if target.is_ipv4() {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    let sock = UdpSocket::bind((any, 0)).map_err(AgentError::Socket)?;
    sock.connect(target)
        .map_err(|source| AgentError::NoRoute { target, source })?;
    let own = sock.local_addr().map_err(AgentError::OwnAddress)?;
    Ok(own.ip())
}

impl Session {
    /// The restart's address exchange, at the start of RESTORE (connections
    /// are rebuilt with their final addresses, so the map must be known
    /// before anything is rebuilt): publishes where this node's part was
    /// reachable and where it is now, fetches the same from every other
    /// node in `peers`, and returns the job's whole map. Every node of the
    /// job publishes before it waits, so no get waits on a node that is
    /// itself waiting.
    pub fn exchange_addresses(
        &mut self,
        own: &NodeMove,
        peers: &[String],
        timeout: Duration,
    ) -> Result<AddressMap> {
        let mut map = AddressMap::new();
        own.add_to(&mut map)
            .map_err(|source| AgentError::OwnAddresses {
                at: self.at(),
                source,
            })?;
        let put = self
            .agent
            .put(&addresses_key(&self.node), own.encode().as_bytes());
        put.map_err(|e| self.lost(e))?;
        log::info!("{}: published addresses {}", self.at(), own.encode());
        let others: Vec<&String> = peers.iter().filter(|p| **p != self.node).collect();
        let keys: Vec<String> = others.iter().map(|p| addresses_key(p)).collect();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let got = self.agent.get_many(&key_refs, timeout);
        let values = got.map_err(|e| self.lost(e))?;
        for (peer, value) in others.iter().zip(values) {
            let text = String::from_utf8_lossy(&value);
            let Some(m) = NodeMove::decode(&text) else {
                return Err(AgentError::MalformedAddresses {
                    at: self.at(),
                    peer: peer.to_string(),
                    text: text.into_owned(),
                });
            };
            m.add_to(&mut map)
                .map_err(|source| AgentError::PeerAddresses {
                    at: self.at(),
                    peer: peer.to_string(),
                    source,
                })?;
        }
        Ok(map)
    }
}

impl Session {
    /// Publishes this node's InfiniBand restart blobs and fetches every
    /// peer's: all of them, concatenated (this node's first), for the
    /// verbs layers to connect their queue pairs across nodes.
    pub fn exchange_ib(
        &mut self,
        own: &[u8],
        peers: &[String],
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        let put = self.agent.put(&ib_key(&self.node), own);
        put.map_err(|e| self.lost(e))?;
        let others: Vec<&String> = peers.iter().filter(|p| **p != self.node).collect();
        let keys: Vec<String> = others.iter().map(|p| ib_key(p)).collect();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let got = self.agent.get_many(&key_refs, timeout);
        let values = got.map_err(|e| self.lost(e))?;
        let mut all = own.to_vec();
        for v in values {
            all.extend_from_slice(&v);
        }
        log::info!(
            "{}: verbs restart blobs: {} bytes here, {} from {} peers",
            self.at(),
            own.len(),
            all.len() - own.len(),
            others.len()
        );
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_moves_round_trip_and_bad_ones_are_refused() {
        let m = NodeMove {
            from: ["10.0.0.1".parse().unwrap(), "10.0.1.1".parse().unwrap()].into(),
            to: "10.0.0.2".parse().unwrap(),
        };
        assert_eq!(NodeMove::decode(&m.encode()), Some(m));
        let none = NodeMove {
            from: BTreeSet::new(),
            to: "::1".parse().unwrap(),
        };
        assert_eq!(NodeMove::decode(&none.encode()), Some(none));
        for bad in ["", "10.0.0.1", "x>10.0.0.1", "10.0.0.1>", "10.0.0.1>y"] {
            assert_eq!(NodeMove::decode(bad), None, "{bad}");
        }
        let many: Vec<String> = (0..=MAX_NODE_ADDRESSES)
            .map(|i| format!("10.0.{}.{}", i / 250, i % 250))
            .collect();
        assert_eq!(
            NodeMove::decode(&format!("{}>10.0.0.1", many.join(","))),
            None
        );
    }
}
