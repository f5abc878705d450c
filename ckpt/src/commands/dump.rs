//! `ckpt dump`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use ckpt_coord::protocol::{Intent, Phase as CoordPhase, PhaseInfo, RoundKind};
use ckpt_dumper::{DumpReport, WriteOptions};

use super::agent::{CoordOpts, Local, Session, epoch_dir};
use crate::scripts::{ActionScripts, Phase};
use ckpt_image::caller::with_caller_rights;

/// Arguments of `ckpt dump`.
#[derive(clap::Args, Debug)]
pub struct DumpArgs {
    /// The process to checkpoint, with all its threads and descendants.
    #[arg(long = "tree", short = 't', value_name = "PID")]
    pid: i32,
    /// Checkpoint directory to create; must not exist. With --coord, this
    /// node's checkpoint root: epoch E is written to DIR/epoch-E.
    #[arg(long, short = 'D', value_name = "DIR")]
    dir: PathBuf,
    /// Leave the process running after the dump (the default).
    #[arg(long, conflicts_with = "kill")]
    leave_running: bool,
    /// Kill the process once the images are complete and synced (with
    /// --coord: once the epoch is committed, whatever the round says).
    /// Lets the dump take what it cannot give back: the data a UNIX
    /// client sent on a connection not yet accepted.
    #[arg(long)]
    kill: bool,
    /// How page data is stored: `auto` (the default) and `lz4` compress it
    /// with LZ4 (chunks that do not shrink are stored raw); `none`.
    /// `--compress` alone means `lz4`.
    #[arg(long, value_enum, value_name = "MODE", default_value_t = Compression::Auto,
          num_args = 0..=1, require_equals = true, default_missing_value = "lz4")]
    compress: Compression,
    /// Freeze the tree only to save registers, files and shared memory and
    /// to write-protect private memory, then let it run while that memory is
    /// saved: the image is still the memory of the freeze instant (a write
    /// to a page not saved yet waits until ckpt has read it). Fails, leaving
    /// the job unharmed, if the job unmaps memory before it is saved.
    /// Post-dump action scripts run with the tree running.
    #[arg(long, conflicts_with = "kill")]
    background: bool,
    /// Save memory only, mostly while the tree runs, and leave write
    /// tracking in every process: a later dump with `--prev DIR` then
    /// reads only the pages written since (a short final freeze). Not
    /// restorable by itself.
    #[arg(long, conflicts_with_all = ["kill", "background"])]
    pre_dump: bool,
    /// A pre-dump of the same tree: pages unchanged since are taken from it
    /// (verified) instead of the tree. The new checkpoint holds all it needs;
    /// DIR can be removed afterwards. With --background, only the pages
    /// written since are saved frozen, and the tree runs while the rest is
    /// copied from DIR.
    #[arg(long, value_name = "DIR")]
    prev: Option<PathBuf>,
    /// Leave write tracking in every process after this (restorable)
    /// checkpoint, as --pre-dump does, so that the next dump can take
    /// `--prev DIR` on it: periodic checkpoints, each complete, each
    /// reading only the pages written since the one before.
    #[arg(long, conflicts_with_all = ["kill", "background", "pre_dump"])]
    track: bool,
    /// With --coord, periodic checkpoints of a job: leave write tracking in
    /// every process (as --track; not with --kill, which ends the chain)
    /// and take this node's images of the last committed epoch as --prev
    /// when they are here. Each epoch is complete (restorable alone, the one
    /// before removable once it commits); the tree is read only for the
    /// pages written since the last epoch.
    #[arg(long, requires = "addr", conflicts_with_all = ["background", "pre_dump", "track", "prev"])]
    incremental: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// The site's image key file, created on first use (default: $CKPT_IMAGE_KEY, else
    /// /var/lib/ckpt/image.key).
    #[arg(long, value_name = "PATH")]
    image_key: Option<PathBuf>,
    /// Run this program at pre-dump (before the freeze) and post-dump
    /// (images committed, tree still frozen) (repeatable); a failure aborts
    /// the dump.
    #[arg(long = "action-script", value_name = "PATH")]
    action_scripts: Vec<PathBuf>,
    /// Accepted for CRIU compatibility; changes nothing (terminals are
    /// always recorded; see `restore --shell-job`).
    #[arg(long, short = 'j')]
    shell_job: bool,
    /// Declare an open file external instead of refusing it (repeatable):
    /// KEY is `pipe:[INODE]` or `socket:[INODE]` as /proc/PID/fd shows the
    /// fd, or a path. Nothing of it is saved; restore is handed an fd for it
    /// with `--inherit-fd fd[N]:KEY`.
    #[arg(long = "external", value_name = "KEY")]
    externals: Vec<String>,
    /// Also save established TCP connections to peers outside the tree
    /// (CRIU's option): they are frozen in repair mode, and after
    /// `--kill` the peer sees nothing until the restored process continues
    /// the stream. Connections with both ends in the tree are always saved.
    #[arg(long)]
    tcp_established: bool,
    /// How the peers of connections saved with `--tcp-established` are
    /// kept from seeing a reset while the sockets are gone (after `--kill`,
    /// until the restore): `nftables` (the default) drops their segments
    /// with rules of ckpt's own (table `inet ckpt-PID`, PID the tree's
    /// root), which the restore deletes: the peer retransmits and just sees
    /// a delay; it needs the `nft` program. `none` leaves the peer to get a
    /// reset if it sends meanwhile. Delete a lock of a checkpoint that will
    /// not be restored by hand: `nft delete table inet ckpt-PID`.
    #[arg(long, value_enum, value_name = "HOW", default_value_t = NetworkLockArg::Nftables)]
    network_lock: NetworkLockArg,
    /// Dump a rank of `srun --mpi=pmix` instead of refusing it: its
    /// connection to its PMIx server in slurmstepd is saved as the identity
    /// it connected with, and a restore inside a new `srun --mpi=pmix` step
    /// of the same job connects it to that step's server (docs/slurm.md,
    /// "MPI launchers").
    #[arg(long)]
    pmix_reconnect: bool,
    /// Coordinated checkpoint of a multi-node job.
    #[command(flatten)]
    coord: CoordOpts,
}

