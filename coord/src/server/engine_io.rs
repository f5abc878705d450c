//! Feeding the engine and carrying out its actions, with the store's writes off the loop.
//!
//! A store action the engine waits for ([`Action::ReserveEpoch`], [`Action::Commit`])
//! goes to the writer thread, and the [`EngineGate`] closes: the actions after it in the
//! same list, and every event after them, are held. When the writer's answer arrives it
//! is fed first, then what was held, in order, until the next such action closes the gate
//! again. The engine thus sees exactly the order of events it would see if each write were
//! done on the spot (as the loop once did), while the loop goes on moving bytes, running
//! handshakes and timers. Nothing is told COMMIT, and no round starts on a reserved epoch
//! number, before the writer reported the fsync done.

use std::collections::VecDeque;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::Server;
use super::config::FaultPoint;
use super::writer::{StoreDone, StoreJob};
use crate::action::{Action, Snapshot};
use crate::engine::Event;
use crate::protocol::{Message, Status};
use crate::store::{GlobalManifest, NodeManifest};

/// A write the engine waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaited {
    /// An epoch number.
    Reserve,
    /// An epoch's commit record.
    Commit,
}

/// Something held while the engine waits for the store.
#[derive(Debug)]
enum Held {
    /// The rest of an action list, after the store action.
    Actions(Vec<Action>),
    /// An event that arrived meanwhile.
    Event(Event),
}

/// Whether the engine waits for the store, and what is held meanwhile.
#[derive(Debug, Default)]
pub(super) struct EngineGate {
    awaited: Option<Awaited>,
    held: VecDeque<Held>,
}

