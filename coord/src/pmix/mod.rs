//! PMIx backend for [`PhaseBackend`]: the phase barriers and the key/value exchange carried
//! by PMIx Put/Commit/Fence/Get instead of the TCP coordinator (cargo feature `pmix`).
//!
//! Run the agents as the tasks of one PMIx job: `srun --mpi=pmix` (for example an agent
//! step, `srun --jobid=J --overlap --mpi=pmix -N<nodes> --ntasks-per-node=1 ...`) or Open
//! MPI's `mpirun`. Every rank runs the same call sequence as with the TCP [`Agent`]:
//!
//! ```no_run
//! # use ckpt_coord::pmix::{PmixBackend, PmixOptions};
//! # use ckpt_coord::{AfterCommit, Phase, PhaseBackend, PhaseInfo, RoundKind};
//! # fn main() -> Result<(), ckpt_coord::ClientError> {
//! let kind = RoundKind::Checkpoint { then: AfterCommit::Resume };
//! let mut b = PmixBackend::init(PmixOptions::new(kind).store("/var/lib/ckpt/coord", "J"))?;
//! let step = b.wait_phase(Phase::Freeze)?;
//! b.report_done(Phase::Freeze, PhaseInfo::None)?; // = the FREEZE barrier
//! b.wait_phase(Phase::Drain)?; // Err(Aborted) if any rank failed FREEZE
//! # let _ = step; Ok(()) }
//! ```
//!
//! How the calls map onto PMIx (there is no coordinator process; every rank computes the
//! same outcome from the same collected data):
//!
//! * [`PmixBackend::init`]: `PMIx_Init`, `PMIx_Get(PMIX_JOB_SIZE)`, then a REGISTER barrier in
//!   which rank 0 chooses the epoch (reserved in the [`EpochStore`] when one is configured,
//!   else [`PmixOptions::epoch`]) and `last_committed`; every rank adopts rank 0's choice.
//! * `report_done(P, info)` / `report_failed(P, reason)`: the barrier of phase P. Put
//!   `ckpt.<epoch>.<P>` = this rank's status (ok, or failed + reason) and `info`, Commit,
//!   Fence over the whole namespace with `PMIX_COLLECT_DATA` and a `PMIX_TIMEOUT`
//!   ([`PmixOptions::fence_timeout`]), then Get every rank's status. The first failed (or
//!   missing) rank aborts the epoch; the abort is returned by the next `wait_phase`, as with
//!   the TCP coordinator.
//! * `wait_phase(P)`: returns the next phase of the fixed sequence (`RoundKind::phases`) as
//!   the same [`Step`] the TCP backend builds, once the previous phase's barrier passed.
//!   `wait_phase(COMMIT)` runs one more barrier in which rank 0 durably writes the epoch's
//!   global manifest through [`EpochStore::commit`] (when a store is configured) and every
//!   rank learns whether that worked: COMMIT means the same as with the TCP coordinator.
//! * `put(k, v)`: Put `ckpt.<epoch>.kv.<k>` (a `PMIX_BYTE_OBJECT`, scoped to this rank) and
//!   Commit. Other ranks see it after the current phase's barrier (put in PUBLISH, get in
//!   SUBSCRIBE), ranks on the same node usually at once.
//! * `get(k, timeout)`: looks for `k` among every rank's data in the local store
//!   (`PMIX_OPTIONAL`, so nothing blocks in the server), polling until `timeout`, then
//!   [`ClientError::KeyTimeout`] naming the key. [`PmixBackend::get_from`] asks for one
//!   rank's key from the server directly (`PMIX_TIMEOUT`).
//!
//! PMIx events are never used: Slurm's default handler SIGKILLs the step and ORTE hangs.

mod sys;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use crate::client::Agent;
use crate::client::{ClientError, PhaseBackend, Step};
use crate::protocol::{Phase, PhaseInfo, RoundKind};
use crate::store::{EpochStore, GlobalManifest, NodeManifest};

/// Rounds started by this process: keys of REGISTER barriers (whose epoch is not known yet)
/// are numbered with it. Every rank runs the same sequence, so the numbers agree.
static ROUNDS: AtomicU64 = AtomicU64::new(0);

