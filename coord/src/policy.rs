//! Where root and relay differ: what to do when nodes register, a barrier completes, a
//! node fails or is late, keys are published or missed, and what comes from a parent.
//!
//! The engine (`engine`) does everything both share (peers, registry, barrier
//! counting, key/value cache) and asks its policy at these points. `root::Root`
//! decides: it starts rounds, commits and aborts. `relay::Relay` forwards: it
//! aggregates its agents into one upstream peer and mirrors the parent's decisions.

use std::time::Instant;

use crate::kv::ConnId;
use crate::protocol::{Fail, Message, NodeReport, RoundKind};
use crate::state::State;

/// How nodes went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Departure {
    /// Outside a round, or after finishing its last phase.
    Quiet,
    /// While the round still counted on them.
    MidRound,
}

/// Root or relay behaviour.
pub(crate) trait Policy: std::fmt::Debug + Send {
    /// Nodes newly registered here (already in the registry).
    fn registered(&mut self, st: &mut State, reports: Vec<NodeReport>);

    /// Every node of the round arrived at the current phase.
    fn barrier_complete(&mut self, st: &mut State, now: Instant);

    /// Every node has arrived ahead at the next phase (see [`crate::protocol::Phase::may_arrive_ahead`]).
    /// The root has nothing to do until that phase starts (it then completes at once); a
    /// relay sends the aggregate up now, in the same write as the current phase's.
    fn ahead_complete(&mut self, _st: &mut State, _now: Instant) {}

    /// A node reported failure (already pinned on a node the sender stands for).
    fn failed(&mut self, st: &mut State, fail: Fail);

    /// A member connection was lost while the round counted on it; `node` is the first
    /// node it stood for.
    fn member_lost(&mut self, st: &mut State, node: String, why: String);

    /// Nodes left (already out of the registry).
    fn nodes_left(&mut self, st: &mut State, nodes: Vec<String>, how: Departure);

    /// A pair was published here (already stored locally).
    fn published(&mut self, key: &str, value: &[u8]);

    /// A get could not be answered from the local store.
    fn missed(&mut self, key: String, deadline: Instant);

    /// A control client asks for a round.
    fn trigger(&mut self, st: &mut State, conn: ConnId, kind: RoundKind);

    /// True while the current phase's deadline is this coordinator's to enforce.
    fn watches_deadline(&self) -> bool;

    /// The current phase's deadline passed with members missing.
    fn deadline_passed(&mut self, st: &mut State, now: Instant);

    /// End of a tick: send what was batched.
    fn flush(&mut self, st: &mut State, now: Instant);

    /// A message from the parent coordinator.
    fn parent_message(&mut self, st: &mut State, msg: Message, _now: Instant) {
        log!(
            st,
            "ignoring {:?} from a parent: this coordinator has none",
            msg.msg_type()
        );
    }

    /// The link to the parent is gone.
    fn parent_lost(&mut self, st: &mut State, reason: &str) {
        log!(
            st,
            "ignoring loss of a parent ({reason}): this coordinator has none"
        );
    }

    /// The store reserved `epoch` for the round waiting to start.
    fn epoch_reserved(&mut self, st: &mut State, epoch: u64, _now: Instant) {
        log!(
            st,
            "ignoring reserved epoch {epoch}: no round was waiting for one"
        );
    }

    /// The store could not reserve an epoch number.
    fn epoch_unavailable(&mut self, st: &mut State, error: &str) {
        log!(
            st,
            "ignoring failed epoch reservation ({error}): none was asked for"
        );
    }

    /// The epoch's record is durable.
    fn commit_written(&mut self, st: &mut State, epoch: u64, _now: Instant) {
        log!(st, "ignoring commit of epoch {epoch}: none was asked for");
    }

    /// The epoch's record could not be written.
    fn commit_failed(&mut self, st: &mut State, epoch: u64, error: &str) {
        log!(
            st,
            "ignoring failed commit of epoch {epoch} ({error}): none was asked for"
        );
    }
}
