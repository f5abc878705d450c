//! A distributed job on two "nodes" of this machine (network namespaces on
//! a bridge, tests/common `NetNodes`): a server on node 1 and a client on
//! node 2 exchange paced, checked messages over TCP (tests/c/netpeer.c).
//! A coordinated checkpoint (`ckpt coord` + one `ckpt dump --coord` agent
//! per node, each inside its node) is taken mid-exchange with `--kill`;
//! a coordinated restart (`ckpt restore --coord` per node) brings both
//! back and the exchange completes: no byte lost, repeated or reordered
//! (both sides end with the same digest of the whole exchange).

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::common::*;

const ROUNDS: u64 = 6000;
const JOB: &str = "mn";
/// The server's port.
const PORT: u16 = 47123;
const WAIT: Duration = Duration::from_secs(90);

fn read_file(env: &TestEnv, name: &str) -> String {
    fs::read_to_string(env.work.join(name)).unwrap_or_default()
}

fn progress(env: &TestEnv) -> u64 {
    read_file(env, "progress-server")
        .trim()
        .parse()
        .unwrap_or(0)
}

/// How a part of the job is started on its node.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// As a plain process: its pid is the tree to dump.
    Plain,
    /// Under `ckpt run --pidns` (a PID namespace of its own, as a site
    /// runs a job that may restart anywhere): the namespace's init is the
    /// tree to dump.
    PidNs,
}

/// A part of the job: what the test started, and the root of the tree a
/// checkpoint saves.
struct Part {
    started: Victim,
    root: i32,
}

