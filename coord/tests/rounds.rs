//! Simulated agents (threads) driven through checkpoint and restart rounds, flat and
//! through a two-level tree, plus every abort path.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ckpt_coord::client::{Agent, AgentOptions, ClientError, Control, Directive};
use ckpt_coord::protocol::{AfterCommit, Intent, Outcome, Phase, PhaseInfo, RoundKind};
use ckpt_coord::server::{CoordConfig, CoordHandle, FaultPoint};
use ckpt_coord::{EpochStore, GlobalManifest, Secret};

const JOB: &str = "job7";
const CKPT: RoundKind = RoundKind::Checkpoint {
    then: AfterCommit::Resume,
};
/// Success paths get a generous deadline so a loaded machine cannot make them flaky.
const LONG: Duration = Duration::from_secs(30);

fn secret() -> Secret {
    Secret::from_bytes(b"test secret, 32 bytes long......")
}

fn root(expect: u32, dir: &Path, deadline: Duration, fault: Option<FaultPoint>) -> CoordHandle {
    let mut cfg = CoordConfig::new("127.0.0.1:0".parse().unwrap(), JOB, expect, secret());
    cfg.state_dir = Some(dir.to_path_buf());
    cfg.phase_deadline = deadline;
    cfg.emit_log = false;
    cfg.fault = fault;
    cfg.name = "root".into();
    ckpt_coord::spawn(cfg).unwrap()
}

fn sub(parent: SocketAddr, name: &str, expect: u32) -> CoordHandle {
    sub_on(parent, name, expect, None)
}

/// A sub-coordinator, also listening on the Unix socket `unix` if given.
fn sub_on(parent: impl ToString, name: &str, expect: u32, unix: Option<&Path>) -> CoordHandle {
    let mut cfg = CoordConfig::new("127.0.0.1:0".parse().unwrap(), JOB, expect, secret());
    cfg.parent = Some(parent.to_string());
    cfg.name = name.into();
    cfg.emit_log = false;
    cfg.listen_unix = unix.map(Path::to_path_buf);
    ckpt_coord::spawn(cfg).unwrap()
}

/// A root coordinator that also listens on the Unix socket `unix`.
fn root_unix(expect: u32, dir: &Path, deadline: Duration, unix: &Path) -> CoordHandle {
    let mut cfg = CoordConfig::new("127.0.0.1:0".parse().unwrap(), JOB, expect, secret());
    cfg.state_dir = Some(dir.to_path_buf());
    cfg.phase_deadline = deadline;
    cfg.emit_log = false;
    cfg.name = "root".into();
    cfg.listen_unix = Some(unix.to_path_buf());
    ckpt_coord::spawn(cfg).unwrap()
}

/// Sends, over `raw`, the Hello of a client in `role` expecting `expect` nodes and then
/// a forged proof, as a client that skips checking the coordinator would; reads until
/// the coordinator hangs up (the caller sets a read timeout) and returns the reason of
/// its last refusal, if it sent one.
fn forged_auth_refusal(
    raw: &mut (impl Read + Write),
    role: ckpt_coord::protocol::Role,
    expect: u32,
) -> Option<String> {
    let hello = ckpt_coord::protocol::Message::Hello(ckpt_coord::protocol::Hello {
        min_version: ckpt_coord::protocol::VERSION_MIN,
        max_version: ckpt_coord::protocol::VERSION_MAX,
        job: JOB.into(),
        node: "intruder".into(),
        role,
        intent: Intent::Standby,
        expect,
        client_nonce: [0; 32],
    });
    raw.write_all(&hello.encode().unwrap()).unwrap();
    let auth = ckpt_coord::protocol::Message::Auth(ckpt_coord::protocol::Auth { proof: [9; 32] });
    raw.write_all(&auth.encode().unwrap()).unwrap();
    let mut buf = Vec::new();
    let _ = raw.read_to_end(&mut buf);
    let mut r = ckpt_coord::protocol::FrameReader::new();
    r.push(&buf);
    let mut refused = None;
    while let Ok(Some(m)) = r.next_message() {
        if let ckpt_coord::protocol::Message::Refused(x) = m {
            refused = Some(x.reason);
        }
    }
    refused
}

