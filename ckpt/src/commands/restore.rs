//! `ckpt restore`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use ckpt_coord::protocol::{Intent, Phase as CoordPhase, PhaseInfo};
use ckpt_image::TrustedParent;
use ckpt_restorer::{AddressMap, FilePolicy, InheritFd, Rebound, RestoreOptions};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;

use super::agent::{CoordOpts, Local, NodeMove, epoch_dir, route_source};
use crate::scripts::{ActionScripts, Phase};

/// Arguments of `ckpt restore`.
#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// Checkpoint directory. With --coord, this node's checkpoint root:
    /// the job's last committed epoch E is restored from DIR/epoch-E.
    #[arg(long, short = 'D', value_name = "DIR")]
    dir: PathBuf,
    /// Exit as soon as the process runs instead of waiting for it (refused
    /// when ckpt is PID 1 of a PID namespace, whose end would kill the tree).
    #[arg(long, short = 'd')]
    detach: bool,
    /// Restore into a new PID namespace, whose PID 1 is this command (it
    /// reaps, passes SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 on to the
    /// restored root, and exits with the root's status, which ends the
    /// namespace): the dumped pids are free there even when processes on
    /// the host hold them, e.g. to run a second copy beside the first. Not
    /// with --detach, --pidfile or --coord.
    #[arg(long)]
    pidns: bool,
    /// Seconds to wait for a zombie that still holds the pid.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pid_wait: u64,
    /// Print the restored pid as JSON.
    #[arg(long)]
    json: bool,
    /// Let the processes run at once and bring their private memory back
    /// on demand (userfaultfd), the rest filled in the background until
    /// every page is resident. Without --detach, ckpt serves the pages
    /// while it waits; with it, a page server daemon does (its outcome goes
    /// to the system log and --stats-file). Killing that server before it
    /// is done leaves the pages it had not filled as zeros.
    #[arg(long)]
    lazy: bool,
    /// Write the restored root's pid to this file once it runs (for
    /// scripts and schedulers). Replaced atomically; its directory is
    /// checked first and may not be reached through a symbolic link
    /// another user owns.
    #[arg(long, value_name = "PATH")]
    pidfile: Option<PathBuf>,
    /// The site's image key file (default: $CKPT_IMAGE_KEY, else
    /// /var/lib/ckpt/image.key).
    #[arg(long, value_name = "PATH")]
    image_key: Option<PathBuf>,
    /// Hand this command's fd to the restored processes (repeatable). `N`:
    /// a terminal fd N may receive this command's fd N (0, 1 and 2 do
    /// unless they are files of someone else's than the process's user,
    /// such as a root-run hook's log; any other terminal fd gets
    /// /dev/null). `fd[N]:KEY`: this command's fd N stands in for the file
    /// declared with `ckpt dump --external KEY` (CRIU's form).
    #[arg(long = "inherit-fd", value_name = "N|fd[N]:KEY")]
    inherit_fd: Vec<InheritFd>,
    /// Accept that this open file changed since the dump (repeatable): it is
    /// reopened at its end instead of the dumped offset, as an append-only
    /// log continues. Its owner, mode and type must still match.
    #[arg(long = "allow-changed", value_name = "PATH")]
    allow_changed: Vec<PathBuf>,
    /// Run this program at pre-restore, post-restore and pre-resume
    /// (repeatable); a failure aborts the restore and kills the tree.
    #[arg(long = "action-script", value_name = "PATH")]
    action_scripts: Vec<PathBuf>,
    /// The tree is a shell job: bind its terminal fds 0-2 to this command's
    /// and let its root join this command's session and process group
    /// without a notice on stderr.
    #[arg(long, short = 'j')]
    shell_job: bool,
    /// Write the restore's figures (phase times, processes, threads, VMAs,
    /// fds, page bytes) as JSON to PATH (created 0600, never through a
    /// symbolic link, nor through a directory symlink another user owns;
    /// an existing file must be a regular file with one link). The
    /// checkpoint directory is input and stays as it is.
    #[arg(long = "stats-file", value_name = "PATH")]
    stats_file: Option<PathBuf>,
    /// The processes' address OLD is now NEW (repeatable): inet sockets
    /// bound or connected to OLD come back on NEW, ports and connection
    /// state kept, for a part restored where its addresses changed.
    #[arg(long = "map-address", value_name = "OLD=NEW", value_parser = parse_address_pair)]
    map_address: Vec<AddressPair>,
    /// Restore the tree into this network namespace (a namespace file such
    /// as /run/netns/NAME or /proc/PID/ns/net): its sockets, listening and
    /// connected, are recreated there with their addresses. Needed for a
    /// tree dumped in a network namespace of its own, whose interfaces
    /// are not in the image: set up the same addresses in the named one.
    #[arg(long, value_name = "PATH")]
    netns: Option<PathBuf>,
    /// Restore the tree into this mount namespace (a namespace file such as
    /// /proc/PID/ns/mnt of a process in it, or one bind-mounted elsewhere;
    /// its /proc must be one of ckpt's PID namespace): the processes'
    /// files are reopened by their paths there. Needed for a tree dumped
    /// in a mount namespace of its own (a container's, or one `ip netns
    /// exec` made), whose mounts are not in the image; /proc/self/ns/mnt
    /// names ckpt's own. A tree restored into a new PID namespace gets a
    /// copy of this one.
    #[arg(long, value_name = "PATH")]
    mntns: Option<PathBuf>,
    /// Every node of the job, this one included (with --coord): exchange
    /// addresses with them before the rebuild, so a part restored on a
    /// node with another address comes back on it and its peers'
    /// connections follow (this node's address is the one it reaches the
    /// coordinator from).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "NODE,...",
        requires = "addr"
    )]
    peers: Vec<String>,
    /// Coordinated restart of a multi-node job.
    #[command(flatten)]
    coord: CoordOpts,
}