/// Settings of a [`PmixBackend`]. Every rank should pass the same values; where they must
/// agree (epoch, `last_committed`) rank 0's are used.
#[derive(Debug, Clone)]
pub struct PmixOptions {
    /// Kind of the first round.
    pub kind: RoundKind,
    /// Our node name in reports, aborts and the manifest; `rank<N>` if `None`. Must be
    /// unique within the job.
    pub node: Option<String>,
    /// Epoch of the first round when no store is configured (default 1; later rounds of
    /// the same backend count up from it).
    pub epoch: Option<u64>,
    /// Last committed epoch when no store is configured (restart: the one to restore).
    pub last_committed: Option<u64>,
    /// Where rank 0 reserves epoch numbers and commits the global manifest:
    /// `(state_dir, job)` as for [`EpochStore::open`]. `None`: COMMIT durability is the
    /// caller's job (see `docs/coord.md`).
    pub store: Option<(PathBuf, String)>,
    /// How long a barrier waits for the slowest rank (`PMIX_TIMEOUT` of every fence; PMIx
    /// counts whole seconds). Also the `deadline` of every [`Step`].
    pub fence_timeout: Duration,
}

impl PmixOptions {
    /// Options for a round of `kind`, no store, node `rank<N>`, 60 s barrier timeout.
    pub fn new(kind: RoundKind) -> PmixOptions {
        PmixOptions {
            kind,
            node: None,
            epoch: None,
            last_committed: None,
            store: None,
            fence_timeout: Duration::from_secs(60),
        }
    }

    /// Sets our node name.
    pub fn node(mut self, node: &str) -> PmixOptions {
        self.node = Some(node.to_string());
        self
    }

    /// Sets the first epoch (used when no store is configured).
    pub fn epoch(mut self, epoch: u64) -> PmixOptions {
        self.epoch = Some(epoch);
        self
    }

    /// Sets the last committed epoch (used when no store is configured).
    pub fn last_committed(mut self, epoch: Option<u64>) -> PmixOptions {
        self.last_committed = epoch;
        self
    }

    /// Lets rank 0 reserve epochs and commit manifests in `<state_dir>/<job>/`.
    pub fn store(mut self, state_dir: impl Into<PathBuf>, job: &str) -> PmixOptions {
        self.store = Some((state_dir.into(), job.to_string()));
        self
    }

    /// Sets the barrier timeout.
    pub fn fence_timeout(mut self, t: Duration) -> PmixOptions {
        self.fence_timeout = t;
        self
    }
}

/// One rank's status at a phase barrier (`ckpt.<epoch>.<PHASE>`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Report {
    ok: bool,
    node: String,
    reason: String,
    info: PhaseInfo,
}

/// One rank's registration (`ckpt.round<N>.REGISTER`); rank 0's carries the round.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Register {
    node: String,
    kind: RoundKind,
    epoch: u64,
    last_committed: Option<u64>,
    error: Option<String>,
}

/// Why the current round was aborted.
#[derive(Debug, Clone)]
struct Abort {
    epoch: u64,
    phase: Phase,
    node: String,
    reason: String,
}

impl Abort {
    fn error(&self) -> ClientError {
        ClientError::Aborted {
            epoch: self.epoch,
            phase: self.phase,
            node: self.node.clone(),
            reason: self.reason.clone(),
        }
    }
}

#[derive(Debug)]
struct Round {
    epoch: u64,
    kind: RoundKind,
    last_committed: Option<u64>,
    /// Index in `kind.phases()` of the next phase `wait_phase` hands out.
    next: usize,
    /// The barrier of the phase handed out last has run.
    reported: bool,
    abort: Option<Abort>,
    /// DUMP reports, by rank: `(node, info)`.
    dumps: Vec<(String, PhaseInfo)>,
}