fn start_part(env: &TestEnv, nodes: &NetNodes, node: usize, how: Start, args: &[&str]) -> Part {
    let bin = victim_bin("netpeer");
    let mut cmd: Vec<&str> = Vec::new();
    let pidfile = env.root.join(format!("part{node}.pid"));
    if how == Start::PidNs {
        cmd.extend([
            CKPT,
            "run",
            "--pidns",
            "--pidfile",
            path_str(&pidfile),
            "--",
        ]);
    }
    cmd.push(path_str(&bin));
    cmd.extend(args);
    let argv = nodes.on(node, &cmd);
    let started = Victim::spawn_program(
        env,
        Path::new("/usr/sbin/ip"),
        &argv.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let root = match how {
        // `ip netns exec` execs the program: the victim's pid is its own.
        Start::Plain => started.pid,
        Start::PidNs => {
            assert!(
                wait_for_file(&pidfile, Duration::from_secs(10)),
                "ckpt run did not start: {}",
                started.diag()
            );
            fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .expect("pid of the namespace's init")
        }
    };
    Part { started, root }
}

/// The server (node 1) and client (node 2) of a paced exchange, well
/// under way.
fn start_exchange(env: &TestEnv, nodes: &NetNodes, how: Start) -> (Part, Part) {
    let work = env.work.display().to_string();
    let rounds = ROUNDS.to_string();
    let port = PORT.to_string();
    let server = start_part(
        env,
        nodes,
        0,
        how,
        &["server", &work, &nodes.addrs[0], &port, &rounds],
    );
    assert!(
        wait_until(Duration::from_secs(10), || env
            .work
            .join("listening-server")
            .exists()),
        "server did not listen"
    );
    let client = start_part(
        env,
        nodes,
        1,
        how,
        &["client", &work, &nodes.addrs[0], &port, &rounds],
    );
    assert!(
        wait_until(WAIT, || progress(env) >= 500),
        "the exchange did not get going: {}",
        read_file(env, "result-client")
    );
    (server, client)
}

/// Coordinated dump of both parts with --kill, mid-exchange.
fn dump_and_kill(env: &TestEnv, coord: &Coordinated<'_>, parts: [Part; 2]) {
    coord.dump_and_kill(&[parts[0].root, parts[1].root], WAIT);
    let at_dump = progress(env);
    for mut p in parts {
        if p.root == p.started.pid {
            p.started.reap_killed(Duration::from_secs(10));
        } else {
            // `ckpt run` ends with its killed init.
            assert!(
                wait_until(Duration::from_secs(10), || !pid_exists(p.started.pid)
                    || proc_state(p.started.pid) == Some('Z')),
                "ckpt run of pid {} did not end with its tree",
                p.root
            );
        }
    }
    assert!(at_dump < ROUNDS, "the exchange had ended before the dump");
}

/// Both restored parts ran to the end and agree on the whole exchange.
fn assert_completed(env: &TestEnv, outs: &[CkptOutput]) {
    let (o1, o2) = (&outs[0], &outs[1]);
    let (server_result, client_result) = (
        read_file(env, "result-server"),
        read_file(env, "result-client"),
    );
    assert!(
        o1.code() == 0 && o2.code() == 0,
        "restored job: server exit {} ({server_result}), client exit {} ({client_result})\n{}\n{}",
        o1.status,
        o2.status,
        o1.stderr,
        o2.stderr
    );
    assert!(
        server_result.starts_with("PASS") && server_result == client_result,
        "both sides agree on the whole exchange: server {server_result}, client {client_result}"
    );
}

/// The exchange job on `nodes`, its parts started `how`, checkpointed by a coordinated
/// dump that kills it: where every restart test begins. Returns the coordinator, which
/// runs the restart.
fn dumped_exchange<'a>(env: &'a TestEnv, nodes: &'a NetNodes, how: Start) -> Coordinated<'a> {
    // The coordinator, reachable from both nodes on the bridge.
    let coord = Coordinated::start(env, nodes, JOB);
    let (server, client) = start_exchange(env, nodes, how);
    // Coordinated dump, one agent per node, inside its node.
    dump_and_kill(env, &coord, [server, client]);
    coord
}

#[test]
fn tcp_job_across_two_nodes_survives_a_coordinated_checkpoint() {
    let env = TestEnv::new("multinode");
    let nodes = NetNodes::new("mn", 2);
    let mut coord = dumped_exchange(&env, &nodes, Start::Plain);
    // Coordinated restart: each node restores its part inside its node.
    let outs = coord.restore(WAIT);
    assert_completed(&env, &outs);
    let server_ends = read_file(&env, "endpoints-server");
    assert!(
        server_ends.starts_with(&format!("{}:{PORT} {}:", nodes.addrs[0], nodes.addrs[1])),
        "the server kept node 1's address, its client node 2's: {server_ends}"
    );
}

/// The parts change nodes at the restart: the server's part (dumped on
/// node 1, listening and connected on node 1's address) is restored on
/// node 2 and the client's on node 1. Each part runs in a PID namespace of
/// its own (`ckpt run --pidns`), as a job that may restart anywhere does. The agents exchange where each part
/// was and where it is now, and every socket comes back on its node's new
/// address with its connection state: the exchange goes on between the
/// swapped nodes and completes.
#[test]
fn tcp_job_restarts_with_the_nodes_parts_swapped() {
    let env = TestEnv::new("multinode-swap");
    let nodes = NetNodes::new("ms", 2);
    let mut coord = dumped_exchange(&env, &nodes, Start::PidNs);
    let outs = coord.restore_on(&[1, 0], WAIT);
    assert_completed(&env, &outs);
    // The server ran on node 2 after the restart (only node 2's address
    // exists there) and talked to the client on node 1.
    let server_ends = read_file(&env, "endpoints-server");
    assert!(
        server_ends.starts_with(&format!("{}:{PORT} {}:", nodes.addrs[1], nodes.addrs[0])),
        "the server's connection moved with it to node 2: {server_ends}"
    );
    let client_ends = read_file(&env, "endpoints-client");
    assert!(
        client_ends.starts_with(&format!("{}:", nodes.addrs[0]))
            && client_ends.ends_with(&format!(" {}:{PORT}", nodes.addrs[1])),
        "the client's connection moved with it to node 1: {client_ends}"
    );
}
