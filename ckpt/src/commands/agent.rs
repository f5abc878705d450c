//! This node's agent in a coordinated checkpoint or restart (`ckpt dump
//! --coord`, `ckpt restore --coord`): the connection to `ckpt coord` and the
//! phase bookkeeping both commands share. The commands themselves run the
//! engine's phases between the barriers (`dump.rs`, `restore.rs`).
//!
//! Every error this module returns names this node, the epoch (once the
//! coordinator has started one) and the phase, so a failed job's log says at
//! once where it broke.

use std::collections::BTreeSet;
use std::net::{IpAddr, ToSocketAddrs, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use ckpt_coord::client::{Agent, AgentOptions, ClientError, Directive, Step};
use ckpt_coord::protocol::{Intent, Phase, PhaseInfo};
use ckpt_coord::{Endpoint, Secret};
use ckpt_restorer::AddressMap;

/// Where the root coordinator keeps the job secret unless told otherwise
/// (`ckpt coord --state-dir`'s default).
const DEFAULT_STATE_DIR: &str = "/var/lib/ckpt/coord";

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
    pub fn connect(o: &CoordOpts, intent: Intent) -> anyhow::Result<Session> {
        let (Some(addr), Some(job)) = (o.addr.as_deref(), o.job.as_deref()) else {
            anyhow::bail!("--coord needs --job");
        };
        let node = o.node.clone().unwrap_or_else(host_name);
        let path = o
            .secret_file
            .clone()
            .unwrap_or_else(|| Path::new(DEFAULT_STATE_DIR).join(format!("{job}.secret")));
        let secret = Secret::load_client(&path).with_context(|| {
            format!("node {node}: reading job {job}'s secret {}", path.display())
        })?;
        let opts = AgentOptions::new(addr, job, secret, &node).intent(intent);
        let agent = Agent::connect_with(&opts)
            .with_context(|| format!("node {node}: joining job {job} at coordinator {addr}"))?;
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
    pub fn wait(&mut self, phase: Phase) -> anyhow::Result<Step> {
        self.wait_any(&[phase])
    }

    /// Blocks until the coordinator starts one of `phases`.
    pub fn wait_any(&mut self, phases: &[Phase]) -> anyhow::Result<Step> {
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
                let e =
                    anyhow::anyhow!("coordinator started {got}, expected {}", want.join(" or "));
                // A coordinator out of step with us cannot be followed: make
                // it abort the epoch for everyone.
                self.fail(&e);
                Err(e.context(self.at()))
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
    fn aborted(&self, epoch: u64, phase: Phase, node: &str, reason: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "node {}: epoch {epoch} aborted in {phase}: node {node} failed: {reason}",
            self.node
        )
    }

    /// An error of the coordinator link (lost, refused, aborted) with where
    /// this node was.
    fn lost(&self, e: ClientError) -> anyhow::Error {
        match e {
            ClientError::Aborted {
                epoch,
                phase,
                node,
                reason,
            } => self.aborted(epoch, phase, &node, &reason),
            // The client's own errors already name this node.
            e => match self.epoch {
                Some(ep) => anyhow::Error::new(e).context(format!("epoch {ep}: {}", self.phase)),
                None => anyhow::Error::new(e).context(format!("waiting for {}", self.phase)),
            },
        }
    }

    /// Reports this node finished the current phase.
    pub fn done(&mut self, info: PhaseInfo) -> anyhow::Result<()> {
        let phase = self.phase;
        self.agent
            .report_done(phase, info)
            .map_err(|e| self.lost(e))?;
        log::info!("{}: done", self.at());
        Ok(())
    }

    /// Runs this node's part of the current phase; a failure is reported to
    /// the coordinator (which aborts the epoch for every node) and returned
    /// naming node, epoch and phase.
    pub fn local<T, E>(&mut self, r: Result<T, E>) -> anyhow::Result<T>
    where
        E: Into<anyhow::Error>,
    {
        r.map_err(|e| {
            let e = e.into();
            self.fail(&e);
            e.context(self.at())
        })
    }

    /// Tells the coordinator this node failed the current phase (best
    /// effort: if the coordinator is gone the epoch dies anyway). `e` is
    /// the bare cause: the coordinator adds node, epoch and phase.
    pub fn fail(&mut self, e: &anyhow::Error) {
        let phase = self.phase;
        let reason = format!("{:#}", e);
        if let Err(le) = self.agent.report_failed(phase, &reason) {
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
    fn add_to(&self, map: &mut AddressMap) -> Result<(), ckpt_restorer::AddressConflict> {
        self.from
            .iter()
            .try_for_each(|&old| map.insert(old, self.to))
    }
}

/// The address this node reaches `coordinator` from: the node's address
/// in the job's network (a connected UDP socket sends nothing; the kernel
/// only picks the route and the source address).
pub fn route_source(coordinator: &str) -> anyhow::Result<IpAddr> {
    if Endpoint::is_unix(coordinator) {
        anyhow::bail!(
            "--peers needs a TCP coordinator address (host:port) to find this node's address from, not the Unix socket {coordinator}"
        );
    }
    let target = coordinator
        .to_socket_addrs()
        .with_context(|| format!("resolving coordinator address {coordinator}"))?
        .next()
        .with_context(|| format!("coordinator address {coordinator}: no address"))?;
    let any: IpAddr = if target.is_ipv4() {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    let sock = UdpSocket::bind((any, 0)).context("a socket to find this node's address")?;
    sock.connect(target)
        .with_context(|| format!("no route to coordinator {target}"))?;
    Ok(sock.local_addr().context("this node's address")?.ip())
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
    ) -> anyhow::Result<AddressMap> {
        let mut map = AddressMap::new();
        own.add_to(&mut map)
            .with_context(|| format!("{}: this node's addresses", self.at()))?;
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
            let m = NodeMove::decode(&text).with_context(|| {
                format!(
                    "{}: node {peer} published malformed addresses {text:?}",
                    self.at()
                )
            })?;
            m.add_to(&mut map)
                .with_context(|| format!("{}: addresses of node {peer}", self.at()))?;
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
    ) -> anyhow::Result<Vec<u8>> {
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
