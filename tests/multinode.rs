//! A distributed job on two "nodes" of this machine (network namespaces on
//! a bridge, tests/common `NetNodes`): a server on node 1 and a client on
//! node 2 exchange paced, checked messages over TCP (tests/c/netpeer.c).
//! A coordinated checkpoint (`ckpt coord` + one `ckpt dump --coord` agent
//! per node, each inside its node) is taken mid-exchange with `--kill`;
//! a coordinated restart (`ckpt restore --coord` per node) brings both
//! back and the exchange completes: no byte lost, repeated or reordered
//! (both sides end with the same digest of the whole exchange).

mod common;

use std::fs;
use std::path::Path;
use std::time::Duration;

use common::*;

const ROUNDS: u64 = 6000;
const JOB: &str = "mn";
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

#[test]
fn tcp_job_across_two_nodes_survives_a_coordinated_checkpoint() {
    let env = TestEnv::new("multinode");
    let nodes = NetNodes::new("mn", 2);
    let bin = victim_bin("netpeer");
    let bin = bin.to_str().expect("utf-8 path");
    let work = env.work.display().to_string();
    let rounds = ROUNDS.to_string();
    let port = "47123";

    // The coordinator, reachable from both nodes on the bridge.
    let mut coord = Coordinated::start(&env, &nodes, JOB);

    let ip = Path::new("/usr/sbin/ip");
    let server_args = nodes.on(0, &[bin, "server", &work, &nodes.addrs[0], port, &rounds]);
    let mut server = Victim::spawn_program(
        &env,
        ip,
        &server_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(
        wait_until(Duration::from_secs(10), || env
            .work
            .join("listening-server")
            .exists()),
        "server did not listen"
    );
    let client_args = nodes.on(1, &[bin, "client", &work, &nodes.addrs[0], port, &rounds]);
    let mut client = Victim::spawn_program(
        &env,
        ip,
        &client_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(
        wait_until(WAIT, || progress(&env) >= 500),
        "the exchange did not get going: {}",
        read_file(&env, "result-client")
    );

    // Coordinated dump, one agent per node, inside its node.
    coord.dump_and_kill(&[server.pid, client.pid], WAIT);
    let at_dump = progress(&env);
    server.reap_killed(Duration::from_secs(10));
    client.reap_killed(Duration::from_secs(10));
    assert!(at_dump < ROUNDS, "the exchange had ended before the dump");

    // Coordinated restart: each node restores its part inside its node.
    let outs = coord.restore(WAIT);
    let (o1, o2) = (&outs[0], &outs[1]);
    let (server_result, client_result) = (
        read_file(&env, "result-server"),
        read_file(&env, "result-client"),
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
