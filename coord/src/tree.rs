//! Sub-coordinator: the node-level relay of seed 002's two-level tree.
//!
//! A sub-coordinator is the ordinary coordinator loop ([`crate::server`]) with a parent
//! link. Towards its agents it behaves like the root; towards its parent it is one client
//! that stands for all its agents:
//!
//! * registrations are batched into one `Arrive{Register}` per poll iteration,
//! * a phase's arrivals become one `Arrive{count = local agents}` once all have arrived,
//! * failures and disconnects are relayed at once as `Fail` (the root decides the abort),
//! * phase commands and aborts from the parent fan out to every local agent,
//! * puts go up in one batch per iteration, always before any arrival that follows them,
//! * gets are answered from a local cache; a miss asks the parent once per key however
//!   many local agents want it.
//!
//! Losing the parent aborts the local agents and stops the sub-coordinator: the root
//! aborts the epoch on its side when the connection drops.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::client::{AgentOptions, Link};
use crate::kv::ConnId;
use crate::protocol::{
    Abort, Get, Intent, Message, NodeReport, Phase, PhaseCmd, Put, Role, Values,
};
use crate::server::{Conn, Round, Server, ServerError};

/// The parent link and what waits to go up it.
pub(crate) struct Upstream {
    pub(crate) conn: Option<Conn>,
    pub(crate) pending_register: Vec<NodeReport>,
    pub(crate) pending_leave: Vec<String>,
    pub(crate) pending_puts: Vec<(String, Vec<u8>)>,
    pending_gets: Vec<String>,
    pending_get_deadline: Option<Instant>,
    pub(crate) requested: HashSet<String>,
}

impl Upstream {
    /// Asks the parent for `key` unless already asked.
    pub(crate) fn want(&mut self, key: String, deadline: Instant) {
        if self.requested.insert(key.clone()) {
            self.pending_gets.push(key);
            self.pending_get_deadline = Some(
                self.pending_get_deadline
                    .map_or(deadline, |d| d.max(deadline)),
            );
        }
    }

    /// The batched get for this iteration, if any.
    pub(crate) fn take_gets(&mut self) -> Option<Get> {
        if self.pending_gets.is_empty() {
            return None;
        }
        let d = self
            .pending_get_deadline
            .take()
            .unwrap_or_else(Instant::now);
        let ms = d
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        Some(Get {
            keys: std::mem::take(&mut self.pending_gets),
            timeout_ms: u32::try_from(ms.as_millis()).unwrap_or(u32::MAX),
        })
    }
}

impl Server {
    /// Connects to the parent (with backoff), authenticates, and moves the socket into the
    /// poll loop.
    pub(crate) fn connect_upstream(&mut self) -> Result<(), ServerError> {
        let parent = self.cfg.parent.clone().unwrap_or_default();
        let mut opts = AgentOptions::new(
            &parent,
            &self.cfg.job,
            self.cfg.secret.clone(),
            &self.cfg.name,
        );
        opts.role = Role::SubCoordinator;
        opts.intent = Intent::Standby;
        opts.expect = self.cfg.expect;
        opts.connect_timeout = Duration::from_secs(60);
        let up_err = |source| ServerError::Upstream {
            name: self.cfg.name.clone(),
            parent: parent.clone(),
            source: Box::new(source),
        };
        let link = Link::open(&opts).map_err(up_err)?;
        let (stream, reader, _) = link.into_parts();
        let addr = stream.peer_addr().map_err(|e| ServerError::Poll {
            name: self.cfg.name.clone(),
            source: e,
        })?;
        self.upstream = Some(Upstream {
            conn: None,
            pending_register: Vec::new(),
            pending_leave: Vec::new(),
            pending_puts: Vec::new(),
            pending_gets: Vec::new(),
            pending_get_deadline: None,
            requested: HashSet::new(),
        });
        self.install_upstream(stream, reader, addr)
            .map_err(|source| ServerError::Poll {
                name: self.cfg.name.clone(),
                source,
            })?;
        Ok(())
    }

    /// A message from the parent.
    pub(crate) fn on_upstream_message(&mut self, m: Message) {
        match m {
            Message::PhaseCmd(p) => self.upstream_phase(p),
            Message::Abort(a) => self.upstream_abort(a),
            Message::Values(v) => self.upstream_values(v),
            other => {
                self.log_line(format!(
                    "ignoring unexpected {:?} from the parent",
                    other.msg_type()
                ));
            }
        }
    }
}

