//! The coordinator as a state machine without I/O.
//!
//! [`Engine::handle`] takes one [`Event`] (a peer joined, a message from it, a
//! disconnect, a message from the parent, a store result, a tick) together with the
//! current time, and returns the [`Action`]s to carry out, in order. It never reads a
//! clock, a socket or a file, so every round, abort and deadline can be driven by a test
//! with invented instants (see `engine/tests.rs`).
//!
//! What root and relay share lives here and in [`crate::state`]: the peer table, the node
//! registry, barrier counting ([`crate::round`]), the key/value cache and the checks that
//! stop one peer from speaking for others. Where they differ the engine asks its
//! [`Policy`]: [`Root`] or [`Relay`].

use std::time::{Duration, Instant};

use crate::action::Action;
use crate::addr::PeerAddr;
use crate::kv::ConnId;
use crate::policy::{Departure, Policy};
use crate::protocol::{
    Arrive, Fail, Get, Intent, Leave, Message, NodeReport, Phase, PhaseInfo, Put, Role, Welcome,
};
use crate::relay::Relay;
use crate::root::Root;
use crate::round::{Barrier, BogusArrival};
use crate::state::{EngineConfig, NodeEntry, Peer, State};

/// Longest a get may be parked, whatever the client asks.
const MAX_GET_WAIT: Duration = Duration::from_secs(3600);

/// Something that happened to the coordinator.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Event {
    /// A downstream peer completed the handshake.
    Joined {
        /// Its connection.
        conn: ConnId,
        /// Its address, for logs and abort reasons.
        addr: PeerAddr,
        /// Agent, relay or control client.
        role: Role,
        /// Node name (agents) or peer name.
        name: String,
        /// What an agent came for.
        intent: Intent,
    },
    /// A message from an authenticated downstream peer.
    Received {
        /// Its connection.
        conn: ConnId,
        /// The message.
        msg: Message,
    },
    /// A downstream connection closed (not after [`Action::Expel`]).
    Disconnected {
        /// The connection.
        conn: ConnId,
        /// Why, as the I/O layer saw it.
        reason: String,
    },
    /// A message from the parent coordinator.
    FromParent(Message),
    /// The link to the parent is gone.
    ParentLost {
        /// Why.
        reason: String,
    },
    /// Answer to [`Action::ReserveEpoch`].
    EpochReserved {
        /// The reserved number.
        epoch: u64,
    },
    /// Answer to [`Action::ReserveEpoch`]: the store failed.
    EpochUnavailable {
        /// What failed.
        error: String,
    },
    /// Answer to [`Action::Commit`]: the record is durable.
    CommitWritten {
        /// Epoch.
        epoch: u64,
    },
    /// Answer to [`Action::Commit`]: the record could not be written.
    CommitFailed {
        /// Epoch.
        epoch: u64,
        /// What failed.
        error: String,
    },
    /// The end of one round of I/O: fire due deadlines, expire parked gets and emit what
    /// was batched (values, a relay's upstream messages).
    Tick,
}

/// The coordinator state machine.
#[derive(Debug)]
pub(crate) struct Engine {
    st: State,
    policy: Box<dyn Policy>,
}

impl Engine {
    /// A root coordinator; `last_committed` comes from the epoch store.
    pub(crate) fn root(cfg: EngineConfig, last_committed: Option<u64>) -> Engine {
        Engine {
            st: State::new(cfg, last_committed),
            policy: Box::new(Root::new()),
        }
    }

    /// A relay below `parent`.
    pub(crate) fn relay(cfg: EngineConfig, parent: &str) -> Engine {
        Engine {
            st: State::new(cfg, None),
            policy: Box::new(Relay::new(parent)),
        }
    }

    /// Last committed epoch known here.
    pub(crate) fn last_committed(&self) -> Option<u64> {
        self.st.last_committed
    }

