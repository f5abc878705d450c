//! Coordinated checkpoint and restart of a multi-node job: `ckpt dump
//! --coord` and `ckpt restore --coord` as the agents of a `ckpt coord`
//! started here (127.0.0.1, a free port, a temporary state dir, `--expect
//! 2`). Each "node" is one agent on this host with its own victim tree
//! (tests/c/counter.c, tests/c/unsupported.c) and its own checkpoint root.
//!
//! What a user relies on: every node's images are committed as one epoch
//! (`epoch-E.json` naming each node's image dir and manifest checksum) and
//! restored together; any failure (a tree that cannot be dumped, an agent
//! killed, the coordinator killed, a wrong secret) leaves every tree running
//! unharmed, no `epoch-E` directory on any node, and the previous epoch the
//! valid one.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use ckpt_coord::{EpochStore, GlobalManifest};

const JOB: &str = "job7";
/// An agent waits at most this long for the whole round.
const ROUND_TIMEOUT: Duration = Duration::from_secs(60);

/// A `ckpt coord` for [`JOB`] expecting two nodes.
struct Coord {
    cmd: Option<CkptCmd>,
    addr: String,
    state: PathBuf,
    secret: PathBuf,
}

impl Coord {
    fn start(env: &TestEnv) -> Coord {
        Coord::start_with(env, None)
    }

    /// A coordinator that also listens on the Unix socket `sock`; agents and
    /// control clients reach it there (`unix:PATH`).
    fn start_unix(env: &TestEnv, sock: &Path) -> Coord {
        let mut c = Coord::start_with(env, Some(sock));
        c.addr = format!("unix:{}", sock.display());
        assert!(
            wait_for_file(sock, READY_TIMEOUT),
            "coordinator did not create its socket: {}",
            c.cmd.as_ref().map(|c| c.stderr_now()).unwrap_or_default()
        );
        c
    }

    fn start_with(env: &TestEnv, sock: Option<&Path>) -> Coord {
        // A port nobody listens on now; the coordinator binds it at once.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let state = env.root.join("coord-state");
        let mut args = vec![
            "coord",
            "--listen",
            &addr,
            "--job",
            JOB,
            "--expect",
            "2",
            "--state-dir",
            path_str(&state),
        ];
        if let Some(sock) = sock {
            args.extend(["--listen-unix", path_str(sock)]);
        }
        let cmd = CkptCmd::spawn(env, &args);
        let secret = state.join(format!("{JOB}.secret"));
        assert!(
            wait_for_file(&secret, READY_TIMEOUT),
            "coordinator did not create its secret: {}",
            cmd.stderr_now()
        );
        Coord {
            cmd: Some(cmd),
            addr,
            state,
            secret,
        }
    }

    /// The committed, intact global manifest of `epoch`, if any.
    fn record(&self, epoch: u64) -> Option<GlobalManifest> {
        EpochStore::open(&self.state, JOB)
            .expect("open the coordinator's epoch store")
            .load(epoch)
    }

    /// Whether the coordinator noted `epoch` as aborted.
    fn aborted_record(&self, epoch: u64) -> bool {
        self.state
            .join(JOB)
            .join(format!("epoch-{epoch:016}.aborted.json"))
            .exists()
    }

    /// `ckpt coord status` output.
    fn status(&self, env: &TestEnv) -> String {
        let out = ckpt(
            env,
            &[
                "coord",
                "status",
                "--connect",
                &self.addr,
                "--job",
                JOB,
                "--secret-file",
                path_str(&self.secret),
            ],
            FAIL_TIMEOUT,
        );
        out.assert_success();
        out.stdout
    }

    /// SIGKILLs the coordinator.
    fn kill(&mut self) {
        drop(self.cmd.take());
    }
}

/// One node: its own scratch space (victim work dir, checkpoint root `img`).
struct Node {
    name: &'static str,
    env: TestEnv,
}

impl Node {
    fn new(test: &str, name: &'static str) -> Node {
        Node {
            name,
            env: TestEnv::new(&format!("{test}-{name}")),
        }
    }

    fn epoch_dir(&self, epoch: u64) -> PathBuf {
        self.env.img.join(format!("epoch-{epoch}"))
    }

