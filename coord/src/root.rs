//! The root coordinator's policy: it decides when a round starts, moves every node through
//! the phases, commits the epoch through the store and aborts it on any failure.
//!
//! A round starts once all N nodes are registered and either a control client triggered
//! it or every node registered with the same intent. After DUMP the root asks the I/O
//! layer to write the global manifest and tells nobody COMMIT until that write is
//! reported done, so a crash leaves an epoch either fully committed or not at all.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::action::Action;
use crate::kv::ConnId;
use crate::policy::{Departure, Policy};
use crate::protocol::{
    Abort, AfterCommit, Fail, Intent, Message, NodeReport, Outcome, Phase, PhaseInfo, RoundKind,
    RoundOver,
};
use crate::round::{Barrier, PhaseDeadline, Round};
use crate::state::{State, deadline_culprits, deadline_reason};
use crate::store::NodeManifest;

/// Shortest grace the root gives a late relay to name its late agent.
const RELAY_GRACE_MIN: Duration = Duration::from_millis(250);
/// Longest such grace.
const RELAY_GRACE_MAX: Duration = Duration::from_secs(2);
/// The grace is this fraction of the phase deadline, within the bounds above.
const RELAY_GRACE_DIVISOR: u32 = 10;
/// Culprit named when a deadline passes and no late peer can be named.
const UNKNOWN_CULPRIT: &str = "(unknown)";

/// Where the root is between rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// No round is waiting to start.
    Idle,
    /// The store is reserving an epoch number for a round of this kind.
    Reserving(RoundKind),
    /// DUMP is complete; the store is writing this epoch's record.
    Committing(u64),
}

/// Root policy.
#[derive(Debug)]
pub(crate) struct Root {
    /// A round asked for by a control client, started once every node is registered.
    trigger: Option<RoundKind>,
    /// Control clients waiting for the outcome of the next round.
    waiting_controls: Vec<ConnId>,
    start: Start,
    /// The one-time extension of the current phase while a late relay names its agent.
    grace_used: bool,
}

impl Root {
    /// A root with no round pending.
    pub(crate) fn new() -> Root {
        Root {
            trigger: None,
            waiting_controls: Vec::new(),
            start: Start::Idle,
            grace_used: false,
        }
    }

    /// The kind of round to start now, if any.
    fn wanted_round(&self, st: &State) -> Option<RoundKind> {
        if st.round.is_some() || self.start != Start::Idle {
            return None;
        }
        if st.nodes.len() < st.cfg.expect as usize || st.cfg.expect == 0 {
            return None;
        }
        if let Some(k) = self.trigger {
            return Some(k);
        }
        // Without a trigger, a round starts when every node came for the same thing.
        let mut intents = st.nodes.values().map(|n| n.intent);
        let first = intents.next()?;
        if first == Intent::Standby || !intents.all(|i| i == first) {
            return None;
        }
        Some(match first {
            Intent::Checkpoint => RoundKind::Checkpoint {
                then: AfterCommit::Resume,
            },
            Intent::BackgroundCheckpoint => RoundKind::BackgroundCheckpoint,
            Intent::Restart | Intent::Standby => RoundKind::Restart,
        })
    }

    fn maybe_start_round(&mut self, st: &mut State) {
        let Some(kind) = self.wanted_round(st) else {
            return;
        };
        self.start = Start::Reserving(kind);
        st.act(Action::ReserveEpoch {
            last_committed: st.last_committed,
        });
    }

    fn start_round(&mut self, st: &mut State, kind: RoundKind, epoch: u64, now: Instant) {
        if st.nodes.len() < st.cfg.expect as usize {
            // Someone left while the number was being reserved; the reserved number is
            // simply skipped (numbers are never reused, gaps are harmless).
            log!(
                st,
                "epoch {epoch} not started: {} of {} nodes registered",
                st.nodes.len(),
                st.cfg.expect
            );
            self.trigger.get_or_insert(kind);
            return;
        }
        self.trigger = None;
        for n in st.nodes.values_mut() {
            n.intent = Intent::Standby;
        }
        st.kv.clear();
        let first = kind.phases()[0];
        let deadline = PhaseDeadline::new(st.cfg.phase_deadline);
        st.round = Some(Round::new(
            epoch,
            kind,
            first,
            st.membership(),
            deadline,
            now + st.cfg.phase_deadline,
        ));
        self.grace_used = false;
        log!(st, "epoch {epoch}: {kind:?} round starts with {first}");
        st.broadcast_phase();
    }