impl EngineGate {
    /// True while a write the engine waits for is in flight.
    pub(super) fn waiting(&self) -> bool {
        self.awaited.is_some()
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Server {
    /// Feeds one event to the engine and carries out what it returns; holds it while the
    /// engine waits for the store.
    pub(super) fn feed(&mut self, event: Event) {
        if self.gate.waiting() {
            self.gate.held.push_back(Held::Event(event));
            return;
        }
        let actions = self.engine.handle(Instant::now(), event);
        self.execute(actions);
    }

    /// The end of one loop iteration for the engine (deadlines, parked gets, batched
    /// output). Skipped while it waits for the store, as the loop once was.
    pub(super) fn tick(&mut self, now: Instant) {
        if self.gate.waiting() {
            return;
        }
        let actions = self.engine.handle(now, Event::Tick);
        self.execute(actions);
    }

    /// Carries out `actions` in order, up to one that makes the engine wait for the store:
    /// the rest is held, ahead of anything held already (it came first).
    fn execute(&mut self, actions: Vec<Action>) {
        let mut rest = actions.into_iter();
        while let Some(a) = rest.next() {
            if self.crashed {
                return;
            }
            self.carry_out(a);
            if self.gate.waiting() {
                let left: Vec<Action> = rest.collect();
                if !left.is_empty() {
                    self.gate.held.push_front(Held::Actions(left));
                }
                return;
            }
        }
    }

    fn carry_out(&mut self, a: Action) {
        match a {
            Action::Send { to, msg } => self.send(to, &msg),
            Action::Broadcast { to, msg } => self.broadcast(&to, &msg),
            Action::SendUp(msg) => {
                if let Some(id) = self.upstream.as_ref().map(|c| c.id) {
                    self.send(id, &msg);
                }
            }
            Action::SendStatus { to, snapshot } => {
                let status = self.status(snapshot);
                self.send(to, &Message::Status(status));
            }
            Action::Refuse { conn, reason } => self.refuse(conn, &reason),
            Action::Expel { conn, reason } => {
                self.traffic.refused += 1;
                if let Some(c) = self.take_conn(conn) {
                    log!(self, "closed {}: {reason}", c.addr);
                }
            }
            Action::Log(line) => self.log_line(line),
            Action::ReserveEpoch { last_committed } => self.reserve_epoch(last_committed),
            Action::Commit { epoch, nodes } => self.commit(epoch, nodes),
            Action::RecordAbort {
                epoch,
                phase,
                node,
                reason,
            } => self.submit_write(StoreJob::RecordAbort {
                epoch,
                phase,
                node,
                reason,
            }),
        }
    }

    fn status(&self, s: Snapshot) -> Status {
        Status {
            registered: s.registered,
            expect: s.expect,
            last_committed: s.last_committed,
            running: s.running.map(|r| (r.epoch, r.phase)),
            bytes_in: self.traffic.bytes_in,
            bytes_out: self.traffic.bytes_out,
            refused: self.traffic.refused,
        }
    }

    fn no_store(&self) -> String {
        format!("coordinator {} has no epoch store", self.cfg.name)
    }

    fn reserve_epoch(&mut self, last_committed: Option<u64>) {
        if self.writer.is_none() {
            let error = self.no_store();
            self.feed(Event::EpochUnavailable { error });
            return;
        }
        self.gate.awaited = Some(Awaited::Reserve);
        self.submit_write(StoreJob::Reserve { last_committed });
    }

    fn commit(&mut self, epoch: u64, nodes: Vec<NodeManifest>) {
        if self.cfg.fault == Some(FaultPoint::CrashAfterDump) {
            self.crashed = true;
            return;
        }
        if self.writer.is_none() {
            let error = self.no_store();
            self.feed(Event::CommitFailed { epoch, error });
            return;
        }
        let manifest = GlobalManifest {
            job: self.cfg.job.clone(),
            epoch,
            committed_unix_ms: now_ms(),
            nodes,
        };
        self.gate.awaited = Some(Awaited::Commit);
        self.submit_write(StoreJob::Commit(manifest));
    }

    /// Hands a job to the writer; if its thread is gone (it panicked), the job fails at
    /// once as a failed write would.
    fn submit_write(&mut self, job: StoreJob) {
        let Some(writer) = &self.writer else {
            return;
        };
        let Err(job) = writer.submit(job) else {
            return;
        };
        let error = format!(
            "coordinator {}: the epoch store's writer stopped",
            self.cfg.name
        );
        match job {
            StoreJob::Reserve { .. } => self.answer(Event::EpochUnavailable { error }),
            StoreJob::Commit(m) => self.answer(Event::CommitFailed {
                epoch: m.epoch,
                error,
            }),
            StoreJob::RecordAbort { epoch, .. } => {
                log!(self, "cannot record the abort of epoch {epoch}: {error}");
            }
        }
    }

    /// Feeds the answers of every write the writer finished.
    pub(super) fn store_answers(&mut self) {
        while !self.crashed {
            let Some(done) = self.writer.as_ref().and_then(|w| w.try_done()) else {
                return;
            };
            match done {
                StoreDone::Reserved(result) => self.answer(match result {
                    Ok(epoch) => Event::EpochReserved { epoch },
                    Err(e) => Event::EpochUnavailable {
                        error: e.to_string(),
                    },
                }),
                StoreDone::Committed {
                    epoch,
                    nodes,
                    took,
                    result,
                } => {
                    let event = match result {
                        Ok(()) => {
                            log!(
                                self,
                                "epoch {epoch}: record of {nodes} nodes written in {:.1} ms",
                                took.as_secs_f64() * 1e3
                            );
                            Event::CommitWritten { epoch }
                        }
                        Err(e) => Event::CommitFailed {
                            epoch,
                            error: e.to_string(),
                        },
                    };
                    self.answer(event);
                }
                StoreDone::AbortRecorded { epoch, result } => {
                    if let Err(e) = result {
                        log!(self, "cannot record the abort of epoch {epoch}: {e}");
                    }
                }
            }
        }
    }

    /// The answer the engine waited for: fed first, then what was held meanwhile, until
    /// the engine waits again.
    fn answer(&mut self, event: Event) {
        self.gate.awaited = None;
        let actions = self.engine.handle(Instant::now(), event);
        self.execute(actions);
        while !self.gate.waiting() && !self.crashed {
            match self.gate.held.pop_front() {
                Some(Held::Actions(actions)) => self.execute(actions),
                Some(Held::Event(event)) => self.feed(event),
                None => return,
            }
        }
    }
}