impl DumpArgs {
    /// The user named a key of their own (flag or environment).
    pub fn has_own_key(&self) -> bool {
        self.image_key.is_some() || std::env::var_os(ckpt_image::seal::KEY_ENV).is_some()
    }

    /// What of this command the ckpt service does not run for a user, if
    /// anything: flags that would have root run a program or trust another
    /// key. `--coord` is the user's (what a coordinator can ask concerns
    /// only the user's own processes and images; the secret is read with
    /// the user's rights, `agent::join`).
    pub fn service_refusal(&self) -> Option<anyhow::Error> {
        use crate::service::worker::{ROOT_ONLY_HINT, refuse};
        if self.image_key.is_some() {
            return Some(refuse(
                "--image-key",
                "the service seals your images with your own key",
            ));
        }
        if !self.action_scripts.is_empty() {
            return Some(refuse("--action-script", ROOT_ONLY_HINT));
        }
        None
    }
}

/// Runs `ckpt dump`.
pub fn run(a: DumpArgs) -> anyhow::Result<ExitCode> {
    let bar = super::progress_bar("dumping pages").filter(|_| !crate::logger::verbose_on_stderr());
    let progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    // The engine's phases, one after the other (a coordinated dump runs
    // the same steps with barriers between them).
    let key = super::image_key(a.image_key.as_deref(), super::KeyUse::Seal)?;
    if a.coord.enabled() {
        anyhow::ensure!(
            !a.pre_dump && a.prev.is_none() && !a.track,
            "--pre-dump, --prev and --track do not go with --coord: --incremental chains the epochs"
        );
        let report = coordinated(&a, &key, &progress);
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        let (epoch, report, killed) = report?;
        print_report(&a, &report, killed, Some(epoch))?;
        return Ok(ExitCode::SUCCESS);
    }
    // Verified before anything is frozen.
    let prev = a
        .prev
        .as_deref()
        .map(|dir| ckpt_dumper::Previous::open(dir, &key))
        .transpose()
        .with_context(|| format!("dump of pid {} failed", a.pid))?;
    let write = WriteOptions {
        background: a.background,
        prev: prev.as_ref(),
        track: a.track,
        ..write_options(&a, a.dir.clone(), &key, &progress)
    };
    let scripts = ActionScripts::new(a.action_scripts.clone(), &a.dir);
    let report =
        phases(&a, &write, &scripts).with_context(|| format!("dump of pid {} failed", a.pid));
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let report = report?;
    print_report(&a, &report, a.kill, None)?;
    Ok(ExitCode::SUCCESS)
}

