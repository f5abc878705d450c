//! Coordinator benchmark: many simulated agents, multiplexed on one poll loop per process,
//! against one coordinator (flat) or through a tree of sub-coordinators.
//!
//! `cargo run --release -p ckpt-coord --example bench -- --agents 1024,4096,16384 --mode both`
//!
//! In tree mode the agents reach their sub-coordinator over its Unix socket
//! (`--listen-unix`), as agents on a relay's node would; `--agent-hop tcp` makes them use
//! loopback TCP instead, for comparison.
//!
//! The same binary re-executes itself for its children (`serve-root`, `serve-subs`,
//! `agents`), so the coordinator's CPU time can be read from `/proc/<pid>/stat`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ckpt_coord::auth;
use ckpt_coord::client::Control;
use ckpt_coord::protocol::{
    AfterCommit, Arrive, Auth, FrameReader, Get, Hello, Intent, Message, NodeReport, Outcome,
    Phase, PhaseInfo, Put, Role, RoundKind, VERSION_MAX, VERSION_MIN,
};
use ckpt_coord::server::CoordConfig;
use ckpt_coord::{Endpoint, Secret};
use mio::net::{TcpStream, UnixStream};
use mio::{Events, Interest, Poll, Registry, Token};

const JOB: &str = "bench";

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn secret() -> Secret {
    let hex = std::env::var(auth::SECRET_ENV).expect("secret in the environment");
    Secret::from_hex(&hex, auth::SECRET_ENV).expect("hex secret")
}

/// Raises the soft fd limit to the hard one; root here lacks CAP_SYS_RESOURCE, so the hard
/// limit is the ceiling.
fn raise_nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid, writable rlimit for the duration of the call.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0;
    if ok && r.rlim_cur < r.rlim_max {
        r.rlim_cur = r.rlim_max;
        // SAFETY: `r` is a valid rlimit read just above; only the soft limit changed.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) };
    }
    r.rlim_cur
}

/// The coordinators' log lines (the `log` facade, info level) on stderr, timed from the
/// start of this process: `BENCH_LOG` chooses which coordinators pass theirs on.
struct StderrLog {
    start: Instant,
}

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Info
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let t = self.start.elapsed().as_secs_f64();
            eprintln!("+{t:.3}s {}", r.args());
        }
    }

    fn flush(&self) {}
}

static STDERR_LOG: std::sync::OnceLock<StderrLog> = std::sync::OnceLock::new();

/// Installs [`StderrLog`] in a coordinator child.
fn log_to_stderr() {
    let logger = STDERR_LOG.get_or_init(|| StderrLog {
        start: Instant::now(),
    });
    // Only fails if a logger is set already, which nothing here does.
    let _ = log::set_logger(logger);
    log::set_max_level(log::LevelFilter::Info);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    raise_nofile();
    match args.get(1).map(|s| s.as_str()) {
        Some("serve-root") => {
            log_to_stderr();
            serve_root(&args)
        }
        Some("serve-subs") => {
            log_to_stderr();
            serve_subs(&args)
        }
        Some("agents") => agents(&args),
        _ => orchestrate(&args),
    }
}

// ------------------------------------------------------------------ children

fn serve_root(args: &[String]) {
    let expect: u32 = arg(args, "--expect").unwrap().parse().unwrap();
    let dir = arg(args, "--state-dir").unwrap();
    let mut cfg = CoordConfig::new("127.0.0.1:0".parse().unwrap(), JOB, expect, secret());
    cfg.state_dir = Some(dir.into());
    // BENCH_LOG=root: only the root's log (its phase lines carry timestamps).
    cfg.emit_log = std::env::var("BENCH_LOG").is_ok();
    cfg.phase_deadline = Duration::from_secs(120);
    cfg.name = "root".into();
    // Every simulated agent connects from 127.0.0.1: one source by design, not a flood.
    cfg.limits.max_pending_per_source = cfg.limits.max_pending;
    // In tree mode the root holds one connection per sub-coordinator, not one per node:
    // size the unauthenticated cap for the connections it really holds, or 32,768
    // expected nodes over a 20,000 descriptor limit squeeze it to the minimum and the
    // sub-coordinators' own connects get shed.
    let conns: u64 = arg(args, "--conns").map_or(u64::from(expect), |c| c.parse().unwrap());
    cfg.limits.fd_limit = Some(raise_nofile() + u64::from(expect) - conns.min(u64::from(expect)));
    let h = ckpt_coord::spawn(cfg).unwrap();
    println!("ADDR {}", h.local_addr());
    let _ = h.join();
}

