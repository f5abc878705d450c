//! `ckpt restore --lazy`: the processes run before their memory is back.
//!
//! The private anonymous memory of a process (the bulk of a job: heap,
//! stacks, anonymous mappings) is registered with a userfaultfd in MISSING
//! mode instead of being copied in; everything else is restored as usual.
//! One page server thread holds every process's userfaultfd and the pages
//! files, answers each fault with the whole piece of page data around it
//! (an LZ4 block decompresses as one unit), and once the tree runs fills
//! the rest in the background in address order, until every page is
//! resident; then it closes the userfaultfds (the kernel unregisters the
//! ranges) and ends.
//!
//! Correctness while the process runs, all from the one thread, so a fill
//! always sees the events read before it:
//! - `madvise(MADV_DONTNEED)` and `munmap` of data not yet filled: the
//!   REMOVE/UNMAP event drops the range from what is pending, so it reads as
//!   zeros and is never filled later (a fault there gets a zero page).
//! - `mremap`: the REMAP event moves the pending data with the mapping.
//! - `fork`: the FORK event brings the child's own userfaultfd; the child is
//!   served from the same data, what was pending in the parent at the fork
//!   being pending in the child.
//! - Exit or exec: the pidfd (or `ESRCH` from a fill) ends that process's
//!   service.
//!
//! Which pages may reach a process: only pieces [`crate::pages::plan`]
//! validated, from 4 MiB blocks of the pages file each checked against
//! its SHA-256 in the sealed manifest before the first copy from it
//! ([`Blocks`]; a bad block kills the processes served and fails the
//! restore). Images without block checksums have the file verified whole
//! before the tree runs. If the server dies before the end, the kernel
//! lets the waiting threads retry without the userfaultfd: the pages not
//! yet filled read as zeros (see docs/architecture.md).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::Instant;

use ckpt_image::PAGE_SIZE;
use ckpt_image::mm::{Mm, PageCopy, PageEncoding};
use ckpt_parasite::remote::Remote;
use ckpt_parasite::uffd::{self, Event, Features, RegisterMode, Stop, Userfault};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::error::{RestoreError, Result};
use crate::pages::layout::{self, Split};
use crate::sys;

/// The events a lazily restored address space reports, besides faults.
const FEATURES: Features = Features::EVENT_FORK
    .with(Features::EVENT_REMAP)
    .with(Features::EVENT_REMOVE)
    .with(Features::EVENT_UNMAP);

/// Starts reading the digest blocks that hold `mm`'s eager pieces (see
/// [`split`]) into the page cache, beside the rest of the rebuild: they
/// are checked whole before the process runs, and from a cold cache their
/// reads were a third of the time to running. Only a hint: a bad layout is
/// reported when the pieces are copied.
pub(crate) fn read_ahead_eager(pid: i32, mm: &Mm, pages: &memmap2::Mmap) {
    let Ok(copies) = layout::plan(pid, mm, pages.len() as u64) else {
        return;
    };
    let block = ckpt_image::digest::BLOCK;
    let file_len = pages.len() as u64;
    let mut blocks: Vec<u64> = layout::split(mm, copies)
        .eager
        .iter()
        .flat_map(|c| c.file_offset / block..(c.file_offset + c.file_len).div_ceil(block))
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    for b in blocks {
        let start = b * block;
        if start >= file_len {
            break;
        }
        let len = block.min(file_len - start);
        // A hint only: the copy reads the blocks whether or not it took.
        let _ = pages.advise_range(memmap2::Advice::WillNeed, start as usize, len as usize);
    }
}

