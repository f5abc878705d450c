//! The relay policy: a sub-coordinator (`--parent`) standing for its local agents.
//!
//! Towards its agents a relay behaves like the root; towards its parent it is one client
//! that stands for all of them. It never decides anything itself:
//!
//! * registrations are batched into one `Arrive{Register}` per tick,
//! * a phase's arrivals become one `Arrive{count = local agents}` once all have arrived,
//! * failures, disconnects and missed deadlines are relayed at once as `Fail` (the root
//!   decides the abort),
//! * phase commands and aborts from the parent fan out to every local agent,
//! * puts go up in one batch per tick, always before any arrival that follows them,
//! * gets are answered from a local cache; a miss asks the parent once per key however
//!   many local agents want it.
//!
//! Losing the parent aborts the local agents (the I/O layer then stops the relay): the
//! root aborts the epoch on its side when the relay's connection drops.
//!
//! The two-level tree follows "System-level Scalable Checkpoint-Restart for Petascale
//! Computing" (Cao, Arya, Garg, Matott, Panda, Subramoni, Vienne, Cooperman): past a few
//! thousand clients, connection count and SYN bursts are what break a flat coordinator.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::action::Action;
use crate::kv::ConnId;
use crate::policy::{Departure, Policy};
use crate::protocol::{
    Abort, Arrive, Fail, Get, Leave, Message, NodeReport, Phase, PhaseCmd, Put, RoundKind, Values,
};
use crate::round::{Barrier, PhaseDeadline, Round};
use crate::state::{State, deadline_reason};

/// A relay's deadline fires this fraction of the parent's deadline early...
const EARLY_DIVISOR: u32 = 10;
/// ...but never more than this early, so that its report names the late agent before the
/// root's own deadline blames the relay.
const EARLY_MAX: Duration = Duration::from_millis(500);
/// Waiters on a key the parent reported missing are timed out if their own deadline is at
/// most this much later: the parent's answer already used up their wait.
const MISSING_SLACK: Duration = Duration::from_millis(20);
/// Shortest wait asked of the parent for a batched get.
const MIN_UPSTREAM_WAIT: Duration = Duration::from_millis(1);

/// Relay policy: what waits to go up to the parent.
#[derive(Debug)]
pub(crate) struct Relay {
    /// Parent address, for logs and abort reasons.
    parent: String,
    pending_register: Vec<NodeReport>,
    pending_leave: Vec<String>,
    pending_puts: Vec<(String, Vec<u8>)>,
    pending_gets: Vec<String>,
    pending_get_deadline: Option<Instant>,
    /// Keys asked of the parent and not answered yet.
    requested: HashSet<String>,
    /// The current phase's arrival (or failure) has gone up: nothing more to report.
    sent_up: bool,
    /// The next phase's aggregate arrival went up ahead (every agent acknowledged it
    /// together with the current one).
    ahead_sent_up: bool,
}

impl Relay {
    /// A relay below `parent`.
    pub(crate) fn new(parent: &str) -> Relay {
        Relay {
            parent: parent.to_string(),
            pending_register: Vec::new(),
            pending_leave: Vec::new(),
            pending_puts: Vec::new(),
            pending_gets: Vec::new(),
            pending_get_deadline: None,
            requested: HashSet::new(),
            sent_up: false,
            ahead_sent_up: false,
        }
    }

    /// Asks the parent for `key` unless already asked.
    fn want(&mut self, key: String, deadline: Instant) {
        if self.requested.insert(key.clone()) {
            self.pending_gets.push(key);
            self.pending_get_deadline = Some(
                self.pending_get_deadline
                    .map_or(deadline, |d| d.max(deadline)),
            );
        }
    }

    /// The batched get for this tick, if any.
    fn take_gets(&mut self, now: Instant) -> Option<Get> {
        if self.pending_gets.is_empty() {
            return None;
        }
        let wait = self
            .pending_get_deadline
            .take()
            .unwrap_or(now)
            .saturating_duration_since(now)
            .max(MIN_UPSTREAM_WAIT);
        Some(Get {
            keys: std::mem::take(&mut self.pending_gets),
            timeout_ms: u32::try_from(wait.as_millis()).unwrap_or(u32::MAX),
        })
    }

