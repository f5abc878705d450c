//! A readable and a JSON summary of a checkpoint (`ckpt show`).

use serde_json::{Value, json};

use crate::dir::ImageDir;
use crate::error::ImageError;
use crate::files::{FdKind, Files};
use crate::header::ImageKind;
use crate::mm::{Mm, VmaKind};
use crate::task::Core;

/// Decodes every image of `dir` into one JSON value.
pub fn summarize(dir: &ImageDir) -> Result<Value, ImageError> {
    let m = dir.manifest();
    let mut procs = Vec::new();
    for p in &m.processes {
        let core: Core = dir.read_meta(&crate::core_name(p.pid), ImageKind::Core)?;
        let mm: Mm = dir.read_meta(&crate::mm_name(p.pid), ImageKind::Mm)?;
        let files: Files = dir.read_meta(&crate::files_name(p.pid), ImageKind::Files)?;
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
                    "saved_bytes": v.pages.iter().map(|r| r.len()).sum::<u64>(),
                })
            })
            .collect();
        let fds: Vec<Value> = files
            .fds
            .iter()
            .map(|f| {
                let kind = FdKind::try_from(f.kind).map_or("unknown".into(), |k| format!("{k:?}"));
                json!({
                    "fd": f.fd,
                    "kind": kind,
                    "path": f.path,
                    "flags": format!("{:#o}", f.flags),
                    "cloexec": f.cloexec,
                    "pos": f.pos,
                })
            })
            .collect();
        procs.push(json!({
            "pid": p.pid,
            "ppid": p.ppid,
            "comm": core.comm,
            "exe": core.exe,
            "cwd": core.cwd,
            "pages_bytes": mm.pages_bytes,
            "pages_compressed": mm.compressed,
            "pages_file_bytes": if mm.compressed { mm.chunks.iter().map(|c| c.file_len).sum::<u64>() } else { mm.pages_bytes },
            "sigactions": core.sigactions.len(),
            "pending_signals": core.pending.len(),
            "vmas": vmas,
            "fds": fds,
        }));
    }
    Ok(json!({
        "dir": dir.path().display().to_string(),
        "format_version": crate::FORMAT_VERSION,
        "tool_version": m.tool_version,
        "kernel": m.kernel,
        "arch": m.arch,
        "hostname": m.hostname,
        "created_unix": m.created_unix,
        "cpu": m.cpu.as_ref().map(|c| json!({"vendor": c.vendor, "xcr0": format!("{:#x}", c.xcr0), "xsave_size": c.xsave_size})),
        "root_pid": m.root_pid,
        "files": m.files.iter().map(|f| json!({"name": f.name, "size": f.size, "crc32c": format!("{:08x}", f.crc32c)})).collect::<Vec<_>>(),
        "processes": procs,
    }))
}

fn prot_string(p: u32) -> String {
    use crate::mm::prot::*;
    [(READ, 'r'), (WRITE, 'w'), (EXEC, 'x')]
        .iter()
        .map(|&(b, c)| if p & b != 0 { c } else { '-' })
        .collect()
}

/// Renders [`summarize`]'s value for a terminal.
pub fn render_text(v: &Value) -> String {
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
        let _ = writeln!(s, "  VMAs:");
        for m in p["vmas"].as_array().into_iter().flatten() {
            let _ = writeln!(
                s,
                "    {}-{} {} {:<11} saved {:>10}  {}",
                m["start"].as_str().unwrap_or(""),
                m["end"].as_str().unwrap_or(""),
                m["prot"].as_str().unwrap_or(""),
                m["kind"].as_str().unwrap_or(""),
                m["saved_bytes"],
                m["path"].as_str().unwrap_or("")
            );
        }
        let _ = writeln!(s, "  fds:");
        for f in p["fds"].as_array().into_iter().flatten() {
            let _ = writeln!(
                s,
                "    {:>3} {:<10} flags {} pos {}{}  {}",
                f["fd"],
                f["kind"].as_str().unwrap_or(""),
                f["flags"].as_str().unwrap_or(""),
                f["pos"],
                if f["cloexec"].as_bool() == Some(true) {
                    " cloexec"
                } else {
                    ""
                },
                f["path"].as_str().unwrap_or("")
            );
        }
    }
    s
}