/// The client address of a Unix socket.
fn unix_addr(path: &Path) -> String {
    format!("unix:{}", path.display())
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Behavior {
    Normal,
    DieIn(Phase),
    FailIn(Phase),
    StallIn(Phase),
}

#[derive(Debug, Clone, PartialEq)]
enum Ev {
    Enter(u64, Phase),
    Aborted(u64, Phase, String),
    Lost,
    Error(String),
}

struct Sim {
    node: String,
    peers: Vec<String>,
    behavior: Behavior,
    rounds: usize,
    intent: Intent,
    /// The behaviour applies only in this epoch.
    bad_epoch: u64,
    /// Acknowledge DRAIN ahead, together with FREEZE (nothing to drain).
    drain_ahead: bool,
}

fn key(node: &str, i: usize) -> String {
    format!("{node}/vid{i}")
}

fn value(node: &str, i: usize) -> Vec<u8> {
    format!("real-{node}-{i}").into_bytes()
}

/// One simulated agent: follows directives, publishes 16 keys, fetches every peer's 16.
fn agent(addr: impl ToString, sim: Sim) -> JoinHandle<Vec<Ev>> {
    let addr = addr.to_string();
    std::thread::spawn(move || {
        let opts = AgentOptions::new(&addr, JOB, secret(), &sim.node).intent(sim.intent);
        let mut a = match Agent::connect_with(&opts) {
            Ok(a) => a,
            Err(e) => return vec![Ev::Error(e.to_string())],
        };
        let mut evs = Vec::new();
        let mut done = 0;
        while done < sim.rounds {
            let d = match a.next_directive(Some(Duration::from_secs(60))) {
                Ok(d) => d,
                Err(ClientError::CoordinatorLost { .. }) => {
                    evs.push(Ev::Lost);
                    return evs;
                }
                Err(e) => {
                    evs.push(Ev::Error(e.to_string()));
                    return evs;
                }
            };
            let step = match d {
                Directive::Abort {
                    epoch, phase, node, ..
                } => {
                    evs.push(Ev::Aborted(epoch, phase, node));
                    done += 1;
                    continue;
                }
                Directive::Phase(s) => s,
            };
            evs.push(Ev::Enter(step.epoch, step.phase));
            if step.phase == Phase::Commit {
                assert_eq!(step.last_committed, Some(step.epoch));
            }
            if step.phase == Phase::Restore {
                assert!(step.last_committed.is_some_and(|e| e < step.epoch));
            }
            let behavior = if step.epoch == sim.bad_epoch {
                sim.behavior
            } else {
                Behavior::Normal
            };
            match behavior {
                Behavior::DieIn(p) if p == step.phase => return evs,
                Behavior::FailIn(p) if p == step.phase => {
                    a.report_failed(p, "simulated failure").unwrap();
                    continue;
                }
                Behavior::StallIn(p) if p == step.phase => continue,
                _ => {}
            }
            let res = match step.phase {
                Phase::Commit => continue,
                Phase::Publish => {
                    let entries = (0..16)
                        .map(|i| (key(&sim.node, i), value(&sim.node, i)))
                        .collect();
                    a.put_many(entries)
                        .and_then(|_| a.report_done(Phase::Publish, PhaseInfo::None))
                }
                Phase::Subscribe => {
                    let keys: Vec<String> = sim
                        .peers
                        .iter()
                        .filter(|p| **p != sim.node)
                        .flat_map(|p| (0..16).map(move |i| key(p, i)))
                        .collect();
                    let refs: Vec<&str> = keys.iter().map(|s| s.as_str()).collect();
                    match a.get_many(&refs, LONG) {
                        Ok(vals) => {
                            for (k, v) in keys.iter().zip(vals) {
                                let (p, i) = k.split_once("/vid").unwrap();
                                assert_eq!(v, value(p, i.parse().unwrap()), "value of {k}");
                            }
                            a.report_done(Phase::Subscribe, PhaseInfo::None)
                        }
                        Err(e) => Err(e),
                    }
                }
                Phase::Freeze if sim.drain_ahead => {
                    a.report_done_ahead(Phase::Freeze, PhaseInfo::None, Phase::Drain)
                }
                Phase::Dump => a.report_done(
                    Phase::Dump,
                    PhaseInfo::Dump {
                        image_dir: format!("/ckpt/{}/{}", sim.node, step.epoch),
                        manifest_crc32c: step.epoch as u32,
                    },
                ),
                p => a.report_done(p, PhaseInfo::None),
            };
            if let Err(e) = res {
                match e {
                    ClientError::Aborted {
                        epoch, phase, node, ..
                    } => {
                        evs.push(Ev::Aborted(epoch, phase, node));
                        done += 1;
                        continue;
                    }
                    e => {
                        evs.push(Ev::Error(e.to_string()));
                        return evs;
                    }
                }
            }
            if step.kind.phases().last() == Some(&step.phase) {
                done += 1;
            }
        }
        evs
    })
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i:02}")).collect()
}

fn spawn_agents(
    addrs: &[impl ToString],
    nodes: &[String],
    rounds: usize,
    special: &[(usize, Behavior)],
) -> Vec<JoinHandle<Vec<Ev>>> {
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let behavior = special
                .iter()
                .find(|(j, _)| *j == i)
                .map(|(_, b)| *b)
                .unwrap_or(Behavior::Normal);
            agent(
                addrs[i % addrs.len()].to_string(),
                Sim {
                    node: n.clone(),
                    peers: nodes.to_vec(),
                    behavior,
                    rounds,
                    intent: Intent::Standby,
                    bad_epoch: 2,
                    drain_ahead: false,
                },
            )
        })
        .collect()
}

/// Agents that acknowledge DRAIN ahead with FREEZE where `ahead(i)` says so.
fn spawn_agents_ahead(
    addrs: &[impl ToString],
    nodes: &[String],
    rounds: usize,
    ahead: impl Fn(usize) -> bool,
) -> Vec<JoinHandle<Vec<Ev>>> {
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            agent(
                addrs[i % addrs.len()].to_string(),
                Sim {
                    node: n.clone(),
                    peers: nodes.to_vec(),
                    behavior: Behavior::Normal,
                    rounds,
                    intent: Intent::Standby,
                    bad_epoch: 0,
                    drain_ahead: ahead(i),
                },
            )
        })
        .collect()
}

fn control(addr: impl ToString) -> Control {
    Control::connect(&addr.to_string(), JOB, secret(), "test-control").unwrap()
}

fn expected_checkpoint(epoch: u64) -> Vec<Ev> {
    [
        Phase::Freeze,
        Phase::Drain,
        Phase::Dump,
        Phase::Commit,
        Phase::Resume,
    ]
    .iter()
    .map(|p| Ev::Enter(epoch, *p))
    .collect()
}

fn expected_restart(epoch: u64) -> Vec<Ev> {
    [
        Phase::Restore,
        Phase::Publish,
        Phase::Subscribe,
        Phase::Resume,
    ]
    .iter()
    .map(|p| Ev::Enter(epoch, *p))
    .collect()
}