/// Makes `r`'s process's userfaultfd, registers `split.ranges` and returns
/// what the page server needs. The pages must not be touched between this
/// and [`PageServer::add`] by anything but the server.
pub(crate) fn prepare(
    r: &Remote<'_>,
    name: String,
    pages: Arc<memmap2::Mmap>,
    split: Split,
    blocks: Option<Blocks>,
) -> Result<Space> {
    let pid = r.t.pid();
    let refuse = |e: ckpt_parasite::ParasiteError| RestoreError::Host {
        pid,
        what: format!("--lazy needs a userfaultfd for the process: {e}"),
    };
    let uffd = uffd::create_in(r).map_err(refuse)?;
    uffd.enable(FEATURES).map_err(refuse)?;
    for &(start, end) in &split.ranges {
        uffd.register(start, end - start, RegisterMode::Missing)?;
    }
    let exit = sys::pidfd_open(pid).map_err(|e| RestoreError::os(pid, "pidfd_open", e))?;
    let pending = split
        .lazy
        .iter()
        .enumerate()
        .map(|(piece, c)| {
            (
                c.addr,
                Target {
                    piece,
                    offset: 0,
                    len: c.raw_len,
                },
            )
        })
        .collect();
    Ok(Space {
        uffd,
        pid,
        exit: Some(exit),
        source: Arc::new(Source {
            pid,
            name,
            pages,
            pieces: split.lazy,
            blocks,
        }),
        pending,
        deferred: Vec::new(),
        gone: false,
    })
}

/// The page data of one dumped process.
struct Source {
    pid: i32,
    /// The pages file's name (for messages).
    name: String,
    pages: Arc<memmap2::Mmap>,
    /// Checked pieces; [`Target::piece`] indexes them.
    pieces: Vec<PageCopy>,
    /// The sealed SHA-256 of every block of the pages file, each checked
    /// before anything of it is served (`None`: the file was verified
    /// whole before the tree ran).
    blocks: Option<Blocks>,
}

/// A pages file's block checksums and which blocks passed.
pub(crate) struct Blocks {
    checks: ckpt_image::BlockChecks,
    verified: Vec<AtomicBool>,
}

impl Blocks {
    /// Nothing verified yet.
    pub(crate) fn new(checks: ckpt_image::BlockChecks) -> Blocks {
        let verified = (0..checks.count())
            .map(|_| AtomicBool::new(false))
            .collect();
        Blocks { checks, verified }
    }