    /// Sends `msg` to the parent, preceded by the pending puts: they must reach the parent
    /// before the arrival that says they are complete.
    fn send_up(&mut self, st: &mut State, msg: Message) {
        self.flush_puts(st);
        st.act(Action::SendUp(msg));
    }

    fn flush_puts(&mut self, st: &mut State) {
        if !self.pending_puts.is_empty() {
            let entries = std::mem::take(&mut self.pending_puts);
            st.act(Action::SendUp(Message::Put(Put { entries })));
        }
    }

    /// A phase command from the parent: mirror the round locally and fan it out.
    fn phase_from_parent(&mut self, st: &mut State, p: PhaseCmd, now: Instant) {
        let same_epoch = st.round.as_ref().is_some_and(|r| r.epoch() == p.epoch);
        if !same_epoch {
            st.kv.clear();
            self.requested.clear();
        }
        let was_committed = same_epoch && st.round.as_ref().is_some_and(|r| r.committed());
        let wire = PhaseDeadline::from_millis(p.deadline_ms);
        let d = wire.duration();
        // Fire a little before the root so the report names the agent, not this relay.
        let local = d.saturating_sub((d / EARLY_DIVISOR).min(EARLY_MAX));
        let mut round = Round::new(p.epoch, p.kind, p.phase, st.membership(), wire, now + local);
        if was_committed {
            round.set_committed();
        }
        if let Some(previous) = st.round.as_mut() {
            round.adopt_ahead(previous);
        }
        // COMMIT needs no reply, so there is nothing to send up for it; nor for a phase
        // whose arrival already went up ahead.
        self.sent_up = p.phase == Phase::Commit || (self.ahead_sent_up && same_epoch);
        self.ahead_sent_up = false;
        let complete = round.barrier() == Barrier::Complete;
        let to = round.members();
        st.round = Some(round);
        st.broadcast(to, Message::PhaseCmd(p));
        // Every agent acknowledged this phase ahead, after the aggregate for the previous
        // one had gone up.
        if complete && !self.sent_up {
            self.barrier_complete(st, now);
        }
    }

    /// Sends up the aggregate arrival at the next phase once every agent sent it ahead
    /// and the current phase's has gone up: both leave in the same write.
    fn send_ahead(&mut self, st: &mut State) {
        if !self.sent_up || self.ahead_sent_up {
            return;
        }
        let Some(r) = st.round.as_mut() else {
            return;
        };
        let (Some(phase), Barrier::Complete) = (r.ahead_phase(), r.ahead_complete()) else {
            return;
        };
        let (count, reports) = r.take_ahead();
        let up = Arrive {
            epoch: r.epoch(),
            phase,
            count,
            reports,
        };
        self.ahead_sent_up = true;
        self.send_up(st, Message::Arrive(up));
    }

    /// An abort from the parent: fan it out and forget the round.
    fn abort_from_parent(&mut self, st: &mut State, a: Abort) {
        log!(
            st,
            "epoch {} ABORTED in {} by the root: node {}: {}",
            a.epoch,
            a.phase,
            a.node,
            a.reason
        );
        let to = st.node_conns();
        st.broadcast(to, Message::Abort(a));
        st.round = None;
    }

    /// Values from the parent: cache, answer waiters, re-ask for keys still awaited.
    fn values_from_parent(&mut self, st: &mut State, v: Values, now: Instant) {
        for (key, value) in v.entries {
            self.requested.remove(&key);
            match value {
                Some(value) => st.kv_put(key, value),
                None => {
                    for conn in st.kv.expire_key(&key, now + MISSING_SLACK) {
                        st.answer(conn, key.clone(), None);
                    }
                    if let Some(d) = st.kv.latest_deadline(&key) {
                        self.want(key, d);
                    }
                }
            }
        }
    }

    fn fail_up(&mut self, st: &mut State, node: String, reason: String) {
        let Some(r) = &st.round else {
            return;
        };
        let fail = Fail {
            epoch: r.epoch(),
            phase: r.phase(),
            node,
            reason,
        };
        self.send_up(st, Message::Fail(fail));
    }
}

