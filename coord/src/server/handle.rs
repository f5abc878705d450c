//! The handle of a coordinator running on its own thread.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use mio::Waker;

use super::{CoordConfig, LogBuf, Server, ServerError};

/// A coordinator running on its own thread.
#[derive(Debug)]
pub struct CoordHandle {
    addr: SocketAddr,
    name: String,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    logs: LogBuf,
    thread: Option<JoinHandle<Result<(), ServerError>>>,
}

impl CoordHandle {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Log lines so far (the most recent ones).
    pub fn log_lines(&self) -> Vec<String> {
        self.logs
            .lock()
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// True once the loop has exited (error, fault point or kill).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// A handle that stops the loop from another thread (a signal handler thread), as
    /// [`CoordHandle::kill`] does; [`CoordHandle::join`] then returns.
    pub fn stopper(&self) -> Stopper {
        Stopper {
            stop: self.stop.clone(),
            waker: self.waker.clone(),
        }
    }

    /// Stops the loop at once, dropping every socket without a word to anyone, as a
    /// killed process would.
    pub fn kill(mut self) -> Result<(), ServerError> {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        self.join_inner()
    }

    /// Waits for the loop to exit by itself.
    pub fn join(mut self) -> Result<(), ServerError> {
        self.join_inner()
    }

    fn join_inner(&mut self) -> Result<(), ServerError> {
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(ServerError::Panicked {
                    name: self.name.clone(),
                })
            }),
            None => Ok(()),
        }
    }
}

impl Drop for CoordHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        let _ = self.join_inner();
    }
}

/// Stops a coordinator's loop from another thread (see [`CoordHandle::stopper`]).
#[derive(Debug, Clone)]
pub struct Stopper {
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
}

impl Stopper {
    /// Makes the loop return at its next iteration; its sockets and its Unix socket file
    /// go with it.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
    }
}

/// Binds and starts a coordinator on a new thread.
pub fn spawn(cfg: CoordConfig) -> Result<CoordHandle, ServerError> {
    let server = Server::new(cfg)?;
    let addr = server
        .listener
        .local_addr()
        .map_err(|source| ServerError::Bind {
            name: server.cfg.name.clone(),
            job: server.cfg.job.clone(),
            addr: server.cfg.listen,
            source,
        })?;
    let waker = server.waker.clone();
    let stop = server.stop.clone();
    let logs = server.logs.clone();
    let name = server.cfg.name.clone();
    let thread = std::thread::Builder::new()
        .name(format!("coord-{name}"))
        .spawn(move || server.run())
        .map_err(|source| ServerError::Poll {
            name: name.clone(),
            source,
        })?;
    Ok(CoordHandle {
        addr,
        name,
        stop,
        waker,
        logs,
        thread: Some(thread),
    })
}

/// Runs a coordinator on the calling thread until it fails.
pub fn run(cfg: CoordConfig) -> Result<(), ServerError> {
    Server::new(cfg)?.run()
}
