//! Nodes on one machine: network namespaces on a bridge, and a coordinated
//! checkpoint across them.

use super::*;

/// "Nodes" of a distributed job on this machine: one network namespace
/// each, joined by a bridge in the host namespace, each with its own
/// address (10.X.Y.n/24; the host side is .254). Removed on drop.
pub struct NetNodes {
    /// Namespace names, node 1 first.
    pub names: Vec<String>,
    /// Their addresses, in the same order.
    pub addrs: Vec<String>,
    /// The host's address on the bridge (where a coordinator listens).
    pub host_addr: String,
    bridge: String,
}

pub(crate) fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run ip: {e}"));
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl NetNodes {
    /// Creates `n` nodes for the test named `tag` (unique per test process).
    pub fn new(tag: &str, n: usize) -> NetNodes {
        // Unique per test process and per instance within it: several
        // tests of one binary run at once, each with its own nodes.
        static INSTANCES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 3;
        let id = std::process::id();
        let net = format!("10.{}.{}", 100 + ((id >> 8) % 50) * 3 + k, id % 256);
        let short = format!("{:x}{k}", id % 0xfffff);
        let bridge = format!("ckb{short}{}", &tag[..tag.len().min(3)]);
        let mut nodes = NetNodes {
            names: Vec::new(),
            addrs: Vec::new(),
            host_addr: format!("{net}.254"),
            bridge: bridge.clone(),
        };
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&[
            "addr",
            "add",
            &format!("{}/24", nodes.host_addr),
            "dev",
            &bridge,
        ]);
        ip(&["link", "set", &bridge, "up"]);
        for i in 1..=n {
            let name = format!("ckpt-{tag}-{short}-n{i}");
            let (outer, inner) = (format!("ckv{short}{i}"), format!("ckp{short}{i}"));
            let addr = format!("{net}.{i}");
            ip(&["netns", "add", &name]);
            nodes.names.push(name.clone());
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ]);
            ip(&["link", "set", &outer, "master", &bridge, "up"]);
            ip(&["link", "set", &inner, "netns", &name]);
            ip(&[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                &inner,
            ]);
            ip(&["-n", &name, "link", "set", &inner, "up"]);
            ip(&["-n", &name, "link", "set", "lo", "up"]);
            nodes.addrs.push(addr);
        }
        nodes
    }

    /// `ip netns exec NODE` in front of `args`: run on node `i` (0-based).
    pub fn on(&self, i: usize, args: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = ["netns", "exec", &self.names[i]]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(args.iter().map(|s| s.to_string()));
        v
    }
}

impl Drop for NetNodes {
    fn drop(&mut self) {
        for i in 0..self.names.len() {
            // Whatever a failed test left running in its nodes (daemons
            // such as Open MPI's orted are no test's child).
            for pid in self.pids(i) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
    }
}

impl NetNodes {
    /// The pid (in the host's pid namespace) of the process named `comm`
    /// inside node `i`'s network namespace, if there is exactly one.
    pub fn pid_of(&self, i: usize, comm: &str) -> Option<i32> {
        let found: Vec<i32> = self
            .pids(i)
            .into_iter()
            .filter(|&p| {
                fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm)
            })
            .collect();
        match found[..] {
            [pid] => Some(pid),
            _ => None,
        }
    }
}

