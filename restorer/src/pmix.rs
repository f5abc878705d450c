//! The client side of a PMIx (4.x) server connection: the handshake a rank
//! of `srun --mpi=pmix` performs once, in `PMIx_Init`, with the PMIx server
//! of its job step (Slurm's `mpi/pmix` plugin, inside slurmstepd), done on
//! the rank's behalf against the server of another step.
//!
//! Why: a restored rank's library keeps everything it learnt at
//! `PMIx_Init` (its namespace and rank, the job's data, the modex values it
//! read) and talks to its server over one TCP socket. The old server is
//! gone with its step; a step started for the restore with the same job id
//! and step id (`slurm.pmix.<job>.<step>`: Slurm numbers a requeued job's
//! steps from 0 again) registers the same namespace and the rank on the
//! same node, and accepts a new connection of that rank. Once the
//! handshake is done the connected socket can stand where the rank's old
//! one was, and the library goes on with it as with the old one.
//!
//! The protocol (openpmix `ptl/base`, client and server halves of the
//! connect handshake), for a simple client over TCP:
//!
//! - the client sends a header of four host-order 32-bit words
//!   (`pindex` = -1, `tag` = all ones, the byte count of what follows,
//!   padding), then: the name of its security module, NUL-terminated; the
//!   credential's length (network order) and bytes; a type byte (0, a
//!   client started by the server's host); its namespace, NUL-terminated,
//!   and rank (network order); its PMIx version, NUL-terminated; its
//!   buffer-operations module, NUL-terminated; the buffer type byte; and
//!   its data-store module, NUL-terminated;
//! - the server answers a status (network order, 0 for success) and then
//!   the client's index in its table of clients (network order), or closes
//!   the connection if it does not know the namespace or rank or refuses
//!   the credential.
//!
//! What is sent is what libpmix 4.x sends for a client whose data store is
//! `hash` (`PMIX_MCA_gds=hash`: no shared-memory data store of the server
//! mapped into the rank, nothing the rank holds belongs to the old step),
//! with the `native` security module: over TCP its credential is the
//! client's effective uid and gid, in host order, which the server compares
//! with those it registered for the rank. It carries no privilege: it is
//! what the rank itself would send, for the uid and gid it runs as.
//!
//! The server ignores the index in later headers (it knows its clients by
//! their socket), so the rank's cached index from its first server does no
//! harm.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The security module whose credential is the client's uid and gid.
const NATIVE_SECURITY: &str = "native";
/// The handshake's type byte of a client started by the server's host.
const SIMPLE_CLIENT: u8 = 0;
/// The version of the handshake's layout (PMIx 4.x; 2.0 ended it earlier).
const CLIENT_VERSION: &str = "4.2.2";
/// The buffer-operations module of PMIx 4.1 and later.
const BUFFER_OPS: &str = "v41";
/// Buffers without type descriptions (`PMIX_BFROP_BUFFER_NON_DESC`), the
/// type of every non-debug build.
const BUFFER_NON_DESCRIBED: u8 = 1;
/// The data store kept in the client's own memory.
const HASH_DATA_STORE: &str = "hash";
/// The header's `pindex` for a client that has none yet.
const NO_INDEX: i32 = -1;
/// The header's tag for a handshake.
const HANDSHAKE_TAG: u32 = u32::MAX;
/// PMIx's `PMIX_SUCCESS`.
const PMIX_SUCCESS: i32 = 0;
/// How long the server may take to answer (libpmix's own default wait).
const REPLY_TIMEOUT: Duration = Duration::from_secs(4);

/// Which URI variables name a TCP server, newest protocol first.
const SERVER_URI_VARS: [&str; 5] = [
    "PMIX_SERVER_URI41",
    "PMIX_SERVER_URI4",
    "PMIX_SERVER_URI3",
    "PMIX_SERVER_URI21",
    "PMIX_SERVER_URI2",
];