fn join_all(hs: Vec<JoinHandle<Vec<Ev>>>) -> Vec<Vec<Ev>> {
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// The record of the last committed epoch in the state directory `dir`; there must be one.
fn last_record(dir: &Path) -> GlobalManifest {
    EpochStore::open(dir, JOB)
        .unwrap()
        .last_committed()
        .unwrap()
        .unwrap()
}

/// Triggers a checkpoint (epoch 1) and a restart (epoch 2) through `ctl`, checks both
/// outcomes and that every agent in `hs` saw exactly those two rounds; returns how many
/// agents finished, so a caller can check none went missing.
fn checkpoint_then_restart(ctl: &mut Control, hs: Vec<JoinHandle<Vec<Ev>>>) -> usize {
    let r1 = ctl.trigger(CKPT, Some(LONG)).unwrap();
    assert_eq!((r1.epoch, r1.outcome), (1, Outcome::Committed));
    let r2 = ctl.trigger(RoundKind::Restart, Some(LONG)).unwrap();
    assert_eq!((r2.epoch, r2.outcome), (2, Outcome::Restarted));
    let mut want = expected_checkpoint(1);
    want.extend(expected_restart(2));
    let all = join_all(hs);
    for evs in &all {
        assert_eq!(*evs, want);
    }
    all.len()
}

/// Triggers a checkpoint, a restart and another checkpoint through `ctl`, and checks
/// each outcome, that every agent in `hs` saw exactly those three rounds, and that the
/// record of epoch 3 names all `nodes` nodes: the full cycle a job goes through.
fn checkpoint_restart_checkpoint(
    ctl: &mut Control,
    hs: Vec<JoinHandle<Vec<Ev>>>,
    dir: &Path,
    nodes: usize,
) {
    for (kind, outcome) in [
        (CKPT, Outcome::Committed),
        (RoundKind::Restart, Outcome::Restarted),
        (CKPT, Outcome::Committed),
    ] {
        assert_eq!(ctl.trigger(kind, Some(LONG)).unwrap().outcome, outcome);
    }
    let mut want = expected_checkpoint(1);
    want.extend(expected_restart(2));
    want.extend(expected_checkpoint(3));
    for evs in join_all(hs) {
        assert_eq!(evs, want);
    }
    let m = last_record(dir);
    assert_eq!((m.epoch, m.nodes.len()), (3, nodes));
}

#[test]
fn flat_checkpoint_then_restart_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let c = root(6, dir.path(), LONG, None);
    let nodes = names("n", 6);
    let hs = spawn_agents(&[c.local_addr()], &nodes, 2, &[]);
    let mut ctl = control(c.local_addr());
    checkpoint_then_restart(&mut ctl, hs);
    let m = last_record(dir.path());
    assert_eq!(m.epoch, 1);
    assert_eq!(m.nodes.len(), 6);
    assert_eq!(m.nodes[3].image_dir, "/ckpt/n03/1");
    assert_eq!(ctl.status().unwrap().last_committed, Some(1));
}

#[test]
fn round_starts_when_every_agent_asks_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = root(3, dir.path(), LONG, None);
    let nodes = names("a", 3);
    let hs: Vec<_> = nodes
        .iter()
        .map(|n| {
            agent(
                c.local_addr(),
                Sim {
                    node: n.clone(),
                    peers: nodes.clone(),
                    behavior: Behavior::Normal,
                    rounds: 1,
                    intent: Intent::Checkpoint,
                    bad_epoch: 0,
                    drain_ahead: false,
                },
            )
        })
        .collect();
    for evs in join_all(hs) {
        assert_eq!(evs, expected_checkpoint(1));
    }
}

#[test]
fn two_level_tree_checkpoint_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let c = root(9, dir.path(), LONG, None);
    let subs: Vec<CoordHandle> = (0..3)
        .map(|i| sub(c.local_addr(), &format!("sub{i}"), 3))
        .collect();
    let addrs: Vec<SocketAddr> = subs.iter().map(|s| s.local_addr()).collect();
    let nodes = names("t", 9);
    let hs = spawn_agents(&addrs, &nodes, 3, &[]);
    checkpoint_restart_checkpoint(&mut control(c.local_addr()), hs, dir.path(), 9);
}

#[test]
fn drain_acknowledged_ahead_flat_and_through_a_tree() {
    // Flat, every agent ahead: DRAIN and DUMP reach them in one write; each still sees
    // every phase, in order, and the record lists every node's images.
    let dir = tempfile::tempdir().unwrap();
    let c = root(4, dir.path(), LONG, None);
    let nodes = names("f", 4);
    let hs = spawn_agents_ahead(&[c.local_addr()], &nodes, 2, |_| true);
    let mut ctl = control(c.local_addr());
    for _ in 0..2 {
        assert_eq!(
            ctl.trigger(CKPT, Some(LONG)).unwrap().outcome,
            Outcome::Committed
        );
    }
    let mut want = expected_checkpoint(1);
    want.extend(expected_checkpoint(2));
    for evs in join_all(hs) {
        assert_eq!(evs, want);
    }
    let m = last_record(dir.path());
    assert_eq!((m.epoch, m.nodes.len()), (2, 4));
    assert!(m.nodes.iter().all(|n| n.image_dir.ends_with("/2")));

    // A tree where one relay's agents all go ahead and the other's are mixed: the DRAIN
    // barrier still waits for the agents that drain in DRAIN, then a restart round.
    let dir = tempfile::tempdir().unwrap();
    let c = root(6, dir.path(), LONG, None);
    let subs: Vec<CoordHandle> = (0..2)
        .map(|i| sub(c.local_addr(), &format!("sub{i}"), 3))
        .collect();
    let addrs: Vec<SocketAddr> = subs.iter().map(|s| s.local_addr()).collect();
    let nodes = names("m", 6);
    // Agent i goes to relay i % 2: relay 0 has agents 0, 2, 4 (all ahead), relay 1 has
    // 1, 3, 5 (only 1 ahead).
    let hs = spawn_agents_ahead(&addrs, &nodes, 3, |i| i % 2 == 0 || i == 1);
    checkpoint_restart_checkpoint(&mut control(c.local_addr()), hs, dir.path(), 6);
}

/// Runs one committed round, then one round with a misbehaving agent; checks that every
/// survivor was told to abort epoch 2, naming the culprit, and epoch 1 stays valid.
fn abort_case(tree: bool, culprit: Behavior, deadline: Duration, expect_reason: &str) {
    abort_case_kind(tree, CKPT, culprit, deadline, expect_reason)
}

fn abort_case_kind(
    tree: bool,
    kind2: RoundKind,
    culprit: Behavior,
    deadline: Duration,
    expect_reason: &str,
) {
    abort_case_over(tree, false, kind2, culprit, deadline, expect_reason)
}