    /// Checks every block `[offset, offset+len)` of `file` lies in, once.
    pub(crate) fn check(&self, file: &[u8], offset: u64, len: u64) -> Result<()> {
        for b in self.checks.blocks_of(offset, len) {
            if !self.verified[b].load(Ordering::Relaxed) {
                self.checks.check(file, b)?;
                self.verified[b].store(true, Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

/// Part of a piece still to be filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Target {
    /// Index of the piece in its [`Source`].
    piece: usize,
    /// Where the part starts in the piece's raw data.
    offset: u64,
    /// Its length.
    len: u64,
}

/// Pending targets by the address they go to (never overlapping).
type Pending = BTreeMap<u64, Target>;

/// Removes `[start, end)` from `pending`; returns the removed parts by
/// their addresses.
fn cut(pending: &mut Pending, start: u64, end: u64) -> Vec<(u64, Target)> {
    let mut hit: Vec<u64> = pending.range(start..end).map(|(k, _)| *k).collect();
    if let Some((&k, t)) = pending.range(..start).next_back()
        && k + t.len > start
    {
        hit.push(k);
    }
    let mut out = Vec::with_capacity(hit.len());
    for k in hit {
        let Some(t) = pending.remove(&k) else {
            continue;
        };
        let t_end = k + t.len;
        let (lo, hi) = (k.max(start), t_end.min(end));
        if k < lo {
            pending.insert(k, Target { len: lo - k, ..t });
        }
        if hi < t_end {
            pending.insert(
                hi,
                Target {
                    offset: t.offset + (hi - k),
                    len: t_end - hi,
                    ..t
                },
            );
        }
        out.push((
            lo,
            Target {
                offset: t.offset + (lo - k),
                len: hi - lo,
                ..t
            },
        ));
    }
    out
}

/// The pending target holding `addr`.
fn holding(pending: &Pending, addr: u64) -> Option<u64> {
    let (&k, t) = pending.range(..=addr).next_back()?;
    (addr < k + t.len).then_some(k)
}

/// One address space served: a restored process or a child it forked.
pub(crate) struct Space {
    uffd: Userfault,
    /// The restored process (for a forked child: the one it descends from).
    pid: i32,
    /// Readable once the restored process exits (none for forked children,
    /// whose end shows as `ESRCH`).
    exit: Option<OwnedFd>,
    source: Arc<Source>,
    pending: Pending,
    /// Faults to answer once the events before them are read.
    deferred: Vec<u64>,
    /// The address space is gone.
    gone: bool,
}

/// How a lazy restore's page service went (in the restore's statistics).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct LazyStats {
    /// From the start of the restore until the tree ran.
    pub running_ms: f64,
    /// From the start of the restore until every page was resident (none
    /// if a process ended first, or the server was handed to a daemon).
    pub resident_ms: Option<f64>,
    /// Bytes of page data served lazily.
    pub lazy_bytes: u64,
    /// Faults answered.
    pub faults: u64,
    /// Bytes filled because of a fault.
    pub fault_bytes: u64,
    /// Bytes filled in the background.
    pub background_bytes: u64,
    /// Faults in dropped or never-saved memory, answered with a zero page.
    pub zero_pages: u64,
    /// Bytes of pending data the processes dropped (munmap, madvise).
    pub dropped_bytes: u64,
    /// Forks served.
    pub forks: u64,
}

/// What the page server thread is told.
enum Msg {
    /// Serve this address space too.
    Add(Box<Space>),
    /// The tree runs (at this time): fill in the background; no more spaces
    /// will come.
    Fill(Instant),
    /// Stop serving and hand the server back (to a daemon).
    HandOver,
}

/// The page server's state, in its thread or in a daemon.
struct Server {
    started: Instant,
    spaces: Vec<Space>,
    /// The last piece decompressed: (source, piece, data).
    cache: Option<(usize, usize, Vec<u8>)>,
    filling: bool,
    /// Round robin over the spaces for background steps.
    next: usize,
    stats: LazyStats,
    /// A process ended before all of its pages were resident.
    cut_short: bool,
    /// A fill met a changing address space whose event is not queued yet
    /// (a fork or mremap under way): wait a little instead of spinning.
    stalled: bool,
}

/// How long the server's poll may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Not at all: there is filling to do.
    No,
    /// [`STALL_WAIT_MS`]: an address space is changing.
    Briefly,
    /// Until something happens.
    Idle,
}

/// The wait while an address space is changing, in milliseconds.
const STALL_WAIT_MS: u8 = 1;

/// Why [`Server::run`] returned.
enum End {
    Done,
    HandedOver,
}

/// Receives messages and wakes the server's poll.
struct Control {
    rx: Receiver<Msg>,
    wake: OwnedFd,
}

/// The page server of a lazy restore, running in a thread of the restorer.
/// Dropping it before [`PageServer::fill`] stops it (the processes are
/// being killed then).
pub struct PageServer {
    /// The processes served, killed if the service fails: their memory
    /// would be wrong.
    pids: Vec<i32>,
    tx: Sender<Msg>,
    wake: OwnedFd,
    thread: Option<JoinHandle<Result<Server>>>,
}

impl PageServer {
    /// Starts the server thread; `started` is when the restore began.
    pub(crate) fn start(started: Instant) -> Result<PageServer> {
        let (rx_fd, tx_fd) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| RestoreError::os(std::process::id() as i32, "pipe", e.into()))?;
        nix::fcntl::fcntl(
            &rx_fd,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(|e| RestoreError::os(std::process::id() as i32, "fcntl", e.into()))?;
        let (tx, rx) = channel();
        let thread = std::thread::Builder::new()
            .name("ckpt-lazy".into())
            .spawn(move || {
                let ctl = Control { rx, wake: rx_fd };
                let mut s = Server {
                    started,
                    spaces: Vec::new(),
                    cache: None,
                    filling: false,
                    next: 0,
                    stats: LazyStats::default(),
                    cut_short: false,
                    stalled: false,
                };
                let ran = s.run(Some(&ctl));
                if ran.is_err() {
                    // Before the userfaultfds close, which would let the
                    // processes go on with zero pages.
                    kill_all(&s.spaces.iter().map(|sp| sp.pid).collect::<Vec<_>>());
                }
                ran.map(|_| s)
            })
            .map_err(|e| RestoreError::os(std::process::id() as i32, "page server thread", e))?;
        Ok(PageServer {
            pids: Vec::new(),
            tx,
            wake: tx_fd,
            thread: Some(thread),
        })
    }

    fn send(&self, m: Msg) {
        // A server that ended (an error) reports it at `wait`.
        let _ = self.tx.send(m);
        let _ = nix::unistd::write(&self.wake, &[1]);
    }

    /// Serves `space` from now on.
    pub(crate) fn add(&mut self, space: Space) {
        self.pids.push(space.pid);
        self.send(Msg::Add(Box::new(space)));
    }

    /// The tree runs: fill the rest in the background.
    pub(crate) fn fill(&self) {
        self.send(Msg::Fill(Instant::now()));
    }

    fn join(&mut self) -> Result<Server> {
        let t = self.thread.take().expect("joined once");
        let got = t.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        if got.is_err() {
            kill_all(&self.pids);
        }
        got
    }

    /// Waits until every page is resident (or the processes ended).
    pub fn wait(mut self) -> Result<LazyStats> {
        let s = self.join()?;
        Ok(s.stats)
    }

    /// Leaves the service to a daemon (a new session, stdio on /dev/null,
    /// its outcome in the system log) and returns at once. `what` names the
    /// restore in the log; the daemon calls `done` with the final figures
    /// before it exits.
    pub fn detach(mut self, what: &str, done: &dyn Fn(&LazyStats)) -> Result<LazyStats> {
        self.send(Msg::HandOver);
        let mut s = self.join()?;
        let stats = s.stats;
        let keep: Vec<RawFd> = s
            .spaces
            .iter()
            .flat_map(|sp| {
                std::iter::once(sp.uffd.as_raw_fd()).chain(sp.exit.as_ref().map(|e| e.as_raw_fd()))
            })
            .chain(crate::ns::restorer_time_fd())
            .collect();
        let me = std::process::id() as i32;
        match sys::daemonize(&keep).map_err(|e| RestoreError::os(me, "fork page server", e))? {
            sys::Forked::Parent => {
                // The daemon holds its own copies now.
                Ok(stats)
            }
            sys::Forked::Daemon => {
                // The logger's lock may have been held by another thread at
                // the fork, and its file is closed: the daemon logs to
                // syslog only.
                log::set_max_level(log::LevelFilter::Off);
                if let Err(e) = crate::ns::leave_job_time_ns() {
                    sys::syslog(
                        true,
                        &format!("page server stays in the job's time namespace: {e}"),
                    );
                }
                let code = match s.run(None) {
                    Ok(_) => {
                        sys::syslog(false, &s.summary(what));
                        done(&s.stats);
                        0
                    }
                    Err(e) => {
                        let pids: Vec<i32> = s.spaces.iter().map(|sp| sp.pid).collect();
                        kill_all(&pids);
                        sys::syslog(
                            true,
                            &format!("{what}: page server failed, processes killed: {e}"),
                        );
                        1
                    }
                };
                std::process::exit(code)
            }
        }
    }
}

/// Kills the processes whose memory can no longer be completed.
fn kill_all(pids: &[i32]) {
    for &pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

impl std::fmt::Debug for PageServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageServer")
            .field("pids", &self.pids)
            .finish_non_exhaustive()
    }
}

impl Drop for PageServer {
    fn drop(&mut self) {
        if self.thread.is_some() {
            // Stops the thread (its spaces are closed with it).
            self.send(Msg::HandOver);
            let _ = self.join();
        }
    }
}

impl Server {
    /// One line on how the service went.
    fn summary(&self, what: &str) -> String {
        let s = &self.stats;
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        let end = match s.resident_ms {
            Some(ms) => format!("all pages resident after {ms:.1} ms"),
            None => "the processes ended before all pages were resident".into(),
        };
        format!(
            "{what}: {end} ({} faults, {:.1} MiB by fault, {:.1} MiB in the background, {:.1} MiB dropped by the processes)",
            s.faults,
            mib(s.fault_bytes),
            mib(s.background_bytes),
            mib(s.dropped_bytes)
        )
    }