impl RestoreArgs {
    /// The user named a key of their own (flag or environment).
    pub fn has_own_key(&self) -> bool {
        self.image_key.is_some() || std::env::var_os(ckpt_image::seal::KEY_ENV).is_some()
    }

    /// What of this command the ckpt service does not run for a user, if
    /// anything: flags that would have root run a program, write a file,
    /// enter a namespace or hand over an fd the user names, or leave a
    /// root daemon behind.
    pub fn service_refusal(&self) -> Option<anyhow::Error> {
        use crate::service::worker::{ROOT_ONLY_HINT, refuse};
        let flag = [
            (self.image_key.is_some(), "--image-key"),
            (!self.action_scripts.is_empty(), "--action-script"),
            (self.netns.is_some(), "--netns"),
            (self.mntns.is_some(), "--mntns"),
            (self.lazy, "--lazy"),
            (self.shell_job, "--shell-job"),
            (self.pidns, "--pidns"),
        ]
        .into_iter()
        .find_map(|(set, flag)| set.then_some(flag));
        if let Some(flag) = flag {
            return Some(refuse(flag, ROOT_ONLY_HINT));
        }
        // The worker's only fds of the user's are its stdio.
        let beyond_stdio = self.inherit_fd.iter().any(|f| match f {
            InheritFd::Terminal(n) | InheritFd::External { fd: n, .. } => *n > 2,
        });
        beyond_stdio.then(|| refuse("--inherit-fd above 2", "the service gets only your stdio"))
    }
}

/// `--map-address OLD=NEW`.
#[derive(Debug, Clone, Copy)]
struct AddressPair {
    old: IpAddr,
    new: IpAddr,
}

fn parse_address_pair(s: &str) -> Result<AddressPair, String> {
    let (old, new) = s
        .split_once('=')
        .ok_or_else(|| format!("{s}: expected OLD=NEW (two IP addresses)"))?;
    let ip = |a: &str| {
        a.parse::<IpAddr>()
            .map_err(|_| format!("{s}: {a} is not an IP address"))
    };
    let pair = AddressPair {
        old: ip(old)?,
        new: ip(new)?,
    };
    if pair.old.is_ipv4() != pair.new.is_ipv4() {
        return Err(format!("{s}: both addresses must be of one family"));
    }
    Ok(pair)
}

/// The `--map-address` pairs as a map.
fn address_map(pairs: &[AddressPair]) -> anyhow::Result<AddressMap> {
    let mut map = AddressMap::new();
    for p in pairs {
        map.insert(p.old, p.new).context("--map-address")?;
    }
    Ok(map)
}

/// Runs `ckpt restore`: exits 0 once the process runs with `--detach`,
/// otherwise waits and exits with its status (128+signal if killed).
pub fn run(a: RestoreArgs) -> anyhow::Result<ExitCode> {
    status(a).map(ExitCode::from)
}