    /// When the engine next needs a [`Event::Tick`] even if nothing else happens.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.st.round.as_ref().map(|r| r.deadline())
    }

    /// Applies one event at `now`; returns what to do, in order.
    pub(crate) fn handle(&mut self, now: Instant, event: Event) -> Vec<Action> {
        match event {
            Event::Joined {
                conn,
                addr,
                role,
                name,
                intent,
            } => self.joined(conn, addr, role, name, intent),
            Event::Received { conn, msg } => self.received(conn, msg, now),
            Event::Disconnected { conn, reason } => {
                if let Some(peer) = self.st.peers.remove(&conn) {
                    self.gone(conn, peer, &reason);
                }
            }
            Event::FromParent(msg) => self.policy.parent_message(&mut self.st, msg, now),
            Event::ParentLost { reason } => self.policy.parent_lost(&mut self.st, &reason),
            Event::EpochReserved { epoch } => self.policy.epoch_reserved(&mut self.st, epoch, now),
            Event::EpochUnavailable { error } => {
                self.policy.epoch_unavailable(&mut self.st, &error)
            }
            Event::CommitWritten { epoch } => self.policy.commit_written(&mut self.st, epoch, now),
            Event::CommitFailed { epoch, error } => {
                self.policy.commit_failed(&mut self.st, epoch, &error)
            }
            Event::Tick => self.tick(now),
        }
        self.st.take_actions()
    }

    fn joined(&mut self, conn: ConnId, addr: PeerAddr, role: Role, name: String, intent: Intent) {
        let st = &mut self.st;
        let mut nodes = Vec::new();
        if role == Role::Agent {
            if let Err(why) = st.can_register(&name) {
                log!(st, "refused {addr} (node {name:?}): {why}");
                st.refuse(conn, &why);
                return;
            }
            nodes.push(name.clone());
        }
        st.peers.insert(
            conn,
            Peer {
                role,
                name: name.clone(),
                addr,
                nodes,
            },
        );
        let welcome = Welcome {
            last_committed: st.last_committed,
        };
        st.send(conn, Message::Welcome(welcome));
        if role == Role::Agent {
            st.nodes.insert(name.clone(), NodeEntry { conn, intent });
            let report = NodeReport {
                node: name,
                info: PhaseInfo::Register { intent },
            };
            self.policy.registered(st, vec![report]);
        }
    }

    fn received(&mut self, conn: ConnId, msg: Message, now: Instant) {
        let Some(peer) = self.st.peers.get(&conn) else {
            // Refused or expelled a moment ago; whatever it still sent does not count.
            return;
        };
        let (role, addr) = (peer.role, peer.addr);
        match (role, msg) {
            (Role::Agent, Message::Arrive(a)) if a.phase != Phase::Register => {
                self.arrive(conn, a, now)
            }
            (Role::SubCoordinator, Message::Arrive(a)) => self.arrive(conn, a, now),
            (Role::Agent | Role::SubCoordinator, Message::Fail(f)) => self.fail(conn, f),
            (Role::SubCoordinator, Message::Leave(l)) => self.leave(conn, l),
            (Role::Agent | Role::SubCoordinator, Message::Put(p)) => self.put(p),
            (Role::Agent | Role::SubCoordinator, Message::Get(g)) => self.get(conn, g, now),
            (Role::Control, Message::Trigger(t)) => self.policy.trigger(&mut self.st, conn, t.kind),
            (_, Message::StatusQuery(_)) => {
                let snapshot = self.st.snapshot();
                self.st.act(Action::SendStatus { to: conn, snapshot });
            }
            (role, m) => {
                log!(
                    self.st,
                    "closing {addr} ({role:?}): unexpected {:?}",
                    m.msg_type()
                );
                self.expel(conn, "protocol violation");
            }
        }
    }

    /// Closes a peer that broke the protocol, with the consequences of its leaving.
    fn expel(&mut self, conn: ConnId, reason: &str) {
        let Some(peer) = self.st.peers.remove(&conn) else {
            return;
        };
        self.st.act(Action::Expel {
            conn,
            reason: reason.to_string(),
        });
        self.gone(conn, peer, reason);
    }

    /// A peer is gone: its nodes leave, and a round that counted on them fails.
    fn gone(&mut self, conn: ConnId, peer: Peer, reason: &str) {
        let st = &mut self.st;
        st.unregister(conn, &peer.nodes);
        let Some(first) = peer.nodes.first().cloned() else {
            return;
        };
        let who = peer.describe();
        let member = st
            .round
            .as_ref()
            .is_some_and(|r| r.is_member(conn) && !r.finished_by(conn));
        if member {
            let why = format!("{who} ({}) disconnected: {reason}", peer.addr);
            self.policy.member_lost(st, first, why);
        } else {
            log!(st, "{who} ({}) left: {reason}", peer.addr);
            self.policy.nodes_left(st, peer.nodes, Departure::Quiet);
        }
    }

    fn arrive(&mut self, conn: ConnId, a: Arrive, now: Instant) {
        if a.phase == Phase::Register {
            self.register_downstream(conn, a.reports);
            return;
        }
        let st = &mut self.st;
        let own_reports = a
            .reports
            .iter()
            .all(|rep| st.nodes.get(&rep.node).is_some_and(|n| n.conn == conn));
        let Some(r) = st.round.as_mut() else {
            return;
        };
        let ahead = a.epoch == r.epoch() && r.ahead_phase() == Some(a.phase);
        if a.epoch != r.epoch() || (a.phase != r.phase() && !ahead) {
            // A late arrival for a round or phase that is over: harmless.
            return;
        }
        let counted = if ahead {
            r.arrive_ahead(conn, a.count, a.reports, own_reports)
        } else {
            r.arrive(conn, a.count, a.reports, own_reports)
        };
        match counted {
            Ok(Barrier::Open) => {}
            Ok(Barrier::Complete) if ahead => self.policy.ahead_complete(st, now),
            Ok(Barrier::Complete) => self.policy.barrier_complete(st, now),
            Err(BogusArrival {
                claimed,
                allowed,
                already,
            }) => {
                let addr = st
                    .peers
                    .get(&conn)
                    .map_or_else(|| "a peer".to_string(), |p| p.addr.to_string());
                log!(
                    st,
                    "closing {addr}: arrival for {claimed} nodes in {} (it stands for {allowed}, {already} arrived) or for foreign nodes",
                    a.phase
                );
                self.expel(conn, "protocol violation: bogus arrival");
            }
        }
    }

    /// Nodes registered through a relay below.
    fn register_downstream(&mut self, conn: ConnId, reports: Vec<NodeReport>) {
        let st = &mut self.st;
        let mut fresh = Vec::new();
        for r in reports {
            let intent = match r.info {
                PhaseInfo::Register { intent } => intent,
                PhaseInfo::None | PhaseInfo::Dump { .. } => Intent::Standby,
            };
            if let Err(why) = st.can_register(&r.node) {
                log!(
                    st,
                    "ignoring registration of {} from downstream: {why}",
                    r.node
                );
                continue;
            }
            st.nodes.insert(r.node.clone(), NodeEntry { conn, intent });
            if let Some(p) = st.peers.get_mut(&conn) {
                p.nodes.push(r.node.clone());
            }
            fresh.push(r);
        }
        self.policy.registered(st, fresh);
    }

    fn fail(&mut self, conn: ConnId, mut f: Fail) {
        // A peer may only speak for nodes it stands for: a failure naming someone else is
        // pinned on the sender.
        if let Some(p) = self.st.peers.get(&conn)
            && !p.nodes.contains(&f.node)
        {
            f.node = p.nodes.first().cloned().unwrap_or_else(|| p.name.clone());
        }
        self.policy.failed(&mut self.st, f);
    }

    fn leave(&mut self, conn: ConnId, l: Leave) {
        let st = &mut self.st;
        st.unregister(conn, &l.nodes);
        if let Some(p) = st.peers.get_mut(&conn) {
            p.nodes.retain(|n| !l.nodes.contains(n));
        }
        let how = if st.round.as_ref().is_some_and(|r| !r.finished_by(conn)) {
            Departure::MidRound
        } else {
            Departure::Quiet
        };
        self.policy.nodes_left(st, l.nodes, how);
    }

    fn put(&mut self, p: Put) {
        for (key, value) in p.entries {
            self.policy.published(&key, &value);
            self.st.kv_put(key, value);
        }
    }

    fn get(&mut self, conn: ConnId, g: Get, now: Instant) {
        let wait = Duration::from_millis(u64::from(g.timeout_ms)).min(MAX_GET_WAIT);
        let deadline = now + wait;
        for key in g.keys {
            match self.st.kv.get(conn, &key, deadline) {
                Some(v) => self.st.answer(conn, key, Some(v)),
                None => self.policy.missed(key, deadline),
            }
        }
    }

    fn tick(&mut self, now: Instant) {
        let st = &mut self.st;
        for (conn, key) in st.kv.expire(now) {
            st.answer(conn, key, None);
        }
        let due = st
            .round
            .as_ref()
            .is_some_and(|r| now >= r.deadline() && r.phase() != Phase::Commit);
        if due && self.policy.watches_deadline() {
            self.policy.deadline_passed(st, now);
        }
        st.flush_values();
        self.policy.flush(st, now);
    }
}

#[cfg(test)]
mod tests;
