//! InfiniBand verbs, dump side.
//!
//! A job that uses verbs directly runs with the shadow verbs layer
//! (`libckpt_ibverbs.so`, `ckpt run --ib`), which keeps the state a
//! restart needs in the process's own memory. Here, with the tree frozen:
//! 1. the layer is found among the process's mappings and its exported
//!    symbols read (goblin) from the very file mapped
//!    (`/proc/PID/map_files`);
//! 2. no thread may be inside a verb: the layer's gate is closed and the
//!    threads inside one are let run until they are out (those that try
//!    to enter wait at the gate), then frozen again;
//! 3. the C library's `mallinfo2` runs inside the process under a deadline:
//!    if a frozen thread holds a malloc lock it never returns, and the dump
//!    is refused (the restart allocates, and would wait for ever);
//! 4. the layer's drain runs inside the process, through the parasite, on
//!    the leader's thread and a stack of its own: every completion queue
//!    is polled into the layer's queues until every send completed or a
//!    quiet window passed, while the adapter keeps working;
//! 5. the memory dump then saves the layer's state with everything else;
//!    the device's own mappings (`/dev/infiniband/*`) are left out, and
//!    its descriptors become `ib` fds (placeholders at restore).
//!
//! Without the layer, a process holding verbs resources is refused by
//! name before anything is saved.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ckpt_image::ib::IbLayer;
use ckpt_parasite::{Infection, Tracee};

use crate::error::{DumpError, Result};
use crate::procfile;

/// The layer's file name.
pub const LAYER_FILE: &str = "libckpt_ibverbs.so";
/// The GNU C library's file name.
const LIBC_FILE: &str = "libc.so.6";
/// How long `mallinfo2` may take in the frozen process: it only walks the
/// arenas, unless a frozen thread holds one's lock, when it never returns.
const MALLOC_PROBE: Duration = Duration::from_millis(500);
/// The largest layer file read for its symbols.
const MAX_LAYER_BYTES: u64 = 256 << 20;
/// The drain waits until no completion came for this long...
const QUIET: Duration = Duration::from_millis(20);
/// ...or this long in all.
const MAX_DRAIN: Duration = Duration::from_millis(2000);
/// Threads inside a verb get this long to come out.
const MAX_QUIESCE: Duration = Duration::from_secs(2);
/// Stack for the layer's code, mapped in the process for the call.
const CALL_STACK: u64 = 1 << 20;
/// Bytes of a failed call's message read back.
const MAX_MESSAGE: usize = 512;

/// Whether a mapping belongs to a verbs device (doorbells, queues): never
/// saved; the layer maps new ones at restart.
pub fn is_device_mapping(path: &str) -> bool {
    path.starts_with("/dev/infiniband/")
}

/// Whether an fd link is a verbs descriptor.
pub fn is_verbs_fd(link: &str) -> bool {
    link.starts_with("/dev/infiniband/") || link == "anon_inode:[infinibandevent]"
}

/// The layer in one process: the addresses of what ckpt uses.
#[derive(Debug, Clone, Copy)]
pub struct Layer {
    /// The C library's `mallinfo2`, when it has one (see [`drain`]).
    mallinfo2: Option<u64>,
    gate: u64,
    in_verbs: u64,
    checkpoint: u64,
    restart_local: u64,
    restart_connect: u64,
    last_error: u64,
}

fn err(pid: i32, what: impl Into<String>) -> DumpError {
    DumpError::Ib {
        pid,
        what: what.into(),
    }
}

/// What a process's mappings say about verbs: where the layer is mapped
/// (its first mapping, at file offset 0) and whether device memory is.
struct Mapped {
    layer: Option<(u64, u64)>,
    device: bool,
    /// The C library's first mapping, for its `mallinfo2`.
    libc: Option<(u64, u64)>,
}