/// [`abort_case_kind`], the agents connecting over Unix sockets if `unix`.
fn abort_case_over(
    tree: bool,
    unix: bool,
    kind2: RoundKind,
    culprit: Behavior,
    deadline: Duration,
    expect_reason: &str,
) {
    let dir = tempfile::tempdir().unwrap();
    let sock = |name: &str| unix.then(|| dir.path().join(name));
    let root_sock = sock("root.sock");
    let c = match &root_sock {
        Some(p) => root_unix(4, dir.path(), deadline, p),
        None => root(4, dir.path(), deadline, None),
    };
    let sub_socks: Vec<Option<std::path::PathBuf>> =
        (0..2).map(|i| sock(&format!("sub{i}.sock"))).collect();
    let subs: Vec<CoordHandle> = if tree {
        (0..2)
            .map(|i| {
                sub_on(
                    c.local_addr(),
                    &format!("sub{i}"),
                    2,
                    sub_socks[i].as_deref(),
                )
            })
            .collect()
    } else {
        Vec::new()
    };
    let addrs: Vec<String> = match (tree, unix) {
        (true, true) => sub_socks.iter().flatten().map(|p| unix_addr(p)).collect(),
        (true, false) => subs.iter().map(|s| s.local_addr().to_string()).collect(),
        (false, true) => root_sock.iter().map(|p| unix_addr(p)).collect(),
        (false, false) => vec![c.local_addr().to_string()],
    };
    let nodes = names("x", 4);
    // Agent 3 behaves in round 1 and misbehaves in round 2: run it separately.
    let hs = spawn_agents(&addrs, &nodes, 2, &[(3, culprit)]);
    let mut ctl = control(c.local_addr());
    let r1 = ctl.trigger(CKPT, Some(LONG)).unwrap();
    assert_eq!((r1.epoch, r1.outcome.clone()), (1, Outcome::Committed));
    let started = Instant::now();
    let r2 = ctl.trigger(kind2, Some(LONG)).unwrap();
    assert_eq!(r2.epoch, 2);
    match &r2.outcome {
        Outcome::Aborted { node, reason, .. } => {
            assert!(
                node.contains("x03"),
                "abort names the failed node, got {node}: {reason}"
            );
            assert!(
                reason.contains(expect_reason),
                "reason {reason:?} lacks {expect_reason:?}"
            );
        }
        o => panic!("expected abort, got {o:?}"),
    }
    let all = join_all(hs);
    for evs in &all[..3] {
        assert_eq!(&evs[..5], &expected_checkpoint(1)[..]);
        match evs.last().unwrap() {
            Ev::Aborted(2, _, node) => assert!(node.contains("x03"), "{node}"),
            e => panic!("survivor saw {e:?} ({evs:?})"),
        }
    }
    let store = EpochStore::open(dir.path(), JOB).unwrap();
    assert_eq!(store.last_committed().unwrap().unwrap().epoch, 1);
    assert!(store.load(2).is_none());
    assert!(started.elapsed() < LONG);
}

#[test]
fn unix_agents_flat_checkpoint_then_restart() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("coord.sock");
    let c = root_unix(5, dir.path(), LONG, &sock);
    let m = std::fs::symlink_metadata(&sock).unwrap();
    assert!(m.file_type().is_socket());
    assert_eq!(m.mode() & 0o777, 0o600, "only our user may connect");
    let nodes = names("u", 5);
    // Four agents over the socket, one over TCP: the transports mix in one job.
    let addrs = [unix_addr(&sock)];
    let mut hs = spawn_agents(&addrs, &nodes[..4], 2, &[]);
    hs.extend(spawn_agents(&[c.local_addr()], &nodes[4..], 2, &[]));
    let mut ctl = control(unix_addr(&sock));
    assert_eq!(checkpoint_then_restart(&mut ctl, hs), 5);
    let m = last_record(dir.path());
    assert_eq!((m.epoch, m.nodes.len()), (1, 5));
    assert_eq!(m.nodes[2].image_dir, "/ckpt/u02/1");
    assert_eq!(ctl.status().unwrap().last_committed, Some(1));
    drop(ctl);
    c.kill().unwrap();
    assert!(
        std::fs::symlink_metadata(&sock).is_err(),
        "the socket file is removed on exit"
    );
}

#[test]
fn unix_agents_through_a_tree() {
    let dir = tempfile::tempdir().unwrap();
    let root_sock = dir.path().join("root.sock");
    let c = root_unix(6, dir.path(), LONG, &root_sock);
    let socks: Vec<_> = (0..2)
        .map(|i| dir.path().join(format!("sub{i}.sock")))
        .collect();
    // Relay 0 is on the root's node and reaches it over the root's socket too.
    let parents = [unix_addr(&root_sock), c.local_addr().to_string()];
    let _subs: Vec<CoordHandle> = socks
        .iter()
        .enumerate()
        .map(|(i, p)| sub_on(&parents[i], &format!("sub{i}"), 3, Some(p)))
        .collect();
    let addrs: Vec<String> = socks.iter().map(|p| unix_addr(p)).collect();
    let nodes = names("v", 6);
    let hs = spawn_agents_ahead(&addrs, &nodes, 3, |i| i != 1);
    checkpoint_restart_checkpoint(&mut control(c.local_addr()), hs, dir.path(), 6);
}

#[test]
fn unix_abort_when_agent_reports_failure() {
    abort_case_over(
        false,
        true,
        CKPT,
        Behavior::FailIn(Phase::Dump),
        LONG,
        "simulated failure",
    );
}

#[test]
fn unix_tree_abort_when_agent_dies_during_freeze() {
    abort_case_over(
        true,
        true,
        CKPT,
        Behavior::DieIn(Phase::Freeze),
        LONG,
        "disconnected",
    );
}