/// The write options of both a plain and a coordinated dump, from the
/// command line: a flag for how images are written is added here once. Only
/// a plain dump may run in the background or on top of a previous one; the
/// caller sets those.
fn write_options<'a>(
    a: &'a DumpArgs,
    dir: std::path::PathBuf,
    key: &'a ckpt_image::ImageKey,
    progress: &'a (dyn Fn(u64, u64) + Sync),
) -> WriteOptions<'a> {
    WriteOptions {
        dir,
        progress: Some(progress),
        compress: a.compress.lz4(),
        key,
        log: Some(&crate::logger::captured),
        externals: &a.externals,
        background: false,
        prev: None,
        track: false,
        held: None,
        before_thaw: None,
        kill_after: a.kill,
    }
}

/// Prints what was dumped (and, coordinated, the committed epoch).
fn print_report(
    a: &DumpArgs,
    report: &DumpReport,
    killed: bool,
    epoch: Option<u64>,
) -> anyhow::Result<()> {
    if a.json {
        super::print_stdout(&format!(
            "{}\n",
            serde_json::json!({
                "pid": report.pid,
                "processes": report.processes,
                "dir": report.dir,
                "vmas": report.vmas,
                "pages_bytes": report.pages_bytes,
                "fds": report.fds,
                "frozen_ms": report.frozen_ms,
                "killed": killed,
                "epoch": epoch,
                "stats": report.stats,
            })
        ))?;
    } else {
        eprintln!(
            "dumped pid {} ({} processes) to {}: {} VMAs, {} bytes of pages, {} fds, frozen {} ms{}{}",
            report.pid,
            report.processes,
            report.dir.display(),
            report.vmas,
            report.pages_bytes,
            report.fds,
            report.frozen_ms,
            epoch.map_or_else(String::new, |e| format!(", epoch {e} committed")),
            if killed { ", killed" } else { "" }
        );
    }
    Ok(())
}

/// What the checks before the freeze let through.
fn freeze_options(a: &DumpArgs) -> ckpt_dumper::FreezeOptions {
    ckpt_dumper::FreezeOptions {
        pmix_reconnect: a.pmix_reconnect,
    }
}

/// The engine's phases with the action scripts between them.
fn phases(
    a: &DumpArgs,
    write: &WriteOptions<'_>,
    scripts: &ActionScripts,
) -> anyhow::Result<DumpReport> {
    scripts.run(Phase::PreDump, Some(a.pid))?;
    // Faulted in just before the freeze, so the frozen part does not pay.
    let held = ckpt_dumper::HeldMemory::for_dump(write);
    let write = &WriteOptions {
        held: Some(&held),
        ..write.clone()
    };
    let mut frozen = ckpt_dumper::freeze_with(a.pid, freeze_options(a))?;
    if a.pre_dump {
        let report = frozen.pre_dump(write)?;
        scripts.run(Phase::PostDump, Some(a.pid))?;
        return Ok(report);
    }
    frozen.drain(&ckpt_dumper::DrainOptions {
        tcp_established: a.tcp_established,
        network_lock: a.network_lock.into(),
    })?;
    let written = frozen.write(write)?;
    if let Err(e) = scripts.run(Phase::PostDump, Some(a.pid)) {
        // A vetoed dump leaves no checkpoint, like any failed one; dropping
        // `written` then thaws the tree.
        let dir = &written.report().dir;
        if let Err(rm) = std::fs::remove_dir_all(dir) {
            return Err(anyhow::Error::new(e).context(format!(
                "{}: cannot remove the vetoed checkpoint: {rm}",
                dir.display()
            )));
        }
        return Err(e.into());
    }
    Ok(if a.kill {
        written.kill()?
    } else {
        written.resume()?
    })
}

