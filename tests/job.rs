//! `ckpt job`: one command for a whole multi-node job. Each part is started
//! with `ckpt job run` (under `ckpt run --pidns`, its root pid and node in
//! the job directory); `ckpt job dump` runs the coordinator and one agent
//! per part on the part's node, `ckpt job restore` restarts every part,
//! `ckpt job list/status` read the job directory back.
//!
//! Nodes are network namespaces on a bridge (`NetNodes`, `--launch
//! netns`), node names for local parts with `--launch exec --via 'env
//! ...={host}'`, or a fake `srun` that runs the step's tasks here with the
//! Slurm variables set (`--launch srun`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use crate::slurm_lab::FAKE_SRUN;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const WAIT: Duration = Duration::from_secs(60);
const IP: &str = "/usr/sbin/ip";
/// The exit code of `ckpt job run` whose init was SIGKILLed.
const KILLED: i32 = 128 + 9;
/// A local "remote execution": every node is this host.
const VIA_LOCAL: &str = "env CKPT_TEST_HOST={host}";

/// A part of the job: `ckpt job run` of a victim with its own work dir.
struct Part {
    /// Holds the part's work dir (and its logs) for the test's length.
    _env: TestEnv,
    v: Victim,
}

impl Part {
    /// Starts `victim` as part `name` on node `node` (locally).
    fn start(jobdir: &Path, name: &str, node: &str, victim: &str) -> Part {
        let env = TestEnv::new(&format!("job-{name}"));
        let bin = victim_bin(victim);
        let work = path_str(&env.work).to_string();
        let mut v = Victim::spawn_program(
            &env,
            Path::new(CKPT),
            &[
                "job",
                "run",
                "--dir",
                path_str(jobdir),
                "--part",
                name,
                "--node",
                node,
                "--",
                path_str(&bin),
                &work,
            ],
        );
        v.wait_ready();
        Part { _env: env, v }
    }

    /// The part's tree was killed after the commit: `ckpt job run` ends
    /// with its init's SIGKILL status.
    fn assert_killed(&mut self) {
        let status = self.v.wait_original_exit(WAIT);
        assert_eq!(status.code(), Some(KILLED), "{}", self.v.diag());
    }

    /// The part runs its own loop, and once told to go passes its checks
    /// as the same incarnation that was dumped.
    fn assert_runs_and_passes(&self, context: &str) {
        assert!(
            self.v.ping(READY_TIMEOUT),
            "{context}: part stopped looping: {}",
            self.v.diag()
        );
        self.v.go();
        let r = self.v.wait_result(WAIT);
        assert_eq!(r, "PASS", "{context}: {}", self.v.diag());
        self.v.assert_pass();
    }
}

/// Kills restored part inits (nobody's child here) when the test ends,
/// if they still run: only a pid that is still a ckpt process, never an
/// unrelated process that reused the number.
#[derive(Default)]
struct Inits(Vec<i32>);