fn scan(pid: i32) -> Result<Mapped> {
    let maps = procfile::read(pid, "maps")?;
    let mut m = Mapped {
        layer: None,
        device: false,
        libc: None,
    };
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(_perms), Some(offset)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let path = f.nth(2).unwrap_or("");
        m.device |= is_device_mapping(path);
        let name = path.rsplit('/').next();
        let slot = match name {
            Some(LAYER_FILE) => &mut m.layer,
            Some(LIBC_FILE) => &mut m.libc,
            _ => continue,
        };
        if offset.chars().all(|c| c == '0')
            && slot.is_none()
            && let Some((s, e)) = range.split_once('-')
            && let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16))
        {
            *slot = Some((s, e));
        }
    }
    Ok(m)
}

/// Why a process's verbs resources cannot be saved without the layer.
pub fn without_layer(what: &str) -> String {
    format!(
        "{what} without the verbs layer (start the job with `ckpt run --ib`, or LD_PRELOAD={LAYER_FILE})"
    )
}

/// Finds the layer in `pid` (a process run with it is drained and
/// restarted through it, whether or not it holds resources yet); refuses
/// device memory mapped without it. A verbs fd without the layer is
/// refused by its fd kind (`fd::ib`), which reads the fds anyway.
pub fn find(pid: i32) -> Result<Option<Layer>> {
    let m = scan(pid)?;
    match m.layer {
        Some((start, end)) => {
            let mut layer = read_layer(pid, start, end)?;
            layer.mallinfo2 = match m.libc {
                Some((s, e)) => mallinfo2(pid, s, e),
                None => None,
            };
            Ok(Some(layer))
        }
        None if m.device => {
            // Only on this path: name the fd too, as the fd kind would.
            let what = match verbs_fd(pid)? {
                Some(n) => format!("fd {n}: verbs device"),
                None => "verbs device memory".into(),
            };
            Err(err(pid, without_layer(&what)))
        }
        None => Ok(None),
    }
}

/// The first verbs descriptor of `pid`, if any (for a refusal's message).
fn verbs_fd(pid: i32) -> Result<Option<i32>> {
    let dir = format!("/proc/{pid}/fd");
    let entries = std::fs::read_dir(&dir).map_err(|e| DumpError::Proc {
        pid,
        path: dir.clone().into(),
        source: e,
    })?;
    for e in entries.flatten() {
        if let Ok(link) = std::fs::read_link(e.path())
            && is_verbs_fd(&link.to_string_lossy())
        {
            return Ok(e.file_name().to_string_lossy().parse().ok());
        }
    }
    Ok(None)
}

/// Whether `pid` runs with the layer.
pub fn has_layer(pid: i32) -> Result<bool> {
    Ok(scan(pid)?.layer.is_some())
}

/// Reads the layer's dynamic symbols from the file mapped at `start`
/// (through map_files: the very inode mapped, whatever its path now).
fn read_layer(pid: i32, start: u64, end: u64) -> Result<Layer> {
    let syms = dynamic_symbols(pid, start, end, LAYER_FILE)?;
    let sym = |name: &str| {
        syms.get(name).copied().ok_or_else(|| {
            err(
                pid,
                format!("{LAYER_FILE} exports no {name} (another version?)"),
            )
        })
    };
    Ok(Layer {
        mallinfo2: None,
        gate: sym("CKPT_IB_GATE")?,
        in_verbs: sym("CKPT_IB_IN_VERBS")?,
        checkpoint: sym("ckpt_ib_checkpoint")?,
        restart_local: sym("ckpt_ib_restart_local")?,
        restart_connect: sym("ckpt_ib_restart_connect")?,
        last_error: sym("ckpt_ib_last_error")?,
    })
}