    fn coord_args<'a>(&'a self, c: &'a Coord) -> Vec<&'a str> {
        vec![
            "--coord",
            &c.addr,
            "--job",
            JOB,
            "--node",
            self.name,
            "--secret-file",
            path_str(&c.secret),
        ]
    }

    /// `ckpt dump --coord` of `v`'s tree into this node's root.
    fn dump(&self, c: &Coord, v: &Victim, extra: &[&str], vars: &[(&str, &Path)]) -> CkptCmd {
        let pid = v.pid.to_string();
        let mut args = vec!["dump", "--tree", &pid, "--dir", path_str(&self.env.img)];
        args.extend(self.coord_args(c));
        args.extend_from_slice(extra);
        CkptCmd::spawn_with_env(&self.env, &args, vars)
    }

    /// `ckpt restore --coord` from this node's root.
    fn restore(&self, c: &Coord) -> CkptCmd {
        let mut args = vec!["restore", "--dir", path_str(&self.env.img)];
        args.extend(self.coord_args(c));
        CkptCmd::spawn(&self.env, &args)
    }

    /// Nothing named `epoch-E` in this node's root.
    fn assert_no_epoch(&self, epoch: u64, context: &str) {
        let d = self.epoch_dir(epoch);
        assert!(
            !d.exists(),
            "{context}: node {} kept {} of an epoch that did not commit",
            self.name,
            d.display()
        );
    }
}

/// The agent failed with one error line naming the epoch, the failing node
/// and `reason`.
fn assert_aborted(out: &CkptOutput, epoch: u64, node: &str, reason: &str) -> String {
    let err = out.assert_error();
    for want in [
        format!("epoch {epoch}"),
        format!("node {node}"),
        reason.to_string(),
    ] {
        assert!(err.contains(&want), "error should name `{want}`: {err}");
    }
    err
}

/// The original victim is no longer traced (its dumper died) and passes.
fn assert_thawed_and_passes(v: &mut Victim, context: &str) {
    assert!(
        wait_until(Duration::from_secs(5), || tracer_pid(v.pid) == Some(0)),
        "{context}: victim pid {} still traced",
        v.pid
    );
    v.assert_unharmed_and_passes(context);
}

/// Two nodes dump with --kill as one epoch, then restart together from it.
/// A counting victim on each of two nodes, both ready.
fn counters(a: &Node, b: &Node) -> (Victim, Victim) {
    let mut va = Victim::spawn(&a.env, "counter", &[]);
    let mut vb = Victim::spawn(&b.env, "counter", &[]);
    va.wait_ready();
    vb.wait_ready();
    (va, vb)
}

#[test]
fn two_nodes_checkpoint_kill_and_restart() {
    let a = Node::new("coord-cycle", "a");
    let b = Node::new("coord-cycle", "b");
    let coord = Coord::start(&a.env);
    let (mut va, mut vb) = counters(&a, &b);

    let da = a.dump(&coord, &va, &["--kill"], &[]);
    let db = b.dump(&coord, &vb, &["--kill"], &[]);
    let oa = da.wait_with(ROUND_TIMEOUT, || va.diag());
    let ob = db.wait_with(ROUND_TIMEOUT, || vb.diag());
    oa.assert_success();
    ob.assert_success();
    assert!(
        oa.stderr.contains("epoch 1 committed, killed"),
        "{}",
        oa.stderr
    );
    va.reap_killed(Duration::from_secs(10));
    vb.reap_killed(Duration::from_secs(10));

    // One global record naming both nodes' image dirs and manifest sums.
    let rec = coord.record(1).expect("epoch 1 committed");
    assert_eq!((rec.job.as_str(), rec.epoch), (JOB, 1));
    assert_eq!(rec.nodes.len(), 2, "{rec:?}");
    for (n, v) in [(&a, &va), (&b, &vb)] {
        let entry = rec
            .nodes
            .iter()
            .find(|e| e.node == n.name)
            .unwrap_or_else(|| panic!("node {} missing from {rec:?}", n.name));
        let dir = n.epoch_dir(1);
        assert_eq!(entry.image_dir, path_str(&dir), "{rec:?}");
        assert_images(&dir, v.pid);
        let manifest = fs::read(dir.join("manifest.img")).expect("manifest.img");
        assert_eq!(
            entry.manifest_crc32c,
            crc32c::crc32c(&manifest),
            "node {}: recorded manifest checksum",
            n.name
        );
    }
    assert!(coord.status(&a.env).contains("last committed epoch 1"));

    // Restart both from epoch 1; each victim checks itself from inside.
    va.clear_protocol_files();
    vb.clear_protocol_files();
    let ra = a.restore(&coord);
    let rb = b.restore(&coord);
    va.go();
    vb.go();
    finish_restore(&va, ra);
    finish_restore(&vb, rb);
}

