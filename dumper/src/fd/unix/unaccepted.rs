//! Data a client sent on a connection its listener has not accepted. It
//! sits in the receive queue of the socket the kernel made for the server
//! end, queued on the listener, which no fd reaches and no interface
//! shows: the only way to it is `accept`. A dump that kills the tree
//! (`killed_after`), once nothing in the tree refuses it, accepts every
//! pending connection of such a listener
//! on its copy of the listener, in the kernel's order, peeks what each
//! holds and records it with the client, whose restore connects again
//! and sends it again. The accepted ends close with ckpt: were the dump to
//! fail after this, the tree would run on without those connections.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::file::Kind;

use super::{Holder, TreeFiles, diag, peek_queue, refuse};
use crate::error::{DumpError, Result};
use crate::sys;

/// What one accepted connection held, for its client's image.
struct Taken {
    /// The client's open file.
    client: u64,
    lengths: Vec<u32>,
    data: Vec<u8>,
}

/// Accepts every pending connection of each listener in `listeners` (file
/// ids; `holders` gives the fd holding each) and records what their
/// clients had sent in the clients' images.
pub(super) fn take(
    tree: &mut TreeFiles,
    holders: &BTreeMap<u64, Holder>,
    listeners: &BTreeSet<u64>,
) -> Result<()> {
    if listeners.is_empty() {
        return Ok(());
    }
    let mut accepted = Vec::new();
    for id in listeners {
        for conn in accept_all(&holders[id])? {
            accepted.push((&holders[id], conn));
        }
    }
    let kernel = diag::all().map_err(|source| DumpError::Proc {
        pid: std::process::id() as i32,
        path: "sock_diag (NETLINK_SOCK_DIAG, unix, after accepting)".into(),
        source,
    })?;
    let by_ino: HashMap<u64, u64> = tree
        .files
        .files
        .iter()
        .filter_map(|f| match &f.kind {
            Some(Kind::Unix(u)) => Some((u.ino, f.id)),
            _ => None,
        })
        .collect();
    let mut taken = Vec::with_capacity(accepted.len());
    for &(listener, ref conn) in &accepted {
        let ino = std::fs::File::from(conn.try_clone().map_err(|e| accept_err(listener, e))?)
            .metadata()
            .map_err(|e| accept_err(listener, e))?
            .ino();
        let found = kernel
            .get(&ino)
            .and_then(|d| by_ino.get(&d.peer))
            .and_then(|client| Some((*client, holders.get(client)?)));
        let Some((client, ch)) = found else {
            return Err(refuse(
                listener,
                "listening unix socket had a connection not yet accepted whose client ckpt cannot find in the tree".into(),
            ));
        };
        let p = super::super::params(ch.pid, ch.fd, &[])?;
        let Some(Kind::Unix(u)) = &tree.file(client).kind else {
            unreachable!("by_ino lists unix sockets only");
        };
        let queue = peek_queue(&p, conn.as_fd(), u.sock_type as i32)?;
        if !queue.ancillary.is_empty() {
            return Err(refuse(
                ch,
                "unix socket sent files or credentials (SCM_RIGHTS, SCM_CREDENTIALS) on a connection not yet accepted".into(),
            ));
        }
        taken.push(Taken {
            client,
            lengths: queue.lengths,
            data: queue.data,
        });
    }
    for t in taken {
        if t.lengths.is_empty() {
            continue;
        }
        let file = tree.files.files.iter_mut().find(|f| f.id == t.client);
        let Some(Kind::Unix(u)) = file.and_then(|f| f.kind.as_mut()) else {
            unreachable!("taken from unix sockets only");
        };
        log::debug!(
            "unix socket file {}: {} bytes sent before accept",
            t.client,
            t.data.len()
        );
        u.unaccepted_queue = t.lengths;
        tree.blobs
            .add(ckpt_image::unix_unaccepted_name(t.client), t.data);
    }
    Ok(())
}

/// Accepts, on ckpt's copy of the listener `h` holds, every connection
/// pending now (the tree is frozen: no new one comes).
fn accept_all(h: &Holder) -> Result<Vec<OwnedFd>> {
    let listener = sys::take_fd(h.pid, h.fd).map_err(|e| accept_err(h, e))?;
    let mut out = Vec::new();
    while let Some(conn) = sys::accept_pending(listener.as_fd()).map_err(|e| accept_err(h, e))? {
        out.push(conn);
    }
    Ok(out)
}

fn accept_err(h: &Holder, source: std::io::Error) -> DumpError {
    DumpError::Proc {
        pid: h.pid,
        path: format!(
            "fd {} (listening unix socket: accepting a connection to read what it was sent)",
            h.fd
        )
        .into(),
        source,
    }
}