/// `ckpt dump --coord`: this node's agent. Each engine phase runs when the
/// coordinator starts it, and this node reports back; the tree stays frozen
/// from FREEZE until the epoch is committed or aborted. Returns the epoch,
/// the report and whether the tree was killed.
///
/// After COMMIT the tree is killed if this command has `--kill` or the
/// round ends in KILL (`ckpt coord trigger --kill`), else resumed: either
/// side can ask to stop the job, and both only once the checkpoint is the
/// job's valid one.
fn coordinated(
    a: &DumpArgs,
    key: &ckpt_image::ImageKey,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> anyhow::Result<(u64, DumpReport, bool)> {
    let intent = if a.background {
        Intent::BackgroundCheckpoint
    } else {
        Intent::Checkpoint
    };
    let mut s = super::agent::join(&a.coord, intent)?;
    let step = s.wait(CoordPhase::Freeze)?;
    let dir = epoch_dir(&a.dir, step.epoch);
    let prev = if a.incremental {
        with_caller_rights(|| previous_epoch(a, key, &s, step.last_committed))?
    } else {
        None
    };
    // Epoch numbers are never reused, so this is someone else's directory:
    // refuse it, and never remove it.
    let foreign = dir.symlink_metadata().is_ok();
    let mut committed = false;
    let r = if foreign {
        s.local(Err(anyhow::anyhow!(
            "{} already exists: not this epoch's, refused",
            dir.display()
        )))
    } else {
        let write = WriteOptions {
            // A tree killed after the commit has no next epoch to track for.
            track: a.incremental && !a.kill,
            prev: prev.as_ref(),
            ..write_options(a, dir.clone(), key, progress)
        };
        coordinated_phases(a, &write, &mut s, &dir, step.kind, &mut committed)
    };
    // Any `Frozen`/`Written` is dropped by now: the tree is thawed as it
    // was. An epoch that did not commit leaves no images behind.
    // A user's images are removed with the user's rights: the directory
    // is a path they named.
    if r.is_err()
        && !committed
        && !foreign
        && let Err(e) = with_caller_rights(|| std::fs::remove_dir_all(&dir))
            .map_err(std::io::Error::other)
            .flatten()
        && e.kind() != std::io::ErrorKind::NotFound
    {
        log::warn!(
            "{}: cannot remove the aborted epoch's {}: {e}",
            s.at(),
            dir.display()
        );
    }
    r.map(|(report, killed)| (step.epoch, report, killed))
}

/// The phases of [`coordinated`] from FREEZE on; sets `committed` once the
/// coordinator made the epoch the valid checkpoint.
fn coordinated_phases(
    a: &DumpArgs,
    write: &WriteOptions<'_>,
    s: &mut Session,
    dir: &std::path::Path,
    kind: RoundKind,
    committed: &mut bool,
) -> anyhow::Result<(DumpReport, bool)> {
    let background = kind == RoundKind::BackgroundCheckpoint;
    if background && a.kill {
        return s.local(Err(anyhow::anyhow!(
            "--kill does not go with a background round: the tree runs on while its pages are written"
        )));
    }
    let scripts = ActionScripts::new(a.action_scripts.clone(), dir);
    s.local(scripts.run(Phase::PreDump, Some(a.pid)))?;
    let mut frozen = s.local(ckpt_dumper::freeze_with(a.pid, freeze_options(a)))?;
    s.done(PhaseInfo::None)?;

    s.wait(CoordPhase::Drain)?;
    // Only TCP for now; InfiniBand queue pairs will be drained here too.
    s.local(frozen.drain(&ckpt_dumper::DrainOptions {
        tcp_established: a.tcp_established,
        network_lock: a.network_lock.into(),
    }))?;
    s.done(PhaseInfo::None)?;

    let written = if background {
        s.local(if write.track {
            Err(anyhow::anyhow!(
                "--incremental does not go with a background round"
            ))
        } else {
            Ok(())
        })?;
        background_write(a, s, frozen, write)?
    } else {
        // Every node's tree stays frozen until the epoch is committed.
        s.wait(CoordPhase::Dump)?;
        s.local(create_root(a))?;
        s.local(frozen.write(write))?
    };
    s.local(scripts.run(Phase::PostDump, Some(a.pid)))?;
    let info = s.local(dump_info(dir))?;
    s.done(info)?;

    s.wait(CoordPhase::Commit)?;
    *committed = true;
    let end = s.wait_any(&[CoordPhase::Resume, CoordPhase::Kill])?;
    let kill = a.kill || end.phase == CoordPhase::Kill;
    let report = if kill {
        s.local(written.kill())?
    } else {
        s.local(written.resume())?
    };
    s.done(PhaseInfo::None)?;
    Ok((report, kill))
}

/// `--incremental`: this node's images of the job's last committed epoch,
/// verified, if they are here (a node's first epoch, or one whose images
/// were pruned or moved, is dumped whole). Opened before the freeze. An
/// epoch that cannot be opened is not fatal: the dump reads everything
/// from the tree, as the first one did.
fn previous_epoch(
    a: &DumpArgs,
    key: &ckpt_image::ImageKey,
    s: &Session,
    last_committed: Option<u64>,
) -> Option<ckpt_dumper::Previous> {
    let dir = epoch_dir(&a.dir, last_committed?);
    if !dir.exists() {
        log::info!(
            "{}: no images of the last committed epoch at {}: dumped whole",
            s.at(),
            dir.display()
        );
        return None;
    }
    match ckpt_dumper::Previous::open(&dir, key) {
        Ok(p) => {
            log::info!("{}: incremental on {}", s.at(), dir.display());
            Some(p)
        }
        Err(e) => {
            log::warn!(
                "{}: cannot use {} as the previous epoch ({e}): dumped whole",
                s.at(),
                dir.display()
            );
            None
        }
    }
}

/// The checkpoint root, created if missing (for a user of the ckpt
/// service, with their rights: only where they could, and theirs).
fn create_root(a: &DumpArgs) -> anyhow::Result<()> {
    with_caller_rights(|| std::fs::create_dir_all(&a.dir))?
        .with_context(|| format!("creating the checkpoint root {}", a.dir.display()))
}

/// A background round's CAPTURE and DUMP: the frozen state is captured and
/// the rest of the memory write-protected in CAPTURE; the tree thaws only
/// on the DUMP command, once every node has captured its own (so no part
/// runs on while another is still frozen-capturing), and the pages are
/// written while it runs. On an abort the tree is thawed unharmed and no
/// image is left.
fn background_write(
    a: &DumpArgs,
    s: &mut Session,
    frozen: ckpt_dumper::Frozen,
    write: &WriteOptions<'_>,
) -> anyhow::Result<ckpt_dumper::Written> {
    s.wait(CoordPhase::Capture)?;
    s.local(create_root(a))?;
    let session = std::sync::Mutex::new(s);
    // The session's own error (an abort naming the failed node, or the lost
    // coordinator), kept whole: the dumper only carries its text.
    let barrier_error: std::sync::Mutex<Option<anyhow::Error>> = std::sync::Mutex::new(None);
    let gate = || -> Result<(), String> {
        let mut s = session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let r = s
            .done(PhaseInfo::None)
            .and_then(|()| s.wait(CoordPhase::Dump).map(drop));
        r.map_err(|e| {
            let text = format!("{e:#}");
            *barrier_error
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e.into());
            text
        })
    };
    let r = frozen.write(&WriteOptions {
        background: true,
        before_thaw: Some(&gate),
        ..write.clone()
    });
    let s = session
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match barrier_error
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        // Already known to the coordinator: it is the one that said no.
        Some(e) => Err(e),
        None => s.local(r),
    }
}