    fn run(&mut self, ctl: Option<&Control>) -> Result<End> {
        if ctl.is_none() {
            // A daemon got the state of a server that was filling already.
            self.filling = true;
        }
        loop {
            if self.filling && self.spaces.is_empty() {
                if !self.cut_short {
                    self.stats.resident_ms = Some(ms_between(self.started, Instant::now()));
                }
                return Ok(End::Done);
            }
            let busy = self.filling && self.spaces.iter().any(|s| !s.pending.is_empty())
                || self.spaces.iter().any(|s| !s.deferred.is_empty());
            let wait = if std::mem::take(&mut self.stalled) {
                Wait::Briefly
            } else if busy {
                Wait::No
            } else {
                Wait::Idle
            };
            let (wake, ready) = self.poll(ctl, wait)?;
            if wake && let Some(c) = ctl {
                let mut buf = [0u8; 64];
                while matches!(nix::unistd::read(&c.wake, &mut buf), Ok(n) if n > 0) {}
                while let Ok(m) = c.rx.try_recv() {
                    match m {
                        Msg::Add(space) => {
                            self.stats.lazy_bytes +=
                                space.pending.values().map(|t| t.len).sum::<u64>();
                            self.spaces.push(*space);
                        }
                        Msg::Fill(at) => {
                            self.filling = true;
                            self.stats.running_ms = ms_between(self.started, at);
                        }
                        Msg::HandOver => return Ok(End::HandedOver),
                    }
                }
            }
            for (i, (uffd_ready, exited)) in ready.into_iter().enumerate() {
                if exited {
                    self.spaces[i].gone = true;
                }
                if uffd_ready && !self.spaces[i].gone {
                    self.serve_events(i)?;
                }
            }
            for i in 0..self.spaces.len() {
                let deferred = std::mem::take(&mut self.spaces[i].deferred);
                for addr in deferred {
                    self.fault(i, addr)?;
                }
            }
            if self.filling {
                self.background_step()?;
            }
            self.retire();
        }
    }