/// Two agents reach the coordinator over its Unix socket (`ckpt coord
/// --listen-unix`, `ckpt dump --coord unix:PATH`): one committed epoch
/// naming both nodes, status over the socket, the socket private to root,
/// and removed when the coordinator is stopped.
#[test]
fn two_nodes_checkpoint_over_the_unix_socket() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let a = Node::new("coord-unix", "a");
    let b = Node::new("coord-unix", "b");
    let run = a.env.root.join("run");
    fs::create_dir(&run).expect("socket dir");
    fs::set_permissions(&run, fs::Permissions::from_mode(0o700)).expect("chmod socket dir");
    let sock = run.join("coord.sock");
    let mut coord = Coord::start_unix(&a.env, &sock);
    let meta = fs::symlink_metadata(&sock).expect("socket file");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let (mut va, mut vb) = counters(&a, &b);

    let da = a.dump(&coord, &va, &[], &[]);
    let db = b.dump(&coord, &vb, &[], &[]);
    let oa = da.wait_with(ROUND_TIMEOUT, || va.diag());
    let ob = db.wait_with(ROUND_TIMEOUT, || vb.diag());
    oa.assert_success();
    ob.assert_success();
    let rec = coord.record(1).expect("epoch 1 committed");
    let mut names: Vec<&str> = rec.nodes.iter().map(|n| n.node.as_str()).collect();
    names.sort();
    assert_eq!(names, ["a", "b"], "{rec:?}");
    for (n, v) in [(&a, &va), (&b, &vb)] {
        let dir = n.epoch_dir(1);
        assert_images(&dir, v.pid);
        let entry = rec.nodes.iter().find(|e| e.node == n.name).expect("entry");
        let manifest = fs::read(dir.join("manifest.img")).expect("manifest.img");
        assert_eq!(entry.manifest_crc32c, crc32c::crc32c(&manifest));
    }
    assert!(coord.status(&a.env).contains("last committed epoch 1"));
    assert_thawed_and_passes(&mut va, "after the dump over the socket");
    assert_thawed_and_passes(&mut vb, "after the dump over the socket");

    // SIGTERM: the coordinator stops and removes its socket file.
    let mut cmd = coord.cmd.take().expect("coordinator");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(cmd.pid()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM the coordinator");
    assert!(
        wait_until(Duration::from_secs(10), || cmd.try_status().is_some()),
        "coordinator did not stop on SIGTERM: {}",
        cmd.stderr_now()
    );
    assert!(
        fs::symlink_metadata(&sock).is_err(),
        "socket file left behind: {}",
        cmd.stderr_now()
    );
}