/// Why a connection to a PMIx server failed.
#[derive(Debug, thiserror::Error)]
pub enum PmixError {
    /// A URI names no TCP address this client can reach.
    #[error(
        "PMIx server URI {uri:?}: not pmix-server.<pid>;tcp4://<ip>:<port> or tcp6://[<ip>]:<port>"
    )]
    BadUri {
        /// The URI as given.
        uri: String,
    },
    /// The environment names no server or no client identity.
    #[error("the environment has no {var}: not a task of a job step with a PMIx server")]
    MissingVar {
        /// The variable missing.
        var: &'static str,
    },
    /// The step serves another rank than the one restored.
    #[error(
        "this step's task is rank {here_rank} of {here_nspace}, the image holds rank {rank} of {nspace}: restore in the requeued job's first step, with the task layout of the dumped one"
    )]
    OtherRank {
        /// The namespace the image holds.
        nspace: String,
        /// The rank the image holds.
        rank: u32,
        /// The namespace of the restoring task.
        here_nspace: String,
        /// The rank of the restoring task.
        here_rank: u32,
    },
    /// A socket operation with the server failed.
    #[error("PMIx server {server}: {what}: {source}")]
    Io {
        /// The server's address.
        server: SocketAddr,
        /// What was being done.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The server closed the connection instead of answering: it does not
    /// know the namespace or the rank, or refused the credential.
    #[error(
        "PMIx server {server} closed the connection of {nspace} rank {rank}: it does not serve that rank (another job step or node) or refused uid {uid}"
    )]
    NotServed {
        /// The server's address.
        server: SocketAddr,
        /// The namespace asked for.
        nspace: String,
        /// The rank asked for.
        rank: u32,
        /// The uid sent.
        uid: u32,
    },
    /// The server answered with an error status.
    #[error("PMIx server {server} refused {nspace} rank {rank}: PMIx status {status}")]
    Refused {
        /// The server's address.
        server: SocketAddr,
        /// The namespace asked for.
        nspace: String,
        /// The rank asked for.
        rank: u32,
        /// The status it answered.
        status: i32,
    },
}

/// Result of this module.
pub type Result<T> = std::result::Result<T, PmixError>;

/// The identity a client connects as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmixClient {
    /// Its namespace (`slurm.pmix.<job>.<step>` under Slurm).
    pub nspace: String,
    /// Its rank in the namespace.
    pub rank: u32,
    /// The effective uid it runs as.
    pub uid: u32,
    /// The effective gid it runs as.
    pub gid: u32,
}

/// A server's place in the environment of its clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmixServer {
    /// Its pid (the `pmix-server.<pid>` of its URI).
    pub pid: Option<i32>,
    /// Its TCP address.
    pub addr: SocketAddr,
}

/// A connection the server accepted.
#[derive(Debug)]
pub struct Connected {
    /// The connected socket, blocking, without timeouts.
    pub stream: TcpStream,
    /// The client's index in the server's table of clients.
    pub index: u32,
}

impl PmixServer {
    /// Parses `pmix-server.<pid>;tcp4://<ip>:<port>` (or `tcp6://[<ip>]:<port>`).
    pub fn from_uri(uri: &str) -> Result<PmixServer> {
        let bad = || PmixError::BadUri {
            uri: uri.to_string(),
        };
        let (name, addr) = uri.split_once(';').ok_or_else(bad)?;
        let pid = name
            .rsplit_once('.')
            .and_then(|(_, pid)| pid.parse::<i32>().ok());
        let addr = addr
            .strip_prefix("tcp4://")
            .or_else(|| addr.strip_prefix("tcp6://"))
            .and_then(|a| a.parse::<SocketAddr>().ok())
            .ok_or_else(bad)?;
        Ok(PmixServer { pid, addr })
    }