impl NetNodes {
    /// Every process in node `i`'s network namespace.
    pub fn pids(&self, i: usize) -> Vec<i32> {
        Command::new("ip")
            .args(["netns", "pids", &self.names[i]])
            .output()
            .map(|out| {
                String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A coordinated checkpoint of a job spread over [`NetNodes`]: a
/// coordinator (`ckpt coord`) on the bridge, reachable from every node,
/// and one agent per node (`ckpt dump --coord` / `ckpt restore --coord`)
/// run inside that node, as a site would run them through its launcher.
pub struct Coordinated<'a> {
    env: &'a TestEnv,
    nodes: &'a NetNodes,
    job: String,
    addr: String,
    state: PathBuf,
    secret: String,
    coord: CkptCmd,
}

impl<'a> Coordinated<'a> {
    /// Starts the coordinator of job `job` expecting one agent per node.
    pub fn start(env: &'a TestEnv, nodes: &'a NetNodes, job: &str) -> Coordinated<'a> {
        let port = std::net::TcpListener::bind("0.0.0.0:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let addr = format!("{}:{port}", nodes.host_addr);
        let state = env.root.join("coord");
        let expect = nodes.names.len().to_string();
        let coord = CkptCmd::spawn(
            env,
            &[
                "coord",
                "--listen",
                &addr,
                "--job",
                job,
                "--expect",
                &expect,
                "--state-dir",
                path_str(&state),
            ],
        );
        let secret = state.join(format!("{job}.secret"));
        assert!(
            wait_until(Duration::from_secs(10), || secret.exists()),
            "coordinator did not start: {}",
            coord.stderr_now()
        );
        Coordinated {
            env,
            nodes,
            job: job.to_string(),
            addr,
            state,
            secret: path_str(&secret).to_string(),
            coord,
        }
    }

    /// Runs the agent of part `part` (its checkpoint root `node<part+1>`,
    /// node name `n<part+1>`) inside node `on`: a dump of the tree at
    /// `dump_root` (killed once the checkpoint is committed), or a restore
    /// of the part's images when `dump_root` is `None`, with `extra`
    /// arguments.
    fn agent(&self, part: usize, on: usize, dump_root: Option<i32>, extra: &[String]) -> CkptCmd {
        let dir = self.env.root.join(format!("node{}", part + 1));
        let node = format!("n{}", part + 1);
        let mut args: Vec<String> = Vec::new();
        match dump_root {
            // The peers are on other nodes: outside this node's tree.
            Some(pid) => args.extend(
                [
                    "dump",
                    "--tree",
                    &pid.to_string(),
                    "--kill",
                    "--tcp-established",
                ]
                .map(String::from),
            ),
            None => args.push("restore".into()),
        }
        args.extend(
            [
                "--dir",
                path_str(&dir),
                "--coord",
                &self.addr,
                "--job",
                &self.job,
                "--node",
                &node,
                "--secret-file",
                &self.secret,
            ]
            .map(String::from),
        );
        args.extend(extra.iter().cloned());
        CkptCmd::spawn_in_netns(
            self.env,
            &self.nodes.names[on],
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    }

    /// Checkpoints the tree rooted at `roots[i]` on node `i`, every node at
    /// once, kills the job once the coordinator has committed the epoch,
    /// and asserts both succeeded.
    pub fn dump_and_kill(&self, roots: &[i32], timeout: Duration) {
        let agents: Vec<CkptCmd> = roots
            .iter()
            .enumerate()
            .map(|(i, &pid)| self.agent(i, i, Some(pid), &[]))
            .collect();
        for out in agents.into_iter().map(|a| a.wait(timeout)) {
            out.assert_success();
        }
        let epoch = self
            .state
            .join(&self.job)
            .join(format!("epoch-{:016}.json", 1));
        assert!(
            epoch.exists(),
            "epoch 1 committed by the coordinator: {:?}",
            fs::read_dir(&self.state).map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        );
    }

    /// Restores every node's part at once, inside its node, and returns
    /// each agent's outcome (its exit code is its tree root's) when the
    /// restored job has finished.
    pub fn restore(&mut self, timeout: Duration) -> Vec<CkptOutput> {
        let home: Vec<usize> = (0..self.nodes.names.len()).collect();
        self.restore_on(&home, timeout)
    }

    /// Restores part `i` inside node `placement[i]` (parts may move or
    /// swap nodes; the agents exchange addresses so connections follow),
    /// every part at once, and returns each part's agent outcome.
    pub fn restore_on(&mut self, placement: &[usize], timeout: Duration) -> Vec<CkptOutput> {
        let peers: Vec<String> = (1..=placement.len()).map(|i| format!("n{i}")).collect();
        // `ip netns exec` gives every command a mount namespace of its own
        // (a copy of the host's): a part started with it was dumped from
        // another, and comes back in its agent's, where the same files are.
        let extra = [
            "--peers".to_string(),
            peers.join(","),
            "--mntns".to_string(),
            "/proc/self/ns/mnt".to_string(),
        ];
        let agents: Vec<CkptCmd> = placement
            .iter()
            .enumerate()
            .map(|(part, &on)| self.agent(part, on, None, &extra))
            .collect();
        let outs = agents.into_iter().map(|a| a.wait(timeout)).collect();
        let _ = self.coord.try_status();
        outs
    }
}
