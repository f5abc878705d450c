//! A rank's connection to its PMIx server outside the tree (slurmstepd
//! under `srun --mpi=pmix`), dumped with `--pmix-reconnect` and restored as
//! a new connection to the server of the restoring task's own environment,
//! handshaken as the rank (victim: tests/c/pmix_link.c, a PMIx client
//! reduced to its link; the servers are this test's, speaking the PMIx 4
//! handshake and answering one finalize request). The real server and a
//! real libpmix are `tests/slurm_pmix.rs`'s, in the Slurm lab.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::common::*;

/// The rank's namespace, as Slurm names a step's.
const NSPACE: &str = "slurm.pmix.77.0";
/// Another step of the same job.
const OTHER_STEP: &str = "slurm.pmix.77.1";
/// The victim's rank.
const RANK: &str = "0";
/// PMIx_Finalize's command, after the count of one value libpmix packs.
const FINALIZE_BODY: [u8; 2] = [2, 5];
/// A success status, packed the same way.
const SUCCESS_BODY: [u8; 2] = [2, 0];
/// The index the restore's server gives its client (the old server's was
/// 0: the client must not depend on it).
const NEW_INDEX: u32 = 5;
const SERVER_TIMEOUT: Duration = Duration::from_secs(60);

/// What a server saw of its one client.
#[derive(Debug)]
struct Seen {
    nspace: String,
    rank: u32,
    uid: u32,
    finalized: bool,
}

/// A NUL-terminated string of `b` at `at`.
fn string_at(b: &[u8], at: &mut usize) -> String {
    let end = b[*at..]
        .iter()
        .position(|&c| c == 0)
        .map_or(b.len(), |p| p + *at);
    let s = String::from_utf8_lossy(&b[*at..end]).into_owned();
    *at = end + 1;
    s
}

/// Reads a connect message and returns who connected.
fn read_handshake(s: &mut TcpStream) -> Seen {
    let mut header = [0u8; 16];
    s.read_exact(&mut header).expect("handshake header");
    let n = u32::from_ne_bytes(header[8..12].try_into().unwrap()) as usize;
    let mut body = vec![0u8; n];
    s.read_exact(&mut body).expect("handshake body");
    let mut at = 0;
    assert_eq!(string_at(&body, &mut at), "native");
    let cred = u32::from_be_bytes(body[at..at + 4].try_into().unwrap()) as usize;
    at += 4;
    let uid = u32::from_ne_bytes(body[at..at + 4].try_into().unwrap());
    at += cred;
    assert_eq!(body[at], 0, "a simple client");
    at += 1;
    let nspace = string_at(&body, &mut at);
    let rank = u32::from_be_bytes(body[at..at + 4].try_into().unwrap());
    Seen {
        nspace,
        rank,
        uid,
        finalized: false,
    }
}

/// A PMIx server for one client: accepts it, answers its handshake with
/// `index`, then (with `finalize`) answers its finalize request, and holds
/// the connection until the client closes it.
fn server(index: u32, finalize: bool) -> (String, JoinHandle<Seen>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a server");
    let uri = format!(
        "pmix-server.{};tcp4://{}",
        std::process::id(),
        l.local_addr().unwrap()
    );
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(l.accept().map(|(s, _)| s));
    });
    let t = std::thread::spawn(move || {
        let mut s = rx
            .recv_timeout(SERVER_TIMEOUT)
            .expect("no client connected")
            .expect("accept");
        let mut seen = read_handshake(&mut s);
        s.write_all(&0u32.to_be_bytes()).unwrap();
        s.write_all(&index.to_be_bytes()).unwrap();
        if finalize {
            s.set_read_timeout(Some(SERVER_TIMEOUT)).unwrap();
            let mut header = [0u8; 16];
            s.read_exact(&mut header).expect("request header");
            let tag = u32::from_be_bytes(header[4..8].try_into().unwrap());
            let n = u32::from_be_bytes(header[8..12].try_into().unwrap()) as usize;
            let mut body = vec![0u8; n];
            s.read_exact(&mut body).expect("request body");
            assert_eq!(body, FINALIZE_BODY, "a finalize request");
            for word in [index, tag, SUCCESS_BODY.len() as u32, 0] {
                s.write_all(&word.to_be_bytes()).unwrap();
            }
            s.write_all(&SUCCESS_BODY).unwrap();
            seen.finalized = true;
        }
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        seen
    });
    (uri, t)
}

#[test]
fn pmix_link_is_refused_then_dumped_with_pmix_reconnect_and_reconnected_at_restore() {
    let env = TestEnv::new("pmix-link");
    let (old_uri, old) = server(0, false);
    let mut v = Victim::spawn(&env, "pmix_link", &[&old_uri, NSPACE, RANK]);
    v.wait_ready();

    let refused = dump_expect_error(&env, &v);
    assert!(
        refused.contains("a rank of srun --mpi=pmix"),
        "without --pmix-reconnect: {refused}"
    );
    dump(&env, &v, &["--pmix-reconnect", "--kill"]);
    v.reap_killed(Duration::from_secs(10));
    let seen = old.join().expect("the old server");
    assert_eq!((seen.nspace.as_str(), seen.rank), (NSPACE, 0));

    let (new_uri, new) = server(NEW_INDEX, true);
    let step = |nspace: &str| {
        [
            ("PMIX_SERVER_URI4", new_uri.clone()),
            ("PMIX_NAMESPACE", nspace.to_string()),
            ("PMIX_RANK", RANK.to_string()),
        ]
    };
    let restore_in = |vars: &[(&str, String)]| {
        let vars: Vec<(&str, &Path)> = vars.iter().map(|(k, v)| (*k, Path::new(v))).collect();
        CkptCmd::spawn_with_env(&env, &["restore", "--dir", path_str(&env.img)], &vars)
    };
    // A task of another step has another namespace: refused before any
    // process is made, naming both.
    let wrong = restore_in(&step(OTHER_STEP))
        .wait(Duration::from_secs(60))
        .assert_error();
    assert!(
        wrong.contains(&format!("rank 0 of {OTHER_STEP}"))
            && wrong.contains(&format!("rank 0 of {NSPACE}")),
        "{wrong}"
    );
    let restore = restore_in(&step(NSPACE));
    v.go();
    finish_restore(&v, restore);
    let seen = new.join().expect("the new server");
    assert_eq!((seen.nspace.as_str(), seen.rank), (NSPACE, 0));
    assert_eq!(seen.uid, nix::unistd::geteuid().as_raw(), "the rank's uid");
    assert!(
        seen.finalized,
        "the restored rank finalized over the new link"
    );
}
