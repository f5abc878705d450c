//! What root and relay have in common: the peers, the node registry, the running round,
//! the key/value store, batched answers and the outbox of actions.
//!
//! The policies (`root`, `relay`) and the engine (`engine`) work
//! on this; it knows nothing about either.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use crate::action::{Action, RunningPhase, Snapshot};
use crate::addr::PeerAddr;
use crate::kv::{ConnId, KvStore};
use crate::protocol::{Intent, Message, Role, Values};
use crate::round::{LateConn, Round};

/// Fixed settings of one engine.
#[derive(Debug, Clone)]
pub(crate) struct EngineConfig {
    /// Coordinator name, used in logs and as the culprit of its own failures.
    pub(crate) name: String,
    /// Job served.
    pub(crate) job: String,
    /// Nodes expected (at a relay: its local agents).
    pub(crate) expect: u32,
    /// How long nodes have for each phase (the root's setting; a relay follows its parent).
    pub(crate) phase_deadline: Duration,
}

/// An authenticated downstream peer.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    /// Agent, relay or control client.
    pub(crate) role: Role,
    /// Its name from the handshake.
    pub(crate) name: String,
    /// Its address, for logs and abort reasons.
    pub(crate) addr: PeerAddr,
    /// Nodes it stands for (an agent: itself; a relay: its registered agents).
    pub(crate) nodes: Vec<String>,
}

impl Peer {
    /// How the peer is named in abort reasons.
    pub(crate) fn describe(&self) -> String {
        match self.role {
            Role::SubCoordinator => format!("sub-coordinator {}", self.name),
            Role::Agent | Role::Control => self.name.clone(),
        }
    }
}

/// A registered node: the connection it is reached through and what it came for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeEntry {
    /// The agent's own connection, or its relay's.
    pub(crate) conn: ConnId,
    /// What it asked for at registration; reset once a round starts.
    pub(crate) intent: Intent,
}

/// A key and its value, `None` when the wait timed out (the wire form of `Values`).
type ValueEntry = (String, Option<Vec<u8>>);

/// State shared by both policies.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) cfg: EngineConfig,
    pub(crate) peers: HashMap<ConnId, Peer>,
    pub(crate) nodes: HashMap<String, NodeEntry>,
    pub(crate) round: Option<Round>,
    pub(crate) kv: KvStore,
    pub(crate) last_committed: Option<u64>,
    /// Answers to gets, sent once per tick so one agent's many keys share a message.
    value_out: BTreeMap<ConnId, Vec<ValueEntry>>,
    out: Vec<Action>,
}

impl State {
    pub(crate) fn new(cfg: EngineConfig, last_committed: Option<u64>) -> State {
        State {
            cfg,
            peers: HashMap::new(),
            nodes: HashMap::new(),
            round: None,
            kv: KvStore::new(),
            last_committed,
            value_out: BTreeMap::new(),
            out: Vec::new(),
        }
    }

    /// Used by the `log!` macro.
    pub(crate) fn log_line(&mut self, line: String) {
        self.out.push(Action::Log(line));
    }

    /// Queues an action.
    pub(crate) fn act(&mut self, a: Action) {
        self.out.push(a);
    }