/// The C library's `mallinfo2` in `pid` (mapped at `start`), if it has
/// one; without it the malloc probe is skipped (logged).
fn mallinfo2(pid: i32, start: u64, end: u64) -> Option<u64> {
    match dynamic_symbols(pid, start, end, LIBC_FILE) {
        Ok(syms) => {
            let found = syms.get("mallinfo2").copied();
            if found.is_none() {
                log::debug!("pid {pid}: {LIBC_FILE} has no mallinfo2: malloc lock not probed");
            }
            found
        }
        Err(e) => {
            log::debug!("pid {pid}: malloc lock not probed: {e}");
            None
        }
    }
}

/// The dynamic symbols of the ELF file mapped at `start` in `pid` (its
/// first mapping), at their addresses in the process.
fn dynamic_symbols(pid: i32, start: u64, end: u64, label: &str) -> Result<HashMap<String, u64>> {
    let path = format!("/proc/{pid}/map_files/{start:x}-{end:x}");
    let io = |e: std::io::Error| DumpError::Proc {
        pid,
        path: path.clone().into(),
        source: e,
    };
    let file = std::fs::File::open(&path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len > MAX_LAYER_BYTES {
        return Err(err(
            pid,
            format!("{label} is {len} bytes, more than any build of it"),
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_LAYER_BYTES), &mut bytes)
        .map_err(io)?;
    let elf = goblin::elf::Elf::parse(&bytes)
        .map_err(|e| err(pid, format!("{label}: not an ELF file ({e})")))?;
    // The load bias: where the first loadable segment went, less its
    // link-time address.
    let first_load = elf
        .program_headers
        .iter()
        .find(|p| p.p_type == goblin::elf::program_header::PT_LOAD)
        .ok_or_else(|| err(pid, format!("{label} has no loadable segment")))?;
    let bias = start.wrapping_sub(first_load.p_vaddr & !0xfff);
    let mut syms = HashMap::new();
    for s in elf.dynsyms.iter() {
        if s.st_value != 0
            && let Some(name) = elf.dynstrtab.get_at(s.st_name)
        {
            syms.insert(name.to_string(), bias.wrapping_add(s.st_value));
        }
    }
    Ok(syms)
}

fn read_u64(t: &Tracee, addr: u64) -> Result<u64> {
    let mut b = [0u8; 8];
    t.read_mem(addr, &mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Makes sure no thread of the frozen process is inside a verb: closes the
/// layer's gate and lets the threads run until the count of threads
/// inside is zero, then freezes them again (see the module doc).
pub fn quiesce(pid: i32, tasks: &[Tracee], job_stopped: bool, layer: &Layer) -> Result<()> {
    let leader = &tasks[0];
    leader.write_mem(layer.gate, &1u32.to_le_bytes())?;
    let started = Instant::now();
    loop {
        if read_u64(leader, layer.in_verbs)? == 0 {
            return Ok(());
        }
        if job_stopped {
            return Err(err(
                pid,
                "stopped by job control inside a verbs call; continue it (SIGCONT) and dump again",
            ));
        }
        if started.elapsed() >= MAX_QUIESCE {
            leader.write_mem(layer.gate, &0u32.to_le_bytes())?;
            return Err(err(
                pid,
                format!("a thread stayed inside a verbs call for {MAX_QUIESCE:?}"),
            ));
        }
        for t in tasks {
            t.let_run()?;
        }
        let out = Instant::now();
        while read_u64(leader, layer.in_verbs)? != 0 && out.elapsed() < MAX_QUIESCE {
            std::thread::sleep(Duration::from_millis(1));
        }
        for t in tasks {
            t.stop_again()?;
        }
        log::debug!(
            "pid {pid}: let the threads out of the verbs layer in {:.1} ms",
            out.elapsed().as_secs_f64() * 1e3
        );
    }
}

/// After the calls into the process: their stack unmapped, the gate open
/// again in memory (the threads waiting there go on when the process is
/// thawed, and a restored one never finds it closed).
fn end_calls(inf: &Infection<'_>, layer: &Layer, stack: u64) -> Result<()> {
    inf.syscall(
        "munmap (verbs layer stack)",
        libc::SYS_munmap,
        [stack, CALL_STACK, 0, 0, 0, 0],
    )?;
    inf.tracee().write_mem(layer.gate, &0u32.to_le_bytes())?;
    Ok(())
}

/// What the layer's drain reports (its `DrainReport`).
const REPORT_LEN: usize = 24;
/// `struct mallinfo2`: ten size_t, returned through a hidden pointer.
const MALLINFO2_LEN: usize = 80;

/// Runs the layer's drain inside the frozen, quiesced process (see the
/// module doc), then opens the gate again in memory: the threads waiting
/// there go on when the process is thawed, and a restored one never finds
/// it closed.
pub fn drain(inf: &Infection<'_>, pid: i32, layer: &Layer) -> Result<IbLayer> {
    let stack = inf.syscall(
        "mmap (verbs layer stack)",
        libc::SYS_mmap,
        [
            0,
            CALL_STACK,
            (libc::PROT_READ | libc::PROT_WRITE) as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE) as u64,
            u64::MAX,
            0,
        ],
    )?;
    let (buf, buf_len) = inf.syscall_buffer();
    debug_assert!(buf_len >= REPORT_LEN.max(MALLINFO2_LEN));
    // The layer's restart allocates in the restored process (so does the
    // verbs library under it): a malloc lock held by a thread frozen inside
    // malloc would be held in the image too, and the restart would wait
    // for it for ever. mallinfo2 takes every arena's lock in turn.
    if let Some(probe) = layer.mallinfo2 {
        let took = inf.call_function_by(
            "probing the malloc locks",
            probe,
            [buf, 0, 0, 0, 0, 0],
            stack + CALL_STACK,
            Some(Instant::now() + MALLOC_PROBE),
        );
        if !matches!(took, Ok(Some(_))) {
            end_calls(inf, layer, stack)?;
            took?;
            return Err(err(
                pid,
                format!(
                    "a thread is inside malloc (a lock of the C library's allocator was still held after {MALLOC_PROBE:?}): a restart would wait for it for ever; dump again in a moment"
                ),
            ));
        }
    }
    let called = inf.call_function(
        "draining the verbs layer",
        layer.checkpoint,
        [
            QUIET.as_millis() as u64,
            MAX_DRAIN.as_millis() as u64,
            buf,
            0,
            0,
            0,
        ],
        stack + CALL_STACK,
    );
    let message = match called {
        Ok(rc) if (rc as i32) < 0 => Some((
            rc as i32,
            inf.call_function(
                "reading the verbs layer's error",
                layer.last_error,
                [0; 6],
                stack + CALL_STACK,
            )
            .ok(),
        )),
        _ => None,
    };
    let mut report = [0u8; REPORT_LEN];
    let read = inf.tracee().read_mem(buf, &mut report);
    let mut text = vec![0u8; MAX_MESSAGE];
    if let Some((_, Some(p))) = message {
        let _ = inf.tracee().read_mem(p, &mut text);
    }
    end_calls(inf, layer, stack)?;
    called?;
    if let Some((rc, _)) = message {
        let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
        return Err(err(
            pid,
            format!(
                "the layer's drain failed: {} ({})",
                String::from_utf8_lossy(&text[..end]),
                nix::errno::Errno::from_raw(-rc)
            ),
        ));
    }
    read?;
    let word = |i: usize| u64::from_le_bytes(report[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let out = IbLayer {
        restart_local: layer.restart_local,
        restart_connect: layer.restart_connect,
        last_error: layer.last_error,
        drained_completions: word(0),
        outstanding_sends: word(1),
        drain_us: word(2),
    };
    log::info!(
        "pid {pid}: verbs drained: {} completions, {} sends outstanding, {:.3} ms",
        out.drained_completions,
        out.outstanding_sends,
        out.drain_us as f64 / 1e3
    );
    Ok(out)
}