impl Drop for Inits {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if exe_of(pid).is_some_and(|e| e == Path::new(CKPT)) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

fn root_pid(jobdir: &Path, part: &str) -> Option<i32> {
    fs::read_to_string(jobdir.join("parts").join(part).join("root.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn node_of(jobdir: &Path, part: &str) -> String {
    read_to_string_lossy(&jobdir.join("parts").join(part).join("node"))
        .trim()
        .to_string()
}

fn job_json(env: &TestEnv, verb: &str, jobdir: &Path) -> serde_json::Value {
    let out = ckpt(
        env,
        &["job", verb, "--dir", path_str(jobdir), "--json"],
        WAIT,
    );
    out.assert_success();
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{verb} --json: {e}: {out:?}"))
}

/// (epoch, state, last committed, parts) of every epoch `list` shows.
fn listed(env: &TestEnv, jobdir: &Path) -> Vec<(u64, String, bool, Vec<String>)> {
    let v = job_json(env, "list", jobdir);
    v["epochs"]
        .as_array()
        .expect("epochs")
        .iter()
        .map(|e| {
            assert!(
                e["state"] != "committed" || e["bytes"].as_u64() > Some(0),
                "a committed epoch has images: {e}"
            );
            (
                e["epoch"].as_u64().expect("epoch"),
                e["state"].as_str().expect("state").to_string(),
                e["last_committed"].as_bool().expect("last"),
                e["parts"]
                    .as_array()
                    .expect("parts")
                    .iter()
                    .map(|p| p.as_str().expect("part").to_string())
                    .collect(),
            )
        })
        .collect()
}

fn committed(epoch: u64, last: bool, parts: &[&str]) -> (u64, String, bool, Vec<String>) {
    (
        epoch,
        "committed".to_string(),
        last,
        parts.iter().map(|p| p.to_string()).collect(),
    )
}

/// The epoch image directories of `part` on disk.
fn epoch_dirs(jobdir: &Path, part: &str) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(jobdir.join("parts").join(part))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("epoch-"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// What JOBDIR/last-committed says.
fn last_committed(jobdir: &Path) -> String {
    read_to_string_lossy(&jobdir.join("last-committed"))
        .trim()
        .to_string()
}

fn record(jobdir: &Path, epoch: u64) -> PathBuf {
    jobdir
        .join("coord/job")
        .join(format!("epoch-{epoch:016}.json"))
}

fn dump_json(env: &TestEnv, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["job", "dump", "--json"];
    all.extend_from_slice(args);
    let out = ckpt(env, &all, WAIT);
    out.assert_success();
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("dump --json: {e}: {out:?}"))
}

// ---------------------------------------------------------------------------

const ROUNDS: u64 = 6000;

fn progress(env: &TestEnv) -> u64 {
    read_to_string_lossy(&env.work.join("progress-server"))
        .trim()
        .parse()
        .unwrap_or(0)
}

#[test]
fn tcp_job_on_two_nodes_is_dumped_killed_listed_and_restored_swapped() {
    let env = TestEnv::new("job-tcp");
    let nodes = NetNodes::new("job", 2);
    let jobdir = env.root.join("job");
    let jd = path_str(&jobdir);
    let bin = victim_bin("netpeer");
    let bin = path_str(&bin);
    let work = path_str(&env.work).to_string();
    let rounds = ROUNDS.to_string();
    let port = "47124";
    let listen = format!("{}:0", nodes.host_addr);
    let mut inits = Inits::default();

    // Each side is one part, started inside its node; the part's node is
    // the network namespace's name (no --node given).
    let part = |i: usize, name: &str, role: &str| {
        let args = nodes.on(
            i,
            &[
                CKPT,
                "job",
                "run",
                "--dir",
                jd,
                "--part",
                name,
                "--",
                bin,
                role,
                &work,
                &nodes.addrs[0],
                port,
                &rounds,
            ],
        );
        Victim::spawn_program(
            &env,
            Path::new(IP),
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    };
    let mut server = part(0, "server", "server");
    assert!(
        wait_until(Duration::from_secs(10), || env
            .work
            .join("listening-server")
            .exists()),
        "server did not listen: {}",
        server.diag()
    );
    let mut client = part(1, "client", "client");
    assert!(
        wait_until(WAIT, || progress(&env) >= 500),
        "the exchange did not get going: {}",
        read_to_string_lossy(&env.work.join("result-client"))
    );
    assert_eq!(node_of(&jobdir, "server"), nodes.names[0]);
    assert_eq!(node_of(&jobdir, "client"), nodes.names[1]);

    let d = dump_json(
        &env,
        &[
            "--dir", jd, "--kill", "--launch", "netns", "--listen", &listen,
        ],
    );
    assert_eq!(d["epoch"], 1, "{d}");
    assert_eq!(d["killed"], true, "{d}");
    let at_dump = progress(&env);
    for v in [&mut server, &mut client] {
        let status = v.wait_original_exit(WAIT);
        assert_eq!(status.code(), Some(KILLED), "{}", v.diag());
    }
    assert!(at_dump < ROUNDS, "the exchange had ended before the dump");
    for i in 0..2 {
        assert!(
            wait_until(Duration::from_secs(10), || nodes.pids(i).is_empty()),
            "node {i} still runs {:?} after the dump with --kill",
            nodes.pids(i)
        );
    }
    assert_eq!(
        listed(&env, &jobdir),
        vec![committed(1, true, &["client", "server"])]
    );

    // Restart in the foreground, the parts swapped between the nodes
    // (parts in name order: the client on node 1, the server on node 2;
    // the agents exchange addresses so the connection follows): it ends
    // when both parts' trees exit.
    let swapped = format!("{},{}", nodes.names[0], nodes.names[1]);
    let restore = CkptCmd::spawn(
        &env,
        &[
            "job", "restore", "--dir", jd, "--launch", "netns", "--listen", &listen, "--nodes",
            &swapped,
        ],
    );
    let old = (server.pid, client.pid);
    assert!(
        wait_until(WAIT, || {
            ["server", "client"].iter().all(|p| {
                root_pid(&jobdir, p).is_some_and(|r| r != old.0 && r != old.1 && pid_exists(r))
            })
        }),
        "the parts' new roots were not recorded: {}",
        restore.stderr_now()
    );
    inits.0.extend(
        ["server", "client"]
            .iter()
            .filter_map(|p| root_pid(&jobdir, p)),
    );
    let out = restore.wait(WAIT);
    let (sr, cr) = (
        read_to_string_lossy(&env.work.join("result-server")),
        read_to_string_lossy(&env.work.join("result-client")),
    );
    assert_eq!(out.code(), 0, "{out:?}\nserver {sr}\nclient {cr}");
    assert!(
        sr.starts_with("PASS") && sr == cr,
        "both sides agree on the whole exchange: server {sr}, client {cr}"
    );
    let s = job_json(&env, "status", &jobdir);
    assert_eq!(s["last_committed"], 1, "{s}");
    assert_eq!(s["parts"][0]["part"], "client", "{s}");
    assert_eq!(s["parts"][0]["node"], nodes.names[0].as_str(), "{s}");
    assert_eq!(s["parts"][1]["part"], "server", "{s}");
    assert_eq!(s["parts"][1]["node"], nodes.names[1].as_str(), "{s}");
}

#[test]
fn retention_keeps_the_newest_epochs() {
    let main = TestEnv::new("job-keep");
    let jobdir = main.root.join("job");
    let jd = path_str(&jobdir);
    let a = Part::start(&jobdir, "a", "n1", "counter");
    let b = Part::start(&jobdir, "b", "n2", "counter");
    let dump = [
        "--dir", jd, "--keep", "2", "--launch", "exec", "--via", VIA_LOCAL,
    ];
    let mut pruned = Vec::new();
    for epoch in 1..=3u64 {
        let d = dump_json(&main, &dump);
        assert_eq!(d["epoch"], epoch, "{d}");
        assert_eq!(d["killed"], false, "{d}");
        pruned.push(d["pruned"].clone());
    }
    assert_eq!(
        pruned,
        vec![
            serde_json::json!([]),
            serde_json::json!([]),
            serde_json::json!([1])
        ]
    );
    for p in ["a", "b"] {
        assert_eq!(epoch_dirs(&jobdir, p), ["epoch-2", "epoch-3"], "part {p}");
    }
    assert!(!record(&jobdir, 1).exists(), "epoch 1's record pruned");
    assert_eq!(last_committed(&jobdir), "3");
    assert!(record(&jobdir, 2).exists() && record(&jobdir, 3).exists());
    assert_eq!(
        listed(&main, &jobdir),
        vec![
            committed(2, false, &["a", "b"]),
            committed(3, true, &["a", "b"])
        ]
    );
    a.assert_runs_and_passes("part a after three dumps");
    b.assert_runs_and_passes("part b after three dumps");
}

/// The figures a part's dump of `epoch` stored with its images.
fn dump_stats(jobdir: &Path, part: &str, epoch: u64) -> serde_json::Value {
    let path = jobdir
        .join("parts")
        .join(part)
        .join(format!("epoch-{epoch}"))
        .join("stats-dump.json");
    serde_json::from_str(&read_to_string_lossy(&path))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `ckpt job dump --background` (a background round: every part's pages
/// written while the job runs) and then `--incremental` twice: the second
/// increment takes each part's pages from the epoch before wherever they
/// did not change; retention keeps the two newest, and the parts run on.
#[test]
fn background_and_incremental_job_dumps() {
    let main = TestEnv::new("job-periodic");
    let jobdir = main.root.join("job");
    let jd = path_str(&jobdir);
    let a = Part::start(&jobdir, "a", "n1", "counter");
    let b = Part::start(&jobdir, "b", "n2", "counter");
    let dump = [
        "--dir", jd, "--keep", "2", "--launch", "exec", "--via", VIA_LOCAL,
    ];
    let d = dump_json(&main, &[&dump[..], &["--background"]].concat());
    assert_eq!(
        (d["epoch"].as_u64(), d["killed"].as_bool()),
        (Some(1), Some(false)),
        "{d}"
    );
    let parts = d["parts"].as_array().expect("parts");
    assert!(
        parts.len() == 2
            && parts
                .iter()
                .all(|p| p["frozen_ms"].as_f64().is_some_and(|ms| ms > 0.0)),
        "every part's frozen time: {d}"
    );
    for p in ["a", "b"] {
        let stats = dump_stats(&jobdir, p, 1);
        assert!(stats["background"].is_object(), "part {p}: {stats}");
    }
    for epoch in [2, 3] {
        let d = dump_json(&main, &[&dump[..], &["--incremental"]].concat());
        assert_eq!(d["epoch"], epoch, "{d}");
    }
    for p in ["a", "b"] {
        let stats = dump_stats(&jobdir, p, 3);
        let reused = stats["reused_bytes"].as_u64().unwrap_or(0);
        let planned = stats["pages_planned_bytes"].as_u64().unwrap_or(0);
        assert!(
            reused > 0 && reused <= planned,
            "part {p}: epoch 3 took nothing from epoch 2: {stats}"
        );
        assert_eq!(epoch_dirs(&jobdir, p), ["epoch-2", "epoch-3"], "part {p}");
    }
    assert_eq!(last_committed(&jobdir), "3");
    a.assert_runs_and_passes("part a after the periodic dumps");
    b.assert_runs_and_passes("part b after the periodic dumps");
}

#[test]
fn an_unsupported_part_aborts_the_epoch_and_harms_nothing() {
    let main = TestEnv::new("job-abort");
    let jobdir = main.root.join("job");
    let jd = path_str(&jobdir);
    let a = Part::start(&jobdir, "a", "n1", "counter");
    let mut b = Part::start(&jobdir, "b", "n2", "counter");
    let dump = ["--dir", jd, "--launch", "exec", "--via", VIA_LOCAL];
    assert_eq!(dump_json(&main, &dump)["epoch"], 1);

    // Part b is started again, now holding a netlink socket.
    let old = root_pid(&jobdir, "b").expect("b's root");
    kill(Pid::from_raw(old), Signal::SIGKILL).expect("kill b's init");
    b.assert_killed();
    let b = Part::start(&jobdir, "b", "n2", "unsupported");

    let mut all = vec!["job", "dump"];
    all.extend_from_slice(&dump);
    let out = ckpt(&main, &all, WAIT);
    out.assert_error();
    // The agents' own errors come first (their stderr is the job's); the
    // job's verdict is the last line.
    let err = out.stderr.lines().last().unwrap_or_default();
    assert!(
        err.starts_with("ckpt: error: job dump: epoch 2 aborted in DUMP: part b (node n2): ")
            && err.contains("netlink socket not supported")
            && err.ends_with("epoch 1 stays the last committed"),
        "the error names the epoch, part, node and reason: {}",
        out.stderr
    );
    for p in ["a", "b"] {
        assert_eq!(epoch_dirs(&jobdir, p), ["epoch-1"], "part {p}");
    }
    assert_eq!(last_committed(&jobdir), "1");
    assert_eq!(
        listed(&main, &jobdir),
        vec![
            committed(1, true, &["a", "b"]),
            (2, "aborted".to_string(), false, vec![])
        ]
    );
    a.assert_runs_and_passes("part a after the abort");
    b.assert_runs_and_passes("part b after the abort");
}

#[test]
fn srun_launch_dumps_and_restores_parts_on_swapped_nodes() {
    let main = TestEnv::new("job-srun");
    let jobdir = main.root.join("job");
    let jd = path_str(&jobdir);
    let bin = main.root.join("bin");
    fs::create_dir(&bin).unwrap();
    let srun = bin.join("srun");
    write_executable(&srun, FAKE_SRUN);
    let log = main.root.join("srun.log");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut a = Part::start(&jobdir, "a", "fake1", "counter");
    let mut b = Part::start(&jobdir, "b", "fake2", "counter");
    let mut inits = Inits::default();

    let vars = |nodes: &'static str| {
        vec![
            ("PATH", PathBuf::from(&path)),
            ("FAKE_SRUN_LOG", log.clone()),
            ("FAKE_SRUN_NODES", PathBuf::from(nodes)),
        ]
    };
    let run = |args: &[&str], nodes: &'static str| {
        let v = vars(nodes);
        let v: Vec<(&str, &Path)> = v.iter().map(|(k, p)| (*k, p.as_path())).collect();
        CkptCmd::spawn_with_env(&main, args, &v)
    };
    let out = run(
        &[
            "job", "dump", "--dir", jd, "--kill", "--launch", "srun", "--json",
        ],
        "fake1,fake2",
    )
    .wait(WAIT);
    out.assert_success();
    a.assert_killed();
    b.assert_killed();
    let first = read_to_string_lossy(&log);
    let first = first.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(
            "--overlap --mpi=none --nodes=2 --ntasks=2 --ntasks-per-node=1 --distribution=block --nodelist=fake1,fake2 "
        ) && first.contains(" job agent dump ")
            && first.ends_with(" --slurm --slurm-nodes=fake1,fake2"),
        "one srun step of one agent per node: {first}"
    );
    assert_eq!(
        listed(&main, &jobdir),
        vec![committed(1, true, &["a", "b"])]
    );

    // The new allocation lists the nodes the other way round: part a
    // (SLURM_NODEID 0) comes back on fake2, part b on fake1.
    let restore = run(
        &["job", "restore", "--dir", jd, "--launch", "srun"],
        "fake2,fake1",
    );
    let old = (a.v.pid, b.v.pid);
    assert!(
        wait_until(WAIT, || ["a", "b"].iter().all(
            |p| root_pid(&jobdir, p).is_some_and(|r| r != old.0 && r != old.1 && pid_exists(r))
        )),
        "the parts' new roots were not recorded: {}",
        restore.stderr_now()
    );
    inits
        .0
        .extend(["a", "b"].iter().filter_map(|p| root_pid(&jobdir, p)));
    assert_eq!(node_of(&jobdir, "a"), "fake2");
    assert_eq!(node_of(&jobdir, "b"), "fake1");
    for p in [&a, &b] {
        p.v.go();
    }
    let out = restore.wait(WAIT);
    assert_eq!(out.code(), 0, "{out:?}");
    for p in [&a, &b] {
        assert_eq!(p.v.wait_result(WAIT), "PASS", "{}", p.v.diag());
        p.v.assert_pass();
    }
    let second = read_to_string_lossy(&log);
    let second = second.lines().nth(1).unwrap_or_default();
    assert!(
        second.starts_with("--overlap --mpi=none --nodes=2 --ntasks=2 --ntasks-per-node=1 ")
            && second.contains(" job agent restore ")
            && !second.contains("--nodelist"),
        "restore step: {second}"
    );
    drop(inits);
}

#[test]
fn restore_of_an_older_epoch_detached() {
    let main = TestEnv::new("job-epoch");
    let jobdir = main.root.join("job");
    let jd = path_str(&jobdir);
    // A victim holding no file whose size an older epoch would miss.
    let mut a = Part::start(&jobdir, "a", "n1", "eventfd");
    let mut b = Part::start(&jobdir, "b", "n2", "eventfd");
    let launch = ["--launch", "exec", "--via", VIA_LOCAL];
    let mut dump = vec!["--dir", jd];
    dump.extend_from_slice(&launch);
    assert_eq!(dump_json(&main, &dump)["epoch"], 1);
    dump.push("--kill");
    assert_eq!(dump_json(&main, &dump)["epoch"], 2);
    a.assert_killed();
    b.assert_killed();

    // Without part a's images of epoch 2, the last committed epoch cannot
    // be restored: the restart aborts naming the part, and nothing runs.
    fs::remove_dir_all(jobdir.join("parts/a/epoch-2")).unwrap();
    let mut all = vec!["job", "restore", "--dir", jd];
    all.extend_from_slice(&launch);
    let out = ckpt(&main, &all, WAIT);
    out.assert_error();
    let err = out.stderr.lines().last().unwrap_or_default();
    assert!(
        err.starts_with(
            "ckpt: error: job restore: epoch 2: aborted in RESTORE: part a (node n1): "
        ) && err.contains("is not on this node")
            && err.ends_with("; no part runs"),
        "{}",
        out.stderr
    );
    assert!(
        ["a", "b"]
            .iter()
            .all(|p| root_pid(&jobdir, p).is_none_or(|r| !pid_exists(r))),
        "a part runs after an aborted restart"
    );
    let mut all = vec![
        "job", "restore", "--dir", jd, "--epoch", "1", "--detach", "--json",
    ];
    all.extend_from_slice(&launch);
    // ... and on each other's node.
    all.extend_from_slice(&["--nodes", "n2,n1"]);
    let out = ckpt(&main, &all, WAIT);
    let mut inits = Inits::default();
    inits
        .0
        .extend(["a", "b"].iter().filter_map(|p| root_pid(&jobdir, p)));
    out.assert_success();
    let r: serde_json::Value = serde_json::from_str(&out.stdout).expect("restore --json");
    assert_eq!(r["epoch"], 1, "{r}");
    assert_eq!(r["detached"], true, "{r}");
    assert_eq!(
        (node_of(&jobdir, "a"), node_of(&jobdir, "b")),
        ("n2".to_string(), "n1".to_string())
    );
    // Restoring epoch 1 leaves the job's records as they were.
    assert_eq!(
        listed(&main, &jobdir),
        vec![committed(1, false, &["a", "b"]), committed(2, true, &["b"])]
    );
    let leftovers: Vec<_> = fs::read_dir(jobdir.join("coord"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != "job")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    for p in [&a, &b] {
        p.assert_runs_and_passes("restored from epoch 1");
    }
    drop(inits);
}

#[test]
fn job_files_are_checked_before_anything_is_dumped() {
    let main = TestEnv::new("job-files");
    let jobdir = main.root.join("job");
    let jd = path_str(&jobdir);
    let a = Part::start(&jobdir, "a", "n1", "counter");
    let dump = [
        "job", "dump", "--dir", jd, "--launch", "exec", "--via", VIA_LOCAL,
    ];
    let pidfile = jobdir.join("parts/a/root.pid");

    // A root.pid naming a process that is not a ckpt init: refused, and
    // that process is left alone.
    let mut other = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("sleep");
    fs::write(&pidfile, format!("{}\n", other.id())).unwrap();
    let out = ckpt(&main, &dump, WAIT);
    out.assert_error();
    assert!(
        out.stderr.contains(&format!(
            "part a: pid {} from {} is not a running ckpt init",
            other.id(),
            pidfile.display()
        )),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.trim_end().ends_with(
            "ckpt: error: job dump: the round did not start: part a on node n1 exited with 1 (its error is above)"
        ),
        "{}",
        out.stderr
    );
    assert_running_untouched(other.id() as i32, "a process a root.pid named");
    let _ = other.kill();
    let _ = other.wait();

    // A root.pid that is a symbolic link is not followed.
    fs::remove_file(&pidfile).unwrap();
    std::os::unix::fs::symlink("/proc/self/stat", &pidfile).unwrap();
    let out = ckpt(&main, &dump, WAIT);
    out.assert_error();
    assert!(
        out.stderr.contains("root.pid: cannot open") || out.stderr.contains("symbolic link"),
        "{}",
        out.stderr
    );
    assert_eq!(epoch_dirs(&jobdir, "a"), Vec::<String>::new());

    // A job directory others may write to is refused.
    fs::set_permissions(&jobdir, fs::Permissions::from_mode(0o777)).unwrap();
    let out = ckpt(&main, &["job", "list", "--dir", jd], WAIT);
    assert!(
        out.assert_error().contains("writable by group or others"),
        "{}",
        out.stderr
    );
    fs::set_permissions(&jobdir, fs::Permissions::from_mode(0o700)).unwrap();
    a.assert_runs_and_passes("part a after the refused dumps");
}

#[test]
fn agents_that_never_register_are_given_up_on() {
    let main = TestEnv::new("job-late");
    let jobdir = main.root.join("job");
    let jd = path_str(&jobdir);
    let a = Part::start(&jobdir, "a", "n1", "counter");
    // A launcher that never runs the agent (a node that is down, a step
    // waiting for resources).
    let stuck = main.root.join("stuck-launcher");
    write_executable(&stuck, "#!/bin/sh\nexec sleep 60\n");
    let via = format!("{} {{host}}", stuck.display());
    let out = ckpt(
        &main,
        &[
            "job",
            "dump",
            "--dir",
            jd,
            "--launch",
            "exec",
            "--via",
            &via,
            "--register-timeout",
            "1",
        ],
        WAIT,
    );
    assert_eq!(
        out.assert_error(),
        "ckpt: error: job dump: the round did not start: 0 of 1 agents registered within 1 s (--register-timeout)"
    );
    assert!(listed(&main, &jobdir).is_empty());
    a.assert_runs_and_passes("part a after the launch failed");
}
