//! The FINs of half-closed and closing connections, replayed.
//!
//! Repair mode rebuilds a connection as established: its queues and
//! sequence numbers, not the FINs. Once repair is off, each end that had
//! shut down writing calls shutdown(SHUT_WR) again, and its FIN goes out
//! after whatever is still queued; a peer in the tree acknowledges it as
//! it did before the dump. When both ends had sent a FIN and one is not
//! acknowledged yet, the order of the two FINs decides the state the end
//! comes back in: the one whose FIN went first (CLOSING) shuts down first,
//! the one that answered its peer's FIN (LAST_ACK) only once that FIN is
//! back (CLOSE_WAIT). A FIN behind bytes the peer's full window holds back
//! stays unacknowledged, as it was.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use ckpt_image::fd::inet::TcpConnection;

use super::Held;
use crate::error::{RestoreError, Result};
use crate::sys;

/// Kernel TCP states (include/net/tcp_states.h) the replay waits for.
mod tcp_state {
    pub const FIN_WAIT2: u8 = 5;
    pub const TIME_WAIT: u8 = 6;
    pub const CLOSE: u8 = 7;
    pub const CLOSE_WAIT: u8 = 8;
    pub const LAST_ACK: u8 = 9;
    pub const CLOSING: u8 = 11;
}

/// How far a connection had got in closing at dump time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fins {
    /// Neither end had shut down (ESTABLISHED).
    Open,
    /// This end had shut down writing and the peer had not (FIN_WAIT1,
    /// FIN_WAIT2).
    FinWait {
        /// Nothing is queued before the FIN: a peer in the tree
        /// acknowledges it before the tree runs (FIN_WAIT2).
        acked_at_once: bool,
    },
    /// The peer's FIN had arrived, this end had not shut down
    /// (CLOSE_WAIT).
    CloseWait,
    /// This end answered the peer's FIN with its own, not acknowledged
    /// yet (LAST_ACK).
    LastAck,
    /// This end's FIN went first and the peer's crossed it; this end's is
    /// not acknowledged yet (CLOSING).
    Closing,
}

impl Fins {
    /// What the image says of `conn`.
    pub(super) fn of(conn: &TcpConnection) -> Fins {
        match (conn.fin_sent, conn.fin_received) {
            (false, false) => Fins::Open,
            (true, false) => Fins::FinWait {
                acked_at_once: conn.send_len == 0,
            },
            (false, true) => Fins::CloseWait,
            (true, true) if conn.fin_first => Fins::Closing,
            (true, true) => Fins::LastAck,
        }
    }

    /// The states in which this end is back where it was for its process:
    /// the peer's FIN in (its reader sees the end of the stream at once),
    /// its own FIN out. A FIN that nothing holds back is acknowledged at
    /// once, which takes LAST_ACK to CLOSE and CLOSING to TIME_WAIT: the
    /// process sees no difference. `None`: nothing to wait for.
    fn settled_in(self) -> Option<&'static [u8]> {
        use tcp_state::*;
        match self {
            Fins::CloseWait => Some(&[CLOSE_WAIT]),
            Fins::FinWait {
                acked_at_once: true,
            } => Some(&[FIN_WAIT2]),
            Fins::LastAck => Some(&[LAST_ACK, CLOSE]),
            Fins::Closing => Some(&[CLOSING, TIME_WAIT, CLOSE]),
            Fins::Open | Fins::FinWait { .. } => None,
        }
    }
}

/// How long the ends of a connection in the tree wait for a FIN sent
/// again and its acknowledgment: on one host the FIN takes microseconds,
/// the acknowledgment a delayed ACK (at most 200 ms).
pub(super) const FIN_WAIT: Duration = Duration::from_secs(2);

/// Whether `h` reaches one of `states` within [`FIN_WAIT`] from `since`.
fn reaches(h: &Held, states: &[u8], since: Instant) -> std::result::Result<(), Option<u8>> {
    let until = since + FIN_WAIT;
    loop {
        match sys::tcp_state(h.sock.as_fd()) {
            Ok(state) if states.contains(&state) => return Ok(()),
            Ok(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(1)),
            Ok(state) => return Err(Some(state)),
            Err(_) => return Err(None),
        }
    }
}

/// Shuts down writing again on each end that had, out of repair mode, in
/// the order the FINs had gone: first the ends whose FIN went first
/// (CLOSING before FIN_WAIT, so a crossing FIN finds it sent), then the
/// LAST_ACK ends once their peer's FIN is in (an outside peer's was handed
/// back in repair mode already).
pub(super) fn send_fins(ends: &[Held]) -> Result<()> {
    let shutdown = |h: &Held| {
        sys::shutdown_write(h.sock.as_fd()).map_err(|e| {
            RestoreError::os(h.pid, format!("fd {}: TCP: shutdown (send FIN)", h.fd), e)
        })?;
        log::debug!("pid {} fd {}: TCP: FIN sent again", h.pid, h.fd);
        Ok::<(), RestoreError>(())
    };
    let first = ends.iter().filter(|h| h.close == Fins::Closing);
    let then = ends
        .iter()
        .filter(|h| matches!(h.close, Fins::FinWait { .. }));
    for h in first.chain(then) {
        shutdown(h)?;
    }
    for h in ends.iter().filter(|h| h.close == Fins::LastAck) {
        if let Err(state) = reaches(h, &[tcp_state::CLOSE_WAIT], Instant::now()) {
            log::warn!(
                "pid {} fd {}: TCP: the peer's FIN is not back ({state:?}); this end's goes first and it comes back in CLOSING, not LAST_ACK",
                h.pid,
                h.fd
            );
        }
        shutdown(h)?;
    }
    Ok(())
}

/// Waits until every end of a connection in the tree is in its state
/// again ([`Fins::settled_in`]), so the process finds its connection as
/// it left it. Not there in time, it is logged: the connection gets
/// there, later.
pub(super) fn await_fins(ends: &[Held]) {
    let since = Instant::now();
    for h in ends {
        let Some(states) = h.close.settled_in() else {
            continue;
        };
        if let Err(state) = reaches(h, states, since) {
            log::warn!(
                "pid {} fd {}: TCP: the closing connection ({:?}) is not back in its state yet ({state:?}); it gets there later",
                h.pid,
                h.fd,
                h.close
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(fin_sent: bool, fin_received: bool, fin_first: bool, send_len: u32) -> Fins {
        Fins::of(&TcpConnection {
            fin_sent,
            fin_received,
            fin_first,
            send_len,
            ..TcpConnection::default()
        })
    }

    #[test]
    fn the_image_names_each_closing_state() {
        assert_eq!(conn(false, false, false, 5), Fins::Open);
        assert_eq!(
            conn(true, false, false, 0),
            Fins::FinWait {
                acked_at_once: true
            }
        );
        assert_eq!(
            conn(true, false, false, 1),
            Fins::FinWait {
                acked_at_once: false
            }
        );
        assert_eq!(conn(false, true, false, 0), Fins::CloseWait);
        assert_eq!(conn(true, true, false, 9), Fins::LastAck);
        assert_eq!(conn(true, true, true, 9), Fins::Closing);
    }
}