fn serve_subs(args: &[String]) {
    let parent = arg(args, "--parent").unwrap();
    let count: usize = arg(args, "--count").unwrap().parse().unwrap();
    let first: usize = arg(args, "--first").unwrap().parse().unwrap();
    let each: u32 = arg(args, "--expect-each").unwrap().parse().unwrap();
    // With a socket directory, agents reach each sub-coordinator over its Unix socket.
    let unix_dir = arg(args, "--unix-dir").map(std::path::PathBuf::from);
    let mut hs = Vec::new();
    for i in first..first + count {
        let mut cfg = CoordConfig::new("127.0.0.1:0".parse().unwrap(), JOB, each, secret());
        cfg.parent = Some(parent.clone());
        cfg.name = format!("sub{i}");
        cfg.limits.max_pending_per_source = cfg.limits.max_pending;
        cfg.emit_log = std::env::var("BENCH_LOG").is_ok_and(|v| v != "root");
        cfg.listen_unix = unix_dir.as_ref().map(|d| d.join(format!("sub{i}.sock")));
        let h = ckpt_coord::spawn(cfg).unwrap();
        match &unix_dir {
            Some(d) => println!("ADDR {i} unix:{}", d.join(format!("sub{i}.sock")).display()),
            None => println!("ADDR {i} {}", h.local_addr()),
        }
        hs.push(h);
    }
    for h in hs {
        let _ = h.join();
    }
}

/// A simulated agent's socket.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn connect(addr: &Endpoint) -> std::io::Result<Stream> {
        match addr {
            Endpoint::Tcp(a) => TcpStream::connect(*a).map(Stream::Tcp),
            Endpoint::Unix(p) => UnixStream::connect(p).map(Stream::Unix),
        }
    }

    /// Whether a non-blocking connect went through.
    fn connected(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.take_error().ok().flatten().is_none() && s.peer_addr().is_ok(),
            Stream::Unix(s) => s.take_error().ok().flatten().is_none() && s.peer_addr().is_ok(),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }

    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn register(&mut self, r: &Registry, t: Token) -> std::io::Result<()> {
        let i = Interest::READABLE | Interest::WRITABLE;
        match self {
            Stream::Tcp(s) => r.register(s, t, i),
            Stream::Unix(s) => r.register(s, t, i),
        }
    }

    fn reregister(&mut self, r: &Registry, t: Token, i: Interest) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => r.reregister(s, t, i),
            Stream::Unix(s) => r.reregister(s, t, i),
        }
    }

    fn deregister(&mut self, r: &Registry) {
        let _ = match self {
            Stream::Tcp(s) => r.deregister(s),
            Stream::Unix(s) => r.deregister(s),
        };
    }
}

/// One simulated agent, driven by the process's poll loop.
struct Sim {
    idx: usize,
    addr: Endpoint,
    stream: Option<Stream>,
    reader: FrameReader,
    out: Vec<u8>,
    nonce: [u8; 32],
    epoch: u64,
    missing: usize,
    attempts: u32,
    retry_at: Option<Instant>,
    connected: bool,
    /// Registered for writability: connecting, or output waiting for room. Otherwise
    /// not, as the coordinator does: a Unix socket signals "writable" each time the peer
    /// reads.
    write_armed: bool,
}

