//! The shutdown state of a UDP or UDP-Lite socket, which only sock_diag
//! tells (`inet_diag`, attribute `INET_DIAG_SHUTDOWN`): getsockopt has
//! no option for it, and trying a read or a write would change the queues.

use super::super::sockdiag;

/// `inet_diag_req_v2`'s size: family, protocol, extensions, pad, states,
/// then a zero `inet_diag_sockid` (48 bytes: match any).
const REQ_LEN: usize = 56;
/// `inet_diag_msg`'s size, and where its inode is.
const MSG_LEN: usize = 72;
const MSG_INODE: usize = 68;
/// `INET_DIAG_SHUTDOWN`: `sk_shutdown`, always sent.
const INET_DIAG_SHUTDOWN: u16 = 8;
/// Every socket state.
const ALL_STATES: u32 = u32::MAX;

/// `sk_shutdown` bits.
pub const RCV_SHUTDOWN: u8 = 1;
pub const SEND_SHUTDOWN: u8 = 2;

/// `sk_shutdown` of the socket with inode `ino` among those of `family`
/// (`AF_INET`, `AF_INET6`) and transport `protocol` (`IPPROTO_UDP`,
/// `IPPROTO_UDPLITE`) in the calling thread's network namespace; `None`
/// when none has that inode.
pub fn shutdown_of(family: i32, protocol: i32, ino: u64) -> std::io::Result<Option<u8>> {
    let mut req = [0u8; REQ_LEN];
    req[0] = family as u8;
    req[1] = protocol as u8;
    req[4..8].copy_from_slice(&ALL_STATES.to_ne_bytes());
    for msg in sockdiag::dump(&req)? {
        if msg.len() < MSG_LEN {
            return Err(sockdiag::bad("short inet_diag_msg"));
        }
        if u64::from(sockdiag::u32_at(&msg, MSG_INODE)?) != ino {
            continue;
        }
        let shutdown = sockdiag::attributes(&msg, MSG_LEN)
            .find(|(kind, _)| *kind == INET_DIAG_SHUTDOWN)
            .and_then(|(_, data)| data.first().copied())
            .unwrap_or(0);
        return Ok(Some(shutdown));
    }
    Ok(None)
}
