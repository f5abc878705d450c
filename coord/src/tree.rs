//! Sub-coordinator: the node-level relay of seed 002's two-level tree.
//!
//! A sub-coordinator is the ordinary coordinator loop ([`crate::server`]) with a parent
//! link. Towards its agents it behaves like the root; towards its parent it is one client
//! that stands for all its agents:
//!
//! * registrations are batched into one `Arrive{Register}` per poll iteration,
//! * a phase's arrivals become one `Arrive{count = local agents}` once all have arrived,
//! * failures and disconnects are relayed at once as `Fail` (the root decides the abort),
//! * phase commands and aborts from the parent fan out to every local agent,
//! * puts go up in one batch per iteration, always before any arrival that follows them,
//! * gets are answered from a local cache; a miss asks the parent once per key however
//!   many local agents want it.
//!
//! Losing the parent aborts the local agents and stops the sub-coordinator: the root
//! aborts the epoch on its side when the connection drops.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::client::{AgentOptions, Link};
use crate::protocol::{Get, Intent, Message, NodeReport, Role};
use crate::server::{Conn, Server, ServerError};

/// The parent link and what waits to go up it.
pub(crate) struct Upstream {
    pub(crate) conn: Option<Conn>,
    pub(crate) pending_register: Vec<NodeReport>,
    pub(crate) pending_leave: Vec<String>,
    pub(crate) pending_puts: Vec<(String, Vec<u8>)>,
    pending_gets: Vec<String>,
    pending_get_deadline: Option<Instant>,
    pub(crate) requested: HashSet<String>,
}

impl Upstream {
    /// Asks the parent for `key` unless already asked.
    pub(crate) fn want(&mut self, key: String, deadline: Instant) {
        if self.requested.insert(key.clone()) {
            self.pending_gets.push(key);
            self.pending_get_deadline = Some(
                self.pending_get_deadline
                    .map_or(deadline, |d| d.max(deadline)),
            );
        }
    }

    /// The batched get for this iteration, if any.
    pub(crate) fn take_gets(&mut self) -> Option<Get> {
        if self.pending_gets.is_empty() {
            return None;
        }
        let d = self
            .pending_get_deadline
            .take()
            .unwrap_or_else(Instant::now);
        let ms = d
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        Some(Get {
            keys: std::mem::take(&mut self.pending_gets),
            timeout_ms: u32::try_from(ms.as_millis()).unwrap_or(u32::MAX),
        })
    }
}

impl Server {
    /// Connects to the parent (with backoff), authenticates, and moves the socket into the
    /// poll loop.
    pub(crate) fn connect_upstream(&mut self) -> Result<(), ServerError> {
        let parent = self.cfg.parent.clone().unwrap_or_default();
        let mut opts = AgentOptions::new(
            &parent,
            &self.cfg.job,
            self.cfg.secret.clone(),
            &self.cfg.name,
        );
        opts.role = Role::SubCoordinator;
        opts.intent = Intent::Standby;
        opts.expect = self.cfg.expect;
        opts.connect_timeout = Duration::from_secs(60);
        let up_err = |source| ServerError::Upstream {
            name: self.cfg.name.clone(),
            parent: parent.clone(),
            source: Box::new(source),
        };
        let link = Link::open(&opts).map_err(up_err)?;
        let (stream, reader, _) = link.into_parts();
        let addr = stream.peer_addr().map_err(|e| ServerError::Poll {
            name: self.cfg.name.clone(),
            source: e,
        })?;
        self.upstream = Some(Upstream {
            conn: None,
            pending_register: Vec::new(),
            pending_leave: Vec::new(),
            pending_puts: Vec::new(),
            pending_gets: Vec::new(),
            pending_get_deadline: None,
            requested: HashSet::new(),
        });
        self.install_upstream(stream, reader, addr)
            .map_err(|source| ServerError::Poll {
                name: self.cfg.name.clone(),
                source,
            })?;
        Ok(())
    }

    /// A message from the parent.
    pub(crate) fn on_upstream_message(&mut self, m: Message) {
        match m {
            Message::PhaseCmd(p) => self.upstream_phase(p),
            Message::Abort(a) => self.upstream_abort(a),
            Message::Values(v) => self.upstream_values(v),
            other => {
                self.log_line(format!(
                    "ignoring unexpected {:?} from the parent",
                    other.msg_type()
                ));
            }
        }
    }
}