    /// The server and the client identity an environment names
    /// (`PMIX_SERVER_URI*`, `PMIX_NAMESPACE`, `PMIX_RANK`), as a job
    /// step's task holds them; `uid` and `gid` are the client's.
    pub fn from_env<'a>(
        vars: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
        uid: u32,
        gid: u32,
    ) -> Result<(PmixServer, PmixClient)> {
        let get = |key: &str| {
            vars.clone()
                .into_iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v)
        };
        let uri = SERVER_URI_VARS
            .iter()
            .find_map(|v| get(v))
            .ok_or(PmixError::MissingVar {
                var: "PMIX_SERVER_URI4",
            })?;
        let server = PmixServer::from_uri(uri)?;
        let nspace = get("PMIX_NAMESPACE").ok_or(PmixError::MissingVar {
            var: "PMIX_NAMESPACE",
        })?;
        let rank = get("PMIX_RANK")
            .and_then(|r| r.parse::<u32>().ok())
            .ok_or(PmixError::MissingVar { var: "PMIX_RANK" })?;
        let client = PmixClient {
            nspace: nspace.to_string(),
            rank,
            uid,
            gid,
        };
        Ok((server, client))
    }

    /// Connects to the server as `client` and performs the handshake.
    pub fn connect(&self, client: &PmixClient) -> Result<Connected> {
        let server = self.addr;
        let io = |what: &'static str| {
            move |source| PmixError::Io {
                server,
                what,
                source,
            }
        };
        let mut stream = TcpStream::connect(server).map_err(io("connect"))?;
        let index = handshake(&mut stream, server, client)?;
        Ok(Connected { stream, index })
    }
}

/// The PMIx variables (`PMIX_*`) of the job step a restore runs in: what
/// slurmstepd gave the task that runs the restore. Taken from the process
/// that asked for the restore, which is not the restorer itself when a
/// service restores for a user.
#[derive(Debug, Clone, Default)]
pub struct StepEnv {
    vars: Vec<(String, String)>,
}

impl StepEnv {
    /// The PMIx variables of this process's environment.
    pub fn of_this_process() -> StepEnv {
        StepEnv::from_vars(std::env::vars_os())
    }

    /// The PMIx variables among `vars` (others, and any not UTF-8, are
    /// left out).
    pub fn from_vars(
        vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    ) -> StepEnv {
        let vars = vars
            .into_iter()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .filter(|(k, _)| k.starts_with("PMIX_"))
            .collect();
        StepEnv { vars }
    }

    /// The server of this step, checked to serve `client`'s namespace and
    /// rank.
    pub fn server_for(&self, client: &PmixClient) -> Result<PmixServer> {
        let (server, here) = PmixServer::from_env(
            self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            client.uid,
            client.gid,
        )?;
        same_rank(client, &here)?;
        Ok(server)
    }
}

/// Refuses a restoring task (`here`) that is not the rank restored.
fn same_rank(client: &PmixClient, here: &PmixClient) -> Result<()> {
    if here.nspace != client.nspace || here.rank != client.rank {
        return Err(PmixError::OtherRank {
            nspace: client.nspace.clone(),
            rank: client.rank,
            here_nspace: here.nspace.clone(),
            here_rank: here.rank,
        });
    }
    Ok(())
}

/// Performs the handshake on `stream`, connected to `server`: returns the
/// client's index in the server's table.
pub fn handshake(stream: &mut TcpStream, server: SocketAddr, client: &PmixClient) -> Result<u32> {
    let io = |what: &'static str| {
        move |source| PmixError::Io {
            server,
            what,
            source,
        }
    };
    stream
        .set_read_timeout(Some(REPLY_TIMEOUT))
        .map_err(io("set a reply timeout"))?;
    stream
        .write_all(&connect_message(client))
        .map_err(io("send the connect message"))?;
    let status = match read_word(stream) {
        Ok(w) => w as i32,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(PmixError::NotServed {
                server,
                nspace: client.nspace.clone(),
                rank: client.rank,
                uid: client.uid,
            });
        }
        Err(e) => return Err(io("read the connect status")(e)),
    };
    // PMIX_ERR_READY_FOR_HANDSHAKE asks for the exchange of a security
    // module other than the one sent, as much a refusal here as any error.
    if status != PMIX_SUCCESS {
        return Err(PmixError::Refused {
            server,
            nspace: client.nspace.clone(),
            rank: client.rank,
            status,
        });
    }
    let index = read_word(stream).map_err(io("read the client index"))?;
    stream
        .set_read_timeout(None)
        .map_err(io("clear the reply timeout"))?;
    Ok(index)
}