/// The phase API over PMIx; see the module documentation.
#[derive(Debug)]
pub struct PmixBackend {
    nspace: String,
    rank: u32,
    size: u32,
    node: String,
    opts: PmixOptions,
    store: Option<Result<EpochStore, String>>,
    next_epoch: u64,
    round: Round,
    own: HashMap<String, Vec<u8>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// How a rank is named in aborts: its node name, plus the rank if the name is not `rank<N>`.
fn label(rank: u32, node: &str) -> String {
    if node == format!("rank{rank}") {
        node.to_string()
    } else {
        format!("{node} (rank {rank})")
    }
}

impl PmixBackend {
    /// `PMIx_Init`, then the REGISTER barrier of a first round of `opts.kind`. Every rank of
    /// the namespace must call it; an `Err(Aborted)` names the rank that could not join.
    pub fn init(opts: PmixOptions) -> Result<PmixBackend, ClientError> {
        let me = sys::init().map_err(|e| pmix_error(opts.node.as_deref().unwrap_or("?"), e))?;
        let nspace = me.nspace();
        let rank = me.rank();
        let node = opts.node.clone().unwrap_or_else(|| format!("rank{rank}"));
        let kind = opts.kind;
        let mut b = PmixBackend {
            nspace,
            rank,
            size: 0,
            node,
            next_epoch: opts.epoch.unwrap_or(1),
            store: None,
            round: Round {
                epoch: 0,
                kind,
                last_committed: opts.last_committed,
                next: 0,
                reported: false,
                abort: None,
                dumps: Vec::new(),
            },
            opts,
            own: HashMap::new(),
        };
        // From here on, Drop finalizes.
        b.size = sys::job_size(&b.nspace).map_err(|e| b.pmix_error(e))?;
        if b.rank == 0 {
            b.store = b.opts.store.as_ref().map(|(dir, job)| {
                EpochStore::open(dir, job).map_err(|e| format!("cannot open the epoch store: {e}"))
            });
        }
        b.register(kind)?;
        Ok(b)
    }

    /// Starts another round with the same ranks (REGISTER barrier, new epoch). Every rank
    /// must call it; the previous round must be over (last phase reported) or aborted.
    pub fn start_round(&mut self, kind: RoundKind) -> Result<(), ClientError> {
        let r = &self.round;
        if r.abort.is_none() && (r.next < r.kind.phases().len() || !r.reported) {
            return Err(ClientError::Unexpected {
                node: self.node.clone(),
                during: "starting a round over PMIx",
                got: format!("a new round while epoch {} is still running", r.epoch),
            });
        }
        self.register(kind)
    }

    /// The REGISTER barrier: rank 0 chooses the epoch, every rank adopts it.
    fn register(&mut self, kind: RoundKind) -> Result<(), ClientError> {
        let seq = ROUNDS.fetch_add(1, Ordering::Relaxed) + 1;
        let key = format!("ckpt.round{seq}.REGISTER");
        let mut mine = Register {
            node: self.node.clone(),
            kind,
            epoch: 0,
            last_committed: None,
            error: None,
        };
        if self.rank == 0 {
            match self.choose_epoch() {
                Ok((e, last)) => {
                    mine.epoch = e;
                    mine.last_committed = last;
                }
                Err(reason) => mine.error = Some(reason),
            }
        }
        let fenced = self.exchange(&key, &mine)?;
        let regs: Vec<Option<Register>> = self.collect(&key, mine);
        let (epoch, last) = match &regs[0] {
            Some(r) => (r.epoch, r.last_committed),
            None => (0, None),
        };
        self.round = Round {
            epoch,
            kind,
            last_committed: last,
            next: 0,
            reported: false,
            abort: None,
            dumps: Vec::new(),
        };
        self.next_epoch = epoch + 1;
        let fault = regs.iter().enumerate().find_map(|(r, reg)| {
            let r = u32::try_from(r).unwrap_or(u32::MAX);
            match reg {
                None => Some((format!("rank{r}"), missing_reason(Phase::Register, &fenced))),
                Some(reg) if reg.error.is_some() => {
                    Some((label(r, &reg.node), reg.error.clone().unwrap_or_default()))
                }
                Some(reg) if reg.kind != kind => Some((
                    label(r, &reg.node),
                    format!(
                        "asked for a {:?} round, rank {} for {kind:?}",
                        reg.kind, self.rank
                    ),
                )),
                Some(_) => None,
            }
        });
        if let Some((node, reason)) = fault {
            let a = Abort {
                epoch,
                phase: Phase::Register,
                node,
                reason,
            };
            let e = a.error();
            self.round.abort = Some(a);
            return Err(e);
        }
        Ok(())
    }