impl Policy for Relay {
    fn registered(&mut self, _st: &mut State, reports: Vec<NodeReport>) {
        self.pending_register.extend(reports);
    }

    fn barrier_complete(&mut self, st: &mut State, _now: Instant) {
        if self.sent_up {
            return;
        }
        let Some(r) = st.round.as_mut() else {
            return;
        };
        self.sent_up = true;
        let up = Arrive {
            epoch: r.epoch(),
            phase: r.phase(),
            count: r.arrived(),
            reports: r.take_reports(),
        };
        // The last phase ends the round here; the root confirms nothing more.
        if r.in_last_phase() {
            st.round = None;
        }
        self.send_up(st, Message::Arrive(up));
        self.send_ahead(st);
    }

    fn ahead_complete(&mut self, st: &mut State, _now: Instant) {
        self.send_ahead(st);
    }

    fn failed(&mut self, st: &mut State, fail: Fail) {
        self.send_up(st, Message::Fail(fail));
    }

    fn member_lost(&mut self, st: &mut State, node: String, why: String) {
        self.fail_up(st, node, why);
    }

    fn nodes_left(&mut self, _st: &mut State, nodes: Vec<String>, _how: Departure) {
        // The root decides what a departure means; it hears of it after the aggregated
        // arrival (see `flush`).
        self.pending_leave.extend(nodes);
    }

    fn published(&mut self, key: &str, value: &[u8]) {
        self.pending_puts.push((key.to_string(), value.to_vec()));
    }

    fn missed(&mut self, key: String, deadline: Instant) {
        self.want(key, deadline);
    }

    fn trigger(&mut self, st: &mut State, conn: ConnId, _kind: RoundKind) {
        log!(st, "refusing a trigger: sub-coordinators take no triggers");
        st.refuse(conn, "send triggers to the root coordinator");
    }

    fn watches_deadline(&self) -> bool {
        !self.sent_up
    }

    fn deadline_passed(&mut self, st: &mut State, _now: Instant) {
        let late = st.late_peers();
        let Some(r) = &st.round else {
            return;
        };
        let reason = deadline_reason(r, &late);
        let node = late
            .first()
            .map(|l| l.first_node.clone())
            .unwrap_or_default();
        self.sent_up = true;
        self.fail_up(st, node, reason);
    }

    fn flush(&mut self, st: &mut State, now: Instant) {
        let reg = std::mem::take(&mut self.pending_register);
        // Agents that finish the last phase may hang up before their neighbours arrive;
        // their Leave must follow the aggregated arrival, or the root would see a node
        // vanish mid-round.
        let leave = if st.round.is_none() {
            std::mem::take(&mut self.pending_leave)
        } else {
            Vec::new()
        };
        if !reg.is_empty() {
            let count = reg.len() as u32;
            self.send_up(
                st,
                Message::Arrive(Arrive {
                    epoch: 0,
                    phase: Phase::Register,
                    count,
                    reports: reg,
                }),
            );
        }
        if !leave.is_empty() {
            self.send_up(st, Message::Leave(Leave { nodes: leave }));
        }
        match self.take_gets(now) {
            Some(g) => self.send_up(st, Message::Get(g)),
            None => self.flush_puts(st),
        }
    }

    fn parent_message(&mut self, st: &mut State, msg: Message, now: Instant) {
        match msg {
            Message::PhaseCmd(p) => self.phase_from_parent(st, p, now),
            Message::Abort(a) => self.abort_from_parent(st, a),
            Message::Values(v) => self.values_from_parent(st, v, now),
            other => log!(
                st,
                "ignoring unexpected {:?} from the parent",
                other.msg_type()
            ),
        }
    }

    fn parent_lost(&mut self, st: &mut State, reason: &str) {
        log!(st, "lost parent {}: {reason}", self.parent);
        let Some(r) = &st.round else {
            return;
        };
        if r.committed() {
            return;
        }
        let abort = Abort {
            epoch: r.epoch(),
            phase: r.phase(),
            node: st.cfg.name.clone(),
            reason: format!("parent coordinator {} lost: {reason}", self.parent),
        };
        self.abort_from_parent(st, abort);
    }
}
