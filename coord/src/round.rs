//! One round's barrier bookkeeping: which connections stand for how many nodes, who has
//! arrived at the current phase, and when the phase times out.
//!
//! The same structure serves the root (which drives the round) and a relay (which mirrors
//! the round its parent drives); what happens when a barrier completes is the policy's
//! business (`policy`), not this module's.
//!
//! ```text
//! checkpoint: Registering ─▶ Freeze ─▶ Drain ─▶ Dump ─▶ Commit ─▶ Resume | Kill
//!                               └──── failure / deadline / disconnect ────▶ Aborted
//! restart:    Registering ─▶ Restore ─▶ Publish ─▶ Subscribe ─▶ Resume
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::kv::ConnId;
use crate::protocol::{NodeReport, Phase, PhaseCmd, RoundKind};

/// How long nodes have for a phase, as sent on the wire in every phase command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PhaseDeadline {
    millis: u32,
}

impl PhaseDeadline {
    /// Saturates at `u32::MAX` milliseconds (about 49 days), the wire field's range.
    pub(crate) fn new(d: Duration) -> PhaseDeadline {
        PhaseDeadline {
            millis: u32::try_from(d.as_millis()).unwrap_or(u32::MAX),
        }
    }

    /// As received in a phase command.
    pub(crate) fn from_millis(millis: u32) -> PhaseDeadline {
        PhaseDeadline { millis }
    }

    /// Wire form.
    pub(crate) fn millis(self) -> u32 {
        self.millis
    }

    /// As a duration.
    pub(crate) fn duration(self) -> Duration {
        Duration::from_millis(u64::from(self.millis))
    }
}

/// Why an arrival was refused: the sender tried to complete a barrier for others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BogusArrival {
    /// Nodes the arrival claimed.
    pub(crate) claimed: u32,
    /// Nodes the sender stands for in this round.
    pub(crate) allowed: u32,
    /// Nodes of the sender that had already arrived.
    pub(crate) already: u32,
}

/// What an accepted arrival did to the barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Barrier {
    /// Still waiting for someone.
    Open,
    /// Every node of the round has arrived at the current phase.
    Complete,
}

/// A running round, at the root or mirrored at a relay.
#[derive(Debug)]
pub(crate) struct Round {
    epoch: u64,
    kind: RoundKind,
    phase_index: usize,
    phase: Phase,
    deadline_wire: PhaseDeadline,
    deadline: Instant,
    need: u32,
    members: BTreeMap<ConnId, u32>,
    /// Arrivals at the current phase.
    current: Arrivals,
    /// Arrivals for the next phase, sent ahead ([`Phase::may_arrive_ahead`]); they count
    /// once that phase starts.
    ahead: Arrivals,
    committed: bool,
}

/// The arrivals at one phase: the current one, or the next one for those sent ahead. One
/// type for both so both are bounded by the same rules.
#[derive(Debug, Default)]
struct Arrivals {
    arrived: u32,
    per_conn: BTreeMap<ConnId, u32>,
    reports: Vec<NodeReport>,
}

impl Arrivals {
    /// Nodes of `conn` that have arrived.
    fn of(&self, conn: ConnId) -> u32 {
        self.per_conn.get(&conn).copied().unwrap_or(0)
    }

    /// Counts an arrival of `count` nodes from `conn`, which stands for `allowed` nodes.
    fn add(
        &mut self,
        conn: ConnId,
        count: u32,
        reports: Vec<NodeReport>,
        allowed: u32,
        own_reports: bool,
    ) -> Result<(), BogusArrival> {
        // Arrivals are bounded by the nodes the peer stands for, and reports must name
        // them: one peer must not be able to complete a barrier for others.
        let already = self.of(conn);
        if already.saturating_add(count) > allowed || !own_reports {
            return Err(BogusArrival {
                claimed: count,
                allowed,
                already,
            });
        }
        self.arrived += count;
        *self.per_conn.entry(conn).or_default() += count;
        self.reports.extend(reports);
        Ok(())
    }

    /// `Complete` once `need` nodes have arrived.
    fn barrier(&self, need: u32) -> Barrier {
        if self.arrived >= need {
            Barrier::Complete
        } else {
            Barrier::Open
        }
    }
}

impl Round {
    /// A round entering `phase` with `members` (connection → nodes it stands for).
    pub(crate) fn new(
        epoch: u64,
        kind: RoundKind,
        phase: Phase,
        members: BTreeMap<ConnId, u32>,
        deadline_wire: PhaseDeadline,
        deadline: Instant,
    ) -> Round {
        let need = members.values().sum();
        let phase_index = kind.phases().iter().position(|p| *p == phase).unwrap_or(0);
        Round {
            epoch,
            kind,
            phase_index,
            phase,
            deadline_wire,
            deadline,
            need,
            members,
            current: Arrivals::default(),
            ahead: Arrivals::default(),
            committed: phase == Phase::Commit,
        }
    }

    /// Epoch number.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Kind of round.
    pub(crate) fn kind(&self) -> RoundKind {
        self.kind
    }