    /// Rank 0: the round's epoch and the last committed one.
    fn choose_epoch(&mut self) -> Result<(u64, Option<u64>), String> {
        match &self.store {
            Some(Ok(s)) => {
                let last = s
                    .last_committed()
                    .map_err(|e| format!("cannot read the epoch store: {e}"))?
                    .map(|m| m.epoch)
                    .or(self.round.last_committed);
                let e = s
                    .next_epoch(last)
                    .map_err(|e| format!("cannot reserve an epoch: {e}"))?;
                Ok((e, last))
            }
            Some(Err(e)) => Err(e.clone()),
            None => Ok((self.next_epoch, self.round.last_committed)),
        }
    }

    /// Put + Commit + Fence(collect). `Ok(Err(status))` when the fence itself failed in a
    /// way that still lets us look for the missing ranks (timeout, partial success).
    fn exchange<T: Serialize>(
        &mut self,
        key: &str,
        value: &T,
    ) -> Result<Result<(), sys::PmixError>, ClientError> {
        let bytes = postcard::to_stdvec(value).map_err(|e| ClientError::Unexpected {
            node: self.node.clone(),
            during: "encoding a PMIx barrier record",
            got: e.to_string(),
        })?;
        sys::put_bytes(key, &bytes).map_err(|e| self.pmix_error(e))?;
        sys::commit().map_err(|e| self.pmix_error(e))?;
        match sys::fence(&self.nspace, self.opts.fence_timeout) {
            Ok(()) => Ok(Ok(())),
            Err(e) if matches!(e.status, sys::ERR_TIMEOUT | sys::ERR_PARTIAL_SUCCESS) => Ok(Err(e)),
            Err(e) => Err(self.pmix_error(e)),
        }
    }

    /// Every rank's record under `key` (ours is `mine`), `None` where it is missing.
    fn collect<T: for<'de> Deserialize<'de>>(&self, key: &str, mine: T) -> Vec<Option<T>> {
        let mut mine = Some(mine);
        (0..self.size)
            .map(|r| {
                if r == self.rank {
                    return mine.take();
                }
                match sys::get(&sys::Proc::new(&self.nspace, r), key, sys::Lookup::Local) {
                    Ok(sys::Fetched::Bytes(b)) => postcard::from_bytes(&b).ok(),
                    _ => None,
                }
            })
            .collect()
    }

    /// The barrier of `phase`: publish our status, fence, read everyone's.
    fn barrier(&mut self, phase: Phase, report: Report) -> Result<(), ClientError> {
        let key = format!("ckpt.{}.{phase}", self.round.epoch);
        let fenced = self.exchange(&key, &report)?;
        let reports = self.collect(&key, report);
        self.round.reported = true;
        let fault = reports.iter().enumerate().find_map(|(r, rep)| {
            let r = u32::try_from(r).unwrap_or(u32::MAX);
            match rep {
                None => Some((format!("rank{r}"), missing_reason(phase, &fenced))),
                Some(rep) if !rep.ok => Some((label(r, &rep.node), rep.reason.clone())),
                Some(_) => None,
            }
        });
        // A fence that failed without anyone missing still leaves the collective broken.
        let fault = fault.or_else(|| {
            fenced.err().map(|e| {
                (
                    format!("namespace {}", self.nspace),
                    format!("{phase} barrier: {e}"),
                )
            })
        });
        if let Some((node, reason)) = fault {
            self.round.abort = Some(Abort {
                epoch: self.round.epoch,
                phase,
                node,
                reason,
            });
        } else if phase == Phase::Dump {
            self.round.dumps = reports
                .into_iter()
                .flatten()
                .map(|r| (r.node, r.info))
                .collect();
        }
        Ok(())
    }

    /// The COMMIT barrier: rank 0 writes the manifest, every rank learns the outcome.
    fn commit_barrier(&mut self) -> Result<(), ClientError> {
        let mut report = Report {
            ok: true,
            node: self.node.clone(),
            reason: String::new(),
            info: PhaseInfo::None,
        };
        if self.rank == 0
            && let Some(Ok(store)) = &self.store
        {
            let mut nodes: Vec<NodeManifest> = self
                .round
                .dumps
                .iter()
                .map(|(node, info)| match info {
                    PhaseInfo::Dump {
                        image_dir,
                        manifest_crc32c,
                    } => NodeManifest {
                        node: node.clone(),
                        image_dir: image_dir.clone(),
                        manifest_crc32c: *manifest_crc32c,
                    },
                    _ => NodeManifest {
                        node: node.clone(),
                        image_dir: String::new(),
                        manifest_crc32c: 0,
                    },
                })
                .collect();
            nodes.sort_by(|a, b| a.node.cmp(&b.node));
            let job = self
                .opts
                .store
                .as_ref()
                .map(|(_, j)| j.clone())
                .unwrap_or_default();
            let manifest = GlobalManifest {
                job,
                epoch: self.round.epoch,
                committed_unix_ms: now_ms(),
                nodes,
            };
            if let Err(e) = store.commit(&manifest) {
                report.ok = false;
                report.reason = format!("commit failed: {e}");
            }
        }
        self.barrier(Phase::Commit, report)?;
        match &self.round.abort {
            Some(a) => {
                if self.rank == 0
                    && let Some(Ok(store)) = &self.store
                {
                    let _ = store.record_abort(a.epoch, a.phase, &a.node, &a.reason);
                }
                Err(a.error())
            }
            None => {
                self.round.last_committed = Some(self.round.epoch);
                Ok(())
            }
        }
    }