    /// Moves to the next phase, or ends the round after the last one.
    fn advance(&mut self, st: &mut State, now: Instant) {
        let Some(r) = st.round.as_mut() else {
            return;
        };
        self.grace_used = false;
        match r.next_phase(now + st.cfg.phase_deadline) {
            Some(phase) => {
                let epoch = r.epoch();
                let done_ahead = r.barrier() == Barrier::Complete;
                log!(st, "epoch {epoch}: {phase}");
                st.broadcast_phase();
                // Every node acknowledged this phase ahead: the next command follows in
                // the same write.
                if done_ahead {
                    self.barrier_complete(st, now);
                }
            }
            None => {
                let outcome = match r.kind() {
                    RoundKind::Checkpoint { .. } | RoundKind::BackgroundCheckpoint => {
                        Outcome::Committed
                    }
                    RoundKind::Restart => Outcome::Restarted,
                };
                self.finish_round(st, outcome);
            }
        }
    }

    /// DUMP is complete: ask for the epoch's record to be written.
    fn commit(&mut self, st: &mut State) {
        let Some(r) = st.round.as_mut() else {
            return;
        };
        let epoch = r.epoch();
        let mut dumped: BTreeMap<String, NodeManifest> = BTreeMap::new();
        for rep in r.take_reports() {
            if let PhaseInfo::Dump {
                image_dir,
                manifest_crc32c,
            } = rep.info
            {
                dumped.insert(
                    rep.node.clone(),
                    NodeManifest {
                        node: rep.node,
                        image_dir,
                        manifest_crc32c,
                    },
                );
            }
        }
        let mut nodes: Vec<NodeManifest> = st
            .nodes
            .keys()
            .map(|n| {
                dumped.remove(n).unwrap_or_else(|| NodeManifest {
                    node: n.clone(),
                    image_dir: String::new(),
                    manifest_crc32c: 0,
                })
            })
            .collect();
        nodes.sort_by(|a, b| a.node.cmp(&b.node));
        self.start = Start::Committing(epoch);
        st.act(Action::Commit { epoch, nodes });
    }

    /// Aborts the round (or, once committed, ends it with the error on record).
    fn fail_round(&mut self, st: &mut State, node: &str, reason: &str) {
        let Some(r) = &st.round else {
            return;
        };
        let (epoch, phase) = (r.epoch(), r.phase());
        if r.committed() {
            log!(
                st,
                "epoch {epoch} stays committed, but node {node} failed in {phase}: {reason}"
            );
            self.finish_round(
                st,
                Outcome::CommittedWithErrors {
                    node: node.to_string(),
                    reason: reason.to_string(),
                },
            );
            return;
        }
        self.abort_round(st, phase, node, reason);
    }

    fn abort_round(&mut self, st: &mut State, phase: Phase, node: &str, reason: &str) {
        let Some(r) = &st.round else {
            return;
        };
        let epoch = r.epoch();
        let to = r.members();
        st.broadcast(
            to,
            Message::Abort(Abort {
                epoch,
                phase,
                node: node.to_string(),
                reason: reason.to_string(),
            }),
        );
        log!(
            st,
            "epoch {epoch} ABORTED in {phase}: node {node}: {reason}; last committed epoch {:?} stays valid",
            st.last_committed
        );
        st.act(Action::RecordAbort {
            epoch,
            phase,
            node: node.to_string(),
            reason: reason.to_string(),
        });
        self.finish_round(
            st,
            Outcome::Aborted {
                phase,
                node: node.to_string(),
                reason: reason.to_string(),
            },
        );
    }

    fn finish_round(&mut self, st: &mut State, outcome: Outcome) {
        self.start = Start::Idle;
        let Some(r) = st.round.take() else {
            return;
        };
        log!(st, "epoch {}: round over: {outcome:?}", r.epoch());
        self.notify_controls(st, r.epoch(), r.kind(), outcome);
        self.maybe_start_round(st);
    }

    fn notify_controls(&mut self, st: &mut State, epoch: u64, kind: RoundKind, outcome: Outcome) {
        let to = std::mem::take(&mut self.waiting_controls);
        st.broadcast(
            to,
            Message::RoundOver(RoundOver {
                epoch,
                kind,
                outcome,
            }),
        );
    }
}

impl Policy for Root {
    fn registered(&mut self, st: &mut State, _reports: Vec<NodeReport>) {
        if st.nodes.len() == st.cfg.expect as usize {
            log!(st, "all {} nodes registered", st.cfg.expect);
        }
        self.maybe_start_round(st);
    }

    fn barrier_complete(&mut self, st: &mut State, now: Instant) {
        match st.round.as_ref().map(|r| r.phase()) {
            Some(Phase::Dump) => self.commit(st),
            Some(_) => self.advance(st, now),
            None => {}
        }
    }