/// [`run`]'s exit code.
pub fn status(a: RestoreArgs) -> anyhow::Result<u8> {
    if a.pidns {
        return in_new_pidns(&a);
    }
    // As PID 1 of a PID namespace (`unshare --pid --fork`), ckpt is the
    // namespace's init: if it exited, the kernel would kill every process
    // in the namespace, the restored tree included.
    let ns_init = nix::unistd::getpid().as_raw() == 1;
    if ns_init && a.detach {
        anyhow::bail!(
            "ckpt restore is PID 1 of its PID namespace: --detach would end the namespace and kill the restored tree; run it without --detach (ckpt then stays as the namespace's init)"
        );
    }
    // Where ckpt writes as root, checked before anything is restored: a
    // path through a user's symlink fails the restore, not the restored job.
    let pidfile = super::output_parent(a.pidfile.as_deref(), "--pidfile")?;
    let stats_file = super::output_parent(a.stats_file.as_deref(), "--stats-file")?;
    let bar =
        super::progress_bar("restoring pages").filter(|_| !crate::logger::verbose_on_stderr());
    let notice = |msg: &str| {
        crate::logger::file_only(log::Level::Warn, msg);
        match &bar {
            Some(b) => b.println(format!("ckpt: {msg}")),
            None => eprintln!("ckpt: {msg}"),
        }
    };
    let progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let key = super::image_key(a.image_key.as_deref(), super::KeyUse::Verify)
        .with_context(|| format!("restore from {} failed", a.dir.display()))?;
    let mut opts = RestoreOptions {
        dir: a.dir.clone(),
        key: &key,
        pid_wait: Duration::from_secs(a.pid_wait),
        notice: &notice,
        progress: Some(&progress),
        files: FilePolicy {
            inherit_fds: a.inherit_fd.clone(),
            allow_changed: a
                .allow_changed
                .iter()
                .map(|p| dumped_form(p))
                .collect::<anyhow::Result<_>>()?,
            addresses: address_map(&a.map_address)?,
        },
        lazy: a.lazy,
        netns: a
            .netns
            .as_deref()
            .map(ckpt_restorer::ns::NetTarget::open)
            .transpose()
            .with_context(|| format!("restore from {} failed", a.dir.display()))?,
        mntns: a
            .mntns
            .as_deref()
            .map(ckpt_restorer::ns::MntTarget::open)
            .transpose()
            .with_context(|| format!("restore from {} failed", a.dir.display()))?,
        pmix_step: pmix_step(),
    };
    if let Some(addr) = a.coord.addr.as_deref().filter(|_| !a.peers.is_empty()) {
        // Before joining the round: this node's address comes from its
        // route to the coordinator, which a Unix socket does not have.
        route_source(addr)?;
    }
    let mut r = if a.coord.enabled() {
        coordinated(&a, &mut opts, bar.as_ref())?
    } else {
        let scripts = ActionScripts::new(a.action_scripts.clone(), &a.dir);
        phases(&a, &opts, &scripts, bar.as_ref())
            .with_context(|| format!("restore from {} failed", a.dir.display()))?
    };
    if let Some(parent) = &pidfile {
        write_pidfile(parent, r.pid)?;
    }
    if let Some(server) = r.lazy.take() {
        r.stats.lazy = Some(serve_lazily(
            &a,
            stats_file.as_ref(),
            r.pid,
            r.stats,
            server,
        )?);
    }
    // A detached page server wrote them already, and rewrites them when
    // it is done.
    let written = a.lazy && a.detach;
    if let Some(parent) = stats_file.as_ref().filter(|_| !written) {
        write_stats(parent, &r.stats)?;
    }
    if a.json {
        super::print_stdout(&format!(
            "{}\n",
            serde_json::json!({ "pid": r.pid, "stats": r.stats })
        ))?;
    } else {
        eprintln!("ckpt: restored pid {}", r.pid);
    }
    if a.detach {
        return Ok(0);
    }
    // As a namespace's init, orphans of the tree are reparented to ckpt:
    // reap them all, and end with the root. The kernel keeps from an init
    // every signal it has no handler for, so the root would never see a
    // SIGTERM meant for the job: pass them on.
    let wait_for = if ns_init {
        ckpt_restorer::run::forward_to(r.pid)
            .with_context(|| format!("passing signals on to pid {}", r.pid))?;
        Pid::from_raw(-1)
    } else {
        Pid::from_raw(r.pid)
    };
    loop {
        match waitpid(wait_for, None) {
            Ok(WaitStatus::Exited(p, code)) if p.as_raw() == r.pid => {
                return Ok(code as u8);
            }
            Ok(WaitStatus::Signaled(p, sig, _)) if p.as_raw() == r.pid => {
                return Ok(128 + sig as u8);
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e).context(format!("waiting for pid {}", r.pid)),
        }
    }
}

