//! TCP and UDP sockets (IPv4, IPv6) come back bound, listening, connected,
//! and established TCP connections with every queued byte, through
//! TCP_REPAIR (victim: tests/c/inet.c).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::common::*;

/// Bytes each side sends on each connection (`TOTAL` in inet.c).
const TOTAL: u64 = 1 << 20;
/// The victim's small receive buffer (`SMALL_RCVBUF` in inet.c).
const SMALL_RCVBUF: libc::c_int = 4096;
/// Bytes the test queues towards the victim before the dump (under its
/// small receive buffer).
const OUTSIDE_QUEUED: u64 = 2000;
const PUMP_TIMEOUT: Duration = Duration::from_secs(60);

/// Byte `n` of the stream in direction `dir` (`stream_byte` in inet.c).
fn stream_byte(dir: u64, n: u64) -> u8 {
    let mut x = n
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(dir.wrapping_mul(0xD1B5_4A32_D192_ED03));
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    (x >> 56) as u8
}

/// One end of the stream the test itself holds (direction 0 out, 1 in).
struct OutsideEnd {
    s: TcpStream,
    sent: u64,
    rcvd: u64,
}

impl OutsideEnd {
    /// Writes until the queues are full; returns false once done or blocked.
    fn send_some(&mut self) -> bool {
        if self.sent == TOTAL {
            return false;
        }
        let n = (TOTAL - self.sent).min(65536) as usize;
        let buf: Vec<u8> = (0..n as u64)
            .map(|i| stream_byte(0, self.sent + i))
            .collect();
        match self.s.write(&buf) {
            Ok(w) => {
                self.sent += w as u64;
                if self.sent == TOTAL {
                    self.s.shutdown(Shutdown::Write).expect("shutdown");
                }
                w > 0
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => false,
            Err(e) => panic!("send to the victim: {e}"),
        }
    }

    /// Reads what is there, checking every byte against its offset;
    /// returns Some(true) at the end of the stream.
    fn recv_some(&mut self) -> Option<bool> {
        let mut buf = vec![0u8; 65536];
        match self.s.read(&mut buf) {
            Ok(0) => Some(true),
            Ok(r) => {
                for (i, b) in buf[..r].iter().enumerate() {
                    let at = self.rcvd + i as u64;
                    assert_eq!(
                        *b,
                        stream_byte(1, at),
                        "byte {at} from the victim: lost or repeated data"
                    );
                }
                self.rcvd += r as u64;
                Some(false)
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => None,
            Err(e) => panic!("recv from the victim after {} bytes: {e}", self.rcvd),
        }
    }

    /// Runs both streams to their end.
    fn pump(&mut self) {
        let deadline = Instant::now() + PUMP_TIMEOUT;
        let mut eof = false;
        while !(eof && self.sent == TOTAL) {
            assert!(
                Instant::now() < deadline,
                "stream stuck: sent {}, received {}",
                self.sent,
                self.rcvd
            );
            let wrote = self.send_some();
            let read = match self.recv_some() {
                Some(true) => {
                    eof = true;
                    false
                }
                Some(false) => true,
                None => false,
            };
            if !wrote && !read {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        assert_eq!(self.rcvd, TOTAL, "the victim's stream ended early");
    }
}

/// The test's listening socket, with the victim's small receive buffer
/// (inherited by the accepted end) so the queues fill on both sides.
fn outside_listener() -> TcpListener {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let v = SMALL_RCVBUF;
    // SAFETY: the kernel reads one int from the live local `v`.
    let r = unsafe {
        libc::setsockopt(
            l.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&raw const v).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_RCVBUF");
    l
}

fn inet_objects(env: &TestEnv) -> Vec<String> {
    let json = show_json(env);
    fds_of_kind(&json, "inet")
        .iter()
        .map(|f| f["object"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn tcp_connections_in_the_tree_survive_with_their_queues() {
    let env = TestEnv::new("inet-tcp");
    let mut v = Victim::spawn(&env, "inet", &["tcp"]);
    v.wait_ready();
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("2 processes"), "{}", out.stderr);
    v.reap_killed(Duration::from_secs(10));

    let objects = inet_objects(&env);
    let established: Vec<&String> = objects
        .iter()
        .filter(|o| o.contains("established"))
        .collect();
    // Server and client each hold one v4 and one v6 end.
    assert_eq!(established.len(), 4, "{objects:?}");
    for o in &established {
        assert!(
            !o.contains("receive queue 0 ") && o.contains("peer file"),
            "every end has unread bytes and its other end in the tree: {o}"
        );
    }
    // The listening sockets, shared by server and client over fork: two
    // fds each, one open file each.
    let listeners = fds_of_kind(&show_json(&env), "inet")
        .into_iter()
        .filter(|f| f["object"].as_str().unwrap_or_default().contains("listen"))
        .collect::<Vec<_>>();
    assert!(
        established.iter().any(|o| o.starts_with("tcp6"))
            && listeners.len() == 4
            && file_ids(&listeners).len() == 2,
        "{objects:?}"
    );

    restore_and_check(&env, &v);
}

#[test]
fn dump_without_kill_leaves_connections_working() {
    let env = TestEnv::new("inet-leave");
    let mut v = Victim::spawn(&env, "inet", &["tcp"]);
    v.wait_ready();
    dump(&env, &v, &[]);
    // Repair mode was switched off: every byte still flows, and the
    // sockets keep their options.
    v.assert_unharmed_and_passes("after a dump without --kill");
}

#[test]
fn udp_sockets_survive_as_their_user_and_queued_datagrams_are_dropped() {
    let env = TestEnv::new("inet-udp");
    let mut v = Victim::spawn_as(&env, "inet", &["udp"], test_user());
    v.wait_ready();
    dump(&env, &v, &["--kill"]);
    v.reap_killed(Duration::from_secs(10));

    let objects = inet_objects(&env);
    assert_eq!(
        objects
            .iter()
            .filter(|o| o.starts_with("udp4 connected 127.0.0.1:")
                || o.starts_with("udp6 connected [::1]:"))
            .count(),
        4,
        "{objects:?}"
    );
    let log = read_to_string_lossy(&env.img.join("dump.log"));
    assert!(
        log.contains("dropping the queued datagrams"),
        "the dump logs the datagram it drops:\n{log}"
    );

    restore_and_check(&env, &v);
    assert_eq!(read_to_string_lossy(&v.path("udp-queued")), "dropped");
}

#[test]
fn connection_to_outside_needs_tcp_established_and_then_goes_on() {
    let env = TestEnv::new("inet-outside");
    let listener = outside_listener();
    let port = listener
        .local_addr()
        .expect("local_addr")
        .port()
        .to_string();
    let mut v = Victim::spawn(&env, "inet", &["outside", &port]);
    let (stream, _) = listener.accept().expect("accept");
    stream.set_nonblocking(true).expect("nonblocking");
    let mut end = OutsideEnd {
        s: stream,
        sent: 0,
        rcvd: 0,
    };
    // Bytes the victim has not read yet, within its receive window (the
    // network lock keeps a window probe meanwhile from being reset).
    let queued: Vec<u8> = (0..OUTSIDE_QUEUED).map(|i| stream_byte(0, i)).collect();
    end.s
        .write_all(&queued)
        .expect("queue bytes for the victim");
    end.sent = OUTSIDE_QUEUED;
    v.wait_ready();

    // Refused by name, one line, and the victim runs on untouched.
    let out = dump_outcome(&env, &v, &[]);
    out.assert_error();
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("--tcp-established"))
        .unwrap_or_else(|| panic!("no line names --tcp-established:\n{}", out.stderr));
    let victim_addr = format!("127.0.0.1:{port}");
    assert!(
        line.contains(&format!("pid {}", v.pid))
            && line.contains("fd ")
            && line.contains(&victim_addr),
        "the refusal names pid, fd and addresses: {line}"
    );
    assert!(
        v.ping(Duration::from_secs(10)),
        "victim stopped: {}",
        v.diag()
    );
    assert!(!env.img.exists(), "a refused dump leaves no checkpoint");

    dump(&env, &v, &["--tcp-established", "--kill"]);
    v.reap_killed(Duration::from_secs(10));
    let objects = inet_objects(&env);
    assert!(
        objects.len() == 1 && objects[0].contains("peer outside the tree"),
        "{objects:?}"
    );

    // The network lock drops whatever reaches the victim's port before its
    // socket is back.
    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    v.go();
    // The test's end never saw a FIN or RST: the stream just goes on.
    end.pump();
    finish_restore(&v, restore);
}

/// ckpt's exit code for a dump it refuses (docs/usage.md).
const EXIT_UNSUPPORTED: i32 = 3;

/// A rank of `srun --mpi=pmix` as slurmstepd starts it: Slurm's PMIx
/// namespace and server URIs in its environment, and a connection to the
/// server's address. The test plays slurmstepd, outside the tree.
#[test]
fn srun_pmix_rank_is_refused_by_name_and_runs_on() {
    let env = TestEnv::new("inet-srun-pmix");
    let server = outside_listener();
    let port = server.local_addr().expect("local_addr").port().to_string();
    let uri = format!("pmix-server.{};tcp4://127.0.0.1:{port}", std::process::id());
    let mut v = Victim::spawn_with_vars(
        &env,
        "inet",
        &["outside", &port],
        &[
            ("PMIX_NAMESPACE", "slurm.pmix.4242.0"),
            ("PMIX_RANK", "0"),
            ("PMIX_SERVER_URI4", &uri),
            ("PMIX_SERVER_URI41", &uri),
        ],
    );
    let (_stream, _) = server.accept().expect("accept");
    v.wait_ready();

    // Saving the connection to an outside peer does not help: the server
    // is gone with the step, so --tcp-established is refused the same way.
    for extra in [&[][..], &["--tcp-established"][..]] {
        let out = dump_outcome(&env, &v, extra);
        let line = out.assert_error();
        assert_eq!(out.code(), EXIT_UNSUPPORTED, "{}", out.stderr);
        assert_eq!(
            out.stderr
                .lines()
                .filter(|l| l.starts_with("ckpt: error:"))
                .count(),
            1,
            "one line: {}",
            out.stderr
        );
        assert!(
            line.contains(&format!("pid {}: a rank of srun --mpi=pmix", v.pid))
                && line.contains("slurmstepd")
                && line.contains(&format!("pid {}", std::process::id()))
                && line.contains("ckpt slurm -- mpirun"),
            "the refusal names the rank, its server and the launch that works: {line}"
        );
        assert!(!env.img.exists(), "a refused dump leaves no checkpoint");
        assert!(
            v.ping(Duration::from_secs(10)),
            "victim stopped: {}",
            v.diag()
        );
    }
}

#[test]
fn privileged_port_is_not_given_back_without_cap_net_bind_service() {
    let env = TestEnv::new("inet-privport");
    let mut v = Victim::spawn(&env, "inet", &["privport"]);
    v.wait_ready();
    let port = read_to_string_lossy(&v.path("port"));
    dump(&env, &v, &["--kill"]);
    v.reap_killed(Duration::from_secs(10));
    // The restorer binds as root; the process could not have.
    let out = spawn_restore(&env, &[]).wait(Duration::from_secs(30));
    let line = out.assert_error();
    assert!(
        line.contains(&format!("pid {}", v.pid))
            && line.contains(&format!("127.0.0.1:{port}"))
            && line.contains("CAP_NET_BIND_SERVICE"),
        "{line}"
    );
    assert!(!pid_exists(v.pid), "nothing of the refused restore runs");
}

/// A connection not accepted yet whose server end holds bytes the client
/// sent (only accept(2) shows them) is refused, naming them; the tree goes
/// on with it.
#[test]
fn unaccepted_connections_holding_bytes_are_refused_by_name() {
    let env = TestEnv::new("inet-refused");
    let mut v = Victim::spawn(&env, "inet", &["refused"]);
    v.wait_ready();
    let out = dump_outcome(&env, &v, &[]);
    out.assert_error();
    let what = "not accepted yet by its listener in the tree: the listener holds 5 bytes of it";
    assert!(
        out.stderr
            .lines()
            .any(|l| l.contains(&format!("pid {}", v.pid)) && l.contains(what)),
        "no line for {what}:\n{}",
        out.stderr
    );
    v.assert_unharmed_and_passes("after a refused dump");
}

/// Half-closed connections in the tree (FIN_WAIT2 and CLOSE_WAIT, over
/// IPv4 and IPv6) come back in their states, each end with its unread
/// bytes; the CLOSE_WAIT end reads the end of the stream after them and
/// still writes (checked by the victim).
#[test]
fn half_closed_connections_come_back_with_unread_bytes_then_eof() {
    standard_cycle("inet-half-closed", "inet", &["halfclosed"]);
}

/// Connections whose writer shut down writing with bytes still queued
/// behind a full window (FIN_WAIT1, over IPv4 and IPv6): every byte
/// arrives after the restore, then the end of the stream, and the writer
/// reaches FIN_WAIT2 (checked by the victim).
#[test]
fn fin_wait1_with_queued_bytes_comes_back() {
    standard_cycle("inet-fin-wait1", "inet", &["finwait1"]);
}

/// Connections whose reader shut down first and whose writer then
/// answered with its own FIN behind bytes the reader's full window holds
/// back (LAST_ACK, over IPv4 and IPv6): the writer is in LAST_ACK again
/// and reads the end of the stream, the reader gets every byte exactly
/// once and then the end of the stream (checked by the victim).
#[test]
fn last_ack_with_queued_bytes_comes_back() {
    standard_cycle("inet-last-ack", "tcpclose", &["lastack"]);
}

/// Connections whose writer's FIN, queued behind a full window, was
/// crossed by the reader's (CLOSING, over IPv4 and IPv6): the writer is in
/// CLOSING again and reads the end of the stream, the reader gets every
/// byte and then the end of the stream, and the writer's FIN is
/// acknowledged (checked by the victim).
#[test]
fn closing_with_queued_bytes_comes_back() {
    standard_cycle("inet-closing", "tcpclose", &["closing"]);
}

/// Connections a listener has not accepted yet, their clients in the tree
/// (one shut down writing), over IPv4 and IPv6: after the restore the
/// listener accepts exactly them, from the clients' addresses, and they
/// carry bytes both ways; the shut down one reads the end of the stream
/// (checked by the victim).
#[test]
fn unaccepted_connections_of_clients_in_the_tree_come_back() {
    standard_cycle("inet-unaccepted", "tcppending", &["pending"]);
}

/// Non-blocking connects under way (SYN_SENT, over IPv4 and IPv6) to a
/// listener whose full accept queue drops their SYN: after the restore
/// they are still under way, and complete (POLLOUT, SO_ERROR 0) once the
/// listener accepts its pending connection (checked by the victim).
#[test]
fn connects_under_way_complete_after_the_restore() {
    standard_cycle("inet-syn-sent", "tcppending", &["synsent"]);
}

/// Options a program set and reads back (SO_BINDTODEVICE, SO_BUF_LOCK,
/// SO_LINGER, keepalive and its timing, TCP_NODELAY, TCP_CORK,
/// IP_FREEBIND, IP_TOS/IPV6_TCLASS, IPV6_V6ONLY, TCP_USER_TIMEOUT,
/// TCP_CONGESTION, a classic BPF filter) on an established connection and
/// a listener read back as set after the restore (checked by the victim).
#[test]
fn socket_options_read_back_as_set() {
    standard_cycle("inet-options", "tcpopts", &[]);
}

/// Two listeners sharing a port with SO_REUSEPORT both come back on it
/// and between them accept every new connection (checked by the victim).
#[test]
fn reuseport_listeners_share_their_port_again() {
    standard_cycle("inet-reuseport", "tcpopts", &["reuseport"]);
}

/// Dumped without --kill, connections not accepted yet go on as they
/// were: the clients left repair mode, the listener accepts them.
#[test]
fn unaccepted_connections_go_on_after_a_dump_without_kill() {
    let env = TestEnv::new("inet-unaccepted-live");
    let mut v = Victim::spawn(&env, "tcppending", &["pending"]);
    v.wait_ready();
    dump(&env, &v, &[]);
    v.assert_unharmed_and_passes("after a dump that left it running");
}

/// Dumped without --kill, half-closed connections go on as they were.
#[test]
fn half_closed_connections_go_on_after_a_dump_without_kill() {
    let env = TestEnv::new("inet-half-closed-live");
    let mut v = Victim::spawn(&env, "inet", &["halfclosed"]);
    v.wait_ready();
    dump(&env, &v, &[]);
    v.assert_unharmed_and_passes("after a dump that left it running");
}

#[test]
fn tcp_connections_of_an_unprivileged_user_survive() {
    let env = TestEnv::new("inet-tcp-user");
    let mut v = Victim::spawn_as(&env, "inet", &["tcp"], test_user());
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    restore_and_check(&env, &v);
}

/// A dumper killed while the connections are in repair mode: its guard
/// switches repair off, and the tree's streams complete.
#[test]
fn dumper_killed_in_repair_mode_leaves_connections_working() {
    let env = TestEnv::new("inet-dumper-killed");
    let mut v = Victim::spawn(&env, "inet", &["tcp"]);
    v.wait_ready();
    let out = faulty_dump_command(&env, &v, "before-commit", &["--kill"])
        .output()
        .expect("run ckpt");
    assert!(!out.status.success(), "the dumper was to die");
    v.assert_unharmed_and_passes("after the dumper died in repair mode");
}

/// Leaves a TIME_WAIT socket whose local end is 127.0.0.1:`port` (no
/// SO_REUSEADDR): a connection from that port, closed from that side
/// first.
fn time_wait_on(port: u16) {
    let peer = TcpListener::bind("127.0.0.1:0").expect("listen");
    let to = peer.local_addr().expect("local addr");
    let addr = |port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a fresh fd with pointers to live locals
    // of the size passed.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket");
        let me = addr(port);
        assert_eq!(
            libc::bind(fd, (&raw const me).cast(), len),
            0,
            "bind 127.0.0.1:{port}: {}",
            std::io::Error::last_os_error()
        );
        let them = addr(to.port());
        assert_eq!(
            libc::connect(fd, (&raw const them).cast(), len),
            0,
            "connect"
        );
        let (accepted, _) = peer.accept().expect("accept");
        libc::close(fd);
        // The peer sees the FIN, then closes too: the side that closed
        // first is left in TIME_WAIT.
        let mut rest = Vec::new();
        let _ = (&accepted).read_to_end(&mut rest);
    }
    let ss = std::process::Command::new("ss")
        .args(["-tan", "state", "time-wait"])
        .output()
        .expect("run ss");
    assert!(
        String::from_utf8_lossy(&ss.stdout).contains(&format!("127.0.0.1:{port} ")),
        "no TIME_WAIT on 127.0.0.1:{port}: {}",
        String::from_utf8_lossy(&ss.stdout)
    );
}

/// A listener's port taken meanwhile by the TIME_WAIT remains of a
/// connection that ended (here one the test makes from that port) comes
/// back: those remains are removed, the restored listener has its port.
#[test]
fn listener_comes_back_past_time_wait_on_its_port() {
    let env = TestEnv::new("inet-timewait");
    let mut v = Victim::spawn(&env, "inet", &["tcp"]);
    v.wait_ready();
    dump(&env, &v, &["--kill"]);
    v.reap_killed(Duration::from_secs(10));
    let listener = inet_objects(&env)
        .into_iter()
        .find(|o| o.starts_with("tcp4 listen"))
        .expect("a v4 listener in the image");
    let port: u16 = listener
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("port of {listener}"));
    time_wait_on(port);
    restore_and_check(&env, &v);
}

/// Dumps killed at fault points: after the seize, with the parasite
/// loaded, in the page copy (where the probe found most deaths), before
/// the commit and before the kill of `--kill`, each several times (the
/// race lost one kill in five).
const KILLED_AT: [(&str, usize, &[&str]); 5] = [
    ("after-seize", 2, &[]),
    ("parasite-loaded", 2, &[]),
    ("during-pages", 10, &[]),
    ("before-commit", 4, &[]),
    ("before-kill", 4, &["--kill"]),
];

/// Dumps killed after a delay of their own (0 to 150 ms): any moment.
const KILLED_AFTER: [u64; 10] = [0, 5, 10, 15, 25, 40, 60, 80, 110, 150];

/// A dumper SIGKILLed while a process talks on a connection to outside:
/// the kernel lets the tree go at once, and a send or receive on a
/// connection still in repair mode fails (EINVAL, EPERM). The tree must
/// stay stopped until the guard has switched repair off, then run on: the
/// victim, sending and receiving without pause, sees no failure over every
/// kill and is never left stopped.
#[test]
fn dumper_killed_at_any_moment_never_fails_a_live_connection() {
    let env = TestEnv::new("inet-killed-anywhen");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port().to_string();
    let mut v = Victim::spawn(&env, "inet", &["chatter", &port]);
    let (mut peer, _) = listener.accept().expect("accept");
    // A victim killed by a dump that finished closes its end in repair
    // mode, silently: the echo is ended from here.
    let peer_end = peer.try_clone().expect("clone the test's end");
    let stop_echo = move || {
        let _ = peer_end.shutdown(Shutdown::Both);
    };
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = peer.read(&mut buf) {
            if n == 0 || peer.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    v.wait_ready();
    let check = |round: &str| {
        assert!(
            v.result().is_none(),
            "{round}: the victim failed: {:?}",
            v.result()
        );
        assert!(
            v.ping(Duration::from_secs(10)),
            "{round}: the victim does not run (state {:?}): {}",
            proc_state(v.pid),
            v.diag()
        );
    };
    for (point, rounds, extra) in KILLED_AT {
        for round in 0..rounds {
            let mut args = vec!["--tcp-established"];
            args.extend_from_slice(extra);
            let out = faulty_dump_command(&env, &v, point, &args)
                .output()
                .expect("run ckpt");
            assert!(!out.status.success(), "the dumper was to die at {point}");
            let _ = std::fs::remove_dir_all(&env.img);
            check(&format!("killed at {point}, round {round}"));
        }
    }
    let pid = v.pid.to_string();
    for ms in KILLED_AFTER {
        let mut dumper = env
            .ckpt_command()
            .args(["dump", "--tree", &pid, "--dir", path_str(&env.img)])
            .args(["--tcp-established", "--kill"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run ckpt");
        std::thread::sleep(Duration::from_millis(ms));
        let _ = dumper.kill();
        let status = dumper.wait().expect("wait for ckpt");
        // The dump may have got as far as its `--kill` (after the commit)
        // before it was killed itself: the victim is gone with its
        // checkpoint, and the rest of the test has nothing left to run.
        let committed = env.img.join("manifest.img").exists();
        if status.success() || (committed && proc_state(v.pid).is_none_or(|s| s == 'Z')) {
            assert!(committed, "the victim was killed without a checkpoint");
            v.reap_killed(Duration::from_secs(10));
            // No restore comes for this checkpoint: its network lock goes
            // by hand (unless the guard of the killed dumper deleted it).
            unlock_by_hand(&format!("ckpt-{}", v.pid));
            stop_echo();
            echo.join().expect("echo thread");
            return;
        }
        let _ = std::fs::remove_dir_all(&env.img);
        check(&format!("killed after {ms} ms"));
    }
    v.go_and_pass();
    stop_echo();
    echo.join().expect("echo thread");
}

/// Bytes the test sends the `server` victim before the dump, and while
/// it is down (`SERVER_BEFORE`, `SERVER_GAP` in inet.c).
const SERVER_BEFORE: u64 = 1000;
const SERVER_GAP: u64 = 1500;
/// How long the test's segments go unanswered while the tree is down:
/// past the client's first retransmission timeouts (200 ms, doubling).
const DOWN_TIME: Duration = Duration::from_millis(1500);

/// The test as the `server` victim's outside client: connected, with the
/// bytes before the dump sent and the victim ready.
fn server_and_client(env: &TestEnv) -> (Victim, TcpStream) {
    let mut v = Victim::spawn(env, "inet", &["server"]);
    assert!(
        wait_for_file(&v.path("port"), Duration::from_secs(10)),
        "the victim never listened: {}",
        v.diag()
    );
    let port = read_to_string_lossy(&v.path("port"));
    let mut client = TcpStream::connect(format!("127.0.0.1:{}", port.trim())).expect("connect");
    let before: Vec<u8> = (0..SERVER_BEFORE).map(|i| stream_byte(0, i)).collect();
    client.write_all(&before).expect("send before the dump");
    v.wait_ready();
    (v, client)
}

/// The bytes of the stream the client sends while the tree is down.
fn gap_bytes() -> Vec<u8> {
    (SERVER_BEFORE..SERVER_BEFORE + SERVER_GAP)
        .map(|i| stream_byte(0, i))
        .collect()
}

/// Reads from the restored server the echo of what
/// [`send_while_down`] sent, and checks it byte for byte.
fn read_back_what_was_sent_while_down(client: &mut TcpStream) {
    client
        .set_read_timeout(Some(PUMP_TIMEOUT))
        .expect("read timeout");
    let mut back = vec![0u8; SERVER_GAP as usize];
    client
        .read_exact(&mut back)
        .expect("read back what was sent while the tree was down");
    assert!(
        back == gap_bytes(),
        "the restored server sent back other bytes"
    );
}

/// Sends the bytes of the gap while the victim is down, and gives the
/// kernel time to answer them (with a reset, were there no lock).
fn send_while_down(client: &mut TcpStream) {
    client
        .write_all(&gap_bytes())
        .expect("send while the tree is down");
    std::thread::sleep(DOWN_TIME);
}

/// The nftables tables ckpt's network lock has in place.
fn lock_tables() -> Vec<String> {
    lock_tables_in(None)
}

/// The same in the named network namespace `netns` (None: the test's).
fn lock_tables_in(netns: Option<&str>) -> Vec<String> {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = std::process::Command::new("ip");
            c.args(["netns", "exec", ns, "nft"]);
            c
        }
        None => std::process::Command::new("nft"),
    };
    let out = cmd
        .args(["list", "tables"])
        .output()
        .expect("run nft (scripts/test-deps.sh installs it)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("table inet "))
        .filter(|t| t.starts_with("ckpt-"))
        .map(str::to_string)
        .collect()
}

/// Deletes a network lock, if there, the way docs/usage.md tells a user.
fn unlock_by_hand(table: &str) {
    if lock_tables().iter().any(|t| t == table) {
        // It may go between the look and the delete (a dumper's guard).
        let _ = std::process::Command::new("nft")
            .args(["delete", "table", "inet", table])
            .stderr(std::process::Stdio::null())
            .status();
    }
    assert!(!lock_tables().iter().any(|t| t == table));
}

/// An outside client of a server dumped with --kill and restored keeps
/// its connection: what it sends while the server is down is dropped by
/// the network lock (no reset), retransmitted, and read by the restored
/// server, which sends it back; the restore deletes the lock.
#[test]
fn outside_client_of_a_killed_server_sees_a_delay_not_a_reset() {
    let env = TestEnv::new("inet-netlock");
    let (mut v, mut client) = server_and_client(&env);
    let table = format!("ckpt-{}", v.pid);
    dump(&env, &v, &["--tcp-established", "--kill"]);
    v.reap_killed(Duration::from_secs(10));
    assert!(
        lock_tables().contains(&table),
        "no lock table {table} after the dump: {:?}",
        lock_tables()
    );

    send_while_down(&mut client);
    client.set_nonblocking(true).expect("nonblocking");
    let mut probe = [0u8; 1];
    match client.read(&mut probe) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the client's connection while the tree is down: {other:?}"),
    }
    client.set_nonblocking(false).expect("blocking");

    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    assert!(
        !lock_tables().contains(&table),
        "the restore left the lock {table} in place"
    );
    v.go();
    read_back_what_was_sent_while_down(&mut client);
    finish_restore(&v, restore);
}

/// Without the lock the same client gets a reset: what the lock is for.
#[test]
fn outside_client_of_a_killed_server_is_reset_without_the_network_lock() {
    let env = TestEnv::new("inet-no-netlock");
    let (mut v, mut client) = server_and_client(&env);
    dump(
        &env,
        &v,
        &["--tcp-established", "--network-lock=none", "--kill"],
    );
    v.reap_killed(Duration::from_secs(10));
    assert!(
        !lock_tables().contains(&format!("ckpt-{}", v.pid)),
        "--network-lock=none put a lock in place"
    );
    send_while_down(&mut client);
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut probe = [0u8; 1];
    let got = client.read(&mut probe);
    assert!(
        matches!(&got, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "the client was not reset: {got:?}"
    );
}

/// Unread bytes of each end in the `halfclosed` and `shutout` victims
/// (`HALF_DATA` in inet.c).
const HALF_DATA: u64 = 3000;

/// A connection the victim shut down writing to the test, outside the
/// tree (FIN_WAIT2), dumped with --tcp-established and --kill: the test
/// sends while it is down, and the restored end is in FIN_WAIT2 again,
/// reads those bytes and then the test's FIN (checked by the victim).
#[test]
fn half_closed_connection_to_outside_comes_back_in_fin_wait2() {
    let env = TestEnv::new("inet-shutout");
    let listener = outside_listener();
    let port = listener.local_addr().expect("addr").port().to_string();
    let mut v = Victim::spawn(&env, "inet", &["shutout", &port]);
    let (mut end, _) = listener.accept().expect("accept");
    let mut got = Vec::new();
    end.read_to_end(&mut got)
        .expect("read the victim's bytes and FIN");
    let want: Vec<u8> = (0..HALF_DATA).map(|i| stream_byte(0, i)).collect();
    assert!(got == want, "the victim sent other bytes");
    v.wait_ready();
    dump(&env, &v, &["--tcp-established", "--kill"]);
    v.reap_killed(Duration::from_secs(10));

    let data: Vec<u8> = (0..HALF_DATA).map(|i| stream_byte(1, i)).collect();
    end.write_all(&data).expect("send while the victim is down");
    let restore = spawn_restore(&env, &[]);
    v.go();
    end.shutdown(Shutdown::Write).expect("shutdown");
    finish_restore(&v, restore);
}

/// A connection the peer outside the tree closed, with bytes the victim
/// has not read (CLOSE_WAIT: "closed by the peer with unread data"):
/// refused by name without --tcp-established; with it, killed and
/// restored, the victim is in CLOSE_WAIT again, reads its bytes and then
/// the end of the stream, and still writes (the peer's FIN is given back
/// through the network lock).
#[test]
fn close_wait_to_outside_comes_back_with_unread_bytes_then_eof() {
    close_wait_to_outside("inet-close-wait-outside", "v4", "127.0.0.1");
}

/// The same over IPv6.
#[test]
fn close_wait_to_outside_over_ipv6_comes_back_too() {
    close_wait_to_outside("inet-close-wait-outside-v6", "v6", "[::1]");
}

fn close_wait_to_outside(test: &str, family: &str, host: &str) {
    let env = TestEnv::new(test);
    let mut v = Victim::spawn(&env, "inet", &["closedby", family]);
    assert!(
        wait_for_file(&v.path("port"), Duration::from_secs(10)),
        "the victim never listened: {}",
        v.diag()
    );
    let port = read_to_string_lossy(&v.path("port"));
    let mut client = TcpStream::connect(format!("{host}:{}", port.trim())).expect("connect");
    let before: Vec<u8> = (0..SERVER_BEFORE).map(|i| stream_byte(0, i)).collect();
    client.write_all(&before).expect("send");
    client.shutdown(Shutdown::Write).expect("shutdown");
    v.wait_ready();

    let out = dump_outcome(&env, &v, &[]);
    out.assert_error();
    assert!(
        out.stderr
            .lines()
            .any(|l| l.contains(&format!("pid {}", v.pid))
                && l.contains("in state CLOSE_WAIT to a peer outside the tree")
                && l.contains("--tcp-established")),
        "no line names the CLOSE_WAIT connection:\n{}",
        out.stderr
    );
    assert!(!env.img.exists(), "a refused dump leaves no checkpoint");

    dump(&env, &v, &["--tcp-established", "--kill"]);
    v.reap_killed(Duration::from_secs(10));
    let restore = spawn_restore(&env, &[]);
    v.go();
    client
        .set_read_timeout(Some(PUMP_TIMEOUT))
        .expect("read timeout");
    let mut bye = Vec::new();
    client.read_to_end(&mut bye).expect("read the victim's bye");
    assert_eq!(bye, b"bye", "the victim wrote in CLOSE_WAIT");
    finish_restore(&v, restore);
}

/// Runs `f` on a thread in the network namespace `/run/netns/NAME`: a
/// socket it creates stays in that namespace.
fn in_netns<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{name}");
    std::thread::spawn(move || {
        let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // SAFETY: setns on an fd this thread owns; it moves only this thread.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("thread in the namespace")
}

/// A server in a network namespace of its own: the lock goes into that
/// namespace, where its client's segments pass (one in ckpt's own would
/// never see them, and the client would be reset).
#[test]
fn network_lock_goes_into_the_trees_network_namespace() {
    let env = TestEnv::new("inet-netlock-netns");
    let nodes = NetNodes::new("nlk", 1);
    let ns = nodes.names[0].clone();
    let mut v = Victim::spawn_in_netns(&env, "inet", &["server"], &ns);
    assert!(
        wait_for_file(&v.path("port"), Duration::from_secs(10)),
        "the victim never listened: {}",
        v.diag()
    );
    let addr = format!("127.0.0.1:{}", read_to_string_lossy(&v.path("port")).trim());
    let mut client = in_netns(&ns, move || TcpStream::connect(addr).expect("connect"));
    let before: Vec<u8> = (0..SERVER_BEFORE).map(|i| stream_byte(0, i)).collect();
    client.write_all(&before).expect("send before the dump");
    v.wait_ready();
    let table = format!("ckpt-{}", v.pid);
    dump(&env, &v, &["--tcp-established", "--kill"]);
    v.reap_killed(Duration::from_secs(10));
    assert!(
        lock_tables_in(Some(&ns)).contains(&table) && !lock_tables().contains(&table),
        "the lock {table} is not in the tree's namespace only"
    );

    send_while_down(&mut client);
    let ns_path = format!("/run/netns/{ns}");
    let mut restore = spawn_restore(&env, &["--netns", &ns_path]);
    wait_restored_and_running(&v, &mut restore);
    assert!(
        !lock_tables_in(Some(&ns)).contains(&table),
        "the restore left the lock {table} in place"
    );
    v.go();
    read_back_what_was_sent_while_down(&mut client);
    finish_restore(&v, restore);
}

/// UDP sockets come back shut down as they were (one way, both ways, even
/// unconnected), a corked one with nothing pending keeps its cork, and
/// UDP-Lite sockets come back with their checksum coverage (victim:
/// tests/c/dgram.c).
#[test]
fn udp_shutdown_cork_and_udplite_come_back() {
    let env = TestEnv::new("inet-udpshut");
    let mut v = Victim::spawn_as(&env, "dgram", &["udpshut"], test_user());
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let objects = inet_objects(&env);
    for want in [
        "shut down for reading",
        "shut down for writing",
        "udp6 connected",
        "udplite4 connected",
        "udplite6 connected",
    ] {
        assert!(
            objects.iter().any(|o| o.contains(want)),
            "{want}: {objects:?}"
        );
    }
    restore_and_check(&env, &v);
}

/// A UDP socket holding back the start of a datagram (UDP_CORK, MSG_MORE)
/// is refused by name, and the tree goes on and sends it whole.
#[test]
fn corked_udp_with_data_pending_is_refused_by_name() {
    for how in [&["udpcork"][..], &["udpcork", "more"][..]] {
        let env = TestEnv::new("inet-udpcork");
        let mut v = Victim::spawn(&env, "dgram", how);
        v.wait_ready();
        let out = dump_outcome(&env, &v, &["--kill"]);
        out.assert_error();
        assert!(
            out.stderr
                .lines()
                .any(|l| l.contains(&format!("pid {}", v.pid))
                    && l.contains("fd ")
                    && l.contains("corked UDP socket 127.0.0.1:")),
            "{how:?}: no line naming pid, fd and the corked socket:\n{}",
            out.stderr
        );
        assert!(!env.img.exists(), "a refused dump leaves no checkpoint");
        v.assert_unharmed_and_passes("after a refused dump");
    }
}

/// Lets every group open ICMP ping sockets while it lives (root only),
/// then puts the range back.
struct PingGroups {
    was: String,
}

const PING_GROUP_RANGE: &str = "/proc/sys/net/ipv4/ping_group_range";

impl PingGroups {
    fn open_to_all() -> PingGroups {
        let was = read_to_string_lossy(std::path::Path::new(PING_GROUP_RANGE));
        std::fs::write(PING_GROUP_RANGE, "0 2147483647").expect("set ping_group_range");
        PingGroups { was }
    }
}

impl Drop for PingGroups {
    fn drop(&mut self) {
        let _ = std::fs::write(PING_GROUP_RANGE, self.was.trim());
    }
}

/// ICMP ping sockets (v4 bound and connected, v6 connected) come back with
/// their echo identifiers, options and destinations: an echo sent after
/// the restore with send() is answered to the same identifier.
#[test]
fn ping_sockets_come_back_with_their_identifiers() {
    let _groups = PingGroups::open_to_all();
    let env = TestEnv::new("inet-ping");
    let mut v = Victim::spawn(&env, "dgram", &["ping"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let objects = inet_objects(&env);
    assert_eq!(
        objects
            .iter()
            .filter(|o| o.starts_with("ping4 connected 127.0.0.1:")
                || o.starts_with("ping6 connected [::"))
            .count(),
        2,
        "{objects:?}"
    );
    restore_and_check(&env, &v);
}
