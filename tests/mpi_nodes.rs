//! An Open MPI job across two "nodes" of this machine (network namespaces
//! on a bridge, tests/common `NetNodes`): `mpirun` on node 1 starts 2 ranks
//! of tests/c/mpi_job.c there and, through an rsh-like launch agent written
//! by the test (`ip netns exec` into the other node instead of ssh), an
//! `orted` on node 2 that starts the other 2 ranks. Every message between
//! ranks goes over TCP on the bridge. The `orted` daemonizes, so the job is
//! two unrelated process trees, one per node, joined only by TCP: a
//! coordinated checkpoint (`mpirun` as node 1's root, `orted` as node 2's)
//! with `--kill`, then a coordinated restart, and the job ends with the
//! result a run without MPI computes.

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::common::*;

/// About 100 rounds a second across the bridge on a shared 2-core machine.
const ROUNDS: u64 = 1200;
/// Rounds done before the checkpoint: the job is well under way.
const DUMP_AFTER: u64 = 300;
const JOB: &str = "mpi";
const WAIT: Duration = Duration::from_secs(90);
const RANKS_PER_NODE: usize = 2;

fn progress(env: &TestEnv) -> u64 {
    fs::read_to_string(env.work.join("progress"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Open MPI's rsh launch agent is called as `AGENT HOST COMMAND...`: run
/// COMMAND inside the node whose address is HOST (the hostfile names
/// nodes by address).
fn launch_agent(nodes: &NetNodes) -> String {
    let mut cases = String::new();
    for (name, addr) in nodes.names.iter().zip(&nodes.addrs) {
        cases.push_str(&format!("  {addr}) ns={name} ;;\n"));
    }
    format!(
        "#!/bin/sh\nhost=\"$1\"; shift\ncase \"$host\" in\n{cases}  *) echo \"launch agent: unknown node $host\" >&2; exit 1 ;;\nesac\nexec ip netns exec \"$ns\" sh -c \"$*\"\n"
    )
}

#[test]
fn open_mpi_job_across_two_nodes_survives_a_coordinated_checkpoint() {
    let env = TestEnv::new("mpi-nodes");
    let nodes = NetNodes::new("mpi", 2);
    let bin = mpi_victim_bin("mpi_job");
    let work = env.work.display().to_string();
    let rounds = ROUNDS.to_string();

    let agent = env.root.join("netns-rsh");
    write_executable(&agent, &launch_agent(&nodes));
    let hostfile = env.root.join("hostfile");
    let hosts: String = nodes
        .addrs
        .iter()
        .map(|a| format!("{a} slots={RANKS_PER_NODE}\n"))
        .collect();
    fs::write(&hostfile, hosts).expect("write hostfile");
    // Only the bridge: neither loopback nor the host's own interfaces.
    let subnet = format!(
        "{}.0/24",
        nodes.host_addr.rsplit_once('.').expect("dotted address").0
    );
    let np = (RANKS_PER_NODE * nodes.names.len()).to_string();

    let mut coord = Coordinated::start(&env, &nodes, JOB);
    let mpirun_args = nodes.on(
        0,
        &[
            "/usr/bin/mpirun",
            "--allow-run-as-root",
            "-np",
            &np,
            "--hostfile",
            path_str(&hostfile),
            "--mca",
            "plm_rsh_agent",
            path_str(&agent),
            "--mca",
            "plm_rsh_no_tree_spawn",
            "1",
            "--mca",
            "btl",
            "self,tcp",
            "--mca",
            "btl_tcp_if_include",
            &subnet,
            "--mca",
            "oob_tcp_if_include",
            &subnet,
            path_str(&bin),
            &work,
            &rounds,
        ],
    );
    // `ip netns exec` execs mpirun: the victim's pid is mpirun's.
    let mut mpirun = Victim::spawn_program(
        &env,
        Path::new("/usr/sbin/ip"),
        &mpirun_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(
        wait_until(WAIT, || progress(&env) >= DUMP_AFTER),
        "the job did not get going: progress {}\n{}",
        progress(&env),
        mpirun.diag()
    );
    let orted = nodes
        .pid_of(1, "orted")
        .expect("one orted in node 2, started through the launch agent");
    let ranks_on_node2 = fs::read_to_string(format!("/proc/{orted}/task/{orted}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .count();
    assert_eq!(
        ranks_on_node2, RANKS_PER_NODE,
        "orted on node 2 runs its share of the ranks"
    );

    coord.dump_and_kill(&[mpirun.pid, orted], WAIT);
    let at_dump = progress(&env);
    mpirun.reap_killed(Duration::from_secs(10));
    assert!(
        wait_until(Duration::from_secs(10), || !pid_exists(orted)),
        "orted killed after the checkpoint"
    );
    assert!(
        at_dump < ROUNDS && !env.work.join("result").exists(),
        "the job had already finished when it was dumped ({at_dump} of {ROUNDS})"
    );

    let outs = coord.restore(WAIT);
    let result = fs::read_to_string(env.work.join("result")).unwrap_or_default();
    for (i, out) in outs.iter().enumerate() {
        assert_eq!(
            out.code(),
            0,
            "node {} after a restore at round {at_dump}: exit {}, result {result}\n{}",
            i + 1,
            out.status,
            out.stderr
        );
    }
    assert!(
        result.starts_with("PASS"),
        "the MPI job across two nodes after a restore at round {at_dump} of {ROUNDS}: {result}"
    );
}
