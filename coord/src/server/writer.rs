//! The epoch store's writes, on a thread of their own.
//!
//! Every store write ends in an fsync (of the file, then of the directory), which takes
//! milliseconds on a good disk and far longer on a busy or networked one. Done in the poll
//! loop it would stall every connection meanwhile: handshakes, status queries, output
//! waiting to be flushed. So the loop hands each write to this thread through a channel
//! and goes on; the thread writes the jobs in the order they were given and reports each
//! one back through another channel, waking the loop. The loop tells the engine a write
//! is done only when this report arrives, that is after its fsync: nothing that depends
//! on a write (a reserved epoch number, a COMMIT) is acknowledged before it is durable.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::Waker;

use crate::protocol::Phase;
use crate::store::{EpochStore, GlobalManifest, StoreError};

/// One durable write for the writer thread.
#[derive(Debug)]
pub(super) enum StoreJob {
    /// Reserve the next epoch number ([`EpochStore::next_epoch`]).
    Reserve {
        /// Last committed epoch, as the engine knows it.
        last_committed: Option<u64>,
    },
    /// Write an epoch's commit record ([`EpochStore::commit`]).
    Commit(GlobalManifest),
    /// Note why an epoch was aborted ([`EpochStore::record_abort`]).
    RecordAbort {
        /// Epoch.
        epoch: u64,
        /// Phase that was running.
        phase: Phase,
        /// Node held responsible.
        node: String,
        /// Why.
        reason: String,
    },
}

/// A write the writer thread finished (durably, if it succeeded).
#[derive(Debug)]
pub(super) enum StoreDone {
    /// Answer to [`StoreJob::Reserve`].
    Reserved(Result<u64, StoreError>),
    /// Answer to [`StoreJob::Commit`].
    Committed {
        /// Epoch.
        epoch: u64,
        /// Nodes in the record.
        nodes: usize,
        /// How long the write took.
        took: Duration,
        /// Whether it is on disk.
        result: Result<(), StoreError>,
    },
    /// Answer to [`StoreJob::RecordAbort`].
    AbortRecorded {
        /// Epoch.
        epoch: u64,
        /// Whether it is on disk.
        result: Result<(), StoreError>,
    },
}

/// The writer thread and its two channels.
#[derive(Debug)]
pub(super) struct StoreWriter {
    /// `None` once dropped, which ends the thread after the jobs already given.
    jobs: Option<Sender<StoreJob>>,
    done: Receiver<StoreDone>,
    thread: Option<JoinHandle<()>>,
}

impl StoreWriter {
    /// Starts the thread of coordinator `name`; it wakes the loop through `waker` after
    /// each write.
    pub(super) fn start(
        store: EpochStore,
        waker: Arc<Waker>,
        name: &str,
    ) -> std::io::Result<StoreWriter> {
        let (jobs, job_rx) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("coord-{name}-store"))
            .spawn(move || write_all(&store, &job_rx, &done_tx, &waker))?;
        Ok(StoreWriter {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
        })
    }

    /// Hands a job to the thread; gives it back if the thread is gone (it panicked).
    pub(super) fn submit(&self, job: StoreJob) -> Result<(), StoreJob> {
        match &self.jobs {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }

    /// The next finished write, if any.
    pub(super) fn try_done(&self) -> Option<StoreDone> {
        // Empty, or the thread is gone (then `submit` says so).
        self.done.try_recv().ok()
    }
}

impl Drop for StoreWriter {
    /// Waits for the jobs already given: each write the loop started is finished, as it
    /// was when the loop wrote them itself.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread: each job in order, each answer sent back with a wake-up.
fn write_all(
    store: &EpochStore,
    jobs: &Receiver<StoreJob>,
    done: &Sender<StoreDone>,
    waker: &Waker,
) {
    for job in jobs {
        let answer = write_one(store, job);
        // The loop is gone only after dropping us, which waits for this thread: a failed
        // send means there is nobody left to tell.
        if done.send(answer).is_err() {
            return;
        }
        let _ = waker.wake();
    }
}

fn write_one(store: &EpochStore, job: StoreJob) -> StoreDone {
    match job {
        StoreJob::Reserve { last_committed } => {
            StoreDone::Reserved(store.next_epoch(last_committed))
        }
        StoreJob::Commit(manifest) => {
            let t = Instant::now();
            let result = store.commit(&manifest);
            StoreDone::Committed {
                epoch: manifest.epoch,
                nodes: manifest.nodes.len(),
                took: t.elapsed(),
                result,
            }
        }
        StoreJob::RecordAbort {
            epoch,
            phase,
            node,
            reason,
        } => StoreDone::AbortRecorded {
            epoch,
            result: store.record_abort(epoch, phase, &node, &reason),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::manifest;
    use mio::{Poll, Token};

    /// Waits for the next answer (the thread wakes `poll`).
    fn next(poll: &mut Poll, w: &StoreWriter) -> StoreDone {
        let mut events = mio::Events::with_capacity(4);
        loop {
            if let Some(d) = w.try_done() {
                return d;
            }
            poll.poll(&mut events, Some(Duration::from_secs(10)))
                .unwrap();
        }
    }

    #[test]
    fn writes_in_order_and_answers_only_once_durable() {
        let d = tempfile::tempdir().unwrap();
        let store = EpochStore::open(d.path(), "j").unwrap();
        let mut poll = Poll::new().unwrap();
        let waker = Arc::new(Waker::new(poll.registry(), Token(0)).unwrap());
        let w = StoreWriter::start(store.clone(), waker, "t").unwrap();
        w.submit(StoreJob::Reserve {
            last_committed: None,
        })
        .unwrap();
        w.submit(StoreJob::Commit(manifest(1))).unwrap();
        assert!(matches!(next(&mut poll, &w), StoreDone::Reserved(Ok(1))));
        match next(&mut poll, &w) {
            StoreDone::Committed {
                epoch: 1,
                nodes: 1,
                result: Ok(()),
                ..
            } => {}
            other => panic!("unexpected answer {other:?}"),
        }
        // Answered means on disk.
        assert_eq!(store.last_committed().unwrap().unwrap().epoch, 1);
    }

    #[test]
    fn dropping_finishes_the_jobs_given() {
        let d = tempfile::tempdir().unwrap();
        let store = EpochStore::open(d.path(), "j").unwrap();
        let poll = Poll::new().unwrap();
        let waker = Arc::new(Waker::new(poll.registry(), Token(0)).unwrap());
        let w = StoreWriter::start(store.clone(), waker, "t").unwrap();
        w.submit(StoreJob::Commit(manifest(3))).unwrap();
        drop(w);
        assert_eq!(store.last_committed().unwrap().unwrap().epoch, 3);
    }
}