#[test]
fn unix_wrong_secret_is_refused_and_a_live_socket_is_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("coord.sock");
    let c = root_unix(1, dir.path(), LONG, &sock);
    let addr = unix_addr(&sock);
    let bad = Agent::connect(
        &addr,
        JOB,
        Secret::from_bytes(b"not the secret"),
        "intruder",
    );
    assert!(
        matches!(bad, Err(ClientError::ServerAuth { .. })),
        "wrong secret over the socket: {bad:?}"
    );
    // A client that skips the server check is refused by the coordinator.
    let mut raw = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    raw.set_read_timeout(Some(LONG)).unwrap();
    let refused = forged_auth_refusal(&mut raw, ckpt_coord::protocol::Role::Agent, 1);
    assert_eq!(refused.as_deref(), Some("authentication failed"));
    let mut ctl = control(&addr);
    let st = ctl.status().unwrap();
    assert_eq!(st.registered, 0, "nobody got in");
    assert!(st.refused >= 2, "both refusals counted: {st:?}");
    assert!(
        c.log_lines()
            .iter()
            .any(|l| l.contains("unix peer pid") && l.contains("authentication failed")),
        "the refusal names the local peer: {:?}",
        c.log_lines()
    );
    // A second coordinator on the same path is refused while this one runs.
    let mut cfg = CoordConfig::new("127.0.0.1:0".parse().unwrap(), JOB, 1, secret());
    cfg.state_dir = Some(dir.path().to_path_buf());
    cfg.emit_log = false;
    cfg.listen_unix = Some(sock.clone());
    let err = ckpt_coord::spawn(cfg).unwrap_err().to_string();
    assert!(err.contains("in use"), "{err}");
    // The real agent still gets in.
    let hs = spawn_agents(&[addr.as_str()], &names("w", 1), 1, &[]);
    assert_eq!(
        ctl.trigger(CKPT, Some(LONG)).unwrap().outcome,
        Outcome::Committed
    );
    assert_eq!(join_all(hs), vec![expected_checkpoint(1)]);
}

#[test]
fn abort_when_agent_dies_during_freeze() {
    abort_case(false, Behavior::DieIn(Phase::Freeze), LONG, "disconnected");
}

#[test]
fn abort_when_agent_dies_during_dump() {
    abort_case(false, Behavior::DieIn(Phase::Dump), LONG, "disconnected");
}

#[test]
fn abort_when_agent_reports_failure() {
    abort_case(
        false,
        Behavior::FailIn(Phase::Drain),
        LONG,
        "simulated failure",
    );
}

#[test]
fn abort_when_phase_deadline_missed() {
    abort_case(
        false,
        Behavior::StallIn(Phase::Dump),
        Duration::from_millis(2500),
        "deadline",
    );
}

#[test]
fn tree_abort_when_agent_dies_during_freeze() {
    abort_case(true, Behavior::DieIn(Phase::Freeze), LONG, "disconnected");
}

#[test]
fn tree_abort_when_phase_deadline_missed() {
    abort_case(
        true,
        Behavior::StallIn(Phase::Drain),
        Duration::from_millis(2500),
        "deadline",
    );
}

#[test]
fn coordinator_killed_after_dump_never_half_commits() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = names("k", 3);
    // Epoch 1 commits normally.
    let c = root(3, dir.path(), LONG, None);
    let hs = spawn_agents(&[c.local_addr()], &nodes, 1, &[]);
    assert_eq!(
        control(c.local_addr())
            .trigger(CKPT, Some(LONG))
            .unwrap()
            .outcome,
        Outcome::Committed
    );
    join_all(hs);
    c.kill().unwrap();
    // Epoch 2: the coordinator dies once every DUMP is in, before the commit record.
    let c = root(3, dir.path(), LONG, Some(FaultPoint::CrashAfterDump));
    let hs = spawn_agents(&[c.local_addr()], &nodes, 1, &[]);
    let mut ctl = control(c.local_addr());
    let err = ctl.trigger(CKPT, Some(LONG)).unwrap_err();
    assert!(matches!(err, ClientError::CoordinatorLost { .. }), "{err}");
    for evs in join_all(hs) {
        assert_eq!(evs.last(), Some(&Ev::Lost), "{evs:?}");
        assert!(!evs.contains(&Ev::Enter(2, Phase::Commit)));
    }
    c.join().unwrap();
    let store = EpochStore::open(dir.path(), JOB).unwrap();
    assert_eq!(store.last_committed().unwrap().unwrap().epoch, 1);
    assert!(store.load(2).is_none());
    // Restarted coordinator: epoch 1 is still the valid one, 2 is never reused.
    let c = root(3, dir.path(), LONG, None);
    let a = Agent::connect(&c.local_addr().to_string(), JOB, secret(), "probe").unwrap();
    assert_eq!(a.last_committed(), Some(1));
    drop(a);
    let hs = spawn_agents(&[c.local_addr()], &nodes, 1, &[]);
    let r = control(c.local_addr()).trigger(CKPT, Some(LONG)).unwrap();
    assert_eq!((r.epoch, r.outcome), (3, Outcome::Committed));
    join_all(hs);
}

