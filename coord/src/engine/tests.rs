//! Engine tests: rounds, aborts and deadlines driven without sockets, files or clocks.
//!
//! Each test plays the I/O layer by hand: it feeds events at invented instants and
//! checks the actions, answering store actions the way the server (`server/engine_io.rs`) does.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use super::{Engine, Event};
use crate::action::{Action, RunningPhase};
use crate::kv::ConnId;
use crate::protocol::{
    Abort, AfterCommit, Arrive, Fail, Get, Intent, Message, NodeReport, Outcome, Phase, PhaseCmd,
    PhaseInfo, Put, Role, RoundKind, RoundOver, StatusQuery, Trigger, Values,
};
use crate::state::EngineConfig;

const JOB: &str = "job7";
const DEADLINE: Duration = Duration::from_secs(10);
const CKPT: RoundKind = RoundKind::Checkpoint {
    then: AfterCommit::Resume,
};
/// Connection number of the control client in every test.
const CONTROL: usize = 100;
/// Connection number of the control client that asks for status.
const STATUS: usize = 101;
/// Connection number of the first agent (or relay) below the engine.
const FIRST_AGENT: usize = 10;

fn conn(n: usize) -> ConnId {
    ConnId {
        token: n,
        serial: n as u64,
    }
}

fn addr(n: usize) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 40_000 + n as u16)
}

fn config(name: &str, expect: u32) -> EngineConfig {
    EngineConfig {
        name: name.to_string(),
        job: JOB.to_string(),
        expect,
        phase_deadline: DEADLINE,
    }
}

/// An engine, the time it is at, and its agents (connection → node name).
struct Harness {
    engine: Engine,
    now: Instant,
    agents: Vec<(ConnId, String)>,
    status_joined: bool,
}

impl Harness {
    fn root(expect: u32, last_committed: Option<u64>) -> Harness {
        Harness {
            engine: Engine::root(config("root", expect), last_committed),
            now: Instant::now(),
            agents: Vec::new(),
            status_joined: false,
        }
    }

    fn relay(expect: u32) -> Harness {
        Harness {
            engine: Engine::relay(config("sub0", expect), "head:7420"),
            now: Instant::now(),
            agents: Vec::new(),
            status_joined: false,
        }
    }

    fn feed(&mut self, e: Event) -> Vec<Action> {
        self.engine.handle(self.now, e)
    }

    fn after(&mut self, d: Duration) {
        self.now += d;
    }

    fn join(&mut self, n: usize, role: Role, name: &str, intent: Intent) -> Vec<Action> {
        self.feed(Event::Joined {
            conn: conn(n),
            addr: addr(n).into(),
            role,
            name: name.to_string(),
            intent,
        })
    }

    /// Registers `count` standby agents `n00`, `n01`, ...
    fn agents(&mut self, count: usize) -> Vec<Action> {
        let mut all = Vec::new();
        for i in 0..count {
            let name = format!("n{i:02}");
            let c = FIRST_AGENT + i;
            all.extend(self.join(c, Role::Agent, &name, Intent::Standby));
            self.agents.push((conn(c), name));
        }
        all
    }

    fn msg(&mut self, n: ConnId, msg: Message) -> Vec<Action> {
        self.feed(Event::Received { conn: n, msg })
    }

    fn arrive(&mut self, n: ConnId, epoch: u64, phase: Phase, info: PhaseInfo) -> Vec<Action> {
        let node = self.name_of(n);
        self.msg(
            n,
            Message::Arrive(Arrive {
                epoch,
                phase,
                count: 1,
                reports: vec![NodeReport { node, info }],
            }),
        )
    }

    /// Every agent arrives at `phase`; returns what the last arrival set off.
    fn all_arrive(&mut self, epoch: u64, phase: Phase) -> Vec<Action> {
        let mut last = Vec::new();
        for (c, name) in self.agents.clone() {
            let info = match phase {
                Phase::Dump => PhaseInfo::Dump {
                    image_dir: format!("/ckpt/{name}/{epoch}"),
                    manifest_crc32c: epoch as u32,
                },
                _ => PhaseInfo::None,
            };
            last = self.arrive(c, epoch, phase, info);
        }
        last
    }

    fn name_of(&self, n: ConnId) -> String {
        self.agents
            .iter()
            .find(|(c, _)| *c == n)
            .map(|(_, name)| name.clone())
            .unwrap_or_default()
    }

    fn agent_conns(&self) -> Vec<ConnId> {
        self.agents.iter().map(|(c, _)| *c).collect()
    }

    /// A control client connects and triggers `kind`.
    fn trigger(&mut self, kind: RoundKind) -> Vec<Action> {
        self.join(CONTROL, Role::Control, "ctl", Intent::Standby);
        self.msg(conn(CONTROL), Message::Trigger(Trigger { kind }))
    }

    /// The running round, as a status query from a separate control client sees it.
    fn running(&mut self) -> Option<RunningPhase> {
        if !self.status_joined {
            self.join(STATUS, Role::Control, "status", Intent::Standby);
            self.status_joined = true;
        }
        let actions = self.msg(conn(STATUS), Message::StatusQuery(StatusQuery {}));
        match actions.as_slice() {
            [Action::SendStatus { snapshot, .. }] => snapshot.running,
            other => panic!("expected one status answer, got {other:?}"),
        }
    }
}