/// A tree that cannot be dumped aborts the epoch on every node: the other
/// node's tree goes on unharmed, no node keeps `epoch-2`, and epoch 1 stays
/// the valid checkpoint.
#[test]
fn undumpable_tree_aborts_the_epoch_everywhere() {
    let a = Node::new("coord-abort", "a");
    let b = Node::new("coord-abort", "b");
    let coord = Coord::start(&a.env);
    let (mut va, mut vb) = counters(&a, &b);

    // Epoch 1: both trees dumped and left running.
    let da = a.dump(&coord, &va, &[], &[]);
    let db = b.dump(&coord, &vb, &[], &[]);
    da.wait_with(ROUND_TIMEOUT, || va.diag()).assert_success();
    db.wait_with(ROUND_TIMEOUT, || vb.diag()).assert_success();
    assert!(coord.record(1).is_some(), "epoch 1 not committed");

    // Epoch 2: node b now checkpoints a tree holding a netlink socket.
    let ub = Node::new("coord-abort", "b-unsupported");
    let mut vu = Victim::spawn(&ub.env, "unsupported", &[]);
    vu.wait_ready();
    let da = a.dump(&coord, &va, &["--kill"], &[]);
    let db = b.dump(&coord, &vu, &["--kill"], &[]);
    let oa = da.wait_with(ROUND_TIMEOUT, || va.diag());
    let ob = db.wait_with(ROUND_TIMEOUT, || vu.diag());
    let ea = assert_aborted(&oa, 2, "b", "netlink socket");
    assert!(
        ea.contains("fd 42"),
        "the abort should carry b's reason: {ea}"
    );
    let eb = assert_aborted(&ob, 2, "b", "netlink socket");
    assert!(eb.contains(&vu.pid.to_string()), "{eb}");

    a.assert_no_epoch(2, "after the abort");
    b.assert_no_epoch(2, "after the abort");
    assert!(a.epoch_dir(1).is_dir() && b.epoch_dir(1).is_dir());
    assert!(coord.record(2).is_none(), "aborted epoch 2 committed");
    assert!(coord.aborted_record(2), "no epoch-2.aborted.json");
    assert!(coord.status(&a.env).contains("last committed epoch 1"));

    // Neither --kill took effect: every tree runs and passes its checks.
    va.assert_unharmed_and_passes("node a after epoch 2 aborted");
    vu.assert_unharmed_and_passes("node b's undumpable tree");
    vb.assert_unharmed_and_passes("node b's epoch 1 tree");
}