impl Server {
    /// A phase command from the parent: mirror the round locally and fan it out.
    pub(crate) fn upstream_phase(&mut self, p: PhaseCmd) {
        let new_epoch = self.round.as_ref().is_none_or(|r| r.epoch != p.epoch);
        if new_epoch {
            self.kv.clear();
            if let Some(up) = self.upstream.as_mut() {
                up.requested.clear();
            }
        }
        let mut members: HashMap<ConnId, u32> = HashMap::new();
        for (c, _) in self.nodes.values() {
            *members.entry(*c).or_default() += 1;
        }
        let need = self.nodes.len() as u32;
        let d = Duration::from_millis(u64::from(p.deadline_ms));
        // Fire a little before the root so the report names the agent, not this relay.
        let local = d.saturating_sub((d / 10).min(Duration::from_millis(500)));
        let committed = p.phase == Phase::Commit
            || self
                .round
                .as_ref()
                .is_some_and(|r| r.committed && !new_epoch);
        self.round = Some(Round {
            epoch: p.epoch,
            kind: p.kind,
            idx: 0,
            phase: p.phase,
            deadline_ms: p.deadline_ms,
            deadline: Instant::now() + local,
            arrived: 0,
            need,
            per_conn: HashMap::new(),
            members,
            reports: Vec::new(),
            committed,
            sent_up: p.phase == Phase::Commit,
            grace_used: false,
        });
        let to = self.members();
        self.broadcast(&to, &Message::PhaseCmd(p));
    }

    /// An abort from the parent: fan it out and forget the round.
    pub(crate) fn upstream_abort(&mut self, a: Abort) {
        let to: Vec<ConnId> = self
            .nodes
            .values()
            .map(|(c, _)| *c)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        log!(
            self,
            "epoch {} ABORTED in {} by the root: node {}: {}",
            a.epoch,
            a.phase,
            a.node,
            a.reason
        );
        self.broadcast(&to, &Message::Abort(a));
        self.round = None;
    }

    /// Values from the parent: cache, answer waiters, re-ask for keys still awaited.
    pub(crate) fn upstream_values(&mut self, v: Values) {
        let now = Instant::now();
        for (k, val) in v.entries {
            if let Some(up) = self.upstream.as_mut() {
                up.requested.remove(&k);
            }
            match val {
                Some(val) => {
                    for (conn, key, val) in self.kv.put(k, val) {
                        self.value_out
                            .entry(conn)
                            .or_default()
                            .push((key, Some(val)));
                    }
                }
                None => {
                    for conn in self.kv.expire_key(&k, now + Duration::from_millis(20)) {
                        self.value_out
                            .entry(conn)
                            .or_default()
                            .push((k.clone(), None));
                    }
                    if let Some(d) = self.kv.latest_deadline(&k)
                        && let Some(up) = self.upstream.as_mut()
                    {
                        up.want(k, d);
                    }
                }
            }
        }
    }

    pub(crate) fn upstream_lost(&mut self, reason: &str) {
        let parent = self.cfg.parent.clone().unwrap_or_default();
        log!(self, "lost parent {parent}: {reason}");
        if let Some(r) = &self.round
            && !r.committed
        {
            let a = Abort {
                epoch: r.epoch,
                phase: r.phase,
                node: self.cfg.name.clone(),
                reason: format!("parent coordinator {parent} lost: {reason}"),
            };
            self.upstream_abort(a);
        }
        self.flush_dirty();
        self.fatal = Some(ServerError::UpstreamLost {
            name: self.cfg.name.clone(),
            parent,
            reason: reason.to_string(),
        });
    }

    pub(crate) fn send_up(&mut self, m: Message) {
        let Some(up) = self.upstream.as_mut() else {
            return;
        };
        // Puts must reach the parent before the arrival that says they are complete.
        let puts = std::mem::take(&mut up.pending_puts);
        let id = up.conn.as_ref().map(|c| c.id);
        let Some(id) = id else {
            return;
        };
        if !puts.is_empty() {
            self.send(id, &Message::Put(Put { entries: puts }));
        }
        self.send(id, &m);
    }
}
