//! Ranks of `srun --mpi=pmix`, refused by name before anything is frozen.
//!
//! Under direct launch each rank's PMIx server is Slurm's slurmstepd: the
//! rank holds a TCP connection to it (the address of its
//! `PMIX_SERVER_URI*`), maps the server's dstore files and inherits its
//! listening socket. None of it is in the dumped tree, it all ends with the
//! job step, and a PMIx client cannot reconnect to another server. A rank
//! is told so, with the launch that works instead, rather than failing on
//! one of those resources later with a less helpful reason.
//!
//! The environment alone is not enough: a process started by `srun
//! --mpi=pmix` that never called `PMIx_Init` (e.g. `ckpt run` itself) holds
//! the variables but no connection, and nothing ties it to slurmstepd.
//!
//! A restored rank's environment still names the server it had when it
//! started: its new connection (to the server of the step that restored
//! it) is told by the other end, a listening socket of a slurmstepd.
//!
//! With [`FreezeOptions::pmix_reconnect`](crate::FreezeOptions) a rank is
//! dumped instead: its connection to the server is saved as a
//! [`PmixLink`] (`fd/inet.rs`), which a restore in a new step of the same
//! job replaces by a new connection to that step's server.

use std::net::SocketAddr;

use ckpt_image::fd::inet::PmixLink;

use crate::error::{DumpError, Result};
use crate::fd::inet;
use crate::procfile;

/// The namespace prefix Slurm's `mpi/pmix` plugin gives every job step
/// (`slurm.pmix.<job>.<step>`).
const SLURM_NAMESPACE_PREFIX: &str = "slurm.pmix.";

/// The name of the process that hosts Slurm's PMIx servers.
const SLURMSTEPD: &str = "slurmstepd";
/// `/proc/net/tcp`'s state of a listening socket.
const TCP_LISTEN_HEX: &str = "0A";

/// Every version of the server URI variable (`PMIX_SERVER_URI`, `...2`,
/// `...21`, `...3`, `...4`, `...41`) starts so.
const SERVER_URI_PREFIX: &str = "PMIX_SERVER_URI";

/// The PMIx server a process was started to talk to, as its environment
/// says.
#[derive(Debug, Default, PartialEq, Eq)]
struct SlurmPmixServer {
    /// The server's pid (the `pmix-server.<pid>` of its URIs).
    pid: Option<i32>,
    /// The TCP addresses its URIs name.
    addrs: Vec<SocketAddr>,
    /// The client's namespace (`PMIX_NAMESPACE`).
    nspace: String,
    /// The client's rank (`PMIX_RANK`), if the environment says.
    rank: Option<u32>,
}

/// The server named by an environment (`/proc/PID/environ`, NUL-separated
/// `KEY=VALUE`), if its PMIx namespace is one of Slurm's.
fn server_of(environ: &[u8]) -> Option<SlurmPmixServer> {
    let mut slurm = false;
    let mut server = SlurmPmixServer::default();
    for var in environ.split(|&b| b == 0) {
        let var = String::from_utf8_lossy(var);
        let Some((key, value)) = var.split_once('=') else {
            continue;
        };
        if key == "PMIX_NAMESPACE" {
            slurm = value.starts_with(SLURM_NAMESPACE_PREFIX);
            server.nspace = value.to_string();
        } else if key == "PMIX_RANK" {
            server.rank = value.parse().ok();
        } else if key.starts_with(SERVER_URI_PREFIX) {
            parse_uri(value, &mut server);
        }
    }
    (slurm && !server.addrs.is_empty()).then_some(server)
}

/// Adds what a server URI says to `server`: `pmix-server.<pid>;tcp4://<ip>:<port>`
/// (or `tcp6://[<ip>]:<port>`). Other transports have no TCP address.
fn parse_uri(uri: &str, server: &mut SlurmPmixServer) {
    let Some((name, addr)) = uri.split_once(';') else {
        return;
    };
    if let Some(pid) = name
        .rsplit_once('.')
        .and_then(|(_, pid)| pid.parse::<i32>().ok())
    {
        server.pid = Some(pid);
    }
    let Some(addr) = addr
        .strip_prefix("tcp4://")
        .or_else(|| addr.strip_prefix("tcp6://"))
        .and_then(|a| a.parse::<SocketAddr>().ok())
    else {
        return;
    };
    if !server.addrs.contains(&addr) {
        server.addrs.push(addr);
    }
}

/// Whether `peer`, the other end of a connection of `pid`, is its PMIx
/// server: the one its environment names, or (a restored rank, connected
/// to the server of the step that restored it) a listening socket of a
/// slurmstepd.
fn is_server(pid: i32, server: &SlurmPmixServer, peer: SocketAddr) -> bool {
    server.addrs.contains(&peer)
        || listener_inode(pid, peer)
            .and_then(owner_of_socket)
            .is_some_and(|owner| {
                procfile::read(owner, "comm").is_ok_and(|c| c.trim() == SLURMSTEPD)
            })
}

/// The inode of the IPv4 listening TCP socket bound to `addr`, in the
/// network namespace of `pid` (`/proc/PID/net/tcp`).
fn listener_inode(pid: i32, addr: SocketAddr) -> Option<u64> {
    let SocketAddr::V4(addr) = addr else {
        return None;
    };
    let table = procfile::read(pid, "net/tcp").ok()?;
    // "sl local rem st ... inode": the address as the kernel's
    // little-endian hex word and the port in hex.
    let want = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(addr.ip().octets()),
        addr.port()
    );
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 9 && f[1] == want && f[3] == TCP_LISTEN_HEX)
            .then(|| f[9].parse().ok())
            .flatten()
    })
}