#[test]
fn wrong_secret_is_refused_and_logged() {
    let dir = tempfile::tempdir().unwrap();
    let c = root(2, dir.path(), LONG, None);
    let addr = c.local_addr().to_string();
    let bad = Agent::connect(
        &addr,
        JOB,
        Secret::from_bytes(b"not the secret"),
        "intruder",
    );
    assert!(
        matches!(bad, Err(ClientError::ServerAuth { .. })),
        "a client with the wrong secret cannot even verify the coordinator: {bad:?}"
    );
    // A client that skips the server check still gets refused by the coordinator.
    let mut raw = TcpStream::connect(c.local_addr()).unwrap();
    raw.set_read_timeout(Some(LONG)).unwrap();
    let refused = forged_auth_refusal(&mut raw, ckpt_coord::protocol::Role::Control, 0);
    assert!(refused.is_some());
    // Wrong job.
    let other = Agent::connect(&addr, "otherjob", secret(), "n");
    assert!(other.is_err());
    // A rogue coordinator with another secret is detected by a genuine agent.
    let rogue_dir = tempfile::tempdir().unwrap();
    let mut cfg = CoordConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        JOB,
        1,
        Secret::from_bytes(b"rogue"),
    );
    cfg.state_dir = Some(rogue_dir.path().to_path_buf());
    cfg.emit_log = false;
    let rogue = ckpt_coord::spawn(cfg).unwrap();
    let fooled = Agent::connect(&rogue.local_addr().to_string(), JOB, secret(), "n");
    assert!(matches!(fooled, Err(ClientError::ServerAuth { .. })));
    // The real job is unaffected.
    let nodes = names("s", 2);
    let hs = spawn_agents(&[c.local_addr()], &nodes, 1, &[]);
    let mut ctl = control(c.local_addr());
    assert_eq!(
        ctl.trigger(CKPT, Some(LONG)).unwrap().outcome,
        Outcome::Committed
    );
    join_all(hs);
    assert!(ctl.status().unwrap().refused >= 2);
    let logs = c.log_lines().join("\n");
    assert!(logs.contains("authentication failed"), "{logs}");
}

#[test]
fn garbage_on_the_socket_closes_only_that_connection() {
    let dir = tempfile::tempdir().unwrap();
    let c = root(3, dir.path(), LONG, None);
    let nodes = names("g", 3);
    let hs = spawn_agents(&[c.local_addr()], &nodes, 1, &[]);
    let mut garbage: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        vec![0xff; 5000],
        // Valid magic and version, absurd length.
        [
            &b"CKCO"[..],
            &ckpt_coord::protocol::VERSION_MAX.to_le_bytes(),
            &1u16.to_le_bytes(),
            &u32::MAX.to_le_bytes(),
        ]
        .concat(),
        // Valid header, payload that is not a Hello.
        [
            &b"CKCO"[..],
            &ckpt_coord::protocol::VERSION_MAX.to_le_bytes(),
            &1u16.to_le_bytes(),
            &4u32.to_le_bytes(),
            &[0xff; 4],
        ]
        .concat(),
    ];
    let mut x = 0x1234_5678_u32;
    garbage.push(
        (0..3000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect(),
    );
    for g in &garbage {
        let mut s = TcpStream::connect(c.local_addr()).unwrap();
        let _ = s.write_all(g);
        s.set_read_timeout(Some(LONG)).unwrap();
        let mut sink = Vec::new();
        // The coordinator hangs up on us (EOF or reset), and only on us.
        let _ = s.read_to_end(&mut sink);
    }
    let mut ctl = control(c.local_addr());
    assert_eq!(
        ctl.trigger(CKPT, Some(LONG)).unwrap().outcome,
        Outcome::Committed
    );
    for evs in join_all(hs) {
        assert_eq!(evs, expected_checkpoint(1));
    }
    assert!(ctl.status().unwrap().refused >= garbage.len() as u64);
}

#[test]
fn get_of_a_key_that_never_comes_times_out_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let c = root(1, dir.path(), LONG, None);
    let s = sub(c.local_addr(), "sub0", 1);
    let mut a = Agent::connect(&s.local_addr().to_string(), JOB, secret(), "lonely").unwrap();
    a.put("present", b"yes").unwrap();
    assert_eq!(a.get("present", LONG).unwrap(), b"yes");
    let t = Instant::now();
    let err = a
        .get("never/published", Duration::from_millis(400))
        .unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(350));
    assert!(t.elapsed() < Duration::from_secs(10));
    match &err {
        ClientError::KeyTimeout { key, node, .. } => {
            assert_eq!(key, "never/published");
            assert_eq!(node, "lonely");
        }
        e => panic!("expected a key timeout, got {e}"),
    }
    assert!(err.to_string().contains("never/published"));
}

