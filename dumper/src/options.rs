//! What a dump is asked to do: the options of [`crate::dump`] and of each
//! phase.

use std::path::PathBuf;

use ckpt_image::ImageKey;

use crate::{HeldMemory, Previous};

/// What happens to the target once its images are complete and synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FinalState {
    /// Detach; the process carries on (the default).
    #[default]
    LeaveRunning,
    /// SIGKILL it.
    Kill,
}

/// Options of a whole dump ([`dump`](crate::dump)).
pub struct DumpOptions<'a> {
    /// The process to dump.
    pub pid: i32,
    /// Where and how to write.
    pub write: WriteOptions<'a>,
    /// What to do with the process afterwards.
    pub final_state: FinalState,
    /// What the drain saves of interconnect state.
    pub drain: DrainOptions,
}

/// Options of [`freeze_with`](crate::freeze_with).
#[derive(Debug, Clone, Copy, Default)]
pub struct FreezeOptions {
    /// A rank of `srun --mpi=pmix` is dumped, its connection to its PMIx
    /// server in slurmstepd saved as the identity it connected with, for a
    /// restore in a new step of the same job to reconnect it (`ckpt dump
    /// --pmix-reconnect`); without it such a rank is refused.
    pub pmix_reconnect: bool,
}

/// Options of [`Frozen::drain`](crate::Frozen::drain).
#[derive(Debug, Clone, Copy, Default)]
pub struct DrainOptions {
    /// Established TCP connections to a peer outside the tree are saved
    /// too (`ckpt dump --tcp-established`); without it they are refused.
    /// Connections with both ends in the tree are always saved.
    pub tcp_established: bool,
    /// What keeps the peers of those outside connections from being
    /// answered with resets while their sockets are gone (`ckpt dump
    /// --network-lock`).
    pub network_lock: NetworkLock,
}

/// How the peers of saved connections to outside the tree are kept from
/// seeing a reset between the dump and the restore.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NetworkLock {
    /// nftables rules of ckpt's own drop their segments
    /// (`ckpt_netlock`): the peer retransmits and just sees a delay.
    #[default]
    Nftables,
    /// Nothing: a segment arriving while the socket is gone is answered
    /// with a reset (for a peer known to stay silent meanwhile).
    None,
}

/// Options of [`Frozen::write`](crate::Frozen::write).
#[derive(Clone)]
pub struct WriteOptions<'a> {
    /// The checkpoint directory to create (must not exist).
    pub dir: PathBuf,
    /// Called with (bytes of page data written, total) while pages are copied.
    pub progress: Option<&'a (dyn Fn(u64, u64) + Sync)>,
    /// Store pages as LZ4 blocks (smaller images of compressible memory;
    /// restore decompresses instead of mapping the file).
    pub compress: bool,
    /// The site's key, which seals the manifest.
    pub key: &'a ImageKey,
    /// The log so far, stored as `dump.log` with the images just before
    /// the commit (so it is listed and sealed like every other file).
    pub log: Option<&'a (dyn Fn() -> Vec<u8> + Sync)>,
    /// Keys of open files the user declared external (`--external`):
    /// `pipe:[INODE]`, `socket:[INODE]` or a path, as `/proc/PID/fd` shows.
    pub externals: &'a [String],
    /// Let the tree run while its private memory is saved
    /// (`--background`): the tree is thawed once the rest is saved and that
    /// memory write-protected, and the image is still the memory of the
    /// freeze instant. [`Written::kill`](crate::Written::kill) is refused after it.
    pub background: bool,
    /// A pre-dump to take unchanged pages from (`--prev`), opened before
    /// the freeze.
    pub prev: Option<&'a Previous>,
    /// Leave write tracking in every process after this (restorable)
    /// dump, as a pre-dump does (`--track`), so that the next dump can
    /// take `--prev` on it: periodic checkpoints, each whole, each saving
    /// only what was written since the one before. Not with `background`
    /// or a kill.
    pub track: bool,
    /// With `background`: called once the frozen state is captured and the
    /// rest of the memory write-protected, just before the tree is thawed;
    /// the tree stays frozen until it returns, and an `Err` (its reason)
    /// fails the dump with [`DumpError::ThawRefused`](crate::DumpError::ThawRefused),
    /// the tree thawed unharmed and no image left. A coordinator's agent
    /// reports its capture here and waits for every other node's, so all
    /// parts of a job thaw together.
    pub before_thaw: Option<&'a (dyn Fn() -> std::result::Result<(), String> + Sync)>,
    /// Memory reserved before the freeze for the pages a `--prev
    /// --background` dump reads while frozen ([`HeldMemory::for_dump`](crate::HeldMemory::for_dump)).
    pub held: Option<&'a HeldMemory>,
    /// The tree is killed once this dump commits (`--kill`): the dump may
    /// then take what it cannot give back, the connections a UNIX
    /// listener has not accepted, whose data only accepting shows. A dump
    /// that fails after taking them leaves the tree running without them.
    pub kill_after: bool,
}

/// Name of the dump's log in the checkpoint directory.
pub const LOG_NAME: &str = "dump.log";
/// Name of the dump's figures ([`DumpStats`](crate::DumpStats) as JSON) in the checkpoint
/// directory.
pub const STATS_NAME: &str = "stats-dump.json";