/// `ckpt restore --pidns`: this same command again, without `--pidns`, as
/// PID 1 of a new PID namespace (with its own /proc and session, see
/// [`ckpt_restorer::run::spawn_init`]), where it restores the tree with its
/// dumped pids and stays as the namespace's init. This process passes the
/// job's signals on to it and exits with its status.
fn in_new_pidns(a: &RestoreArgs) -> anyhow::Result<u8> {
    let refused = [
        (
            a.detach,
            "--detach (the namespace ends with its init, this command)",
        ),
        (
            a.pidfile.is_some(),
            "--pidfile (the restored pids are the namespace's, not the host's)",
        ),
        (a.coord.enabled(), "--coord"),
    ];
    if let Some((_, what)) = refused.iter().find(|(set, _)| *set) {
        anyhow::bail!("--pidns cannot be used with {what}");
    }
    let me = std::env::current_exe().context("the ckpt executable")?;
    let args: Vec<std::ffi::OsString> = std::env::args_os()
        .skip(1)
        .filter(|arg| arg != "--pidns")
        .collect();
    let mut init = ckpt_restorer::run::spawn_init(&me, &args, &Default::default())
        .context("starting ckpt restore as the init of a new PID namespace")?;
    log::info!("restore: pid namespace init is host pid {}", init.id());
    let status = init.wait().context("waiting for the namespace's init")?;
    Ok(ckpt_restorer::run::exit_code(status) as u8)
}

/// The page service of `ckpt restore --lazy`: in this process until every
/// page is resident, or handed to a daemon with `--detach`. Reports
/// time-to-running and time-to-resident on stderr. A detached server
/// writes `--stats-file` before it leaves and again once it is done.
fn serve_lazily(
    a: &RestoreArgs,
    stats_file: Option<&TrustedParent>,
    pid: i32,
    stats: ckpt_restorer::RestoreStats,
    server: ckpt_restorer::lazy::PageServer,
) -> anyhow::Result<ckpt_restorer::lazy::LazyStats> {
    let what = format!("restore of pid {pid} from {}", a.dir.display());
    if a.detach {
        if let Some(parent) = stats_file {
            write_stats(parent, &stats)?;
        }
        let done = |lazy: &ckpt_restorer::lazy::LazyStats| {
            if let Some(path) = &a.stats_file {
                let mut all = stats;
                all.lazy = Some(*lazy);
                // The daemon closed the directory's fd with the others:
                // the path is walked again, with the same care.
                let written = TrustedParent::resolve(path)
                    .context("--stats-file")
                    .and_then(|parent| write_stats(&parent, &all));
                // Nowhere to report a failure but the system log.
                if let Err(e) = written {
                    log::warn!("{what}: {e:#}");
                }
            }
        };
        let s = server
            .detach(&what, &done)
            .with_context(|| format!("{what}: page server"))?;
        eprintln!(
            "ckpt: pid {pid}: running after {:.1} ms; a page server fills the rest (outcome in the system log{})",
            s.running_ms,
            if a.stats_file.is_some() {
                " and the stats file"
            } else {
                ""
            }
        );
        return Ok(s);
    }
    if let Some(running) = stats.lazy.map(|l| l.running_ms) {
        eprintln!("ckpt: pid {pid}: running after {running:.1} ms; serving its pages");
    }
    let s = server
        .wait()
        .with_context(|| format!("{what}: page server failed, the processes were killed"))?;
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    match s.resident_ms {
        Some(ms) => eprintln!(
            "ckpt: pid {pid}: all pages resident after {ms:.1} ms ({} faults, {:.1} MiB by fault, {:.1} MiB in the background)",
            s.faults,
            mib(s.fault_bytes),
            mib(s.background_bytes)
        ),
        None => eprintln!("ckpt: pid {pid}: the processes ended before all pages were resident"),
    }
    Ok(s)
}