/// Phase commands broadcast, in order.
fn phases(actions: &[Action]) -> Vec<Phase> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Broadcast {
                msg: Message::PhaseCmd(p),
                ..
            } => Some(p.phase),
            _ => None,
        })
        .collect()
}

/// The one phase command broadcast, with its recipients.
fn phase_cmd(actions: &[Action]) -> (Vec<ConnId>, PhaseCmd) {
    let cmds: Vec<_> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Broadcast {
                to,
                msg: Message::PhaseCmd(p),
            } => Some((to.clone(), p.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(cmds.len(), 1, "{actions:?}");
    cmds[0].clone()
}

/// The abort broadcast, with its recipients.
fn abort(actions: &[Action]) -> (Vec<ConnId>, Abort) {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Broadcast {
                to,
                msg: Message::Abort(ab),
            } => Some((to.clone(), ab.clone())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no abort in {actions:?}"))
}

/// The round report sent to control clients.
fn round_over(actions: &[Action]) -> RoundOver {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Broadcast {
                to,
                msg: Message::RoundOver(r),
            } => {
                assert_eq!(to, &vec![conn(CONTROL)]);
                Some(r.clone())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no round report in {actions:?}"))
}

/// Values sent to `to`.
fn values_to(actions: &[Action], to: ConnId) -> Vec<(String, Option<Vec<u8>>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send {
                to: t,
                msg: Message::Values(v),
            } if *t == to => Some(v.entries.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Messages sent to the parent, in order.
fn sent_up(actions: &[Action]) -> Vec<Message> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::SendUp(m) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

fn logs(actions: &[Action]) -> String {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Log(l) => Some(l.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A root with `n` agents whose checkpoint round is in FREEZE of epoch 1.
fn root_in_freeze(n: usize) -> Harness {
    let mut h = Harness::root(n as u32, None);
    h.agents(n);
    let a = h.trigger(CKPT);
    assert!(a.contains(&Action::ReserveEpoch {
        last_committed: None
    }));
    let a = h.feed(Event::EpochReserved { epoch: 1 });
    assert_eq!(phases(&a), vec![Phase::Freeze]);
    h
}

#[test]
fn checkpoint_round_through_all_phases() {
    let mut h = Harness::root(3, None);
    let a = h.agents(3);
    assert_eq!(
        a.iter()
            .filter(|a| matches!(
                a,
                Action::Send {
                    msg: Message::Welcome(_),
                    ..
                }
            ))
            .count(),
        3
    );
    assert!(logs(&a).contains("all 3 nodes registered"));
    // Registered, but nobody asked for a round yet.
    assert!(!a.iter().any(|a| matches!(a, Action::ReserveEpoch { .. })));
    let a = h.trigger(CKPT);
    assert!(a.contains(&Action::ReserveEpoch {
        last_committed: None
    }));
    let a = h.feed(Event::EpochReserved { epoch: 1 });
    let (to, cmd) = phase_cmd(&a);
    assert_eq!(to, h.agent_conns());
    assert_eq!((cmd.epoch, cmd.phase, cmd.kind), (1, Phase::Freeze, CKPT));
    assert_eq!(cmd.deadline_ms, 10_000);
    assert_eq!(
        h.running(),
        Some(RunningPhase {
            epoch: 1,
            phase: Phase::Freeze
        })
    );
    // A barrier holds until the last node arrives.
    let (first, _) = h.agents[0].clone();
    assert!(phases(&h.arrive(first, 1, Phase::Freeze, PhaseInfo::None)).is_empty());
    let (second, _) = h.agents[1].clone();
    // Arrivals for another phase or epoch are stale and ignored.
    assert!(h.arrive(second, 1, Phase::Dump, PhaseInfo::None).is_empty());
    assert!(
        h.arrive(second, 7, Phase::Freeze, PhaseInfo::None)
            .is_empty()
    );
    h.arrive(second, 1, Phase::Freeze, PhaseInfo::None);
    let (third, _) = h.agents[2].clone();
    let a = h.arrive(third, 1, Phase::Freeze, PhaseInfo::None);
    assert_eq!(phases(&a), vec![Phase::Drain]);
    assert_eq!(phases(&h.all_arrive(1, Phase::Drain)), vec![Phase::Dump]);
    // DUMP complete: the record is written before anyone hears COMMIT.
    let a = h.all_arrive(1, Phase::Dump);
    assert!(phases(&a).is_empty(), "{a:?}");
    let nodes = a
        .iter()
        .find_map(|a| match a {
            Action::Commit { epoch: 1, nodes } => Some(nodes.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no commit in {a:?}"));
    let dirs: Vec<&str> = nodes.iter().map(|n| n.image_dir.as_str()).collect();
    assert_eq!(dirs, ["/ckpt/n00/1", "/ckpt/n01/1", "/ckpt/n02/1"]);
    let a = h.feed(Event::CommitWritten { epoch: 1 });
    assert_eq!(phases(&a), vec![Phase::Commit, Phase::Resume]);
    let (_, resume) = phase_cmd(&a[a.len() - 1..]);
    assert_eq!(resume.last_committed, Some(1));
    let a = h.all_arrive(1, Phase::Resume);
    let over = round_over(&a);
    assert_eq!((over.epoch, over.outcome), (1, Outcome::Committed));
    assert_eq!(h.running(), None);
    assert_eq!(h.engine.last_committed(), Some(1));
}

#[test]
fn root_holds_drain_acknowledged_ahead() {
    let mut h = root_in_freeze(3);
    let cs = h.agent_conns();
    // Two nodes acknowledge DRAIN ahead with FREEZE: held, nothing starts.
    for c in &cs[..2] {
        assert!(phases(&h.arrive(*c, 1, Phase::Freeze, PhaseInfo::None)).is_empty());
        assert!(phases(&h.arrive(*c, 1, Phase::Drain, PhaseInfo::None)).is_empty());
    }
    // Only DRAIN may be acknowledged ahead: DUMP ahead is stale and ignored.
    assert!(h.arrive(cs[2], 1, Phase::Dump, PhaseInfo::None).is_empty());
    // The last FREEZE starts DRAIN, which then waits for that node alone.
    assert_eq!(
        phases(&h.arrive(cs[2], 1, Phase::Freeze, PhaseInfo::None)),
        vec![Phase::Drain]
    );
    assert_eq!(
        phases(&h.arrive(cs[2], 1, Phase::Drain, PhaseInfo::None)),
        vec![Phase::Dump]
    );
    let a = h.all_arrive(1, Phase::Dump);
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::Commit { epoch: 1, .. }))
    );
}

#[test]
fn a_node_cannot_arrive_ahead_twice() {
    let mut h = root_in_freeze(2);
    let cs = h.agent_conns();
    h.arrive(cs[0], 1, Phase::Freeze, PhaseInfo::None);
    h.arrive(cs[0], 1, Phase::Drain, PhaseInfo::None);
    let a = h.arrive(cs[0], 1, Phase::Drain, PhaseInfo::None);
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::Expel { conn, .. } if *conn == cs[0])),
        "{a:?}"
    );
}

#[test]
fn relay_sends_drain_acknowledged_ahead_with_freeze() {
    let mut h = relay_with(2);
    parent_phase(&mut h, 1, Phase::Freeze, CKPT);
    let cs = h.agent_conns();
    let mut up = Vec::new();
    for c in &cs {
        up.extend(sent_up(&h.arrive(*c, 1, Phase::Freeze, PhaseInfo::None)));
        up.extend(sent_up(&h.arrive(*c, 1, Phase::Drain, PhaseInfo::None)));
    }
    // One aggregate per phase, FREEZE first, both set off by the last agent's write.
    let got: Vec<(Phase, u32)> = up
        .iter()
        .map(|m| match m {
            Message::Arrive(a) => (a.phase, a.count),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(got, vec![(Phase::Freeze, 2), (Phase::Drain, 2)]);
    // The parent's DRAIN is fanned out; nothing more goes up for it.
    let a = parent_phase(&mut h, 1, Phase::Drain, CKPT);
    assert_eq!(phases(&a), vec![Phase::Drain]);
    assert!(sent_up(&a).is_empty());
    assert!(sent_up(&h.feed(Event::Tick)).is_empty());
    parent_phase(&mut h, 1, Phase::Dump, CKPT);
    let up = sent_up(&h.all_arrive(1, Phase::Dump));
    assert!(matches!(&up[..], [Message::Arrive(a)] if (a.phase, a.count) == (Phase::Dump, 2)));
}

#[test]
fn relay_with_some_agents_ahead_reports_drain_when_the_rest_arrive() {
    let mut h = relay_with(2);
    parent_phase(&mut h, 1, Phase::Freeze, CKPT);
    let cs = h.agent_conns();
    h.arrive(cs[0], 1, Phase::Freeze, PhaseInfo::None);
    assert!(sent_up(&h.arrive(cs[0], 1, Phase::Drain, PhaseInfo::None)).is_empty());
    let up = sent_up(&h.arrive(cs[1], 1, Phase::Freeze, PhaseInfo::None));
    assert!(matches!(&up[..], [Message::Arrive(a)] if a.phase == Phase::Freeze));
    parent_phase(&mut h, 1, Phase::Drain, CKPT);
    let up = sent_up(&h.arrive(cs[1], 1, Phase::Drain, PhaseInfo::None));
    assert!(matches!(&up[..], [Message::Arrive(a)] if (a.phase, a.count) == (Phase::Drain, 2)));
}

#[test]
fn round_starts_when_every_agent_asks_for_it() {
    let mut h = Harness::root(2, Some(4));
    let a = h.join(FIRST_AGENT, Role::Agent, "a", Intent::Checkpoint);
    assert!(!a.iter().any(|a| matches!(a, Action::ReserveEpoch { .. })));
    let a = h.join(FIRST_AGENT + 1, Role::Agent, "b", Intent::Checkpoint);
    assert!(a.contains(&Action::ReserveEpoch {
        last_committed: Some(4)
    }));
    let a = h.feed(Event::EpochReserved { epoch: 5 });
    let (_, cmd) = phase_cmd(&a);
    assert_eq!((cmd.epoch, cmd.phase, cmd.kind), (5, Phase::Freeze, CKPT));
}

#[test]
fn mixed_intents_wait_for_a_trigger() {
    let mut h = Harness::root(2, None);
    h.join(FIRST_AGENT, Role::Agent, "a", Intent::Checkpoint);
    let a = h.join(FIRST_AGENT + 1, Role::Agent, "b", Intent::Restart);
    assert!(!a.iter().any(|a| matches!(a, Action::ReserveEpoch { .. })));
}

#[test]
fn restart_round_with_kv_put_and_get() {
    let mut h = Harness::root(2, Some(1));
    h.agents(2);
    let (a_conn, b_conn) = (h.agents[0].0, h.agents[1].0);
    h.trigger(RoundKind::Restart);
    let a = h.feed(Event::EpochReserved { epoch: 2 });
    let (_, cmd) = phase_cmd(&a);
    assert_eq!((cmd.phase, cmd.last_committed), (Phase::Restore, Some(1)));
    assert_eq!(
        phases(&h.all_arrive(2, Phase::Restore)),
        vec![Phase::Publish]
    );
    // b asks before a publishes: the get is parked, answered when the key comes.
    let get = |keys: &[&str], ms: u32| {
        Message::Get(Get {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            timeout_ms: ms,
        })
    };
    h.msg(b_conn, get(&["a/vid1"], 5_000));
    assert!(values_to(&h.feed(Event::Tick), b_conn).is_empty());
    h.msg(
        a_conn,
        Message::Put(Put {
            entries: vec![("a/vid1".into(), b"41".to_vec())],
        }),
    );
    let a = h.feed(Event::Tick);
    assert_eq!(
        values_to(&a, b_conn),
        vec![("a/vid1".to_string(), Some(b"41".to_vec()))]
    );
    h.msg(
        b_conn,
        Message::Put(Put {
            entries: vec![("b/vid1".into(), b"42".to_vec())],
        }),
    );
    assert_eq!(
        phases(&h.all_arrive(2, Phase::Publish)),
        vec![Phase::Subscribe]
    );
    // A present key is answered at the next tick; a missing one once its wait is over.
    h.msg(a_conn, get(&["b/vid1", "never"], 500));
    let a = h.feed(Event::Tick);
    assert_eq!(
        values_to(&a, a_conn),
        vec![("b/vid1".to_string(), Some(b"42".to_vec()))]
    );
    h.after(Duration::from_millis(499));
    assert!(values_to(&h.feed(Event::Tick), a_conn).is_empty());
    h.after(Duration::from_millis(1));
    assert_eq!(
        values_to(&h.feed(Event::Tick), a_conn),
        vec![("never".to_string(), None)]
    );
    assert_eq!(
        phases(&h.all_arrive(2, Phase::Subscribe)),
        vec![Phase::Resume]
    );
    let over = round_over(&h.all_arrive(2, Phase::Resume));
    assert_eq!((over.epoch, over.outcome), (2, Outcome::Restarted));
    // A restart commits nothing.
    assert_eq!(h.engine.last_committed(), Some(1));
}

#[test]
fn abort_on_report_failed() {
    let mut h = root_in_freeze(3);
    h.all_arrive(1, Phase::Freeze);
    let culprit = h.agents[1].0;
    // A failure naming another node is pinned on its sender.
    let a = h.msg(
        culprit,
        Message::Fail(Fail {
            epoch: 1,
            phase: Phase::Drain,
            node: "n00".into(),
            reason: "disk full".into(),
        }),
    );
    let (to, ab) = abort(&a);
    assert_eq!(to, h.agent_conns());
    assert_eq!(
        (ab.epoch, ab.phase, ab.node.as_str()),
        (1, Phase::Drain, "n01")
    );
    assert_eq!(ab.reason, "reported failure: disk full");
    assert!(a.contains(&Action::RecordAbort {
        epoch: 1,
        phase: Phase::Drain,
        node: "n01".into(),
        reason: "reported failure: disk full".into(),
    }));
    match round_over(&a).outcome {
        Outcome::Aborted { phase, node, .. } => {
            assert_eq!((phase, node.as_str()), (Phase::Drain, "n01"))
        }
        o => panic!("{o:?}"),
    }
    assert_eq!(h.running(), None);
    assert!(!a.iter().any(|a| matches!(a, Action::Commit { .. })));
}

#[test]
fn failure_for_another_epoch_is_ignored() {
    let mut h = root_in_freeze(2);
    let c = h.agents[0].0;
    let a = h.msg(
        c,
        Message::Fail(Fail {
            epoch: 9,
            phase: Phase::Freeze,
            node: "n00".into(),
            reason: "old news".into(),
        }),
    );
    assert!(logs(&a).contains("no such round running"), "{a:?}");
    assert!(h.running().is_some());
}

#[test]
fn abort_on_disconnect() {
    let mut h = root_in_freeze(3);
    let gone = h.agents[2].0;
    let a = h.feed(Event::Disconnected {
        conn: gone,
        reason: "connection closed".into(),
    });
    let (_, ab) = abort(&a);
    assert_eq!((ab.phase, ab.node.as_str()), (Phase::Freeze, "n02"));
    assert_eq!(
        ab.reason,
        format!(
            "n02 ({}) disconnected: connection closed",
            addr(FIRST_AGENT + 2)
        )
    );
    assert_eq!(h.running(), None);
    // Its name is free again, and a disconnect outside a round aborts nothing.
    let a = h.join(FIRST_AGENT + 5, Role::Agent, "n02", Intent::Standby);
    assert!(a.iter().any(|a| matches!(
        a,
        Action::Send {
            msg: Message::Welcome(_),
            ..
        }
    )));
    let a = h.feed(Event::Disconnected {
        conn: conn(FIRST_AGENT + 5),
        reason: "connection closed".into(),
    });
    assert!(
        !a.iter().any(|a| matches!(a, Action::Broadcast { .. })),
        "{a:?}"
    );
}

#[test]
fn abort_on_deadline() {
    let mut h = root_in_freeze(3);
    let (c0, c1) = (h.agents[0].0, h.agents[1].0);
    h.arrive(c0, 1, Phase::Freeze, PhaseInfo::None);
    h.after(DEADLINE - Duration::from_millis(1));
    assert!(h.feed(Event::Tick).is_empty());
    h.arrive(c1, 1, Phase::Freeze, PhaseInfo::None);
    h.after(Duration::from_millis(1));
    let a = h.feed(Event::Tick);
    let (_, ab) = abort(&a);
    assert_eq!((ab.phase, ab.node.as_str()), (Phase::Freeze, "n02"));
    assert_eq!(ab.reason, "missed the FREEZE deadline (10.0 s)");
    assert_eq!(h.running(), None);
    // Once the round is over, time passing sets nothing off.
    h.after(DEADLINE);
    assert!(h.feed(Event::Tick).is_empty());
}

#[test]
fn deadline_restarts_with_each_phase() {
    let mut h = root_in_freeze(1);
    h.after(DEADLINE - Duration::from_secs(1));
    h.all_arrive(1, Phase::Freeze);
    h.after(Duration::from_secs(2));
    assert!(h.feed(Event::Tick).is_empty());
    assert_eq!(
        h.engine.next_deadline(),
        Some(h.now + DEADLINE - Duration::from_secs(2))
    );
}

#[test]
fn commit_failure_aborts_in_commit() {
    let mut h = root_in_freeze(2);
    h.all_arrive(1, Phase::Freeze);
    h.all_arrive(1, Phase::Drain);
    h.all_arrive(1, Phase::Dump);
    let a = h.feed(Event::CommitFailed {
        epoch: 1,
        error: "disk full".into(),
    });
    let (_, ab) = abort(&a);
    assert_eq!((ab.phase, ab.node.as_str()), (Phase::Commit, "root"));
    assert_eq!(ab.reason, "commit failed: disk full");
    assert_eq!(h.engine.last_committed(), None);
}

#[test]
fn failure_after_commit_keeps_the_epoch() {
    let mut h = root_in_freeze(2);
    h.all_arrive(1, Phase::Freeze);
    h.all_arrive(1, Phase::Drain);
    h.all_arrive(1, Phase::Dump);
    h.feed(Event::CommitWritten { epoch: 1 });
    let a = h.feed(Event::Disconnected {
        conn: h.agents[0].0,
        reason: "killed".into(),
    });
    assert!(!a.iter().any(|a| matches!(
        a,
        Action::Broadcast {
            msg: Message::Abort(_),
            ..
        }
    )));
    match round_over(&a).outcome {
        Outcome::CommittedWithErrors { node, .. } => assert_eq!(node, "n00"),
        o => panic!("{o:?}"),
    }
    assert_eq!(h.engine.last_committed(), Some(1));
}

#[test]
fn epoch_reservation_failure_is_reported() {
    let mut h = Harness::root(1, None);
    h.agents(1);
    h.trigger(CKPT);
    let a = h.feed(Event::EpochUnavailable {
        error: "read-only file system".into(),
    });
    match round_over(&a).outcome {
        Outcome::Aborted { phase, reason, .. } => {
            assert_eq!(phase, Phase::Register);
            assert!(reason.contains("read-only file system"), "{reason}");
        }
        o => panic!("{o:?}"),
    }
    assert_eq!(h.running(), None);
}

#[test]
fn an_agent_cannot_arrive_for_others() {
    let mut h = root_in_freeze(3);
    let cheat = h.agents[0].0;
    let a = h.msg(
        cheat,
        Message::Arrive(Arrive {
            epoch: 1,
            phase: Phase::Freeze,
            count: 3,
            reports: Vec::new(),
        }),
    );
    assert!(a.contains(&Action::Expel {
        conn: cheat,
        reason: "protocol violation: bogus arrival".into()
    }));
    let (_, ab) = abort(&a);
    assert_eq!(ab.node, "n00");
    // Nor report for another node, even within its count.
    let mut h = root_in_freeze(2);
    let cheat = h.agents[0].0;
    let a = h.msg(
        cheat,
        Message::Arrive(Arrive {
            epoch: 1,
            phase: Phase::Freeze,
            count: 1,
            reports: vec![NodeReport {
                node: "n01".into(),
                info: PhaseInfo::None,
            }],
        }),
    );
    assert!(a.iter().any(|a| matches!(a, Action::Expel { .. })));
}

/// The reason of the refusal among `actions`.
fn refusal(actions: &[Action]) -> String {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Refuse { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no refusal in {actions:?}"))
}

#[test]
fn registration_is_refused_when_duplicate_full_or_closed() {
    let mut h = Harness::root(2, None);
    h.agents(1);
    let dup = h.join(50, Role::Agent, "n00", Intent::Standby);
    assert_eq!(refusal(&dup), "node n00 is already registered");
    h.join(51, Role::Agent, "n01", Intent::Standby);
    let full = h.join(52, Role::Agent, "n02", Intent::Standby);
    assert_eq!(
        refusal(&full),
        "job job7 already has all 2 nodes registered"
    );
    // A refused peer is forgotten: what it still sends is ignored.
    assert!(
        h.msg(conn(52), Message::StatusQuery(StatusQuery {}))
            .is_empty()
    );
    // A relay mirroring a round with fewer agents than expected admits nobody mid-round.
    let mut h = Harness::relay(2);
    h.agents(1);
    parent_phase(&mut h, 3, Phase::Freeze, CKPT);
    let closed = h.join(53, Role::Agent, "late", Intent::Standby);
    assert_eq!(
        refusal(&closed),
        "epoch 3 is in FREEZE; registration is closed"
    );
}

#[test]
fn unexpected_message_expels_the_peer() {
    let mut h = Harness::root(2, None);
    h.agents(1);
    let c = h.agents[0].0;
    let a = h.msg(c, Message::Trigger(Trigger { kind: CKPT }));
    assert!(a.contains(&Action::Expel {
        conn: c,
        reason: "protocol violation".into()
    }));
    // The node left with it.
    let a = h.join(52, Role::Agent, "n00", Intent::Standby);
    assert!(a.iter().any(|a| matches!(
        a,
        Action::Send {
            msg: Message::Welcome(_),
            ..
        }
    )));
}

// ---------------------------------------------------------------- relay

/// A relay with `n` agents that has sent its registrations up.
fn relay_with(n: usize) -> Harness {
    let mut h = Harness::relay(n as u32);
    h.agents(n);
    let up = sent_up(&h.feed(Event::Tick));
    match &up[..] {
        [Message::Arrive(a)] => {
            assert_eq!((a.phase, a.count), (Phase::Register, n as u32));
            let names: Vec<&str> = a.reports.iter().map(|r| r.node.as_str()).collect();
            let want: Vec<String> = (0..n).map(|i| format!("n{i:02}")).collect();
            assert_eq!(names, want);
        }
        other => panic!("expected one batched registration, got {other:?}"),
    }
    h
}

fn parent_phase(h: &mut Harness, epoch: u64, phase: Phase, kind: RoundKind) -> Vec<Action> {
    h.feed(Event::FromParent(Message::PhaseCmd(PhaseCmd {
        epoch,
        phase,
        kind,
        deadline_ms: 10_000,
        last_committed: None,
    })))
}

#[test]
fn relay_aggregates_its_agents_into_one_report() {
    let mut h = relay_with(3);
    let a = parent_phase(&mut h, 1, Phase::Freeze, CKPT);
    let (to, cmd) = phase_cmd(&a);
    assert_eq!((to, cmd.phase), (h.agent_conns(), Phase::Freeze));
    let cs = h.agent_conns();
    assert!(sent_up(&h.arrive(cs[0], 1, Phase::Freeze, PhaseInfo::None)).is_empty());
    assert!(sent_up(&h.arrive(cs[1], 1, Phase::Freeze, PhaseInfo::None)).is_empty());
    let up = sent_up(&h.arrive(cs[2], 1, Phase::Freeze, PhaseInfo::None));
    match &up[..] {
        [Message::Arrive(a)] => {
            assert_eq!(
                (a.epoch, a.phase, a.count, a.reports.len()),
                (1, Phase::Freeze, 3, 3)
            )
        }
        other => panic!("expected one aggregated arrival, got {other:?}"),
    }
    // DUMP reports travel up with the aggregate, for the root's manifest.
    parent_phase(&mut h, 1, Phase::Drain, CKPT);
    h.all_arrive(1, Phase::Drain);
    parent_phase(&mut h, 1, Phase::Dump, CKPT);
    let up = sent_up(&h.all_arrive(1, Phase::Dump));
    match &up[..] {
        [Message::Arrive(a)] => assert!(a.reports.iter().all(
            |r| matches!(&r.info, PhaseInfo::Dump { image_dir, .. } if image_dir.ends_with("/1"))
        )),
        other => panic!("{other:?}"),
    }
    // COMMIT is fanned out and needs no reply; RESUME ends the mirrored round.
    let a = parent_phase(&mut h, 1, Phase::Commit, CKPT);
    assert_eq!(phases(&a), vec![Phase::Commit]);
    parent_phase(&mut h, 1, Phase::Resume, CKPT);
    let up = sent_up(&h.all_arrive(1, Phase::Resume));
    assert!(matches!(&up[..], [Message::Arrive(a)] if a.count == 3));
    assert_eq!(h.running(), None);
}

#[test]
fn relay_puts_go_up_before_the_arrival() {
    let mut h = relay_with(2);
    parent_phase(&mut h, 2, Phase::Publish, RoundKind::Restart);
    let cs = h.agent_conns();
    for (i, c) in cs.iter().enumerate() {
        h.msg(
            *c,
            Message::Put(Put {
                entries: vec![(format!("k{i}"), vec![i as u8])],
            }),
        );
    }
    let up = sent_up(&h.all_arrive(2, Phase::Publish));
    match &up[..] {
        [Message::Put(p), Message::Arrive(a)] => {
            assert_eq!(p.entries.len(), 2);
            assert_eq!(a.count, 2);
        }
        other => panic!("expected puts then the arrival, got {other:?}"),
    }
}

#[test]
fn relay_asks_the_parent_once_per_key() {
    let mut h = relay_with(2);
    parent_phase(&mut h, 2, Phase::Subscribe, RoundKind::Restart);
    let cs = h.agent_conns();
    for c in &cs {
        h.msg(
            *c,
            Message::Get(Get {
                keys: vec!["far".into()],
                timeout_ms: 5_000,
            }),
        );
    }
    let up = sent_up(&h.feed(Event::Tick));
    match &up[..] {
        [Message::Get(g)] => assert_eq!(
            (g.keys.clone(), g.timeout_ms),
            (vec!["far".to_string()], 5_000)
        ),
        other => panic!("expected one upstream get, got {other:?}"),
    }
    let a = h.feed(Event::FromParent(Message::Values(Values {
        entries: vec![("far".into(), Some(b"v".to_vec()))],
    })));
    assert!(a.is_empty());
    let a = h.feed(Event::Tick);
    for c in cs {
        assert_eq!(
            values_to(&a, c),
            vec![("far".to_string(), Some(b"v".to_vec()))]
        );
    }
}

#[test]
fn relay_propagates_an_abort_down() {
    let mut h = relay_with(3);
    parent_phase(&mut h, 1, Phase::Freeze, CKPT);
    let a = h.feed(Event::FromParent(Message::Abort(Abort {
        epoch: 1,
        phase: Phase::Freeze,
        node: "m07".into(),
        reason: "reported failure: disk full".into(),
    })));
    let (to, ab) = abort(&a);
    assert_eq!(to, h.agent_conns());
    assert_eq!(
        (ab.node.as_str(), ab.reason.as_str()),
        ("m07", "reported failure: disk full")
    );
    assert_eq!(h.running(), None);
}

#[test]
fn relay_reports_failures_and_disconnects_up() {
    let mut h = relay_with(2);
    parent_phase(&mut h, 1, Phase::Freeze, CKPT);
    let cs = h.agent_conns();
    let up = sent_up(&h.feed(Event::Disconnected {
        conn: cs[1],
        reason: "connection closed".into(),
    }));
    match &up[..] {
        [Message::Fail(f)] => {
            assert_eq!(
                (f.epoch, f.phase, f.node.as_str()),
                (1, Phase::Freeze, "n01")
            );
            assert!(f.reason.contains("disconnected"), "{}", f.reason);
        }
        other => panic!("{other:?}"),
    }
    // The relay decides nothing: no abort until the parent says so.
    assert!(h.running().is_some());
}

#[test]
fn relay_deadline_fires_first_and_names_the_agent() {
    let mut h = relay_with(2);
    parent_phase(&mut h, 1, Phase::Drain, CKPT);
    let cs = h.agent_conns();
    h.arrive(cs[0], 1, Phase::Drain, PhaseInfo::None);
    // 10 s at the root, 9.5 s here.
    h.after(Duration::from_millis(9_499));
    assert!(sent_up(&h.feed(Event::Tick)).is_empty());
    h.after(Duration::from_millis(1));
    let up = sent_up(&h.feed(Event::Tick));
    match &up[..] {
        [Message::Fail(f)] => {
            assert_eq!((f.phase, f.node.as_str()), (Phase::Drain, "n01"));
            assert!(
                f.reason.contains("missed the DRAIN deadline"),
                "{}",
                f.reason
            );
        }
        other => panic!("{other:?}"),
    }
    // Reported once.
    h.after(Duration::from_secs(1));
    assert!(sent_up(&h.feed(Event::Tick)).is_empty());
}

#[test]
fn relay_losing_its_parent_aborts_its_agents() {
    let mut h = relay_with(2);
    parent_phase(&mut h, 1, Phase::Freeze, CKPT);
    let a = h.feed(Event::ParentLost {
        reason: "connection closed".into(),
    });
    let (to, ab) = abort(&a);
    assert_eq!(to, h.agent_conns());
    assert_eq!(ab.node, "sub0");
    assert!(
        ab.reason.contains("parent coordinator head:7420 lost"),
        "{}",
        ab.reason
    );
}

#[test]
fn relay_refuses_triggers() {
    let mut h = relay_with(1);
    let a = h.trigger(CKPT);
    assert!(matches!(&a[..], [.., Action::Refuse { conn: c, .. }] if *c == conn(CONTROL)));
}

#[test]
fn root_gives_a_late_relay_time_to_name_its_agent() {
    let mut h = Harness::root(2, None);
    let relay = conn(FIRST_AGENT);
    h.join(FIRST_AGENT, Role::SubCoordinator, "sub0", Intent::Standby);
    let reports = ["m0", "m1"]
        .iter()
        .map(|n| NodeReport {
            node: n.to_string(),
            info: PhaseInfo::Register {
                intent: Intent::Standby,
            },
        })
        .collect();
    h.msg(
        relay,
        Message::Arrive(Arrive {
            epoch: 0,
            phase: Phase::Register,
            count: 2,
            reports,
        }),
    );
    h.trigger(CKPT);
    let a = h.feed(Event::EpochReserved { epoch: 1 });
    let (to, _) = phase_cmd(&a);
    assert_eq!(to, vec![relay]);
    h.after(DEADLINE);
    // First expiry: a grace period, no abort yet.
    assert!(
        !h.feed(Event::Tick)
            .iter()
            .any(|a| matches!(a, Action::Broadcast { .. }))
    );
    // The relay's own report names the late agent.
    let a = h.msg(
        relay,
        Message::Fail(Fail {
            epoch: 1,
            phase: Phase::Freeze,
            node: "m1".into(),
            reason: "missed the FREEZE deadline (10.0 s)".into(),
        }),
    );
    let (_, ab) = abort(&a);
    assert_eq!(ab.node, "m1");
}

#[test]
fn root_blames_a_silent_relay_after_the_grace() {
    let mut h = Harness::root(1, None);
    let relay = conn(FIRST_AGENT);
    h.join(FIRST_AGENT, Role::SubCoordinator, "sub0", Intent::Standby);
    h.msg(
        relay,
        Message::Arrive(Arrive {
            epoch: 0,
            phase: Phase::Register,
            count: 1,
            reports: vec![NodeReport {
                node: "m0".into(),
                info: PhaseInfo::Register {
                    intent: Intent::Standby,
                },
            }],
        }),
    );
    h.trigger(CKPT);
    h.feed(Event::EpochReserved { epoch: 1 });
    h.after(DEADLINE);
    h.feed(Event::Tick);
    // One second of grace (a tenth of the deadline).
    h.after(Duration::from_secs(1));
    let (_, ab) = abort(&h.feed(Event::Tick));
    assert_eq!(ab.node, "sub-coordinator sub0 (1 of 1 nodes late)");
}

const BACKGROUND: RoundKind = RoundKind::BackgroundCheckpoint;

#[test]
fn background_round_thaws_only_after_every_node_captured() {
    let mut h = Harness::root(3, Some(4));
    h.agents(3);
    h.trigger(BACKGROUND);
    let a = h.feed(Event::EpochReserved { epoch: 5 });
    let (_, cmd) = phase_cmd(&a);
    assert_eq!((cmd.phase, cmd.kind), (Phase::Freeze, BACKGROUND));
    assert_eq!(phases(&h.all_arrive(5, Phase::Freeze)), vec![Phase::Drain]);
    assert_eq!(phases(&h.all_arrive(5, Phase::Drain)), vec![Phase::Capture]);
    // DUMP (the signal to thaw) waits for the last node's frozen state.
    let cs = h.agent_conns();
    assert!(phases(&h.arrive(cs[0], 5, Phase::Capture, PhaseInfo::None)).is_empty());
    assert!(phases(&h.arrive(cs[1], 5, Phase::Capture, PhaseInfo::None)).is_empty());
    let a = h.arrive(cs[2], 5, Phase::Capture, PhaseInfo::None);
    let (to, cmd) = phase_cmd(&a);
    assert_eq!((to, cmd.phase), (cs.clone(), Phase::Dump));
    // The epoch commits only once every node's pages are written.
    let a = h.all_arrive(5, Phase::Dump);
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::Commit { epoch: 5, .. }))
    );
    let a = h.feed(Event::CommitWritten { epoch: 5 });
    assert_eq!(phases(&a), vec![Phase::Commit, Phase::Resume]);
    let over = round_over(&h.all_arrive(5, Phase::Resume));
    assert_eq!((over.kind, over.outcome), (BACKGROUND, Outcome::Committed));
    assert_eq!(h.engine.last_committed(), Some(5));
}

#[test]
fn background_round_starts_when_every_agent_asks_for_it() {
    let mut h = Harness::root(2, None);
    h.join(FIRST_AGENT, Role::Agent, "a", Intent::BackgroundCheckpoint);
    let a = h.join(
        FIRST_AGENT + 1,
        Role::Agent,
        "b",
        Intent::BackgroundCheckpoint,
    );
    assert!(a.iter().any(|a| matches!(a, Action::ReserveEpoch { .. })));
    let (_, cmd) = phase_cmd(&h.feed(Event::EpochReserved { epoch: 1 }));
    assert_eq!(cmd.kind, BACKGROUND);
}

#[test]
fn failure_after_the_thaw_aborts_and_keeps_the_last_commit() {
    let mut h = Harness::root(2, Some(3));
    h.agents(2);
    h.trigger(BACKGROUND);
    h.feed(Event::EpochReserved { epoch: 4 });
    h.all_arrive(4, Phase::Freeze);
    h.all_arrive(4, Phase::Drain);
    h.all_arrive(4, Phase::Capture);
    let cs = h.agent_conns();
    h.arrive(
        cs[0],
        4,
        Phase::Dump,
        PhaseInfo::Dump {
            image_dir: "/ckpt/n00/4".into(),
            manifest_crc32c: 1,
        },
    );
    // The other node loses its pages' writer after its tree runs again.
    let a = h.msg(
        cs[1],
        Message::Fail(Fail {
            epoch: 4,
            phase: Phase::Dump,
            node: "n01".into(),
            reason: "disk full".into(),
        }),
    );
    let (to, ab) = abort(&a);
    assert_eq!(to, cs);
    assert_eq!(
        (ab.epoch, ab.phase, ab.node.as_str()),
        (4, Phase::Dump, "n01")
    );
    assert!(!a.iter().any(|a| matches!(a, Action::Commit { .. })));
    assert_eq!(h.running(), None);
    assert_eq!(h.engine.last_committed(), Some(3));
}

#[test]
fn relay_mirrors_a_background_round() {
    let mut h = relay_with(2);
    parent_phase(&mut h, 1, Phase::Freeze, BACKGROUND);
    h.all_arrive(1, Phase::Freeze);
    parent_phase(&mut h, 1, Phase::Drain, BACKGROUND);
    h.all_arrive(1, Phase::Drain);
    let a = parent_phase(&mut h, 1, Phase::Capture, BACKGROUND);
    assert_eq!(phases(&a), vec![Phase::Capture]);
    let up = sent_up(&h.all_arrive(1, Phase::Capture));
    assert!(
        matches!(&up[..], [Message::Arrive(a)] if a.phase == Phase::Capture && a.count == 2),
        "{up:?}"
    );
}