    fn report(&mut self, phase: Phase, report: Report) -> Result<(), ClientError> {
        if self.round.abort.is_some() || phase == Phase::Commit {
            // Every rank saw the same abort (nobody fences again); COMMIT takes no reply.
            return Ok(());
        }
        let phases = self.round.kind.phases();
        let current = self.round.next.checked_sub(1).map(|i| phases[i]);
        let previous_done = self.round.next == 0 || self.round.reported;
        if !report.ok && phases.get(self.round.next) == Some(&phase) && previous_done {
            // Failed before even waiting for the phase: take it as entered.
            self.round.next += 1;
        } else if current != Some(phase) || self.round.reported {
            return Err(ClientError::Unexpected {
                node: self.node.clone(),
                during: "reporting a phase over PMIx",
                got: format!(
                    "a report for {phase} (epoch {}: current phase {}, already reported: {})",
                    self.round.epoch,
                    current
                        .map(|p| p.to_string())
                        .unwrap_or_else(|| "none".into()),
                    self.round.reported
                ),
            });
        }
        self.barrier(phase, report)?;
        if let Some(a) = &self.round.abort
            && self.rank == 0
            && let Some(Ok(store)) = &self.store
            && self.round.last_committed != Some(a.epoch)
        {
            let _ = store.record_abort(a.epoch, a.phase, &a.node, &a.reason);
        }
        Ok(())
    }

    fn step(&self, phase: Phase) -> Step {
        Step {
            epoch: self.round.epoch,
            phase,
            kind: self.round.kind,
            deadline: self.opts.fence_timeout,
            last_committed: self.round.last_committed,
        }
    }

    fn pmix_error(&self, e: sys::PmixError) -> ClientError {
        pmix_error(&self.node, e)
    }

    /// Our rank in the PMIx namespace.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks (`PMIX_JOB_SIZE`).
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The PMIx namespace (`slurm.pmix.<job>.<step>` under Slurm).
    pub fn nspace(&self) -> &str {
        &self.nspace
    }

    /// Our node name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Epoch of the current round (chosen by rank 0 at its REGISTER barrier).
    pub fn epoch(&self) -> u64 {
        self.round.epoch
    }

    /// Last committed epoch as known to this round.
    pub fn last_committed(&self) -> Option<u64> {
        self.round.last_committed
    }

    /// Fetches `key` as published by `rank`, asking the PMIx server if it is not local yet
    /// (direct modex, `PMIX_TIMEOUT`). Faster than [`PhaseBackend::get`] when the publisher
    /// is known.
    pub fn get_from(
        &mut self,
        rank: u32,
        key: &str,
        timeout: Duration,
    ) -> Result<Vec<u8>, ClientError> {
        if rank == self.rank
            && let Some(v) = self.own.get(key)
        {
            return Ok(v.clone());
        }
        let full = self.kv_key(key);
        match sys::get(
            &sys::Proc::new(&self.nspace, rank),
            &full,
            sys::Lookup::Wait(timeout),
        ) {
            Ok(sys::Fetched::Bytes(b)) => Ok(b),
            Ok(_) => Err(ClientError::Unexpected {
                node: self.node.clone(),
                during: "PMIx_Get of a key",
                got: format!("a value of another type for {key:?} from rank {rank}"),
            }),
            Err(e) if matches!(e.status, sys::ERR_TIMEOUT | sys::ERR_NOT_FOUND) => {
                Err(ClientError::KeyTimeout {
                    node: self.node.clone(),
                    key: key.to_string(),
                    timeout,
                })
            }
            Err(e) => Err(self.pmix_error(e)),
        }
    }