/// The engine's phases (a coordinated restart publishes and subscribes
/// between them) with the action scripts. An error after the rebuild drops
/// the stopped tree, which kills it.
fn phases(
    a: &RestoreArgs,
    opts: &RestoreOptions<'_>,
    scripts: &ActionScripts,
    bar: Option<&indicatif::ProgressBar>,
) -> anyhow::Result<ckpt_restorer::Restored> {
    // The checkpoint is not read yet, so the pid is not known.
    scripts.run(Phase::PreRestore, None)?;
    let stopped = ckpt_restorer::rebuild(opts);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let stopped = stopped?;
    print_rebound(a, stopped.rebound());
    let root = stopped.pids().first().copied();
    scripts.run(Phase::PostRestore, root)?;
    scripts.run(Phase::PreResume, root)?;
    Ok(stopped.resume()?)
}

/// `ckpt restore --coord`: this node's agent in a restart round. Rebuilds
/// its part of the job's last committed epoch at RESTORE and holds it
/// stopped until every node has published and subscribed; an abort (or a
/// lost coordinator) drops the stopped tree, which kills it.
fn coordinated(
    a: &RestoreArgs,
    opts: &mut RestoreOptions<'_>,
    bar: Option<&indicatif::ProgressBar>,
) -> anyhow::Result<ckpt_restorer::Restored> {
    let mut s = super::agent::join(&a.coord, Intent::Restart)?;
    let step = s.wait(CoordPhase::Restore)?;
    let dir = s.local(match step.last_committed {
        None => Err(anyhow::anyhow!(
            "the job has no committed checkpoint to restore"
        )),
        Some(e) => {
            let dir = epoch_dir(&a.dir, e);
            if dir.is_dir() {
                Ok(dir)
            } else {
                Err(anyhow::anyhow!(
                    "{}: epoch {e} (the last committed) is not on this node, refused",
                    dir.display()
                ))
            }
        }
    })?;
    opts.dir = dir.clone();
    if !a.peers.is_empty() {
        let own = s.local(this_node_move(a, opts.key, &dir))?;
        let moved = s.exchange_addresses(&own, &a.peers, step.deadline)?;
        s.local(opts.files.addresses.merge(&moved))?;
        for (old, new) in moved.iter().filter(|(o, n)| o != n) {
            log::info!("{}: address {old} is now {new}", s.at());
        }
    }
    let scripts = ActionScripts::new(a.action_scripts.clone(), &dir);
    s.local(scripts.run(Phase::PreRestore, None))?;
    let stopped = ckpt_restorer::rebuild(opts);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let stopped = s.local(stopped)?;
    print_rebound(a, stopped.rebound());
    let root = stopped.pids().first().copied();
    s.local(scripts.run(Phase::PostRestore, root))?;
    s.done(PhaseInfo::None)?;

    let mut stopped = stopped;
    let publish = s.wait(CoordPhase::Publish)?;
    // A restored tree keeps its pids and (with --peers, exchanged above)
    // knows where its peers' addresses went. What only exists now: the
    // InfiniBand ids the verbs layers got from the devices here, published
    // for every node (empty if none) and fetched from every peer before
    // anything runs. Without --peers the layers connect within this tree.
    let ib_all = if a.peers.is_empty() {
        None
    } else {
        let own = stopped.ib_blobs().to_vec();
        Some(s.exchange_ib(&own, &a.peers, publish.deadline)?)
    };
    s.done(PhaseInfo::None)?;
    s.wait(CoordPhase::Subscribe)?;
    if let Some(all) = ib_all {
        s.local(stopped.ib_connect(&all))?;
    }
    s.done(PhaseInfo::None)?;

    s.wait(CoordPhase::Resume)?;
    s.local(scripts.run(Phase::PreResume, root))?;
    let restored = s.local(stopped.resume())?;
    s.done(PhaseInfo::None)?;
    Ok(restored)
}

/// Where this node's part was reachable when dumped (the checkpoint's
/// bound addresses of the family the coordinator is reached with) and
/// this node's address now.
fn this_node_move(
    a: &RestoreArgs,
    key: &ckpt_image::ImageKey,
    dir: &std::path::Path,
) -> anyhow::Result<NodeMove> {
    let coordinator = a.coord.addr.as_deref().context("--peers needs --coord")?;
    let to = route_source(coordinator)?;
    let dumped = ckpt_restorer::node_addresses(dir, key)
        .with_context(|| format!("{}: reading its addresses", dir.display()))?;
    let from = dumped
        .into_iter()
        .filter(|ip| ip.is_ipv4() == to.is_ipv4())
        .collect();
    Ok(NodeMove { from, to })
}

