//! The root's round state machine: when a round starts, how a barrier completes, the
//! commit, aborts and the report to control clients.
//!
//! ```text
//! Registering ──(N nodes + trigger or unanimous intent)──▶ Freezing ─▶ Draining ─▶ Dumping
//!      ▲                                                      │           │           │
//!      │                                  failure/deadline/disconnect     ▼           ▼
//!      └───────────── Aborted ◀──────────────────────────────────────── (any) ── Committed
//!                                                                                     │
//!                                                                     Resume | Kill ◀─┘
//! restart:   Registering ─▶ Restore ─▶ Publish ─▶ Subscribe ─▶ Resume
//! ```

use std::collections::HashMap;
use std::time::Instant;

use crate::kv::ConnId;
use crate::protocol::{
    Abort, Intent, Message, Outcome, Phase, PhaseCmd, PhaseInfo, RoundKind, RoundOver,
};
use crate::server::{FaultPoint, Round, Server, now_ms};
use crate::store::{GlobalManifest, NodeManifest};

impl Server {
    pub(crate) fn maybe_start_round(&mut self) {
        if self.round.is_some() || self.upstream.is_some() {
            return;
        }
        if self.nodes.len() < self.cfg.expect as usize || self.cfg.expect == 0 {
            return;
        }
        let kind = match self.trigger {
            Some(k) => k,
            None => {
                let mut intents = self.nodes.values().map(|(_, i)| *i);
                match intents.next() {
                    Some(first) if first != Intent::Standby && intents.all(|i| i == first) => {
                        match first {
                            Intent::Checkpoint => RoundKind::Checkpoint {
                                then: crate::protocol::AfterCommit::Resume,
                            },
                            _ => RoundKind::Restart,
                        }
                    }
                    _ => return,
                }
            }
        };
        self.trigger = None;
        for v in self.nodes.values_mut() {
            v.1 = Intent::Standby;
        }
        let last = self.last_committed;
        let epoch = match self.store.as_ref().map(|s| s.next_epoch(last)) {
            Some(Ok(e)) => e,
            Some(Err(e)) => {
                log!(self, "cannot start a round: {e}");
                self.notify_controls(
                    0,
                    kind,
                    Outcome::Aborted {
                        phase: Phase::Register,
                        node: self.cfg.name.clone(),
                        reason: format!("cannot reserve an epoch: {e}"),
                    },
                );
                return;
            }
            None => return,
        };
        let mut members: HashMap<ConnId, u32> = HashMap::new();
        for (c, _) in self.nodes.values() {
            *members.entry(*c).or_default() += 1;
        }
        self.kv.clear();
        let first = kind.phases()[0];
        self.round = Some(Round {
            epoch,
            kind,
            idx: 0,
            phase: first,
            deadline_ms: self.deadline_ms(),
            deadline: Instant::now() + self.cfg.phase_deadline,
            arrived: 0,
            need: self.cfg.expect,
            per_conn: HashMap::new(),
            members,
            reports: Vec::new(),
            committed: false,
            sent_up: false,
            grace_used: false,
        });
        log!(self, "epoch {epoch}: {kind:?} round starts with {first}");
        self.broadcast_phase();
    }

    pub(crate) fn deadline_ms(&self) -> u32 {
        u32::try_from(self.cfg.phase_deadline.as_millis()).unwrap_or(u32::MAX)
    }

    pub(crate) fn members(&self) -> Vec<ConnId> {
        self.round
            .as_ref()
            .map(|r| r.members.keys().copied().collect())
            .unwrap_or_default()
    }

    pub(crate) fn broadcast_phase(&mut self) {
        let Some(r) = &self.round else {
            return;
        };
        let m = Message::PhaseCmd(PhaseCmd {
            epoch: r.epoch,
            phase: r.phase,
            kind: r.kind,
            deadline_ms: r.deadline_ms,
            last_committed: self.last_committed,
        });
        let to = self.members();
        self.broadcast(&to, &m);
    }