fn agents(args: &[String]) {
    let addrs: Vec<Endpoint> = arg(args, "--addrs")
        .unwrap()
        .split(',')
        .map(|a| Endpoint::resolve(a).unwrap())
        .collect();
    let first: usize = arg(args, "--first").unwrap().parse().unwrap();
    let count: usize = arg(args, "--count").unwrap().parse().unwrap();
    let total: usize = arg(args, "--total").unwrap().parse().unwrap();
    let victim_epoch: u64 = arg(args, "--victim-epoch").unwrap().parse().unwrap();
    let drain_separately = args.iter().any(|a| a == "--drain-separately");
    let secret = secret();
    // Staggered start (the "staggered sleep" of "System-level Scalable Checkpoint-Restart
    // for Petascale Computing", Cao et al.): all agents at once overflow the listen queue,
    // and the kernel retries a dropped SYN only after a second.
    let spread = Duration::from_millis(arg(args, "--spread-ms").map_or(0, |s| s.parse().unwrap()));
    let start = Instant::now();
    let mut poll = Poll::new().unwrap();
    let mut sims: Vec<Sim> = (0..count)
        .map(|k| {
            let idx = first + k;
            // Agents are spread over the coordinators in contiguous blocks, so each
            // sub-coordinator gets exactly its expected number.
            let addr = addrs[idx * addrs.len() / total].clone();
            Sim {
                idx,
                addr,
                stream: None,
                reader: FrameReader::new(),
                out: Vec::new(),
                nonce: [0; 32],
                epoch: 0,
                missing: 0,
                attempts: 0,
                retry_at: Some(start + spread.mul_f64(jitter01())),
                connected: false,
                write_armed: true,
            }
        })
        .collect();
    let mut events = Events::with_capacity(4096);
    let mut abort_max = 0u64;
    let mut commit_max = 0u64;
    let mut commits = 0usize;
    let mut aborts = 0usize;
    let mut alive = count;
    let mut closed = 0usize;
    // Agents waiting to (re)connect; the scan over all agents is skipped when none are.
    let mut retries = count;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let now = Instant::now();
        for (k, s) in sims
            .iter_mut()
            .enumerate()
            .skip(if retries == 0 { count } else { 0 })
        {
            if s.retry_at.is_some_and(|t| t <= now) {
                s.retry_at = None;
                retries -= 1;
                s.attempts += 1;
                match Stream::connect(&s.addr) {
                    Ok(mut st) => {
                        st.register(poll.registry(), Token(k)).unwrap();
                        s.stream = Some(st);
                        s.write_armed = true;
                    }
                    Err(_) => {
                        s.retry_at = Some(now + backoff(s.attempts));
                        retries += 1;
                    }
                }
            }
        }
        poll.poll(&mut events, Some(Duration::from_millis(20)))
            .unwrap();
        for ev in events.iter() {
            let k = ev.token().0;
            let s = &mut sims[k];
            let Some(st) = s.stream.as_mut() else {
                continue;
            };
            if !s.connected && ev.is_writable() {
                if ev.is_error() || !st.connected() {
                    // Refused or reset while the coordinator was swamped: back off, retry.
                    st.deregister(poll.registry());
                    s.stream = None;
                    s.retry_at = Some(Instant::now() + backoff(s.attempts));
                    retries += 1;
                    continue;
                }
                s.connected = true;
                if let Stream::Tcp(t) = st {
                    let _ = t.set_nodelay(true);
                }
                s.nonce = auth::nonce().unwrap();
                Message::Hello(Hello {
                    min_version: VERSION_MIN,
                    max_version: VERSION_MAX,
                    job: JOB.into(),
                    node: format!("a{}", s.idx),
                    role: Role::Agent,
                    intent: Intent::Standby,
                    expect: 1,
                    client_nonce: s.nonce,
                })
                .encode_into(&mut s.out)
                .unwrap();
            }
            let mut eof = false;
            if ev.is_readable() {
                loop {
                    match st.read(&mut buf) {
                        Ok(0) => {
                            eof = true;
                            break;
                        }
                        Ok(n) => {
                            s.reader.push(&buf[..n]);
                            if n < buf.len() && !ev.is_read_closed() {
                                break;
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(_) => {
                            eof = true;
                            break;
                        }
                    }
                }
            }
            let mut die = false;
            while let Ok(Some(m)) = s.reader.next_message() {
                let node = format!("a{}", s.idx);
                match m {
                    Message::Challenge(c) => {
                        assert!(secret.verify_server(
                            JOB,
                            &s.nonce,
                            &c.server_nonce,
                            &c.server_proof
                        ));
                        let proof =
                            secret.client_proof(JOB, &node, Role::Agent, &c.server_nonce, &s.nonce);
                        Message::Auth(Auth { proof })
                            .encode_into(&mut s.out)
                            .unwrap();
                    }
                    Message::Welcome(_) => {}
                    Message::Refused(r) => panic!("agent {node} refused: {}", r.reason),
                    Message::PhaseCmd(p) => {
                        s.epoch = p.epoch;
                        if s.idx == 0 && p.epoch == victim_epoch && p.phase == Phase::Freeze {
                            die = true;
                            break;
                        }
                        let arrive = |out: &mut Vec<u8>, phase, reports| {
                            Message::Arrive(Arrive {
                                epoch: p.epoch,
                                phase,
                                count: 1,
                                reports,
                            })
                            .encode_into(out)
                            .unwrap()
                        };
                        match p.phase {
                            // A simulated agent has no interconnect state: it acknowledges
                            // DRAIN together with FREEZE (protocol version 2), unless told
                            // to run the four-barrier round.
                            Phase::Freeze if !drain_separately => {
                                arrive(&mut s.out, Phase::Freeze, Vec::new());
                                arrive(&mut s.out, Phase::Drain, Vec::new());
                            }
                            Phase::Drain if !drain_separately => {}
                            Phase::Commit => {
                                commit_max = commit_max.max(wall_us());
                                commits += 1;
                                if commits == alive {
                                    println!("COMMIT {} {commit_max}", p.epoch);
                                    commits = 0;
                                }
                            }
                            Phase::Dump => arrive(
                                &mut s.out,
                                Phase::Dump,
                                vec![NodeReport {
                                    node,
                                    info: PhaseInfo::Dump {
                                        image_dir: format!("/ckpt/a{}", s.idx),
                                        manifest_crc32c: s.idx as u32,
                                    },
                                }],
                            ),
                            Phase::Publish => {
                                let entries = (0..16)
                                    .map(|i| (format!("a{}/k{i}", s.idx), vec![i as u8; 8]))
                                    .collect();
                                Message::Put(Put { entries })
                                    .encode_into(&mut s.out)
                                    .unwrap();
                                arrive(&mut s.out, Phase::Publish, Vec::new());
                            }
                            Phase::Subscribe => {
                                let peer = (s.idx + 1) % total;
                                let keys = (0..16).map(|i| format!("a{peer}/k{i}")).collect();
                                s.missing = 16;
                                Message::Get(Get {
                                    keys,
                                    timeout_ms: 60_000,
                                })
                                .encode_into(&mut s.out)
                                .unwrap();
                            }
                            ph => arrive(&mut s.out, ph, Vec::new()),
                        }
                    }
                    Message::Values(v) => {
                        s.missing = s.missing.saturating_sub(v.entries.len());
                        assert!(v.entries.iter().all(|e| e.1.is_some()), "key timed out");
                        if s.missing == 0 {
                            Message::Arrive(Arrive {
                                epoch: s.epoch,
                                phase: Phase::Subscribe,
                                count: 1,
                                reports: Vec::new(),
                            })
                            .encode_into(&mut s.out)
                            .unwrap();
                        }
                    }
                    Message::Abort(_) => {
                        abort_max = abort_max.max(wall_us());
                        aborts += 1;
                        if aborts == alive {
                            println!("ABORTED {abort_max}");
                        }
                    }
                    _ => {}
                }
            }
            if die {
                println!("DEATH {}", wall_us());
                st.deregister(poll.registry());
                s.stream = None;
                alive -= 1;
                closed += 1;
                continue;
            }
            if !s.out.is_empty() {
                match st.write(&s.out) {
                    Ok(n) => {
                        s.out.drain(..n);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(_) => eof = true,
                }
            }
            if !eof && s.out.is_empty() == s.write_armed {
                let i = if s.out.is_empty() {
                    Interest::READABLE
                } else {
                    Interest::READABLE | Interest::WRITABLE
                };
                st.reregister(poll.registry(), Token(k), i).unwrap();
                s.write_armed = !s.out.is_empty();
            }
            if eof {
                st.deregister(poll.registry());
                s.stream = None;
                closed += 1;
            }
        }
        let _ = std::io::stdout().flush();
        if closed == count {
            return;
        }
    }
}

fn backoff(attempt: u32) -> Duration {
    let base = 5u64 << attempt.min(8);
    let mut b = [0u8; 2];
    let _ = getrandom_fill(&mut b);
    let jitter = u64::from(u16::from_le_bytes(b)) % base.max(1);
    Duration::from_millis(base / 2 + jitter)
}

fn jitter01() -> f64 {
    let mut b = [0u8; 2];
    getrandom_fill(&mut b);
    f64::from(u16::from_le_bytes(b)) / f64::from(u16::MAX)
}

fn getrandom_fill(b: &mut [u8]) -> bool {
    match auth::nonce() {
        Ok(n) => {
            let k = b.len().min(n.len());
            b[..k].copy_from_slice(&n[..k]);
            true
        }
        Err(_) => false,
    }
}

// ------------------------------------------------------------------ orchestrator

struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

fn spawn_child(args: &[String], secret_hex: &str) -> Proc {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    // SAFETY: the hook only calls prctl, which is async-signal-safe; it makes the child
    // die with the orchestrator, so a failed run leaves no coordinators or agents behind.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .args(args)
        .env(auth::SECRET_ENV, secret_hex)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    Proc { child, lines: rx }
}

fn cpu_secs(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the command name; USER_HZ=100.
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

#[derive(Default)]
struct Row {
    mode: String,
    agents: usize,
    register: f64,
    commit: f64,
    round: f64,
    kv: f64,
    abort: f64,
    cpu_root: f64,
    cpu_subs: f64,
    cpu_agents: f64,
    round_cpu_coord: f64,
    round_cpu_agents: f64,
    bytes_per_agent: f64,
}

/// How the simulated agents reach their coordinator in tree mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hop {
    /// The sub-coordinator's Unix socket (the default).
    Unix,
    /// Loopback TCP, for comparison.
    Tcp,
}

fn run_case(
    mode: &str,
    n: usize,
    subs: usize,
    procs: usize,
    spread_ms: u64,
    drain_separately: bool,
    hop: Hop,
) -> Row {
    let secret = Secret::generate().unwrap();
    let hex = secret.to_hex();
    let dir = std::env::temp_dir().join(format!(
        "ckpt-coord-bench-{}-{mode}-{n}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut children: Vec<Proc> = Vec::new();
    let root = spawn_child(
        &[
            "serve-root".into(),
            "--expect".into(),
            n.to_string(),
            "--state-dir".into(),
            dir.display().to_string(),
            "--conns".into(),
            if mode == "tree" { subs } else { n }.to_string(),
        ],
        &hex,
    );
    let root_addr: SocketAddr = root
        .lines
        .recv_timeout(Duration::from_secs(30))
        .unwrap()
        .strip_prefix("ADDR ")
        .unwrap()
        .parse()
        .unwrap();
    let root_pid = root.child.id();
    children.push(root);
    let mut sub_pids = Vec::new();
    let addrs: Vec<String> = if mode == "tree" {
        let per_proc = subs.div_ceil(procs);
        let mut found: HashMap<usize, String> = HashMap::new();
        let mut first = 0;
        while first < subs {
            let count = per_proc.min(subs - first);
            let p = spawn_child(
                &[
                    "serve-subs".into(),
                    "--parent".into(),
                    root_addr.to_string(),
                    "--count".into(),
                    count.to_string(),
                    "--first".into(),
                    first.to_string(),
                    "--expect-each".into(),
                    (n / subs).to_string(),
                ]
                .into_iter()
                .chain(
                    (hop == Hop::Unix)
                        .then(|| ["--unix-dir".to_string(), dir.display().to_string()])
                        .into_iter()
                        .flatten(),
                )
                .collect::<Vec<_>>(),
                &hex,
            );
            for _ in 0..count {
                let l = p.lines.recv_timeout(Duration::from_secs(60)).unwrap();
                let mut it = l.split_whitespace().skip(1);
                let i: usize = it.next().unwrap().parse().unwrap();
                found.insert(i, it.next().unwrap().to_string());
            }
            sub_pids.push(p.child.id());
            children.push(p);
            first += count;
        }
        (0..subs).map(|i| found[&i].clone()).collect()
    } else {
        vec![root_addr.to_string()]
    };
    let addr_list = addrs.join(",");
    let mut ctl = Control::connect(&root_addr.to_string(), JOB, secret.clone(), "bench").unwrap();
    let t0 = Instant::now();
    let per = n.div_ceil(procs);
    let mut agent_procs = Vec::new();
    let mut first = 0;
    while first < n {
        let count = per.min(n - first);
        agent_procs.push(spawn_child(
            &[
                "agents".into(),
                "--addrs".into(),
                addr_list.clone(),
                "--first".into(),
                first.to_string(),
                "--count".into(),
                count.to_string(),
                "--total".into(),
                n.to_string(),
                "--victim-epoch".into(),
                "3".into(),
                "--spread-ms".into(),
                spread_ms.to_string(),
            ]
            .into_iter()
            .chain(drain_separately.then(|| "--drain-separately".to_string()))
            .collect::<Vec<_>>(),
            &hex,
        ));
        first += count;
    }
    loop {
        let s = ctl.status().unwrap();
        if s.registered as usize >= n {
            break;
        }
        if t0.elapsed() > Duration::from_secs(300) {
            panic!("registration stalled at {} of {n}", s.registered);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let register = t0.elapsed().as_secs_f64();
    let coord_cpu =
        |pids: &[u32]| cpu_secs(root_pid) + pids.iter().map(|p| cpu_secs(*p)).sum::<f64>();
    let agent_pids: Vec<u32> = agent_procs.iter().map(|p| p.child.id()).collect();
    let agents_cpu = || agent_pids.iter().map(|p| cpu_secs(*p)).sum::<f64>();
    let (c0, a0) = (coord_cpu(&sub_pids), agents_cpu());
    let t = Instant::now();
    let trigger_wall = wall_us();
    let r = ctl
        .trigger(
            RoundKind::Checkpoint {
                then: AfterCommit::Resume,
            },
            Some(Duration::from_secs(300)),
        )
        .unwrap();
    assert_eq!(r.outcome, Outcome::Committed, "round 1: {r:?}");
    let round = t.elapsed().as_secs_f64();
    let (round_cpu_coord, round_cpu_agents) = (coord_cpu(&sub_pids) - c0, agents_cpu() - a0);
    let mut commit_wall = 0u64;
    for p in &agent_procs {
        loop {
            let l = p
                .lines
                .recv_timeout(Duration::from_secs(30))
                .expect("an agent process never reported the commit");
            if let Some(v) = l.strip_prefix("COMMIT 1 ") {
                commit_wall = commit_wall.max(v.parse().unwrap());
                break;
            }
        }
    }
    let commit = commit_wall.saturating_sub(trigger_wall) as f64 / 1e6;
    let t = Instant::now();
    let r = ctl
        .trigger(RoundKind::Restart, Some(Duration::from_secs(300)))
        .unwrap();
    assert_eq!(r.outcome, Outcome::Restarted, "restart round: {r:?}");
    let kv = t.elapsed().as_secs_f64();
    let status = ctl.status().unwrap();
    let cpu_root = cpu_secs(root_pid);
    let cpu_subs: f64 = 0.0 + sub_pids.iter().map(|p| cpu_secs(*p)).sum::<f64>();
    let cpu_agents: f64 = agent_procs.iter().map(|p| cpu_secs(p.child.id())).sum();
    // Abort: agent a0 dies on FREEZE of epoch 3.
    let r = ctl
        .trigger(
            RoundKind::Checkpoint {
                then: AfterCommit::Resume,
            },
            Some(Duration::from_secs(300)),
        )
        .unwrap();
    assert!(matches!(r.outcome, Outcome::Aborted { .. }), "{r:?}");
    let mut death = 0u64;
    let mut last_abort = 0u64;
    for p in &agent_procs {
        let mut got = false;
        while !got {
            match p.lines.recv_timeout(Duration::from_secs(30)) {
                Ok(l) => {
                    if let Some(v) = l.strip_prefix("DEATH ") {
                        death = v.parse().unwrap();
                    } else if let Some(v) = l.strip_prefix("ABORTED ") {
                        last_abort = last_abort.max(v.parse().unwrap());
                        got = true;
                    }
                }
                Err(_) => panic!("an agent process never reported the abort"),
            }
        }
    }
    let abort = (last_abort.saturating_sub(death)) as f64 / 1e6;
    for mut p in agent_procs.into_iter().chain(children) {
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    Row {
        mode: if mode == "tree" {
            let hop = match hop {
                Hop::Unix => "unix",
                Hop::Tcp => "tcp",
            };
            format!("tree {subs}x{} {hop}", n / subs)
        } else {
            "flat".into()
        },
        agents: n,
        register,
        commit,
        round,
        kv,
        abort,
        cpu_root,
        cpu_subs,
        cpu_agents,
        round_cpu_coord,
        round_cpu_agents,
        bytes_per_agent: (status.bytes_in + status.bytes_out) as f64 / n as f64,
    }
}

fn orchestrate(args: &[String]) {
    let sizes: Vec<usize> = arg(args, "--agents")
        .unwrap_or_else(|| "1024,4096,16384".into())
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    let mode = arg(args, "--mode").unwrap_or_else(|| "both".into());
    let subs: usize = arg(args, "--subs").map_or(64, |s| s.parse().unwrap());
    let procs: usize = arg(args, "--procs").map_or(4, |s| s.parse().unwrap());
    let spread_ms: u64 = arg(args, "--spread-ms").map_or(0, |s| s.parse().unwrap());
    // Agents report DRAIN in its own barrier instead of ahead with FREEZE.
    let drain_separately = args.iter().any(|a| a == "--drain-separately");
    // Tree mode: agents reach their sub-coordinator over its Unix socket unless
    // `--agent-hop tcp`.
    let hop = match arg(args, "--agent-hop").as_deref() {
        None | Some("unix") => Hop::Unix,
        Some("tcp") => Hop::Tcp,
        Some(other) => panic!("--agent-hop {other}: expected unix or tcp"),
    };
    let modes: Vec<&str> = match mode.as_str() {
        "both" => vec!["flat", "tree"],
        m => vec![if m == "tree" { "tree" } else { "flat" }],
    };
    println!(
        "fd limit {}; {procs} agent processes; times in seconds, abort = agent death to last agent told",
        raise_nofile()
    );
    println!(
        "{:<19} {:>7} {:>9} {:>8} {:>8} {:>9} {:>8} {:>9} {:>9} {:>10} {:>10} {:>10} {:>8}",
        "mode",
        "agents",
        "register",
        "commit",
        "round",
        "kv-round",
        "abort",
        "cpu-root",
        "cpu-subs",
        "cpu-agents",
        "rcpu-coord",
        "rcpu-agent",
        "B/agent"
    );
    for m in modes {
        for &n in &sizes {
            let r = run_case(m, n, subs.min(n), procs, spread_ms, drain_separately, hop);
            println!(
                "{:<19} {:>7} {:>9.3} {:>8.3} {:>8.3} {:>9.3} {:>8.3} {:>9.2} {:>9.2} {:>10.2} {:>10.2} {:>10.2} {:>8.0}",
                r.mode,
                r.agents,
                r.register,
                r.commit,
                r.round,
                r.kv,
                r.abort,
                r.cpu_root,
                r.cpu_subs,
                r.cpu_agents,
                r.round_cpu_coord,
                r.round_cpu_agents,
                r.bytes_per_agent
            );
        }
    }
}