/// A process holding socket `inode` (any of them).
fn owner_of_socket(inode: u64) -> Option<i32> {
    let link = format!("socket:[{inode}]");
    let pids = std::fs::read_dir("/proc").ok()?;
    pids.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|&pid| {
            procfile::numbered_entries(pid, "fd").is_ok_and(|fds| {
                fds.iter()
                    .any(|fd| procfile::readlink(pid, &format!("fd/{fd}")).is_ok_and(|l| l == link))
            })
        })
}

/// Whether `pid` is `root` or one of its descendants (by the parent links
/// of `/proc/PID/stat`; a pid that vanished is not).
fn in_tree(pid: i32, root: i32) -> bool {
    let mut at = pid;
    // Parent links end at pid 1 or at 0 (outside our PID namespace).
    while at > 1 {
        if at == root {
            return true;
        }
        at = match procfile::stat_fields(at) {
            Ok(f) => f.get(procfile::stat_index(4)).copied().unwrap_or(0) as i32,
            Err(_) => return false,
        };
    }
    at == root
}

/// The identity `pid` connected to its Slurm PMIx server with, if `peer`
/// (the other end of one of its TCP connections) is that server; `uid`
/// and `gid` are the process's effective ids.
pub(crate) fn link_to(pid: i32, peer: SocketAddr, uid: u32, gid: u32) -> Option<PmixLink> {
    let environ = procfile::read_bytes(pid, "environ").ok()?;
    let server = server_of(&environ)?;
    if !is_server(pid, &server, peer) {
        return None;
    }
    Some(PmixLink {
        nspace: server.nspace,
        rank: server.rank?,
        uid,
        gid,
    })
}

/// Refuses `pid` if it is a rank of `srun --mpi=pmix` connected to its
/// server, and that server is not in the tree of `root`, unless
/// `reconnect` (the connection is then saved as a [`PmixLink`]).
pub(crate) fn refuse_rank(pid: i32, root: i32, reconnect: bool) -> Result<()> {
    // Another user's environment may not be readable; the seize decides
    // about such a process, with its own error.
    let Ok(environ) = procfile::read_bytes(pid, "environ") else {
        return Ok(());
    };
    let Some(server) = server_of(&environ) else {
        return Ok(());
    };
    if server.pid.is_some_and(|s| in_tree(s, root)) {
        return Ok(());
    }
    let connected = inet::established_peers(pid)?
        .into_iter()
        .find(|c| is_server(pid, &server, c.peer));
    match connected {
        Some(c) if reconnect => {
            log::info!(
                "pid {pid}: a rank of srun --mpi=pmix (namespace {}): its connection to slurmstepd on fd {} is saved for a reconnect at restore",
                server.nspace,
                c.fd
            );
            Ok(())
        }
        Some(c) => Err(DumpError::SrunPmixRank {
            pid,
            fd: c.fd,
            server: server.pid,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn environ(vars: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for v in vars {
            out.extend_from_slice(v.as_bytes());
            out.push(0);
        }
        out
    }

    #[test]
    fn a_slurm_step_namespace_with_tcp_uris_names_its_server() {
        let env = environ(&[
            "PATH=/usr/bin",
            "PMIX_NAMESPACE=slurm.pmix.42.0",
            "PMIX_RANK=1",
            "PMIX_SERVER_URI4=pmix-server.3120;tcp4://127.0.0.1:40001",
            "PMIX_SERVER_URI41=pmix-server.3120;tcp4://127.0.0.1:40001",
            "PMIX_SERVER_URI3=pmix-server.3120;tcp6://[::1]:40002",
            "PMIX_SERVER_URI=pmix-server:3120:/var/spool/slurmd/pmix.42.0/pmix-3120",
        ]);
        assert_eq!(
            server_of(&env),
            Some(SlurmPmixServer {
                pid: Some(3120),
                addrs: vec![
                    "127.0.0.1:40001".parse().unwrap(),
                    "[::1]:40002".parse().unwrap()
                ],
                nspace: "slurm.pmix.42.0".into(),
                rank: Some(1),
            })
        );
    }

    #[test]
    fn another_servers_namespace_or_no_tcp_uri_is_not_slurms() {
        // mpirun's own server (inside the job) names its namespace otherwise.
        let ompi = environ(&[
            "PMIX_NAMESPACE=2795044865",
            "PMIX_SERVER_URI4=pmix-server.77;tcp4://127.0.0.1:40001",
        ]);
        assert_eq!(server_of(&ompi), None);
        let no_tcp = environ(&[
            "PMIX_NAMESPACE=slurm.pmix.42.0",
            "PMIX_SERVER_URI=pmix-server:3120:/var/spool/slurmd/pmix-3120",
        ]);
        assert_eq!(server_of(&no_tcp), None);
        assert_eq!(server_of(&environ(&["HOME=/root"])), None);
    }

    #[test]
    fn a_listening_socket_is_found_with_its_owner_by_address() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let me = std::process::id() as i32;
        let inode = listener_inode(me, addr).expect("the listener in /proc/net/tcp");
        assert_eq!(owner_of_socket(inode), Some(me));
        // A connected socket's address is no listener's.
        let c = std::net::TcpStream::connect(addr).unwrap();
        assert_eq!(listener_inode(me, c.local_addr().unwrap()), None);
        let server = SlurmPmixServer::default();
        assert!(!is_server(me, &server, addr), "this test is no slurmstepd");
    }

    #[test]
    fn the_process_itself_and_its_ancestors_chain() {
        let me = std::process::id() as i32;
        assert!(in_tree(me, me));
        assert!(!in_tree(1, me), "init is not below this process");
    }
}
