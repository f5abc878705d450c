//! `ckpt show`: a readable and a JSON summary of a checkpoint. The
//! presentation lives here; the image crate only decodes.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use ckpt_image::fd::file::Kind;
use ckpt_image::fd::{FdTable, File, Files};
use ckpt_image::mm::{Mm, VmaKind};
use ckpt_image::shmem::{ShmemKind, ShmemObjects};
use ckpt_image::task::Core;
use ckpt_image::{ImageDir, ImageError, ImageKind};
use serde_json::{Value, json};

/// Arguments of `ckpt show`.
#[derive(clap::Args, Debug)]
pub struct ShowArgs {
    /// Checkpoint directory.
    dir: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// The site's image key file (default: $CKPT_IMAGE_KEY, else
    /// /var/lib/ckpt/image.key).
    #[arg(long, value_name = "PATH")]
    image_key: Option<PathBuf>,
}

impl ShowArgs {
    /// The user named a key of their own (flag or environment).
    pub fn has_own_key(&self) -> bool {
        self.image_key.is_some() || std::env::var_os(ckpt_image::seal::KEY_ENV).is_some()
    }

    /// What of this command the ckpt service does not run for a user.
    pub fn service_refusal(&self) -> Option<anyhow::Error> {
        self.image_key.is_some().then(|| {
            crate::service::worker::refuse(
                "--image-key",
                "the service reads your images with your own key",
            )
        })
    }
}