/// What the coordinator records of this node's images: their directory and
/// the crc32c of their manifest.
fn dump_info(dir: &std::path::Path) -> anyhow::Result<PhaseInfo> {
    let image_dir =
        std::path::absolute(dir).with_context(|| format!("{}: absolute path", dir.display()))?;
    let manifest = image_dir.join(ckpt_image::MANIFEST_NAME);
    let bytes =
        std::fs::read(&manifest).with_context(|| format!("reading {}", manifest.display()))?;
    Ok(PhaseInfo::Dump {
        image_dir: image_dir.display().to_string(),
        manifest_crc32c: crc32c::crc32c(&bytes),
    })
}

/// How the peers of saved outside connections are kept from seeing resets
/// (`ckpt dump --network-lock`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkLockArg {
    /// nftables rules drop their segments until the restore.
    Nftables,
    /// No lock.
    None,
}

impl From<NetworkLockArg> for ckpt_dumper::NetworkLock {
    fn from(a: NetworkLockArg) -> Self {
        match a {
            NetworkLockArg::Nftables => ckpt_dumper::NetworkLock::Nftables,
            NetworkLockArg::None => ckpt_dumper::NetworkLock::None,
        }
    }
}

/// How page data is stored (`ckpt dump --compress`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// The default: LZ4 wherever the images go.
    Auto,
    /// Raw pages.
    None,
    /// LZ4 blocks.
    Lz4,
}

impl Compression {
    /// Whether page data is LZ4-compressed. `auto`
    /// compresses on every storage. On disks and network filesystems there
    /// are fewer bytes to write and sync (LZ4 runs at some 4 GB/s per core,
    /// zero and repetitive pages shrink to almost nothing). On tmpfs every
    /// byte stored is a fresh page of memory, which costs more than
    /// compressing it: 4 GiB of mixed memory dumped in 1.9 s instead of
    /// 2.3–2.9 s raw and restored in 1.4 s instead of 1.7–1.9 s, in a third
    /// less memory. Memory that does not compress costs little either way:
    /// a chunk whose first 64 KiB do not shrink is stored raw untried.
    pub fn lz4(self) -> bool {
        match self {
            Compression::None => false,
            Compression::Lz4 | Compression::Auto => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_follows_the_mode_and_auto_compresses() {
        assert!(!Compression::None.lz4());
        assert!(Compression::Lz4.lz4());
        assert!(Compression::Auto.lz4());
    }
}
