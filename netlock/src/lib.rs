//! The network lock: while a dumped connection to a peer outside the tree
//! has no socket behind it (the tree was killed after the dump, and is not
//! restored yet), the kernel would answer the peer's segments with a
//! reset. The lock drops them instead, so the peer just retransmits and
//! sees a delay.
//!
//! Each lock is an nftables table of ckpt's own, `inet ckpt-<PID>` (PID:
//! the dumped tree's root), in the tree's network namespace, with one rule
//! per connection and direction matching its four-tuple. The dumper adds it before the connections go
//! into repair mode; the restorer deletes it once they are back and out
//! of repair mode, the dumper when the tree goes on after the dump. By
//! hand: `nft delete table inet ckpt-<PID>`.
//!
//! The rules are handed to the `nft` program as JSON (`nft -j -f -`),
//! built here with serde_json; running it is [`nft`]'s job alone.

mod nft;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

pub use nft::program;

/// What went wrong with the lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// No `nft` program to run.
    #[error(
        "the network lock needs the nft program (Debian package nftables), found neither in PATH nor in /usr/sbin or /sbin: install it, or dump with --network-lock=none"
    )]
    NftMissing,
    /// `nft` could not be started or waited for.
    #[error("network lock {table}: running {program}: {source}")]
    Spawn {
        /// The table it was about.
        table: String,
        /// The `nft` it ran.
        program: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The network namespace to lock in cannot be opened.
    #[error("network lock {table}: opening {}: {source}", path.display())]
    NetNs {
        /// The table it was about.
        table: String,
        /// The namespace's `/proc/PID/ns/net`.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `nft` refused the change.
    #[error("network lock {table}: nft could not {what}: {stderr}")]
    Nft {
        /// The table it was about.
        table: String,
        /// The change.
        what: &'static str,
        /// What nft said.
        stderr: String,
    },
}

/// Result of the lock's operations.
pub type Result<T> = std::result::Result<T, LockError>;

/// The nftables table of one dumped tree's lock (family `inet`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table(String);

impl Table {
    /// The table of the tree whose root is `root_pid`.
    pub fn for_tree(root_pid: i32) -> Table {
        Table(format!("ckpt-{root_pid}"))
    }

    /// A table by the name an image recorded.
    pub fn named(name: &str) -> Table {
        Table(name.to_string())
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// The command that deletes it by hand.
    pub fn unlock_hint(&self) -> String {
        format!("nft delete table {FAMILY} {}", self.0)
    }
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{FAMILY} {}", self.0)
    }
}

/// One TCP connection the lock silences, as this host sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connection {
    /// The dumped socket's address.
    pub local: SocketAddr,
    /// The peer's.
    pub peer: SocketAddr,
}

/// The packet mark (SO_MARK) of segments ckpt itself hands a restored
/// socket (the peer's FIN of a CLOSE_WAIT connection): the lock lets them
/// pass.
pub const INJECTED_MARK: u32 = 0x636b_7074;

/// nftables family of the tables: IPv4 and IPv6 in one.
const FAMILY: &str = "inet";
/// Hook priority of the lock's chains: `raw`, before connection tracking
/// and any filter, so nothing else sees a dropped segment.
const PRIORITY_RAW: i32 = -300;

/// The network namespace of process `pid`, where its connections' lock
/// goes.
pub fn netns_of(pid: i32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/ns/net"))
}

/// Adds `conns` to `table`'s lock (creating the table) in the network
/// namespace `netns` ([`netns_of`]), in one transaction: either every
/// connection is locked or none.
pub fn lock(table: &Table, netns: &Path, conns: &[Connection]) -> Result<()> {
    let mut cmds = vec![json!({"add": {"table": {"family": FAMILY, "name": table.name()}}})];
    for (chain, hook) in [("input", "input"), ("output", "output")] {
        cmds.push(json!({"add": {"chain": {
            "family": FAMILY, "table": table.name(), "name": chain,
            "type": "filter", "hook": hook, "prio": PRIORITY_RAW, "policy": "accept",
        }}}));
    }
    for c in conns {
        // What the peer sends us (except what ckpt hands the socket), and
        // what we would send it.
        cmds.push(drop_rule(table, "input", c.peer, c.local));
        cmds.push(drop_rule(table, "output", c.local, c.peer));
    }
    nft::run(
        table,
        netns,
        "add the lock's rules",
        &json!({"nftables": cmds}),
    )
}

/// Deletes `table` of the network namespace `netns`, if it exists (adding
/// it first makes one transaction that succeeds either way).
pub fn unlock(table: &Table, netns: &Path) -> Result<()> {
    let t = json!({"family": FAMILY, "name": table.name()});
    let cmds = json!({"nftables": [{"add": {"table": t}}, {"delete": {"table": t}}]});
    nft::run(table, netns, "delete the table", &cmds)
}

/// The program and arguments that delete `table`, for a process that can
/// only exec (the dumper's TCP repair guard, after a fork; it enters the
/// lock's network namespace itself).
pub fn unlock_argv(table: &Table) -> Result<(PathBuf, Vec<String>)> {
    let prog = program()?;
    let argv = ["nft", "delete", "table", FAMILY, table.name()]
        .map(String::from)
        .to_vec();
    Ok((prog, argv))
}

/// A rule of `chain` dropping TCP segments from `src` to `dst`.
fn drop_rule(table: &Table, chain: &str, src: SocketAddr, dst: SocketAddr) -> Value {
    // A v4-mapped address of an IPv6 socket travels as IPv4.
    let plain = |a: IpAddr| match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        v4 => v4,
    };
    let (s, d) = (plain(src.ip()), plain(dst.ip()));
    let proto = if s.is_ipv4() { "ip" } else { "ip6" };
    let is = |protocol: &str, field: &str, right: Value| {
        json!({"match": {"op": "==",
            "left": {"payload": {"protocol": protocol, "field": field}},
            "right": right}})
    };
    json!({"add": {"rule": {
        "family": FAMILY, "table": table.name(), "chain": chain,
        "expr": [
            {"match": {"op": "!=", "left": {"meta": {"key": "mark"}}, "right": INJECTED_MARK}},
            is(proto, "saddr", json!(s.to_string())),
            is(proto, "daddr", json!(d.to_string())),
            is("tcp", "sport", json!(src.port())),
            is("tcp", "dport", json!(dst.port())),
            {"drop": null},
        ],
    }}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v4_mapped_peer_is_matched_as_ipv4() {
        let t = Table::for_tree(7);
        let r = drop_rule(
            &t,
            "input",
            "[::ffff:10.0.0.1]:80".parse().unwrap(),
            "[::ffff:10.0.0.2]:9".parse().unwrap(),
        );
        let expr = &r["add"]["rule"]["expr"];
        assert_eq!(expr[1]["match"]["left"]["payload"]["protocol"], "ip");
        assert_eq!(expr[1]["match"]["right"], "10.0.0.1");
        assert_eq!(expr[4]["match"]["right"], 9);
        assert_eq!(r["add"]["rule"]["table"], "ckpt-7");
    }

    #[test]
    fn an_ipv6_connection_is_matched_as_ipv6() {
        let r = drop_rule(
            &Table::for_tree(1),
            "output",
            "[::1]:5".parse().unwrap(),
            "[fe80::1]:6".parse().unwrap(),
        );
        assert_eq!(
            r["add"]["rule"]["expr"][2]["match"]["left"]["payload"]["protocol"],
            "ip6"
        );
    }
}