/// Runs `ckpt show`.
pub fn run(a: ShowArgs) -> anyhow::Result<ExitCode> {
    let context = || format!("cannot read checkpoint {}", a.dir.display());
    // Shown only once sealed by this site: an unsealed image is not ckpt's.
    let key =
        super::image_key(a.image_key.as_deref(), super::KeyUse::Verify).with_context(context)?;
    let dir = ckpt_image::ImageDir::open(&a.dir, &key).with_context(context)?;
    // The same bounds as a restore's, before the processes are read one
    // by one.
    dir.check_tree().with_context(context)?;
    if dir.manifest().pre_dump {
        let v = summarize_pre_dump(&dir)?;
        if a.json {
            super::print_stdout(&format!("{v}\n"))?;
        } else {
            super::print_stdout(&render_pre_dump(&v))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let v = summarize(&dir)?;
    if a.json {
        super::print_stdout(&format!("{v}\n"))?;
    } else {
        super::print_stdout(&render_text(&v))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A pre-dump holds memory and write tracking only.
fn summarize_pre_dump(dir: &ImageDir) -> Result<Value, ImageError> {
    let m = dir.manifest();
    let mut procs = Vec::new();
    for p in &m.processes {
        let mm: Mm = dir.read_meta(&ckpt_image::mm_name(p.pid), ImageKind::Mm)?;
        procs.push(json!({
            "pid": p.pid,
            "comm": p.comm,
            "vmas": mm.vmas.len(),
            "pages_bytes": mm.pages_bytes,
            "compressed": mm.compressed,
            "tracking": mm.tracking.map(|t| json!({"fd": t.fd, "inode": t.inode})),
        }));
    }
    Ok(json!({
        "pre_dump": true,
        "root_pid": m.root_pid,
        "created_unix": m.created_unix,
        "processes": procs,
    }))
}

fn render_pre_dump(v: &Value) -> String {
    let mut out = format!(
        "pre-dump of pid {} (memory only; not restorable: give it to `ckpt dump --prev`)\n",
        v["root_pid"]
    );
    for p in v["processes"].as_array().into_iter().flatten() {
        out += &format!(
            "  pid {} ({}): {} VMAs, {} bytes of pages{}, {}\n",
            p["pid"],
            p["comm"].as_str().unwrap_or(""),
            p["vmas"],
            p["pages_bytes"],
            if p["compressed"] == true {
                " (lz4)"
            } else {
                ""
            },
            match p["tracking"]["fd"].as_i64() {
                Some(fd) => format!("writes tracked through its fd {fd}"),
                None => "writes not tracked".into(),
            }
        );
    }
    out
}

/// Decodes every image of `dir` into one JSON value.
fn summarize(dir: &ImageDir) -> Result<Value, ImageError> {
    let m = dir.manifest();
    let files: Files = dir.read_meta(ckpt_image::FILES_NAME, ImageKind::Files)?;
    let mut procs = Vec::new();
    // Zombies have no images of their own, only their manifest entry.
    for p in m.processes.iter().filter(|p| p.zombie_status.is_none()) {
        let core: Core = dir.read_meta(&ckpt_image::core_name(p.pid), ImageKind::Core)?;
        let mm: Mm = dir.read_meta(&ckpt_image::mm_name(p.pid), ImageKind::Mm)?;
        let table: FdTable = dir.read_meta(&ckpt_image::fds_name(p.pid), ImageKind::FdTable)?;
        let vmas: Vec<Value> = mm
            .vmas
            .iter()
            .map(|v| {
                let kind = VmaKind::try_from(v.kind).map_or("unknown".into(), |k| format!("{k:?}"));
                json!({
                    "start": format!("{:#x}", v.start),
                    "end": format!("{:#x}", v.end),
                    "prot": prot_string(v.prot),
                    "kind": kind,
                    "path": v.path,
                    "file_offset": v.file_offset,
                    "shmem_id": VmaKind::try_from(v.kind).is_ok_and(VmaKind::maps_shmem).then_some(v.shmem_id),
                    "saved_bytes": v.pages.iter().map(|r| r.len()).sum::<u64>(),
                    "sysv_shmid": (v.kind == VmaKind::SysvShm as i32).then_some(v.sysv_shmid),
                    "inherited": v.inherited,
                })
            })
            .collect();
        let fds: Vec<Value> = table
            .fds
            .iter()
            .map(|f| {
                let file = files.get(f.file_id);
                json!({
                    "fd": f.fd,
                    "file_id": f.file_id,
                    "kind": file.map_or("missing", |x| x.kind_name()),
                    "path": file.and_then(path_of),
                    "object": file.map(File::describe).unwrap_or_default(),
                    "flags": file.map(|x| format!("{:#o}", x.flags)),
                    "cloexec": f.cloexec,
                    "pos": file.map(|x| x.pos),
                    "locks": table.locks.iter().filter(|l| l.fd == f.fd).map(|l| l.describe()).collect::<Vec<_>>(),
                })
            })
            .collect();
        // Files held by no fd, queued in a UNIX socket the process holds.
        let in_flight: Vec<Value> = table
            .in_flight
            .iter()
            .map(|f| {
                let file = files.get(f.file_id);
                json!({
                    "file_id": f.file_id,
                    "kind": file.map_or("missing", |x| x.kind_name()),
                    "object": file.map(File::describe).unwrap_or_default(),
                })
            })
            .collect();
        procs.push(json!({
            "pid": p.pid,
            "ppid": p.ppid,
            "uids": p.uids,
            "gids": p.gids,
            "comm": core.comm,
            "exe": core.exe,
            "cwd": core.cwd,
            "sid": core.sid,
            "pgid": core.pgid,
            "job_stop": core.job_stop.as_ref().map(|j| nix::sys::signal::Signal::try_from(j.signal).map_or_else(|_| j.signal.to_string(), |s| s.as_str().to_string())),
            "ib": core.ib.as_ref().map(|l| json!({
                "drained_completions": l.drained_completions,
                "outstanding_sends": l.outstanding_sends,
                "drain_us": l.drain_us,
            })),
            "threads": core.threads.iter().map(|t| t.tid).collect::<Vec<_>>(),
            "pages_bytes": mm.pages_bytes,
            "pages_compressed": mm.compressed,
            "pages_file_bytes": if mm.compressed { mm.chunks.iter().map(|c| c.file_len).sum::<u64>() } else { mm.pages_bytes },
            "sigactions": core.sigactions.len(),
            "pending_signals": core.pending.len(),
            "posix_timers": core.posix_timers.iter().map(|t| t.describe()).collect::<Vec<_>>(),
            "sched": sched_summary(&core),
            "oom_score_adj": core.oom_score_adj,
            "prctl": core.prctl.as_ref().map(|p| p.describe()).unwrap_or_default(),
            "security": security_lines(&core),
            "vmas": vmas,
            "aio_rings": mm.aio_rings.iter().map(|a| json!({
                "id": a.id,
                "nr": a.nr,
                "head": a.head,
                "tail": a.tail,
                "unreaped": a.events.len(),
            })).collect::<Vec<_>>(),
            "fds": fds,
            "files_in_flight": in_flight,
            // Left by `dump --track` in the running process, for the next
            // dump's `--prev`; not part of what a restore rebuilds.
            "tracking": mm.tracking.map(|t| json!({"fd": t.fd, "inode": t.inode})),
        }));
    }
    // Shared memory objects, each once, whoever maps them.
    let shmem: Vec<Value> = if m.files.iter().any(|f| f.name == ckpt_image::SHMEM_NAME) {
        let objects: ShmemObjects = dir.read_meta(ckpt_image::SHMEM_NAME, ImageKind::Shmem)?;
        objects
            .objects
            .iter()
            .map(|o| {
                let kind =
                    ShmemKind::try_from(o.kind).map_or("unknown".into(), |k| format!("{k:?}"));
                json!({
                    "id": o.id,
                    "kind": kind,
                    "name": o.name,
                    "size": o.size,
                    "seals": o.seals,
                    "data_bytes": o.data.iter().map(|r| r.len).sum::<u64>(),
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    Ok(json!({
        "dir": dir.path().display().to_string(),
        "format_version": ckpt_image::FORMAT_VERSION,
        "tool_version": m.tool_version,
        "kernel": m.kernel,
        "arch": m.arch,
        "hostname": m.hostname,
        "created_unix": m.created_unix,
        "cpu": m.cpu.as_ref().map(|c| json!({"vendor": c.vendor, "xcr0": format!("{:#x}", c.xcr0), "xsave_size": c.xsave_size})),
        "root_pid": m.root_pid,
        "pre_dump": false,
        "pid_namespace": m.pid_namespace.map(|n| json!({"root_host_pid": n.root_host_pid})),
        "namespaces": m.namespaces.as_ref().map(|n| json!({
            "uts": n.uts.as_ref().map(|u| json!({"hostname": u.hostname, "domainname": u.domainname})),
            "ipc": n.ipc,
            "net": n.net.as_ref().map(|x| json!({"inode": x.inode})),
            "mnt": n.mnt.as_ref().map(|x| json!({"inode": x.inode})),
            "time": n.time.as_ref().map(|t| json!({"monotonic_ns": t.monotonic_ns, "boottime_ns": t.boottime_ns, "monotonic_offset_ns": t.monotonic_offset_ns, "boottime_offset_ns": t.boottime_offset_ns})),
        })),
        "files": m.files.iter().map(|f| json!({"name": f.name, "size": f.size, "blake3": hex(&f.blake3)})).collect::<Vec<_>>(),
        "processes": procs,
        "shmem": shmem,
        "ipc": ipc_summary(dir)?,
    }))
}

/// The SysV IPC objects of the job (`ipc.img`, absent when it has none).
/// Each thread's scheduling attributes (leader first) and the other
/// threads' parent-death signals, for images that have them.
fn sched_summary(core: &Core) -> Vec<Value> {
    let leader = std::iter::once((core.pid, &core.comm, core.sched.as_ref(), None));
    let others = core.threads.iter().map(|t| {
        let pdeath = t.prctl.as_ref().map(|p| p.pdeath_sig).filter(|s| *s != 0);
        (t.tid, &t.comm, t.sched.as_ref(), pdeath)
    });
    leader
        .chain(others)
        .filter_map(|(tid, comm, sched, pdeath)| {
            let mut line = sched?.describe();
            if let Some(sig) = pdeath {
                line.push_str(&format!(", parent-death signal {sig}"));
            }
            Some(json!({ "tid": tid, "comm": comm, "sched": line }))
        })
        .collect()
}

fn ipc_summary(dir: &ImageDir) -> Result<Value, ImageError> {
    use ckpt_image::ipc::{Ipc, IpcPerm};
    let ipc: Ipc = match dir.digest(ckpt_image::IPC_NAME) {
        Ok(_) => dir.read_meta(ckpt_image::IPC_NAME, ImageKind::Ipc)?,
        Err(ImageError::NotListed { .. }) => Ipc::default(),
        Err(e) => return Err(e),
    };
    let perm = |p: &Option<IpcPerm>| {
        let p = p.unwrap_or_default();
        json!({"id": p.id, "key": p.key, "uid": p.uid, "gid": p.gid, "cuid": p.cuid, "cgid": p.cgid, "mode": format!("{:#o}", p.mode)})
    };
    let with = |mut base: Value, extra: Value| {
        if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        base
    };
    Ok(json!({
        "shm": ipc.shm.iter().map(|s| with(perm(&s.perm), json!({"size": s.size, "removed": s.removed, "locked": s.locked, "saved_bytes": s.saved_bytes()}))).collect::<Vec<_>>(),
        "sem": ipc.sem.iter().map(|s| with(perm(&s.perm), json!({"values": s.values}))).collect::<Vec<_>>(),
        "msg": ipc.msg.iter().map(|q| with(perm(&q.perm), json!({"qbytes": q.qbytes, "messages": q.messages.len(), "bytes": q.messages.iter().map(|m| m.text.len()).sum::<usize>()}))).collect::<Vec<_>>(),
    }))
}

/// Lower-case hex of `bytes`.
/// Credentials and seccomp of each thread where they are not the plain
/// case: a thread's ids when they differ from the leader's, fs ids apart
/// from the effective ones, a bounding set with holes, ambient caps,
/// securebits, no_new_privs, seccomp mode and filters.
fn security_lines(core: &Core) -> Vec<String> {
    use ckpt_image::seccomp::Seccomp;
    use ckpt_image::task::Creds;
    let leader = core.creds.clone().unwrap_or_default();
    let describe = |c: &Creds, s: Option<&Seccomp>, is_leader: bool| {
        let mut parts = Vec::new();
        if !is_leader && (c.uids != leader.uids || c.gids != leader.gids) {
            parts.push(format!("uids {:?} gids {:?}", c.uids, c.gids));
        }
        if c.uids.get(3) != c.uids.get(1) || c.gids.get(3) != c.gids.get(1) {
            parts.push(format!(
                "fsuid {} fsgid {}",
                c.uids.get(3).copied().unwrap_or_default(),
                c.gids.get(3).copied().unwrap_or_default()
            ));
        }
        // A full set is 2^n - 1; anything else had caps dropped.
        if c.cap_bnd & c.cap_bnd.wrapping_add(1) != 0 {
            parts.push(format!("bounding set {:#x}", c.cap_bnd));
        }
        if c.cap_amb != 0 {
            parts.push(format!("ambient caps {:#x}", c.cap_amb));
        }
        if c.securebits != 0 {
            parts.push(format!("securebits {:#x}", c.securebits));
        }
        if c.no_new_privs {
            parts.push("no_new_privs".into());
        }
        if let Some(s) = s {
            let insns: usize = s
                .filters
                .iter()
                .filter_map(|&i| core.seccomp_filters.get(i as usize))
                .map(|f| f.len_insns())
                .sum();
            parts.push(format!(
                "seccomp {} ({} filters, {insns} instructions)",
                s.mode_name(),
                s.filters.len()
            ));
        }
        parts
    };
    let mut out = Vec::new();
    let threads = std::iter::once((core.pid, Some(&leader), core.seccomp.as_ref(), true)).chain(
        core.threads
            .iter()
            .map(|t| (t.tid, t.creds.as_ref(), t.seccomp.as_ref(), false)),
    );
    for (tid, c, s, is_leader) in threads {
        let parts = describe(c.unwrap_or(&leader), s, is_leader);
        if !parts.is_empty() {
            out.push(format!("thread {tid}: {}", parts.join(", ")));
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// `rwx` of a VMA's protection bits.
fn prot_string(p: u32) -> String {
    use ckpt_image::mm::prot::*;
    [(READ, 'r'), (WRITE, 'w'), (EXEC, 'x')]
        .iter()
        .map(|&(b, c)| if p & b != 0 { c } else { '-' })
        .collect()
}

/// Renders [`summarize`]'s value for a terminal.
fn render_text(v: &Value) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "checkpoint {} (format {}, ckpt {}, {} on {})",
        v["dir"].as_str().unwrap_or(""),
        v["format_version"],
        v["tool_version"].as_str().unwrap_or(""),
        v["arch"].as_str().unwrap_or(""),
        v["hostname"].as_str().unwrap_or("")
    );
    let _ = writeln!(s, "kernel {}", v["kernel"].as_str().unwrap_or(""));
    if let Some(host) = v["pid_namespace"]["root_host_pid"].as_i64() {
        let _ = writeln!(
            s,
            "pid namespace: pids are the tree's own namespace's (root was host pid {host})"
        );
    }
    let ns = &v["namespaces"];
    if let Some(host) = ns["uts"]["hostname"].as_str() {
        let domain = ns["uts"]["domainname"].as_str().unwrap_or("");
        let _ = writeln!(
            s,
            "uts namespace: its own, hostname {host:?}, domainname {domain:?}"
        );
    }
    if ns["ipc"].as_bool() == Some(true) {
        let _ = writeln!(s, "ipc namespace: its own (SysV ids are that namespace's)");
    }
    if let Some(inode) = ns["net"]["inode"].as_u64() {
        let _ = writeln!(
            s,
            "net namespace: its own (net:[{inode}]), restored into the one given with --netns"
        );
    }
    if let Some(inode) = ns["mnt"]["inode"].as_u64() {
        let _ = writeln!(
            s,
            "mnt namespace: its own (mnt:[{inode}]), restored into the one given with --mntns"
        );
    }
    if let Some(mono) = ns["time"]["monotonic_ns"].as_i64() {
        let boot = ns["time"]["boottime_ns"].as_i64().unwrap_or(0);
        let _ = writeln!(
            s,
            "time namespace: its own, clocks at dump monotonic {mono} ns, boottime {boot} ns"
        );
    }
    let total: u64 = v["files"]
        .as_array()
        .map(|f| f.iter().filter_map(|x| x["size"].as_u64()).sum())
        .unwrap_or(0);
    let _ = writeln!(
        s,
        "{} files, {} bytes",
        v["files"].as_array().map_or(0, Vec::len),
        total
    );
    for o in v["shmem"].as_array().into_iter().flatten() {
        let _ = writeln!(
            s,
            "shared memory object {} {} {:?}: {} bytes, {} of data saved, seals {:#x}",
            o["id"],
            o["kind"].as_str().unwrap_or(""),
            o["name"].as_str().unwrap_or(""),
            o["size"],
            o["data_bytes"],
            o["seals"].as_u64().unwrap_or(0)
        );
    }
    for p in v["processes"].as_array().into_iter().flatten() {
        let _ = writeln!(
            s,
            "\nprocess {} ({}) exe {} cwd {}",
            p["pid"],
            p["comm"].as_str().unwrap_or(""),
            p["exe"].as_str().unwrap_or(""),
            p["cwd"].as_str().unwrap_or("")
        );
        let _ = writeln!(
            s,
            "  {} bytes of pages ({} in the file{}), {} signal handlers, {} pending signals",
            p["pages_bytes"],
            p["pages_file_bytes"],
            if p["pages_compressed"].as_bool() == Some(true) {
                ", LZ4"
            } else {
                ""
            },
            p["sigactions"],
            p["pending_signals"]
        );
        if let Some(sig) = p["job_stop"].as_str() {
            let _ = writeln!(s, "  stopped by {sig} (job control; restored stopped)");
        }
        if let Some(ib) = p["ib"].as_object() {
            let _ = writeln!(
                s,
                "  InfiniBand verbs (recreated by its verbs layer at restart): drained {} completions in {:.3} ms, {} sends outstanding",
                ib["drained_completions"],
                ib["drain_us"].as_f64().unwrap_or(0.0) / 1e3,
                ib["outstanding_sends"]
            );
        }
        for t in p["posix_timers"].as_array().into_iter().flatten() {
            let _ = writeln!(s, "  POSIX {}", t.as_str().unwrap_or(""));
        }
        if let Some(fd) = p["tracking"]["fd"].as_i64() {
            let _ = writeln!(
                s,
                "  write tracking left in the process at fd {fd} (for `dump --prev`)"
            );
        }
        for t in p["sched"].as_array().into_iter().flatten() {
            let _ = writeln!(
                s,
                "  thread {} ({}): {}",
                t["tid"],
                t["comm"].as_str().unwrap_or(""),
                t["sched"].as_str().unwrap_or("")
            );
        }
        if p["oom_score_adj"].as_i64().unwrap_or(0) != 0 {
            let _ = writeln!(s, "  oom_score_adj {}", p["oom_score_adj"]);
        }
        let prctl: Vec<&str> = p["prctl"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if !prctl.is_empty() {
            let _ = writeln!(s, "  {}", prctl.join(", "));
        }
        for t in p["security"].as_array().into_iter().flatten() {
            let _ = writeln!(s, "  {}", t.as_str().unwrap_or(""));
        }
        let _ = writeln!(s, "  VMAs:");
        for m in p["vmas"].as_array().into_iter().flatten() {
            let _ = writeln!(
                s,
                "    {}-{} {} {:<11} saved {:>10}  {}{}",
                m["start"].as_str().unwrap_or(""),
                m["end"].as_str().unwrap_or(""),
                m["prot"].as_str().unwrap_or(""),
                m["kind"].as_str().unwrap_or(""),
                m["saved_bytes"],
                m["sysv_shmid"].as_i64().map_or_else(
                    || m["path"].as_str().unwrap_or("").to_string(),
                    |id| format!("SysV shmid {id}")
                ),
                if m["inherited"] == true {
                    " (rest shared with the parent since fork)"
                } else {
                    ""
                }
            );
        }
        let _ = writeln!(s, "  fds:");
        for f in p["fds"].as_array().into_iter().flatten() {
            let locks: Vec<&str> = f["locks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let locks = if locks.is_empty() {
                String::new()
            } else {
                format!("  (locks {})", locks.join(", "))
            };
            let _ = writeln!(
                s,
                "    {:>3} file {:<4} {:<8} flags {} pos {}{}  {}{locks}",
                f["fd"],
                f["file_id"],
                f["kind"].as_str().unwrap_or(""),
                f["flags"].as_str().unwrap_or(""),
                f["pos"],
                if f["cloexec"].as_bool() == Some(true) {
                    " cloexec"
                } else {
                    ""
                },
                f["object"].as_str().unwrap_or("")
            );
        }
        for f in p["files_in_flight"].as_array().into_iter().flatten() {
            let _ = writeln!(
                s,
                "    in flight file {:<4} {:<8} {}",
                f["file_id"],
                f["kind"].as_str().unwrap_or(""),
                f["object"].as_str().unwrap_or("")
            );
        }
    }
    let ipc = &v["ipc"];
    let objects = |k: &str| ipc[k].as_array().cloned().unwrap_or_default();
    if ["shm", "sem", "msg"].iter().any(|k| !objects(k).is_empty()) {
        let _ = writeln!(s, "\nSysV IPC:");
    }
    let head = |o: &Value| {
        format!(
            "id {} key {:#x} owner {}:{} mode {}",
            o["id"],
            o["key"].as_i64().unwrap_or(0) as u32,
            o["uid"],
            o["gid"],
            o["mode"].as_str().unwrap_or("")
        )
    };
    for o in objects("shm") {
        let _ = writeln!(
            s,
            "  shared memory {}: {} bytes, {} saved{}{}",
            head(&o),
            o["size"],
            o["saved_bytes"],
            if o["locked"].as_bool() == Some(true) {
                ", locked in memory"
            } else {
                ""
            },
            if o["removed"].as_bool() == Some(true) {
                ", marked for removal"
            } else {
                ""
            }
        );
    }
    for o in objects("sem") {
        let _ = writeln!(s, "  semaphores {}: values {}", head(&o), o["values"]);
    }
    for o in objects("msg") {
        let _ = writeln!(
            s,
            "  message queue {}: {} messages, {} bytes (limit {})",
            head(&o),
            o["messages"],
            o["bytes"],
            o["qbytes"]
        );
    }
    s
}

/// The path of an open file that has one.
fn path_of(f: &File) -> Option<&str> {
    match &f.kind {
        Some(Kind::Reg(r)) => Some(&r.path),
        Some(Kind::Dev(d)) => Some(&d.path),
        Some(Kind::Tty(t)) => Some(&t.path),
        _ => None,
    }
}