    /// Every node finished the current phase.
    pub(crate) fn advance(&mut self) {
        let Some(r) = self.round.as_mut() else {
            return;
        };
        if r.phase == Phase::Dump {
            if self.cfg.fault == Some(FaultPoint::CrashAfterDump) {
                self.crashed = true;
                return;
            }
            let mut by_node: HashMap<String, (String, u32)> = HashMap::new();
            for rep in std::mem::take(&mut r.reports) {
                if let PhaseInfo::Dump {
                    image_dir,
                    manifest_crc32c,
                } = rep.info
                {
                    by_node.insert(rep.node, (image_dir, manifest_crc32c));
                }
            }
            let epoch = r.epoch;
            let mut nodes: Vec<NodeManifest> = self
                .nodes
                .keys()
                .map(|n| {
                    let (image_dir, manifest_crc32c) = by_node.remove(n).unwrap_or_default();
                    NodeManifest {
                        node: n.clone(),
                        image_dir,
                        manifest_crc32c,
                    }
                })
                .collect();
            nodes.sort_by(|a, b| a.node.cmp(&b.node));
            let manifest = GlobalManifest {
                job: self.cfg.job.clone(),
                epoch,
                committed_unix_ms: now_ms(),
                nodes,
            };
            let t = Instant::now();
            let res = match &self.store {
                Some(s) => s.commit(&manifest),
                None => Ok(()),
            };
            if let Err(e) = res {
                let name = self.cfg.name.clone();
                self.fail_round(Phase::Commit, &name, &format!("commit failed: {e}"));
                return;
            }
            self.last_committed = Some(epoch);
            log!(
                self,
                "epoch {epoch}: COMMITTED ({} nodes, record written in {:.1} ms)",
                manifest.nodes.len(),
                t.elapsed().as_secs_f64() * 1e3
            );
            if let Some(r) = self.round.as_mut() {
                r.committed = true;
                r.idx += 1;
                r.phase = Phase::Commit;
            }
            self.broadcast_phase();
        }
        let Some(r) = self.round.as_mut() else {
            return;
        };
        r.idx += 1;
        let phases = r.kind.phases();
        if r.idx >= phases.len() {
            let outcome = match r.kind {
                RoundKind::Checkpoint { .. } => Outcome::Committed,
                RoundKind::Restart => Outcome::Restarted,
            };
            self.finish_round(outcome);
            return;
        }
        r.phase = phases[r.idx];
        r.arrived = 0;
        r.per_conn.clear();
        r.reports.clear();
        r.grace_used = false;
        r.deadline = Instant::now() + self.cfg.phase_deadline;
        let (epoch, phase) = (r.epoch, r.phase);
        log!(self, "epoch {epoch}: {phase}");
        self.broadcast_phase();
    }

    pub(crate) fn fail_round(&mut self, phase: Phase, node: &str, reason: &str) {
        let Some(r) = &self.round else {
            return;
        };
        let (epoch, kind) = (r.epoch, r.kind);
        if r.committed {
            log!(
                self,
                "epoch {epoch} stays committed, but node {node} failed in {phase}: {reason}"
            );
            self.finish_round(Outcome::CommittedWithErrors {
                node: node.to_string(),
                reason: reason.to_string(),
            });
            return;
        }
        let to = self.members();
        self.broadcast(
            &to,
            &Message::Abort(Abort {
                epoch,
                phase,
                node: node.to_string(),
                reason: reason.to_string(),
            }),
        );
        log!(
            self,
            "epoch {epoch} ABORTED in {phase}: node {node}: {reason}; last committed epoch {:?} stays valid",
            self.last_committed
        );
        if let Some(s) = &self.store
            && let Err(e) = s.record_abort(epoch, phase, node, reason)
        {
            log!(self, "cannot record the abort of epoch {epoch}: {e}");
        }
        let _ = kind;
        self.finish_round(Outcome::Aborted {
            phase,
            node: node.to_string(),
            reason: reason.to_string(),
        });
    }

    pub(crate) fn finish_round(&mut self, outcome: Outcome) {
        let Some(r) = self.round.take() else {
            return;
        };
        log!(self, "epoch {}: round over: {outcome:?}", r.epoch);
        self.notify_controls(r.epoch, r.kind, outcome);
        self.maybe_start_round();
    }

    pub(crate) fn notify_controls(&mut self, epoch: u64, kind: RoundKind, outcome: Outcome) {
        let m = Message::RoundOver(RoundOver {
            epoch,
            kind,
            outcome,
        });
        for id in std::mem::take(&mut self.waiting_controls) {
            self.send(id, &m);
        }
    }
}