/// One line per process on what it got of this command's instead of its
/// own: not for a shell job, which is meant to be attached to it, unless
/// a file was withheld from it.
fn print_rebound(a: &RestoreArgs, rebound: &[Rebound]) {
    for r in rebound {
        if !a.shell_job || matches!(r, Rebound::Withheld { .. }) {
            eprintln!("ckpt: {}", rebound_notice(r));
        }
    }
}

/// What was bound to this command instead of restored, in one line.
fn rebound_notice(r: &Rebound) -> String {
    match r {
        Rebound::Terminal { pid, fds } => {
            let fds: Vec<String> = fds.iter().map(i32::to_string).collect();
            format!(
                "pid {pid} fd {}: terminal rebound to this command's fds",
                fds.join(",")
            )
        }
        Rebound::StdioPipe { pid, fds } => {
            let fds: Vec<String> = fds.iter().map(i32::to_string).collect();
            format!(
                "pid {pid} fd {}: pipe to outside the tree rebound to this command's fds",
                fds.join(",")
            )
        }
        Rebound::Session { pid } => {
            format!("pid {pid}: session/process group of this command adopted")
        }
        Rebound::Withheld { pid, fds, owner } => {
            let list: Vec<String> = fds.iter().map(i32::to_string).collect();
            let whose = owner.map_or_else(
                || "a file that could not be looked at".to_string(),
                |u| format!("a file of uid {u}"),
            );
            format!(
                "pid {pid} fd {}: this command's fds are {whose}, not of the process's user: /dev/null instead (--inherit-fd {} hands them over)",
                list.join(","),
                fds.first().copied().unwrap_or(1)
            )
        }
    }
}

/// Writes `pid` to the pid file atomically (a temporary file renamed over
/// it, mode 0644), so a reader never sees a partial pid, in a directory
/// reached without a user's symlink and never through one at the name.
pub(crate) fn write_pidfile(parent: &TrustedParent, pid: i32) -> anyhow::Result<()> {
    parent
        .replace_with(format!("{pid}\n").as_bytes(), 0o644)
        .context("--pidfile")
}

/// Writes `stats-restore.json` content to the stats file: created 0600 or
/// emptied if a regular file with no other name, in a directory reached
/// without a user's symlink and never through one at the name.
fn write_stats(parent: &TrustedParent, stats: &ckpt_restorer::RestoreStats) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = parent.open_truncated(0o600).context("--stats-file")?;
    let json = serde_json::to_string_pretty(stats).context("encode restore stats")?;
    writeln!(f, "{json}").with_context(|| format!("--stats-file {}", parent.path().display()))?;
    Ok(())
}

/// A path as the dump recorded it: absolute, with every symbolic link
/// resolved (the dump read it from /proc).
fn dumped_form(p: &std::path::Path) -> anyhow::Result<PathBuf> {
    std::fs::canonicalize(p).or_else(|_| {
        std::path::absolute(p).with_context(|| format!("--allow-changed {}", p.display()))
    })
}

/// The PMIx variables of the job step this restore runs in: the caller's,
/// when the service restores for a user (its worker has only what the
/// service handed over), else this process's own.
fn pmix_step() -> ckpt_restorer::pmix::StepEnv {
    if ckpt_image::caller::acting_for().is_some() {
        ckpt_restorer::pmix::StepEnv::from_vars(crate::service::worker::job_env())
    } else {
        ckpt_restorer::pmix::StepEnv::of_this_process()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_pairs_parse_and_bad_ones_name_the_problem() {
        let p = parse_address_pair("10.0.0.1=10.0.0.2").unwrap();
        assert_eq!(
            (p.old.to_string(), p.new.to_string()),
            ("10.0.0.1".into(), "10.0.0.2".into())
        );
        assert!(parse_address_pair("::1=fe80::1").is_ok());
        for (bad, says) in [
            ("10.0.0.1", "expected OLD=NEW"),
            ("10.0.0.1=host", "host is not an IP address"),
            ("10.0.0.1=::1", "one family"),
        ] {
            let e = parse_address_pair(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let twice = [
            parse_address_pair("10.0.0.1=10.0.0.2").unwrap(),
            parse_address_pair("10.0.0.1=10.0.0.3").unwrap(),
        ];
        assert!(address_map(&twice).is_err());
    }
}