    fn failed(&mut self, st: &mut State, fail: Fail) {
        match &st.round {
            Some(r) if r.epoch() == fail.epoch => {
                let reason = format!("reported failure: {}", fail.reason);
                self.fail_round(st, &fail.node, &reason);
            }
            _ => log!(
                st,
                "ignoring failure report from node {} for epoch {} ({}): no such round running",
                fail.node,
                fail.epoch,
                fail.reason
            ),
        }
    }

    fn member_lost(&mut self, st: &mut State, node: String, why: String) {
        self.fail_round(st, &node, &why);
    }

    fn nodes_left(&mut self, st: &mut State, nodes: Vec<String>, how: Departure) {
        if how == Departure::MidRound
            && let Some(n) = nodes.first()
        {
            self.fail_round(st, n, "left during the round");
        }
    }

    fn published(&mut self, _key: &str, _value: &[u8]) {}

    fn missed(&mut self, _key: String, _deadline: Instant) {}

    fn trigger(&mut self, st: &mut State, conn: ConnId, kind: RoundKind) {
        match self.trigger {
            Some(k) if k != kind => {
                log!(st, "trigger {kind:?} ignored: {k:?} already pending");
            }
            _ => self.trigger = Some(kind),
        }
        self.waiting_controls.push(conn);
        log!(
            st,
            "trigger {kind:?}: {} of {} nodes registered",
            st.nodes.len(),
            st.cfg.expect
        );
        self.maybe_start_round(st);
    }

    fn watches_deadline(&self) -> bool {
        // While the record is being written nobody is late: the wait is the root's own.
        !matches!(self.start, Start::Committing(_))
    }

    fn deadline_passed(&mut self, st: &mut State, now: Instant) {
        let late = st.late_peers();
        // A late relay fires its own, slightly earlier deadline and reports the late agent
        // by name; give its report a moment to arrive before blaming the relay.
        if late.iter().any(|l| l.is_relay) && !self.grace_used {
            let extra = (st.cfg.phase_deadline / RELAY_GRACE_DIVISOR)
                .clamp(RELAY_GRACE_MIN, RELAY_GRACE_MAX);
            self.grace_used = true;
            if let Some(r) = st.round.as_mut() {
                r.extend_deadline(now + extra);
            }
            return;
        }
        let Some(r) = &st.round else {
            return;
        };
        let reason = deadline_reason(r, &late);
        let shown = deadline_culprits(&late);
        let node = if shown.is_empty() {
            UNKNOWN_CULPRIT.to_string()
        } else {
            shown
        };
        self.fail_round(st, &node, &reason);
    }

    fn flush(&mut self, _st: &mut State, _now: Instant) {}

    fn epoch_reserved(&mut self, st: &mut State, epoch: u64, now: Instant) {
        let Start::Reserving(kind) = self.start else {
            log!(
                st,
                "ignoring reserved epoch {epoch}: no round was waiting for one"
            );
            return;
        };
        self.start = Start::Idle;
        self.start_round(st, kind, epoch, now);
    }

    fn epoch_unavailable(&mut self, st: &mut State, error: &str) {
        let Start::Reserving(kind) = self.start else {
            log!(
                st,
                "ignoring failed epoch reservation ({error}): none was asked for"
            );
            return;
        };
        self.start = Start::Idle;
        // The request is consumed, as if the round had run: retrying at once would fail
        // the same way in a loop.
        self.trigger = None;
        for n in st.nodes.values_mut() {
            n.intent = Intent::Standby;
        }
        log!(st, "cannot start a round: {error}");
        let name = st.cfg.name.clone();
        self.notify_controls(
            st,
            0,
            kind,
            Outcome::Aborted {
                phase: Phase::Register,
                node: name,
                reason: format!("cannot reserve an epoch: {error}"),
            },
        );
    }

    fn commit_written(&mut self, st: &mut State, epoch: u64, now: Instant) {
        if self.start != Start::Committing(epoch) {
            log!(st, "ignoring commit of epoch {epoch}: none was asked for");
            return;
        }
        self.start = Start::Idle;
        st.last_committed = Some(epoch);
        log!(st, "epoch {epoch}: COMMITTED ({} nodes)", st.nodes.len());
        // COMMIT needs no reply: it is announced and the round moves straight on.
        if let Some(r) = st.round.as_mut() {
            r.next_phase(now + st.cfg.phase_deadline);
        }
        st.broadcast_phase();
        self.advance(st, now);
    }

    fn commit_failed(&mut self, st: &mut State, epoch: u64, error: &str) {
        if self.start != Start::Committing(epoch) {
            log!(
                st,
                "ignoring failed commit of epoch {epoch} ({error}): none was asked for"
            );
            return;
        }
        self.start = Start::Idle;
        let name = st.cfg.name.clone();
        self.abort_round(st, Phase::Commit, &name, &format!("commit failed: {error}"));
    }
}