    /// Waits for something to do; returns whether the control pipe woke
    /// it and, per space, (its userfaultfd is readable, it exited).
    fn poll(&self, ctl: Option<&Control>, wait: Wait) -> Result<(bool, Vec<(bool, bool)>)> {
        let mut fds = Vec::with_capacity(1 + 2 * self.spaces.len());
        if let Some(c) = ctl {
            fds.push(PollFd::new(c.wake.as_fd(), PollFlags::POLLIN));
        }
        for s in &self.spaces {
            fds.push(PollFd::new(s.uffd.as_fd(), PollFlags::POLLIN));
            if let Some(e) = &s.exit {
                fds.push(PollFd::new(e.as_fd(), PollFlags::POLLIN));
            }
        }
        let timeout = match wait {
            Wait::No => PollTimeout::ZERO,
            Wait::Briefly => PollTimeout::from(STALL_WAIT_MS),
            Wait::Idle => PollTimeout::NONE,
        };
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                return Err(RestoreError::os(
                    std::process::id() as i32,
                    "poll (page server)",
                    e.into(),
                ));
            }
        }
        let hit = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
        let mut it = fds.iter();
        let wake = ctl.is_some() && it.next().is_some_and(hit);
        let mut ready = Vec::with_capacity(self.spaces.len());
        for s in &self.spaces {
            let u = it.next().is_some_and(hit);
            let e = s.exit.is_some() && it.next().is_some_and(hit);
            ready.push((u, e));
        }
        Ok((wake, ready))
    }

    /// Closes the spaces that are done: every page filled, or gone. Closing
    /// a userfaultfd unregisters its ranges, so a later fault in dropped
    /// memory gets the kernel's zero page.
    fn retire(&mut self) {
        let filling = self.filling;
        let mut cut_short = false;
        self.spaces.retain(|s| {
            if s.gone {
                cut_short |= !s.pending.is_empty();
                log::debug!(
                    "lazy: pid {}: address space gone, {} pieces unfilled",
                    s.pid,
                    s.pending.len()
                );
                return false;
            }
            !(filling && s.pending.is_empty() && s.deferred.is_empty())
        });
        self.cut_short |= cut_short;
    }

    /// Reads and handles every message of space `i`, in order.
    fn serve_events(&mut self, i: usize) -> Result<()> {
        let events = match self.spaces[i].uffd.read_events() {
            Ok(e) => e,
            Err(e) => {
                log::debug!("lazy: {e}: serving it stops");
                self.spaces[i].gone = true;
                return Ok(());
            }
        };
        for ev in events {
            match ev {
                Event::Fault { addr, .. } => {
                    self.stats.faults += 1;
                    self.fault(i, addr)?;
                }
                Event::Remove { start, end } | Event::Unmap { start, end } => {
                    let dropped = cut(&mut self.spaces[i].pending, start, end);
                    self.stats.dropped_bytes += dropped.iter().map(|(_, t)| t.len).sum::<u64>();
                }
                Event::Remap { from, to, len } => {
                    let s = &mut self.spaces[i];
                    for (at, t) in cut(&mut s.pending, from, from.saturating_add(len)) {
                        s.pending.insert(at - from + to, t);
                    }
                }
                Event::Fork { ufd } => {
                    self.stats.forks += 1;
                    let parent = &self.spaces[i];
                    let child = Userfault::from_fork(ufd, parent.pid);
                    if parent.pending.is_empty() {
                        // Nothing to serve: closing it unregisters the
                        // child's ranges.
                        continue;
                    }
                    let space = Space {
                        uffd: child,
                        pid: parent.pid,
                        exit: None,
                        source: Arc::clone(&parent.source),
                        pending: parent.pending.clone(),
                        deferred: Vec::new(),
                        gone: false,
                    };
                    log::debug!(
                        "lazy: pid {} forked; the child is served too ({} pieces pending)",
                        space.pid,
                        space.pending.len()
                    );
                    self.spaces.push(space);
                }
                Event::Other { code } => {
                    log::debug!(
                        "lazy: pid {}: unexpected event {code:#x}",
                        self.spaces[i].pid
                    );
                }
            }
        }
        Ok(())
    }

    /// Answers a fault at `addr`: the pending piece holding it, or a zero
    /// page where nothing is pending (dropped or never-saved memory).
    fn fault(&mut self, i: usize, addr: u64) -> Result<()> {
        let addr = addr & !(PAGE_SIZE - 1);
        if let Some(k) = holding(&self.spaces[i].pending, addr) {
            let filled = self.fill(i, k)?;
            self.stats.fault_bytes += filled;
            let s = &mut self.spaces[i];
            if !s.gone && holding(&s.pending, addr).is_some() {
                // Stopped by a changing map: after the events.
                s.deferred.push(addr);
            }
            return Ok(());
        }
        let s = &mut self.spaces[i];
        let f = s.uffd.zeropage_step(addr, PAGE_SIZE)?;
        match f.stop {
            None => self.stats.zero_pages += 1,
            // Filled meanwhile (another thread's fault on the same page):
            // the waiters only need waking.
            Some(Stop::Present) => s.uffd.wake(addr, PAGE_SIZE)?,
            Some(Stop::Changing) => {
                s.deferred.push(addr);
                self.stalled = true;
            }
            Some(Stop::Unmapped) => {}
            Some(Stop::Exited) => s.gone = true,
        }
        Ok(())
    }

    /// Fills the lowest pending target of the next space with any.
    fn background_step(&mut self) -> Result<()> {
        let n = self.spaces.len();
        for j in 0..n {
            let i = (self.next + j) % n;
            let s = &self.spaces[i];
            if s.gone || !s.deferred.is_empty() {
                continue;
            }
            if let Some(&k) = s.pending.keys().next() {
                self.next = i + 1;
                let filled = self.fill(i, k)?;
                self.stats.background_bytes += filled;
                return Ok(());
            }
        }
        Ok(())
    }

    /// Fills the pending target at `k` of space `i` (waking the threads
    /// waiting in it); returns the bytes filled. A target stopped by a
    /// changing map stays pending from where it stopped.
    fn fill(&mut self, i: usize, k: u64) -> Result<u64> {
        let Some(t) = self.spaces[i].pending.remove(&k) else {
            return Ok(0);
        };
        let source = Arc::clone(&self.spaces[i].source);
        let data = piece_data(&mut self.cache, &source, t.piece)?;
        // In range: targets are parts of their piece's raw data.
        let bytes = &data[t.offset as usize..(t.offset + t.len) as usize];
        let s = &mut self.spaces[i];
        let mut done = 0u64;
        let mut filled = 0u64;
        // A range that no longer lies in one VMA (the process split it with
        // mprotect) or lost part of it is copied page by page.
        let mut page_by_page = false;
        while done < t.len {
            let rest = &bytes[done as usize..];
            let step = if page_by_page {
                &rest[..rest.len().min(PAGE_SIZE as usize)]
            } else {
                rest
            };
            let f = s.uffd.copy_step(k + done, step)?;
            done += f.filled;
            filled += f.filled;
            match f.stop {
                None if done >= t.len => break,
                None => {}
                Some(Stop::Present) => {
                    // Made present by the process's own doing (a page moved
                    // in, a fork's copy): that content is newer than ours.
                    done = (done + PAGE_SIZE).min(t.len);
                }
                Some(Stop::Changing) => {
                    self.stalled = true;
                    s.pending.insert(
                        k + done,
                        Target {
                            offset: t.offset + done,
                            len: t.len - done,
                            ..t
                        },
                    );
                    break;
                }
                Some(Stop::Unmapped) if !page_by_page => page_by_page = true,
                // That page is unmapped (its event, still unread, drops the
                // range): the next one may not be.
                Some(Stop::Unmapped) => done = (done + PAGE_SIZE).min(t.len),
                Some(Stop::Exited) => {
                    s.gone = true;
                    s.pending.insert(k + done, t);
                    break;
                }
            }
        }
        Ok(filled)
    }
}