    /// Hands the queued actions to the caller.
    pub(crate) fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.out)
    }

    /// Refuses a peer: it is forgotten now, its connection closes after it read why.
    pub(crate) fn refuse(&mut self, conn: ConnId, reason: &str) {
        self.peers.remove(&conn);
        self.out.push(Action::Refuse {
            conn,
            reason: reason.to_string(),
        });
    }

    pub(crate) fn send(&mut self, to: ConnId, msg: Message) {
        self.out.push(Action::Send { to, msg });
    }

    pub(crate) fn broadcast(&mut self, to: Vec<ConnId>, msg: Message) {
        if !to.is_empty() {
            self.out.push(Action::Broadcast { to, msg });
        }
    }

    /// The current phase command to every member of the round.
    pub(crate) fn broadcast_phase(&mut self) {
        let Some(r) = &self.round else {
            return;
        };
        let msg = Message::PhaseCmd(r.phase_cmd(self.last_committed));
        let to = r.members();
        self.broadcast(to, msg);
    }

    /// Connections standing for registered nodes, each once.
    pub(crate) fn node_conns(&self) -> Vec<ConnId> {
        self.nodes
            .values()
            .map(|n| n.conn)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// Connection → number of registered nodes it stands for.
    pub(crate) fn membership(&self) -> BTreeMap<ConnId, u32> {
        let mut members = BTreeMap::new();
        for n in self.nodes.values() {
            *members.entry(n.conn).or_default() += 1;
        }
        members
    }

    /// Why `node` may not register now, if it may not.
    pub(crate) fn can_register(&self, node: &str) -> Result<(), String> {
        if self.nodes.contains_key(node) {
            return Err(format!("node {node} is already registered"));
        }
        if self.nodes.len() >= self.cfg.expect as usize {
            return Err(format!(
                "job {} already has all {} nodes registered",
                self.cfg.job, self.cfg.expect
            ));
        }
        if let Some(r) = &self.round {
            return Err(format!(
                "epoch {} is in {}; registration is closed",
                r.epoch(),
                r.phase()
            ));
        }
        Ok(())
    }

    /// Forgets `nodes` if they are registered through `conn`.
    pub(crate) fn unregister(&mut self, conn: ConnId, nodes: &[String]) {
        for n in nodes {
            if self.nodes.get(n).is_some_and(|e| e.conn == conn) {
                self.nodes.remove(n);
            }
        }
    }

    /// Stores a published pair and queues answers for the gets it satisfies.
    pub(crate) fn kv_put(&mut self, key: String, value: Vec<u8>) {
        for (conn, key, val) in self.kv.put(key, value) {
            self.value_out
                .entry(conn)
                .or_default()
                .push((key, Some(val)));
        }
    }

    /// Queues an answer for one key.
    pub(crate) fn answer(&mut self, conn: ConnId, key: String, value: Option<Vec<u8>>) {
        self.value_out.entry(conn).or_default().push((key, value));
    }

    /// Sends the answers batched since the last tick.
    pub(crate) fn flush_values(&mut self) {
        for (to, entries) in std::mem::take(&mut self.value_out) {
            self.send(to, Message::Values(Values { entries }));
        }
    }

    /// The engine's part of a status answer.
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot {
            registered: self.nodes.len() as u32,
            expect: self.cfg.expect,
            last_committed: self.last_committed,
            running: self.round.as_ref().map(|r| RunningPhase {
                epoch: r.epoch(),
                phase: r.phase(),
            }),
        }
    }

    /// The late members of the round with their peers, sorted by how they are named.
    pub(crate) fn late_peers(&self) -> Vec<LatePeer> {
        let Some(r) = &self.round else {
            return Vec::new();
        };
        let mut late: Vec<LatePeer> = r
            .late()
            .into_iter()
            .filter_map(|l| self.peers.get(&l.conn).map(|p| LatePeer::new(l, p)))
            .collect();
        late.sort_by(|a, b| a.shown.cmp(&b.shown));
        late
    }
}

/// A member that missed a deadline, as named in the abort.
#[derive(Debug, Clone)]
pub(crate) struct LatePeer {
    /// How it is named: the agent, or the relay with its count of late nodes.
    pub(crate) shown: String,
    /// The first node it stands for (what a relay reports upstream).
    pub(crate) first_node: String,
    /// True for a relay: it will report the late agent by name itself.
    pub(crate) is_relay: bool,
}

impl LatePeer {
    fn new(l: LateConn, p: &Peer) -> LatePeer {
        let is_relay = p.role == Role::SubCoordinator;
        let shown = if is_relay {
            format!(
                "sub-coordinator {} ({} of {} nodes late)",
                p.name, l.late, l.stands_for
            )
        } else {
            p.name.clone()
        };
        LatePeer {
            shown,
            first_node: p.nodes.first().cloned().unwrap_or_default(),
            is_relay,
        }
    }
}

/// Names shown in a deadline abort before the rest is summarised as "with N more".
const LATE_SHOWN: usize = 5;

/// The culprit and reason of a missed deadline: up to [`LATE_SHOWN`] late peers by name.
pub(crate) fn deadline_culprits(late: &[LatePeer]) -> String {
    late.iter()
        .take(LATE_SHOWN)
        .map(|l| l.shown.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The reason of a missed deadline.
pub(crate) fn deadline_reason(r: &Round, late: &[LatePeer]) -> String {
    let more = late.len().saturating_sub(LATE_SHOWN);
    let secs = r.phase_deadline().duration().as_secs_f64();
    let tail = if more > 0 {
        format!(" with {more} more")
    } else {
        String::new()
    };
    format!("missed the {} deadline ({secs:.1} s){tail}", r.phase())
}