    /// Current phase.
    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }

    /// How long nodes have for each phase of this round.
    pub(crate) fn phase_deadline(&self) -> PhaseDeadline {
        self.deadline_wire
    }

    /// When the current phase times out.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Moves the deadline (the root's one-time grace for a late relay).
    pub(crate) fn extend_deadline(&mut self, to: Instant) {
        self.deadline = to;
    }

    /// True once the epoch's record is durable: failures no longer abort it.
    pub(crate) fn committed(&self) -> bool {
        self.committed
    }

    /// Marks a relay's mirror as committed (its parent said so).
    pub(crate) fn set_committed(&mut self) {
        self.committed = true;
    }

    /// Connections taking part.
    pub(crate) fn members(&self) -> Vec<ConnId> {
        self.members.keys().copied().collect()
    }

    /// True if `conn` takes part.
    pub(crate) fn is_member(&self, conn: ConnId) -> bool {
        self.members.contains_key(&conn)
    }

    /// True in the round's last phase (RESUME or KILL).
    pub(crate) fn in_last_phase(&self) -> bool {
        self.kind.phases().last() == Some(&self.phase)
    }

    /// The peer has fully arrived in the round's last phase: leaving now is a normal exit.
    pub(crate) fn finished_by(&self, conn: ConnId) -> bool {
        self.in_last_phase()
            && self.current.of(conn) >= self.members.get(&conn).copied().unwrap_or(1)
    }

    /// The phase command every member is sent for the current phase.
    pub(crate) fn phase_cmd(&self, last_committed: Option<u64>) -> PhaseCmd {
        PhaseCmd {
            epoch: self.epoch,
            phase: self.phase,
            kind: self.kind,
            deadline_ms: self.deadline_wire.millis(),
            last_committed,
        }
    }

    /// Counts an arrival of `count` nodes from `conn`. `own_reports` says whether every
    /// report names a node that `conn` stands for (the caller knows the registry).
    pub(crate) fn arrive(
        &mut self,
        conn: ConnId,
        count: u32,
        reports: Vec<NodeReport>,
        own_reports: bool,
    ) -> Result<Barrier, BogusArrival> {
        let allowed = self.stands_for(conn);
        self.current
            .add(conn, count, reports, allowed, own_reports)?;
        Ok(self.barrier())
    }

    /// Nodes `conn` stands for in this round (none if it is not a member).
    fn stands_for(&self, conn: ConnId) -> u32 {
        self.members.get(&conn).copied().unwrap_or(0)
    }

    /// The phase after the current one, if nodes may arrive at it ahead.
    pub(crate) fn ahead_phase(&self) -> Option<Phase> {
        let next = *self.kind.phases().get(self.phase_index + 1)?;
        next.may_arrive_ahead().then_some(next)
    }

    /// Holds an arrival of `count` nodes from `conn` for the next phase (the caller checked
    /// [`Round::ahead_phase`]); same bounds as [`Round::arrive`]. `Complete` once every
    /// node of the round has arrived ahead.
    pub(crate) fn arrive_ahead(
        &mut self,
        conn: ConnId,
        count: u32,
        reports: Vec<NodeReport>,
        own_reports: bool,
    ) -> Result<Barrier, BogusArrival> {
        let allowed = self.stands_for(conn);
        self.ahead.add(conn, count, reports, allowed, own_reports)?;
        Ok(self.ahead_complete())
    }

    /// Whether every node has arrived ahead at the next phase.
    pub(crate) fn ahead_complete(&self) -> Barrier {
        self.ahead.barrier(self.need)
    }

    /// Nodes that arrived ahead at the next phase, and their reports (handed out).
    pub(crate) fn take_ahead(&mut self) -> (u32, Vec<NodeReport>) {
        (self.ahead.arrived, std::mem::take(&mut self.ahead.reports))
    }

    /// Whether every node has arrived at the current phase (also when they all did
    /// ahead, before it started).
    pub(crate) fn barrier(&self) -> Barrier {
        self.current.barrier(self.need)
    }

    /// A relay's new mirror of the round takes over the arrivals its previous mirror
    /// held ahead for this phase, for connections that are still members (at most the
    /// nodes each stands for).
    pub(crate) fn adopt_ahead(&mut self, previous: &mut Round) {
        if previous.epoch != self.epoch || previous.ahead_phase() != Some(self.phase) {
            return;
        }
        let ahead = std::mem::take(&mut previous.ahead);
        for (conn, count) in ahead.per_conn {
            if let Some(stands_for) = self.members.get(&conn) {
                let count = count.min(*stands_for);
                self.current.arrived += count;
                self.current.per_conn.insert(conn, count);
            }
        }
        self.current.reports = ahead.reports;
    }

    /// Nodes that arrived at the current phase.
    pub(crate) fn arrived(&self) -> u32 {
        self.current.arrived
    }

    /// Hands out the reports gathered in the current phase.
    pub(crate) fn take_reports(&mut self) -> Vec<NodeReport> {
        std::mem::take(&mut self.current.reports)
    }

    /// Members that have not fully arrived: connection and how many of its nodes are late.
    pub(crate) fn late(&self) -> Vec<LateConn> {
        self.members
            .iter()
            .filter_map(|(conn, stands_for)| {
                let got = self.current.of(*conn);
                (got < *stands_for).then(|| LateConn {
                    conn: *conn,
                    late: stands_for - got,
                    stands_for: *stands_for,
                })
            })
            .collect()
    }

    /// Moves to the next phase of the round's kind; `None` when the round is over.
    pub(crate) fn next_phase(&mut self, deadline: Instant) -> Option<Phase> {
        let phases = self.kind.phases();
        self.phase_index += 1;
        let phase = *phases.get(self.phase_index)?;
        self.phase = phase;
        // What arrived ahead counts now (empty unless the phase may be acknowledged ahead).
        self.current = std::mem::take(&mut self.ahead);
        self.deadline = deadline;
        if phase == Phase::Commit {
            self.committed = true;
        }
        Some(phase)
    }
}

/// A member that missed the current phase's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LateConn {
    /// The connection.
    pub(crate) conn: ConnId,
    /// Its nodes that have not arrived.
    pub(crate) late: u32,
    /// Nodes it stands for.
    pub(crate) stands_for: u32,
}