    fn kv_key(&self, key: &str) -> String {
        format!("ckpt.{}.kv.{key}", self.round.epoch)
    }
}

fn missing_reason(phase: Phase, fenced: &Result<(), sys::PmixError>) -> String {
    match fenced {
        Ok(()) => format!("no {phase} status after the barrier"),
        Err(e) => format!("did not reach the {phase} barrier ({e})"),
    }
}

fn pmix_error(node: &str, e: sys::PmixError) -> ClientError {
    ClientError::Backend {
        node: node.to_string(),
        call: e.call,
        status: format!("PMIx status {} ({})", sys::error_string(e.status), e.status),
    }
}

impl PhaseBackend for PmixBackend {
    /// Returns the next phase of the round once the previous phase's barrier passed;
    /// `Err(Aborted)` if a rank failed it, `Err(UnexpectedPhase)` if `expected` is not next.
    fn wait_phase(&mut self, expected: Phase) -> Result<Step, ClientError> {
        if let Some(a) = &self.round.abort {
            return Err(a.error());
        }
        let phases = self.round.kind.phases();
        let Some(&next) = phases.get(self.round.next) else {
            return Err(ClientError::Unexpected {
                node: self.node.clone(),
                during: "waiting for a phase over PMIx",
                got: format!(
                    "a wait for {expected} after epoch {} ended (start_round begins another)",
                    self.round.epoch
                ),
            });
        };
        if let Some(prev) = self.round.next.checked_sub(1).map(|i| phases[i])
            && prev != Phase::Commit
            && !self.round.reported
        {
            return Err(ClientError::Unexpected {
                node: self.node.clone(),
                during: "waiting for a phase over PMIx",
                got: format!("a wait for {expected} before {prev} was reported"),
            });
        }
        if next != expected {
            return Err(ClientError::UnexpectedPhase {
                node: self.node.clone(),
                epoch: self.round.epoch,
                expected,
                got: next,
            });
        }
        self.round.next += 1;
        self.round.reported = false;
        if next == Phase::Commit {
            self.commit_barrier()?;
        }
        Ok(self.step(next))
    }

    fn report_done(&mut self, phase: Phase, info: PhaseInfo) -> Result<(), ClientError> {
        let report = Report {
            ok: true,
            node: self.node.clone(),
            reason: String::new(),
            info,
        };
        self.report(phase, report)
    }

    fn report_failed(&mut self, phase: Phase, reason: &str) -> Result<(), ClientError> {
        let report = Report {
            ok: false,
            node: self.node.clone(),
            reason: reason.to_string(),
            info: PhaseInfo::None,
        };
        self.report(phase, report)
    }

    fn put(&mut self, key: &str, value: &[u8]) -> Result<(), ClientError> {
        let full = self.kv_key(key);
        sys::put_bytes(&full, value).map_err(|e| self.pmix_error(e))?;
        sys::commit().map_err(|e| self.pmix_error(e))?;
        self.own.insert(key.to_string(), value.to_vec());
        Ok(())
    }

    fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>, ClientError> {
        if let Some(v) = self.own.get(key) {
            return Ok(v.clone());
        }
        let full = self.kv_key(key);
        let start = Instant::now();
        let mut pause = Duration::from_millis(2);
        // Start the scan at the next rank so ranks do not all hit rank 0 first.
        let order: Vec<u32> = (1..self.size)
            .map(|i| (self.rank + i) % self.size)
            .collect();
        loop {
            if let Some(a) = &self.round.abort {
                return Err(a.error());
            }
            for &r in &order {
                let p = sys::Proc::new(&self.nspace, r);
                if let Ok(sys::Fetched::Bytes(b)) = sys::get(&p, &full, sys::Lookup::Local) {
                    return Ok(b);
                }
            }
            if start.elapsed() >= timeout {
                return Err(ClientError::KeyTimeout {
                    node: self.node.clone(),
                    key: key.to_string(),
                    timeout,
                });
            }
            std::thread::sleep(pause.min(timeout.saturating_sub(start.elapsed())));
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}

impl Drop for PmixBackend {
    fn drop(&mut self) {
        let _ = sys::finalize();
    }
}