/// One network-order 32-bit word.
fn read_word(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

/// The connect message of `client`: header and body.
pub fn connect_message(client: &PmixClient) -> Vec<u8> {
    let mut body = Vec::new();
    let string = |body: &mut Vec<u8>, s: &str| {
        body.extend_from_slice(s.as_bytes());
        body.push(0);
    };
    string(&mut body, NATIVE_SECURITY);
    // native's TCP credential: uid then gid, in host order.
    let mut cred = Vec::with_capacity(8);
    cred.extend_from_slice(&client.uid.to_ne_bytes());
    cred.extend_from_slice(&client.gid.to_ne_bytes());
    body.extend_from_slice(&(cred.len() as u32).to_be_bytes());
    body.extend_from_slice(&cred);
    body.push(SIMPLE_CLIENT);
    string(&mut body, &client.nspace);
    body.extend_from_slice(&client.rank.to_be_bytes());
    string(&mut body, CLIENT_VERSION);
    string(&mut body, BUFFER_OPS);
    body.push(BUFFER_NON_DESCRIBED);
    string(&mut body, HASH_DATA_STORE);

    let mut msg = Vec::with_capacity(16 + body.len());
    msg.extend_from_slice(&NO_INDEX.to_ne_bytes());
    msg.extend_from_slice(&HANDSHAKE_TAG.to_ne_bytes());
    msg.extend_from_slice(&(body.len() as u32).to_ne_bytes());
    // The header's padding to the size of a size_t pair on 64-bit hosts.
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&body);
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn client() -> PmixClient {
        PmixClient {
            nspace: "slurm.pmix.42.0".into(),
            rank: 1,
            uid: 1000,
            gid: 100,
        }
    }

    /// Reads one NUL-terminated string off `b` at `at`.
    fn string_at(b: &[u8], at: &mut usize) -> String {
        let end = b[*at..].iter().position(|&c| c == 0).expect("NUL") + *at;
        let s = String::from_utf8(b[*at..end].to_vec()).expect("utf-8");
        *at = end + 1;
        s
    }

    #[test]
    fn a_step_is_read_from_the_pmix_variables_handed_over_and_checked_for_the_rank() {
        let vars = [
            ("PATH", "/usr/bin"),
            ("PMIX_SERVER_URI41", "pmix-server.77;tcp4://127.0.0.1:4242"),
            ("PMIX_NAMESPACE", "slurm.pmix.42.0"),
            ("PMIX_RANK", "1"),
        ]
        .map(|(k, v)| (k.into(), v.into()));
        let step = StepEnv::from_vars(vars);
        assert!(step.vars.iter().all(|(k, _)| k.starts_with("PMIX_")));
        let server = step.server_for(&client()).expect("the step serves rank 1");
        assert_eq!(server.addr, "127.0.0.1:4242".parse().unwrap());
        let other = PmixClient {
            rank: 0,
            ..client()
        };
        assert!(matches!(
            step.server_for(&other),
            Err(PmixError::OtherRank { here_rank: 1, .. })
        ));
        assert!(matches!(
            StepEnv::default().server_for(&client()),
            Err(PmixError::MissingVar { .. })
        ));
    }

    #[test]
    fn the_connect_message_is_laid_out_as_a_pmix_4_server_reads_it() {
        let msg = connect_message(&client());
        let word = |at: usize| u32::from_ne_bytes(msg[at..at + 4].try_into().unwrap());
        assert_eq!(word(0) as i32, -1, "no index yet");
        assert_eq!(word(4), u32::MAX, "handshake tag");
        assert_eq!(
            word(8) as usize,
            msg.len() - 16,
            "byte count after the header"
        );
        let mut at = 16;
        assert_eq!(string_at(&msg, &mut at), "native");
        let len = u32::from_be_bytes(msg[at..at + 4].try_into().unwrap()) as usize;
        at += 4;
        assert_eq!(len, 8);
        assert_eq!(
            u32::from_ne_bytes(msg[at..at + 4].try_into().unwrap()),
            1000
        );
        assert_eq!(
            u32::from_ne_bytes(msg[at + 4..at + 8].try_into().unwrap()),
            100
        );
        at += len;
        assert_eq!(msg[at], 0, "simple client");
        at += 1;
        assert_eq!(string_at(&msg, &mut at), "slurm.pmix.42.0");
        assert_eq!(u32::from_be_bytes(msg[at..at + 4].try_into().unwrap()), 1);
        at += 4;
        assert_eq!(string_at(&msg, &mut at), "4.2.2");
        assert_eq!(string_at(&msg, &mut at), "v41");
        assert_eq!(msg[at], 1, "non-described buffers");
        at += 1;
        assert_eq!(string_at(&msg, &mut at), "hash");
        assert_eq!(at, msg.len());
    }

    #[test]
    fn a_step_tasks_environment_names_its_server_and_identity() {
        let env = [
            ("PMIX_NAMESPACE", "slurm.pmix.42.0"),
            ("PMIX_RANK", "3"),
            (
                "PMIX_SERVER_URI2",
                "pmix-server.3120;tcp4://127.0.0.1:40002",
            ),
            (
                "PMIX_SERVER_URI4",
                "pmix-server.3120;tcp4://127.0.0.1:40001",
            ),
        ];
        let (server, client) = PmixServer::from_env(env.iter().copied(), 5, 6).unwrap();
        assert_eq!(server.pid, Some(3120));
        assert_eq!(server.addr, "127.0.0.1:40001".parse().unwrap());
        assert_eq!(client.nspace, "slurm.pmix.42.0");
        assert_eq!((client.rank, client.uid, client.gid), (3, 5, 6));
        let v6 = PmixServer::from_uri("pmix-server.7;tcp6://[::1]:9").unwrap();
        assert_eq!(v6.addr, "[::1]:9".parse().unwrap());
        assert!(matches!(
            PmixServer::from_uri("pmix-server:3120:/var/spool/pmix-3120"),
            Err(PmixError::BadUri { .. })
        ));
        let no_rank = [
            ("PMIX_NAMESPACE", "x"),
            ("PMIX_SERVER_URI4", "s.1;tcp4://127.0.0.1:1"),
        ];
        assert!(matches!(
            PmixServer::from_env(no_rank.iter().copied(), 0, 0),
            Err(PmixError::MissingVar { var: "PMIX_RANK" })
        ));
    }

    #[test]
    fn a_task_of_another_step_or_rank_is_refused_naming_both() {
        let here = PmixClient {
            nspace: "slurm.pmix.42.1".into(),
            ..client()
        };
        let e = same_rank(&client(), &here).unwrap_err();
        assert!(
            e.to_string().contains("rank 1 of slurm.pmix.42.1")
                && e.to_string().contains("rank 1 of slurm.pmix.42.0"),
            "{e}"
        );
        let other = PmixClient {
            rank: 0,
            ..client()
        };
        assert!(matches!(
            same_rank(&client(), &other),
            Err(PmixError::OtherRank { here_rank: 0, .. })
        ));
        assert!(same_rank(&client(), &client()).is_ok());
    }

    /// A server that reads one connect message and answers `reply` words
    /// (or closes at once without any).
    fn server_answering(reply: Vec<u32>) -> (PmixServer, std::thread::JoinHandle<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut header = [0u8; 16];
            s.read_exact(&mut header).unwrap();
            let n = u32::from_ne_bytes(header[8..12].try_into().unwrap()) as usize;
            let mut body = vec![0u8; n];
            s.read_exact(&mut body).unwrap();
            for w in reply {
                s.write_all(&w.to_be_bytes()).unwrap();
            }
            body
        });
        (PmixServer { pid: None, addr }, t)
    }

    #[test]
    fn an_accepted_connection_returns_the_servers_index_for_the_client() {
        let (server, t) = server_answering(vec![0, 7]);
        let c = server.connect(&client()).unwrap();
        assert_eq!(c.index, 7);
        let body = t.join().unwrap();
        assert!(body.windows(16).any(|w| w == b"slurm.pmix.42.0\0"));
    }

    #[test]
    fn a_closed_connection_or_an_error_status_is_a_refusal_naming_the_rank() {
        let (server, t) = server_answering(vec![]);
        let e = server.connect(&client()).unwrap_err();
        t.join().unwrap();
        assert!(matches!(e, PmixError::NotServed { rank: 1, .. }), "{e}");
        assert!(e.to_string().contains("slurm.pmix.42.0 rank 1"), "{e}");
        let (server, t) = server_answering(vec![(-46i32) as u32]);
        let e = server.connect(&client()).unwrap_err();
        t.join().unwrap();
        assert!(matches!(e, PmixError::Refused { status: -46, .. }), "{e}");
    }
}