/// The raw data of piece `piece` of `source`: a slice of the mapped pages
/// file, or the block decompressed (kept for the next call).
fn piece_data<'a>(
    cache: &'a mut Option<(usize, usize, Vec<u8>)>,
    source: &'a Source,
    piece: usize,
) -> Result<&'a [u8]> {
    let c = &source.pieces[piece];
    if let Some(b) = &source.blocks {
        b.check(&source.pages, c.file_offset, c.file_len)?;
    }
    let bad = |what: String| {
        RestoreError::Image(ckpt_image::ImageError::Invalid {
            path: source.name.clone().into(),
            what: format!(
                "pid {}: data for {:#x} at {:#x} ({} bytes): {what}",
                source.pid, c.addr, c.file_offset, c.file_len
            ),
        })
    };
    // In range by `plan`; `get` keeps that a checked fact here too.
    let stored = usize::try_from(c.file_offset)
        .ok()
        .zip(usize::try_from(c.file_len).ok())
        .and_then(|(off, len)| source.pages.get(off..off.checked_add(len)?))
        .ok_or_else(|| bad("outside the pages file".into()))?;
    match c.encoding {
        PageEncoding::Raw => Ok(stored),
        PageEncoding::Lz4 => {
            let id = source as *const Source as usize;
            let hit = matches!(cache, Some((s, p, _)) if *s == id && *p == piece);
            if !hit {
                // raw_len is at most MAX_BLOCK_RAW_LEN (checked by `plan`);
                // the last block's buffer is reused.
                let mut buf = cache.take().map(|(_, _, b)| b).unwrap_or_default();
                buf.resize(c.raw_len as usize, 0);
                let n = lz4_flex::block::decompress_into(stored, &mut buf)
                    .map_err(|e| bad(format!("cannot decompress: {e}")))?;
                if n as u64 != c.raw_len {
                    return Err(bad("decompressed to the wrong length".into()));
                }
                *cache = Some((id, piece, buf));
            }
            Ok(cache.as_ref().map(|(_, _, b)| &b[..]).unwrap_or_default())
        }
    }
}

fn ms_between(a: Instant, b: Instant) -> f64 {
    (b.saturating_duration_since(a).as_secs_f64() * 1e6).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(piece: usize, offset: u64, len: u64) -> Target {
        Target { piece, offset, len }
    }

    #[test]
    fn cutting_keeps_the_sides_and_returns_the_middle() {
        let mut p: Pending = [(0x1000, t(0, 0, 0x4000)), (0x8000, t(1, 0, 0x2000))].into();
        let gone = cut(&mut p, 0x2000, 0x9000);
        assert_eq!(
            gone,
            vec![(0x8000, t(1, 0, 0x1000)), (0x2000, t(0, 0x1000, 0x3000))]
        );
        assert_eq!(
            p,
            [(0x1000, t(0, 0, 0x1000)), (0x9000, t(1, 0x1000, 0x1000))].into()
        );
        assert_eq!(holding(&p, 0x1fff), Some(0x1000));
        assert_eq!(holding(&p, 0x2000), None);
        assert_eq!(holding(&p, 0x9000), Some(0x9000));
    }
}