/// Agent a is SIGKILLed at the fault point `point` (paused there) while it
/// holds its tree frozen in `phase`: the epoch aborts naming it, node b
/// thaws its tree, both trees run on, no node has `epoch-1`.
fn agent_killed_at(point: &str, phase: &str) {
    let test = format!("coord-agent-killed-{phase}");
    let a = Node::new(&test, "a");
    let b = Node::new(&test, "b");
    let coord = Coord::start(&a.env);
    let (mut va, mut vb) = counters(&a, &b);

    let gate = a.env.root.join("gate");
    let reached = a.env.root.join("gate.reached");
    let pause = format!("pause:{point}");
    let fault = [
        ("CKPT_FAULT", Path::new(&pause)),
        ("CKPT_FAULT_GATE", gate.as_path()),
    ];
    let mut da = a.dump(&coord, &va, &["--kill"], &fault);
    let db = b.dump(&coord, &vb, &["--kill"], &[]);
    assert!(
        wait_for_file(&reached, ROUND_TIMEOUT),
        "agent a never reached {point}: {}",
        da.stderr_now()
    );
    assert_eq!(tracer_pid(va.pid), Some(da.pid()), "a's tree is frozen");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(da.pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill agent a");
    let ob = db.wait_with(ROUND_TIMEOUT, || vb.diag());
    let eb = assert_aborted(&ob, 1, "a", phase);
    assert!(eb.contains(&format!("aborted in {phase}")), "{eb}");
    let _ = da.try_status();

    // A killed agent cleans nothing up: at most the engine's temporary
    // directory is left, never `epoch-1` itself.
    a.assert_no_epoch(1, "agent a killed");
    b.assert_no_epoch(1, "agent a killed");
    assert!(
        coord.record(1).is_none(),
        "epoch 1 committed without node a"
    );
    assert_thawed_and_passes(&mut va, "node a's tree, its agent killed");
    assert_thawed_and_passes(&mut vb, "node b's tree");
}

#[test]
fn agent_killed_in_freeze_aborts_the_epoch() {
    agent_killed_at("after-seize", "FREEZE");
}

#[test]
fn agent_killed_in_dump_aborts_the_epoch() {
    agent_killed_at("before-commit", "DUMP");
}

/// The coordinator SIGKILLed while the nodes are in DUMP: both agents exit
/// non-zero, drop their images and thaw their trees.
#[test]
fn coordinator_killed_mid_epoch() {
    let a = Node::new("coord-lost", "a");
    let b = Node::new("coord-lost", "b");
    let mut coord = Coord::start(&a.env);
    let (mut va, mut vb) = counters(&a, &b);

    let gate = a.env.root.join("gate");
    let reached = a.env.root.join("gate.reached");
    let fault = [
        ("CKPT_FAULT", Path::new("pause:before-commit")),
        ("CKPT_FAULT_GATE", gate.as_path()),
    ];
    let da = a.dump(&coord, &va, &["--kill"], &fault);
    let db = b.dump(&coord, &vb, &["--kill"], &[]);
    assert!(
        wait_for_file(&reached, ROUND_TIMEOUT),
        "agent a never reached DUMP: {}",
        da.stderr_now()
    );
    coord.kill();
    write_atomic(&gate, "go");
    let oa = da.wait_with(ROUND_TIMEOUT, || va.diag());
    let ob = db.wait_with(ROUND_TIMEOUT, || vb.diag());
    for (o, n) in [(&oa, "a"), (&ob, "b")] {
        let err = o.assert_error();
        for want in [format!("node {n}"), "epoch 1".into(), "coordinator".into()] {
            assert!(err.contains(&want), "error should name `{want}`: {err}");
        }
    }
    a.assert_no_epoch(1, "coordinator killed");
    b.assert_no_epoch(1, "coordinator killed");
    assert!(coord.record(1).is_none());
    assert_thawed_and_passes(&mut va, "node a's tree, coordinator killed");
    assert_thawed_and_passes(&mut vb, "node b's tree, coordinator killed");
}

/// An agent with the wrong job secret is refused before anything touches
/// its tree.
#[test]
fn wrong_secret_is_refused() {
    let a = Node::new("coord-secret", "a");
    let coord = Coord::start(&a.env);
    let mut va = Victim::spawn(&a.env, "counter", &[]);
    va.wait_ready();
    let wrong = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let out = a
        .dump(
            &coord,
            &va,
            &["--kill"],
            &[("CKPT_COORD_SECRET", Path::new(wrong))],
        )
        .wait_with(FAIL_TIMEOUT, || va.diag());
    // The coordinator's proof fails with our secret, so the agent gives up
    // (and answers anyway, so the coordinator refuses and counts it).
    let err = out.assert_error();
    assert!(
        err.contains("node a") && err.contains("job7's secret"),
        "error should say node a and the coordinator do not share the secret: {err}"
    );
    a.assert_no_epoch(1, "refused agent");
    assert!(
        wait_until(Duration::from_secs(5), || coord
            .status(&a.env)
            .contains("1 connections refused")),
        "the coordinator did not refuse the agent: {}",
        coord.status(&a.env)
    );
    assert!(coord.status(&a.env).contains("registered     0/2"));
    va.assert_unharmed_and_passes("refused agent's tree");
}

/// A restart in which one node lacks its part of the committed epoch: that
/// node refuses, the round aborts, and the other node's tree never runs
/// (rebuilt and held stopped when the abort comes, then killed).
#[test]
fn restart_without_a_nodes_images_aborts_and_kills_the_rebuilt_tree() {
    let a = Node::new("coord-restart-abort", "a");
    let b = Node::new("coord-restart-abort", "b");
    let coord = Coord::start(&a.env);
    let (mut va, mut vb) = counters(&a, &b);
    let da = a.dump(&coord, &va, &["--kill"], &[]);
    let db = b.dump(&coord, &vb, &["--kill"], &[]);
    da.wait_with(ROUND_TIMEOUT, || va.diag()).assert_success();
    db.wait_with(ROUND_TIMEOUT, || vb.diag()).assert_success();
    va.reap_killed(Duration::from_secs(10));
    vb.reap_killed(Duration::from_secs(10));

    // Node b lost its images.
    fs::remove_dir_all(b.epoch_dir(1)).expect("remove b's images");
    va.clear_protocol_files();
    let ra = a.restore(&coord);
    let rb = b.restore(&coord);
    let ob = rb.wait(ROUND_TIMEOUT);
    let oa = ra.wait(ROUND_TIMEOUT);
    let eb = assert_aborted(
        &ob,
        2,
        "b",
        "epoch 1 (the last committed) is not on this node",
    );
    assert!(eb.contains(path_str(&b.epoch_dir(1))), "{eb}");
    assert_aborted(&oa, 2, "b", "RESTORE");
    assert!(
        wait_until(Duration::from_secs(5), || victim_gone(
            va.pid, &va.bin, &va.work
        )),
        "node a's rebuilt tree (pid {}) survived the abort",
        va.pid
    );
    assert!(va.result().is_none(), "node a's tree ran: {}", va.diag());
    assert!(coord.status(&a.env).contains("last committed epoch 1"));
}

/// `ckpt coord trigger --kill` stops every tree after the commit, even
/// agents without `--kill` (either side may end the job once its checkpoint
/// is the valid one).
#[test]
fn trigger_kill_ends_every_tree_after_the_commit() {
    let a = Node::new("coord-trigger-kill", "a");
    let b = Node::new("coord-trigger-kill", "b");
    let coord = Coord::start(&a.env);
    let (mut va, mut vb) = counters(&a, &b);

    // The trigger waits for both nodes; it is pending before they come.
    let trigger = CkptCmd::spawn(
        &a.env,
        &[
            "coord",
            "trigger",
            "--connect",
            &coord.addr,
            "--job",
            JOB,
            "--secret-file",
            path_str(&coord.secret),
            "--kill",
        ],
    );
    let coord_log = coord.cmd.as_ref().expect("coordinator runs");
    assert!(
        wait_until(READY_TIMEOUT, || coord_log
            .stderr_now()
            .contains("trigger Checkpoint { then: Kill }")),
        "the coordinator never saw the trigger: {}",
        coord_log.stderr_now()
    );
    let da = a.dump(&coord, &va, &[], &[]);
    let db = b.dump(&coord, &vb, &[], &[]);
    let oa = da.wait_with(ROUND_TIMEOUT, || va.diag());
    db.wait_with(ROUND_TIMEOUT, || vb.diag()).assert_success();
    oa.assert_success();
    assert!(
        oa.stderr.contains("epoch 1 committed, killed"),
        "{}",
        oa.stderr
    );
    let t = trigger.wait(ROUND_TIMEOUT);
    t.assert_success();
    assert!(t.stdout.contains("epoch 1 committed"), "{}", t.stdout);
    va.reap_killed(Duration::from_secs(10));
    vb.reap_killed(Duration::from_secs(10));
    assert_images(&a.epoch_dir(1), va.pid);
    assert_images(&b.epoch_dir(1), vb.pid);
}

/// How long node b holds its capture back while node a must stay frozen.
const CAPTURE_HOLD: Duration = Duration::from_millis(600);

/// Two writer victims (tests/c/background.c) dumped in one background
/// round (`ckpt dump --coord --background`): node b is held just before
/// its thaw, and node a, already captured, must stay frozen until b has
/// captured too (the CAPTURE barrier), so nothing either part does after
/// the thaw can be in an image. Both thaw, write their pages running, and
/// epoch 1 commits; restored from it, every writer finds the freeze
/// instant in every page.
#[test]
fn two_nodes_background_checkpoint_thaw_together_and_restart() {
    let a = Node::new("coord-background", "a");
    let b = Node::new("coord-background", "b");
    let coord = Coord::start(&a.env);
    let mut va = Victim::spawn(&a.env, "background", &[]);
    let mut vb = Victim::spawn(&b.env, "background", &[]);
    va.wait_ready();
    vb.wait_ready();
    let gate = b.env.root.join("gate");
    let reached = b.env.root.join("gate.reached");
    let hold = [
        ("CKPT_FAULT", Path::new("pause:before-thaw")),
        ("CKPT_FAULT_GATE", gate.as_path()),
    ];
    let da = a.dump(&coord, &va, &["--background", "--json"], &[]);
    let db = b.dump(&coord, &vb, &["--background"], &hold);
    assert!(
        wait_for_file(&reached, ROUND_TIMEOUT),
        "agent b never captured its frozen state: {}",
        db.stderr_now()
    );
    std::thread::sleep(CAPTURE_HOLD);
    for (v, n) in [(&va, "a"), (&vb, "b")] {
        assert_ne!(
            tracer_pid(v.pid),
            Some(0),
            "node {n}'s tree thawed before node b captured its state"
        );
    }
    write_atomic(&gate, "go");
    let oa = da.wait_with(ROUND_TIMEOUT, || va.diag());
    let ob = db.wait_with(ROUND_TIMEOUT, || vb.diag());
    oa.assert_success();
    ob.assert_success();
    assert!(ob.stderr.contains("epoch 1 committed"), "{}", ob.stderr);
    let report: serde_json::Value = serde_json::from_str(oa.stdout.trim()).expect("--json");
    assert_eq!(report["epoch"], 1, "{report}");
    // Node a was frozen through node b's hold, and its writers' memory was
    // saved running.
    let frozen_ms = report["frozen_ms"].as_u64().expect("frozen_ms");
    assert!(
        frozen_ms >= CAPTURE_HOLD.as_millis() as u64,
        "node a frozen {frozen_ms} ms, less than node b's hold: {report}"
    );
    let in_background = report["stats"]["background"]["bytes"].as_u64().unwrap();
    assert!(in_background >= 72 << 20, "{report}");
    let rec = coord.record(1).expect("epoch 1 committed");
    assert_eq!(rec.nodes.len(), 2, "{rec:?}");
    for (n, v) in [(&a, &va), (&b, &vb)] {
        assert_images(&n.epoch_dir(1), v.pid);
        assert_running_untouched(v.pid, "after the background round");
    }

    for v in [&mut va, &mut vb] {
        v.send(nix::sys::signal::Signal::SIGKILL);
        v.reap_killed(Duration::from_secs(10));
        v.clear_protocol_files();
    }
    let ra = a.restore(&coord);
    let rb = b.restore(&coord);
    va.go();
    vb.go();
    finish_restore(&va, ra);
    finish_restore(&vb, rb);
}

/// A node whose agent dies while its pages are written in the background
/// (after the thaw): the epoch aborts on both nodes, no `epoch-2` is left,
/// epoch 1 stays the last committed, and both jobs run on unharmed.
#[test]
fn background_failure_after_the_thaw_aborts_and_the_jobs_run_on() {
    let a = Node::new("coord-background-fail", "a");
    let b = Node::new("coord-background-fail", "b");
    let coord = Coord::start(&a.env);
    let mut va = Victim::spawn(&a.env, "background", &[]);
    let mut vb = Victim::spawn(&b.env, "background", &[]);
    va.wait_ready();
    vb.wait_ready();
    let da = a.dump(&coord, &va, &["--background"], &[]);
    let db = b.dump(&coord, &vb, &["--background"], &[]);
    da.wait_with(ROUND_TIMEOUT, || va.diag()).assert_success();
    db.wait_with(ROUND_TIMEOUT, || vb.diag()).assert_success();

    let die = [("CKPT_FAULT", Path::new("during-background"))];
    let da = a.dump(&coord, &va, &["--background"], &[]);
    let db = b.dump(&coord, &vb, &["--background"], &die);
    let oa = da.wait_with(ROUND_TIMEOUT, || va.diag());
    let ob = db.wait_with(ROUND_TIMEOUT, || vb.diag());
    assert!(!ob.status.success(), "node b's agent should have died");
    assert_aborted(&oa, 2, "b", "DUMP");
    a.assert_no_epoch(2, "background round aborted after the thaw");
    assert!(coord.record(2).is_none());
    assert!(coord.record(1).is_some());
    assert!(coord.aborted_record(2));
    assert!(coord.status(&a.env).contains("last committed epoch 1"));
    assert_thawed_and_passes(&mut va, "node a's tree, background round aborted");
    assert_thawed_and_passes(&mut vb, "node b's tree, its agent killed");
}

/// Bytes of pages `ckpt dump --json` read from the tree (not taken from
/// the previous epoch).
fn read_from_tree(out: &CkptOutput) -> u64 {
    let report: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("--json");
    let stats = &report["stats"];
    let planned = stats["pages_planned_bytes"].as_u64().expect("planned");
    planned - stats["reused_bytes"].as_u64().unwrap_or(0)
}

/// Periodic incremental epochs (`ckpt dump --coord --incremental`): the
/// first epoch is read whole and leaves write tracking; the second takes
/// each node's images of epoch 1 and reads from the tree only what was
/// written since (tests/c/incremental.c rewrites 2 of its 64 MiB, moves
/// and drops two regions). Epoch 2 is complete on its own: with epoch 1's
/// images removed, both parts restore from it and find every change.
#[test]
fn incremental_epochs_read_only_what_changed_and_restore_alone() {
    let a = Node::new("coord-incremental", "a");
    let b = Node::new("coord-incremental", "b");
    let coord = Coord::start(&a.env);
    let mut va = Victim::spawn(&a.env, "incremental", &[]);
    let mut vb = Victim::spawn(&b.env, "incremental", &[]);
    va.wait_ready();
    vb.wait_ready();
    let args = ["--incremental", "--json"];
    let da = a.dump(&coord, &va, &args, &[]);
    let db = b.dump(&coord, &vb, &args, &[]);
    let first = [
        da.wait_with(ROUND_TIMEOUT, || va.diag()),
        db.wait_with(ROUND_TIMEOUT, || vb.diag()),
    ];
    for v in [&va, &vb] {
        write_atomic(&v.path("stage1"), "stage1");
        assert!(
            wait_for_file(&v.path("mutated"), Duration::from_secs(20)),
            "{}",
            v.diag()
        );
    }
    let da = a.dump(&coord, &va, &args, &[]);
    let db = b.dump(&coord, &vb, &args, &[]);
    let second = [
        da.wait_with(ROUND_TIMEOUT, || va.diag()),
        db.wait_with(ROUND_TIMEOUT, || vb.diag()),
    ];
    for (one, two) in first.iter().zip(&second) {
        one.assert_success();
        two.assert_success();
        let (whole, increment) = (read_from_tree(one), read_from_tree(two));
        assert!(
            whole >= 64 << 20 && increment * 4 < whole,
            "epoch 2 read {increment} bytes from the tree, epoch 1 {whole}: {}",
            two.stdout
        );
    }
    assert!(coord.record(2).is_some());
    for n in [&a, &b] {
        fs::remove_dir_all(n.epoch_dir(1)).expect("remove epoch 1");
    }
    for v in [&mut va, &mut vb] {
        v.send(nix::sys::signal::Signal::SIGKILL);
        v.reap_killed(Duration::from_secs(10));
        v.clear_protocol_files();
    }
    let ra = a.restore(&coord);
    let rb = b.restore(&coord);
    va.go();
    vb.go();
    finish_restore(&va, ra);
    finish_restore(&vb, rb);
}

/// A node whose agent dies in CAPTURE, while the other node, captured,
/// waits frozen for the thaw: the waiting node is told the epoch aborted,
/// thaws its tree unharmed (never having thawed for the epoch) and leaves
/// no images.
#[test]
fn background_failure_in_capture_thaws_the_waiting_node() {
    let a = Node::new("coord-background-capture", "a");
    let b = Node::new("coord-background-capture", "b");
    let coord = Coord::start(&a.env);
    let (mut va, mut vb) = counters(&a, &b);
    let die = [("CKPT_FAULT", Path::new("before-thaw"))];
    let da = a.dump(&coord, &va, &["--background"], &[]);
    let db = b.dump(&coord, &vb, &["--background"], &die);
    let oa = da.wait_with(ROUND_TIMEOUT, || va.diag());
    let ob = db.wait_with(ROUND_TIMEOUT, || vb.diag());
    assert!(!ob.status.success(), "node b's agent should have died");
    assert_aborted(&oa, 1, "b", "CAPTURE");
    a.assert_no_epoch(1, "background round aborted in CAPTURE");
    assert!(coord.record(1).is_none());
    assert!(coord.aborted_record(1));
    assert_thawed_and_passes(&mut va, "node a's tree, aborted while it waited to thaw");
    assert_thawed_and_passes(&mut vb, "node b's tree, its agent killed in CAPTURE");
}