#[test]
fn sub_coordinator_killed_mid_round_aborts_everyone() {
    let dir = tempfile::tempdir().unwrap();
    let c = root(5, dir.path(), LONG, None);
    // sub0: r00, r02; sub1: r01, r03 and the staller r99.
    let mut subs: Vec<Option<CoordHandle>> = [2, 3]
        .iter()
        .enumerate()
        .map(|(i, n)| Some(sub(c.local_addr(), &format!("sub{i}"), *n)))
        .collect();
    let addrs: Vec<SocketAddr> = subs
        .iter()
        .map(|s| s.as_ref().unwrap().local_addr())
        .collect();
    let nodes = names("r", 4);
    // r99 (under sub1) stalls in FREEZE so the round is still open when sub0 dies.
    let sims = spawn_agents(&addrs, &nodes, 1, &[]);
    let stall = agent(
        addrs[1],
        Sim {
            node: "r99".into(),
            peers: nodes.clone(),
            behavior: Behavior::StallIn(Phase::Freeze),
            rounds: 1,
            intent: Intent::Standby,
            bad_epoch: 1,
            drain_ahead: false,
        },
    );
    let addr = c.local_addr();
    let trig = std::thread::spawn(move || control(addr).trigger(CKPT, Some(LONG)).unwrap());
    let mut ctl = control(c.local_addr());
    let t = Instant::now();
    loop {
        let s = ctl.status().unwrap();
        if s.running == Some((1, Phase::Freeze)) && t.elapsed() > Duration::from_millis(200) {
            break;
        }
        assert!(t.elapsed() < LONG, "round never started: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    subs[0].take().unwrap().kill().unwrap();
    let r = trig.join().unwrap();
    match &r.outcome {
        Outcome::Aborted { reason, .. } => {
            assert!(reason.contains("sub-coordinator sub0"), "{reason}")
        }
        o => panic!("expected an abort, got {o:?}"),
    }
    let mut all = join_all(sims);
    all.push(stall.join().unwrap());
    let lost = all.iter().filter(|e| e.last() == Some(&Ev::Lost)).count();
    let aborted = all
        .iter()
        .filter(|e| matches!(e.last(), Some(Ev::Aborted(1, Phase::Freeze, _))))
        .count();
    assert_eq!((lost, aborted), (2, 3), "{all:?}");
    assert!(
        EpochStore::open(dir.path(), JOB)
            .unwrap()
            .last_committed()
            .unwrap()
            .is_none()
    );
}

#[test]
fn an_agent_cannot_arrive_for_others() {
    use ckpt_coord::client::Link;
    use ckpt_coord::protocol::{Arrive, Message};
    let dir = tempfile::tempdir().unwrap();
    let c = root(3, dir.path(), LONG, None);
    let nodes = names("b", 2);
    let hs = spawn_agents(&[c.local_addr()], &nodes, 1, &[]);
    let addr = c.local_addr();
    let cheat = std::thread::spawn(move || {
        let mut l = Link::open(&AgentOptions::new(
            &addr.to_string(),
            JOB,
            secret(),
            "cheat",
        ))
        .unwrap();
        let Ok(Message::PhaseCmd(p)) = l.recv(Some(LONG), "freeze") else {
            panic!("no phase command");
        };
        l.send(&Message::Arrive(Arrive {
            epoch: p.epoch,
            phase: p.phase,
            count: 3,
            reports: Vec::new(),
        }))
        .unwrap();
        // The coordinator hangs up on the cheat.
        while l.recv(Some(LONG), "anything").is_ok() {}
    });
    let r = control(c.local_addr()).trigger(CKPT, Some(LONG)).unwrap();
    match r.outcome {
        Outcome::Aborted { node, phase, .. } => {
            assert_eq!((node.as_str(), phase), ("cheat", Phase::Freeze))
        }
        o => panic!("expected an abort, got {o:?}"),
    }
    cheat.join().unwrap();
    for evs in join_all(hs) {
        assert!(
            matches!(evs.last(), Some(Ev::Aborted(1, Phase::Freeze, n)) if n == "cheat"),
            "{evs:?}"
        );
    }
}

#[test]
fn tree_restart_aborts_when_agent_dies_during_publish() {
    abort_case_kind(
        true,
        RoundKind::Restart,
        Behavior::DieIn(Phase::Publish),
        LONG,
        "disconnected",
    );
}

#[test]
fn checkpoint_then_kill() {
    let dir = tempfile::tempdir().unwrap();
    let c = root(2, dir.path(), LONG, None);
    let hs = spawn_agents(&[c.local_addr()], &names("q", 2), 1, &[]);
    let kind = RoundKind::Checkpoint {
        then: AfterCommit::Kill,
    };
    let r = control(c.local_addr()).trigger(kind, Some(LONG)).unwrap();
    assert_eq!((r.epoch, r.outcome), (1, Outcome::Committed));
    let want: Vec<Ev> = [
        Phase::Freeze,
        Phase::Drain,
        Phase::Dump,
        Phase::Commit,
        Phase::Kill,
    ]
    .iter()
    .map(|p| Ev::Enter(1, *p))
    .collect();
    for evs in join_all(hs) {
        assert_eq!(evs, want);
    }
}

/// Runs one agent through a checkpoint round and a restart round; in PUBLISH it puts
/// `put` (key, value) pairs, in SUBSCRIBE it fetches `get` keys and returns their values.
fn big_value_agent(
    addr: String,
    node: &'static str,
    put: Vec<(String, Vec<u8>)>,
    get: Vec<String>,
) -> JoinHandle<Result<Vec<Vec<u8>>, String>> {
    std::thread::spawn(move || {
        let e = |e: ClientError| e.to_string();
        let mut a = Agent::connect(&addr, JOB, secret(), node).map_err(e)?;
        for p in [Phase::Freeze, Phase::Drain, Phase::Dump] {
            a.wait_phase(p).map_err(e)?;
            let info = match p {
                Phase::Dump => PhaseInfo::Dump {
                    image_dir: format!("/ckpt/{node}"),
                    manifest_crc32c: 1,
                },
                _ => PhaseInfo::None,
            };
            a.report_done(p, info).map_err(e)?;
        }
        a.wait_phase(Phase::Commit).map_err(e)?;
        a.wait_phase(Phase::Resume).map_err(e)?;
        a.report_done(Phase::Resume, PhaseInfo::None).map_err(e)?;
        a.wait_phase(Phase::Restore).map_err(e)?;
        a.report_done(Phase::Restore, PhaseInfo::None).map_err(e)?;
        a.wait_phase(Phase::Publish).map_err(e)?;
        // In several messages, each well under the frame limit.
        for chunk in put.chunks(16) {
            a.put_many(chunk.to_vec()).map_err(e)?;
        }
        a.report_done(Phase::Publish, PhaseInfo::None).map_err(e)?;
        a.wait_phase(Phase::Subscribe).map_err(e)?;
        let keys: Vec<&str> = get.iter().map(String::as_str).collect();
        let got = a.get_many(&keys, LONG).map_err(e)?;
        a.report_done(Phase::Subscribe, PhaseInfo::None)
            .map_err(e)?;
        a.wait_phase(Phase::Resume).map_err(e)?;
        a.report_done(Phase::Resume, PhaseInfo::None).map_err(e)?;
        Ok(got)
    })
}

#[test]
fn answers_larger_than_the_socket_buffer_arrive_whole_over_unix_and_tcp() {
    // 4 MiB of values to one agent: far more than a socket buffer holds, so the
    // coordinator's writes hit a full socket and it must wait for room (it only asks for
    // writability then) and carry on, over both transports.
    const KEYS: usize = 64;
    const VALUE_LEN: usize = 64 << 10;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("coord.sock");
    let c = root_unix(2, dir.path(), LONG, &sock);
    let pairs: Vec<(String, Vec<u8>)> = (0..KEYS)
        .map(|i| {
            let v = (0..VALUE_LEN).map(|j| (i * 31 + j * 7) as u8).collect();
            (format!("big/{i}"), v)
        })
        .collect();
    let keys: Vec<String> = pairs.iter().map(|(k, _)| k.clone()).collect();
    let via_unix = big_value_agent(unix_addr(&sock), "bu", pairs.clone(), keys.clone());
    let via_tcp = big_value_agent(c.local_addr().to_string(), "bt", Vec::new(), keys);
    let mut ctl = control(c.local_addr());
    assert_eq!(
        ctl.trigger(CKPT, Some(LONG)).unwrap().outcome,
        Outcome::Committed
    );
    assert_eq!(
        ctl.trigger(RoundKind::Restart, Some(LONG)).unwrap().outcome,
        Outcome::Restarted
    );
    let want: Vec<Vec<u8>> = pairs.into_iter().map(|(_, v)| v).collect();
    assert!(
        via_unix.join().unwrap().unwrap() == want,
        "values over unix"
    );
    assert!(via_tcp.join().unwrap().unwrap() == want, "values over tcp");
}

/// The epoch store's writes run off the poll loop: while the commit record cannot be
/// written (its temp file is a FIFO nobody reads, so creating it blocks), the loop still
/// answers handshakes, and the agent hears nothing about the epoch until the write is
/// over; a write that then fails (a FIFO cannot be fsynced) aborts the epoch in COMMIT.
#[test]
fn a_blocked_commit_write_leaves_the_loop_serving() {
    let dir = tempfile::tempdir().unwrap();
    let job_dir = dir.path().join(JOB);
    std::fs::create_dir_all(&job_dir).unwrap();
    let fifo = job_dir.join(format!(".epoch-{:016}.json.tmp", 1));
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let c = root(1, dir.path(), LONG, None);
    let addr = c.local_addr().to_string();
    let opts = AgentOptions::new(&addr, JOB, secret(), "n1").intent(Intent::Checkpoint);
    let mut a = Agent::connect_with(&opts).unwrap();
    loop {
        let Directive::Phase(step) = a.next_directive(Some(LONG)).unwrap() else {
            panic!("aborted before DUMP");
        };
        let info = match step.phase {
            Phase::Dump => PhaseInfo::Dump {
                image_dir: "/images/n1".into(),
                manifest_crc32c: 1,
            },
            _ => PhaseInfo::None,
        };
        a.report_done(step.phase, info).unwrap();
        if step.phase == Phase::Dump {
            break;
        }
    }
    // The commit is on its way to the writer, which blocks in opening the FIFO.
    std::thread::sleep(Duration::from_millis(200));
    let mut raw = TcpStream::connect(c.local_addr()).unwrap();
    raw.set_read_timeout(Some(LONG)).unwrap();
    let refused = forged_auth_refusal(&mut raw, ckpt_coord::protocol::Role::Control, 0);
    assert_eq!(refused.as_deref(), Some("authentication failed"));
    // No COMMIT (nor anything else) before the write is over.
    let quiet = a.next_directive(Some(Duration::from_millis(300)));
    assert!(
        matches!(quiet, Err(ClientError::Timeout { .. })),
        "{quiet:?}"
    );
    let reader = std::thread::spawn(move || {
        let mut f = std::fs::File::open(&fifo).unwrap();
        let mut record = Vec::new();
        f.read_to_end(&mut record).unwrap();
        record
    });
    match a.next_directive(Some(LONG)).unwrap() {
        Directive::Abort { epoch, phase, .. } => assert_eq!((epoch, phase), (1, Phase::Commit)),
        Directive::Phase(step) => panic!("the epoch went on to {}", step.phase),
    }
    assert!(!reader.join().unwrap().is_empty());
    let logs = c.log_lines().join("\n");
    let refusal = logs.find("authentication failed").unwrap();
    let abort = logs.find("ABORTED in COMMIT").unwrap();
    assert!(refusal < abort, "{logs}");
    assert!(EpochStore::open(dir.path(), JOB).unwrap().load(1).is_none());
}

/// Background rounds through a two-level tree: every agent sees FREEZE, DRAIN, CAPTURE
/// (the barrier before anyone thaws), DUMP, COMMIT and RESUME; a second round, in which
/// one agent fails in DUMP (after the thaw), aborts everywhere and epoch 1 stays the
/// last committed.
#[test]
fn background_rounds_through_a_tree() {
    const BACKGROUND: RoundKind = RoundKind::BackgroundCheckpoint;
    let dir = tempfile::tempdir().unwrap();
    let c = root(4, dir.path(), LONG, None);
    let subs: Vec<CoordHandle> = (0..2)
        .map(|i| sub(c.local_addr(), &format!("sub{i}"), 2))
        .collect();
    let addrs: Vec<SocketAddr> = subs.iter().map(|s| s.local_addr()).collect();
    let nodes = names("b", 4);
    let hs = spawn_agents(&addrs, &nodes, 2, &[(1, Behavior::FailIn(Phase::Dump))]);
    let mut ctl = control(c.local_addr());
    let r1 = ctl.trigger(BACKGROUND, Some(LONG)).unwrap();
    assert_eq!(
        (r1.epoch, r1.kind, r1.outcome),
        (1, BACKGROUND, Outcome::Committed)
    );
    let r2 = ctl.trigger(BACKGROUND, Some(LONG)).unwrap();
    match r2.outcome {
        Outcome::Aborted { phase, node, .. } => {
            assert_eq!((r2.epoch, phase, node.as_str()), (2, Phase::Dump, "b01"))
        }
        o => panic!("{o:?}"),
    }
    let enter = |epoch: u64, phases: &[Phase]| -> Vec<Ev> {
        phases.iter().map(|p| Ev::Enter(epoch, *p)).collect()
    };
    let mut want = enter(1, BACKGROUND.phases());
    want.extend(enter(
        2,
        &[Phase::Freeze, Phase::Drain, Phase::Capture, Phase::Dump],
    ));
    want.push(Ev::Aborted(2, Phase::Dump, "b01".into()));
    for evs in join_all(hs) {
        assert_eq!(evs, want);
    }
    assert_eq!(last_record(dir.path()).epoch, 1);
}
