//! InfiniBand verbs, restore side.
//!
//! A process dumped with the verbs layer (`Core.ib`) gets its memory and
//! fds back like any other, the verbs descriptors as placeholders and
//! without the device's mappings. Once every process of the tree is whole
//! and still stopped, the layer recreates the resources from inside each:
//! 1. `ckpt_ib_restart_local` in every process: the device is reopened
//!    (another one if this node has no device of that name), PDs, MRs at
//!    their addresses, CQs, SRQs and QPs recreated, the new descriptors put
//!    on the numbers the application knows; it returns the process's
//!    restart blob (its new QP numbers, GIDs, LIDs, rkeys and the count of
//!    receives each QP consumed);
//! 2. `ckpt_ib_restart_connect` in every process with all the blobs (this
//!    tree's alone, or every node's through the coordinator's
//!    publish/subscribe phases under `ckpt restore --coord`): the QPs are
//!    brought to RTS again towards their peers' new ids, the sends a peer
//!    had already received are retired, the rest re-posted.
//!
//! The layer's code is the user's: it runs in the restored process, with
//! the process's final credentials, on its leader's thread and a stack
//! mapped for the call, under a watchdog that kills the process if the
//! call never returns.

use std::time::Duration;

use ckpt_image::ib::IbLayer;
use ckpt_parasite::{Regs, SYSCALL_INT3, Tracee};

use crate::error::{RestoreError, Result};
use crate::held::Held;
use crate::read::ProcessImages;

const PAGE: u64 = 4096;
/// Stack for the layer's code.
const CALL_STACK: u64 = 1 << 20;
/// No process's blob is larger (the layer's own bound).
const MAX_BLOB: u64 = 16 << 20;
/// Bytes of a failed call's message read back.
const MAX_MESSAGE: usize = 512;
/// A call that has not returned by then is not going to.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Where the `syscall; int3` for the final `munmap` sits in the area
/// (the `int3` a call returns to is at offset 0).
const SYSCALL_AT: u64 = 16;
/// The x86 breakpoint instruction a call returns to.
const INT3: u8 = 0xcc;

fn err(pid: i32, what: impl Into<String>) -> RestoreError {
    RestoreError::Ib {
        pid,
        what: what.into(),
    }
}

/// An area mapped in a stopped process for calling its layer: a trap to
/// return to, a data page (plus room for the blobs), a stack. The
/// process's registers, xstate and mask are put back when it is unmapped.
struct CallArea<'t> {
    t: &'t Tracee,
    base: u64,
    len: u64,
    data: u64,
    stack_top: u64,
    saved: Option<(Regs, Vec<u8>, u64)>,
}

impl<'t> CallArea<'t> {
    fn map(t: &'t Tracee, data_len: u64) -> Result<CallArea<'t>> {
        let saved = (t.regs()?, t.xstate()?, t.sigmask()?);
        t.set_sigmask(!0)?;
        let data_len = data_len.max(PAGE).next_multiple_of(PAGE);
        let len = PAGE + data_len + CALL_STACK;
        let site = ckpt_parasite::first_exec_addr(t.pid())?;
        let base = t.bootstrap_mmap(
            site,
            "mmap (verbs layer call area)",
            0,
            len,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        )?;
        let area = CallArea {
            t,
            base,
            len,
            data: base + PAGE,
            stack_top: base + len,
            saved: Some(saved),
        };
        t.write_mem(base, &[INT3])?;
        t.write_mem(base + SYSCALL_AT, &SYSCALL_INT3)?;
        Ok(area)
    }

    /// Calls the layer's function at `addr`; its `int` result.
    fn call(&self, what: &'static str, addr: u64, args: [u64; 6]) -> Result<i32> {
        Ok(self.call_raw(what, addr, args)? as i32)
    }

    /// Calls the layer's function at `addr`; its whole `rax`.
    fn call_raw(&self, what: &'static str, addr: u64, args: [u64; 6]) -> Result<u64> {
        let pid = self.t.pid();
        let (cancel, expired) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                expired.recv_timeout(CALL_TIMEOUT)
            {
                log::warn!("pid {pid}: {what} did not return in {CALL_TIMEOUT:?}; killing it");
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        });
        let ret = self
            .t
            .call_function_at(what, addr, args, self.stack_top, self.base);
        drop(cancel);
        let _ = watchdog.join();
        Ok(ret?)
    }

    /// The layer's message about its last failure.
    fn message(&self, layer: &IbLayer) -> String {
        let Ok(p) = self
            .call("reading the verbs layer's error", layer.last_error, [0; 6])
            .map(|_| self.t.regs().map(|r| r.rax))
        else {
            return String::new();
        };
        let Ok(p) = p else { return String::new() };
        let mut text = vec![0u8; MAX_MESSAGE];
        if self.t.read_mem(p, &mut text).is_err() {
            return String::new();
        }
        let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
        String::from_utf8_lossy(&text[..end]).into_owned()
    }

    fn unmap(&mut self) -> Result<()> {
        let Some((regs, xstate, mask)) = self.saved.take() else {
            return Ok(());
        };
        let t = self.t;
        let ret = t.syscall_stop_at_exit(
            self.base + SYSCALL_AT,
            libc::SYS_munmap,
            [self.base, self.len, 0, 0, 0, 0],
        );
        t.set_regs(&regs)?;
        t.set_xstate(&xstate)?;
        t.set_sigmask(mask)?;
        ckpt_parasite::check_ret(t.pid(), "munmap (verbs layer call area)", ret?)?;
        Ok(())
    }
}

impl Drop for CallArea<'_> {
    fn drop(&mut self) {
        let _ = self.unmap();
    }
}

fn check(area: &CallArea<'_>, pid: i32, layer: &IbLayer, step: &str, rc: i32) -> Result<()> {
    if rc >= 0 {
        return Ok(());
    }
    Err(err(
        pid,
        format!(
            "{step}: {} ({})",
            area.message(layer),
            nix::errno::Errno::from_raw(-rc)
        ),
    ))
}

/// The processes whose verbs layers recreated their resources and wait to
/// connect, and their blobs.
#[derive(Default)]
pub struct Pending {
    /// (index in the tree's tracees, pid, layer).
    procs: Vec<(usize, i32, IbLayer)>,
    /// This tree's restart blobs, concatenated.
    blobs: Vec<u8>,
    connected: bool,
}

impl Pending {
    /// This tree's restart blobs (empty if no process runs the layer).
    pub fn blobs(&self) -> &[u8] {
        &self.blobs
    }

    /// Connects every process's queue pairs with `all` (every node's blobs,
    /// this tree's included), then re-posts their outstanding work.
    pub(crate) fn connect(&mut self, tracees: &[Held], all: &[u8]) -> Result<()> {
        if self.connected || self.procs.is_empty() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        for &(i, pid, ref layer) in &self.procs {
            let t = &tracees[i];
            let mut area = CallArea::map(t, all.len() as u64)?;
            t.write_mem(area.data, all)?;
            let rc = area.call(
                "reconnecting verbs queue pairs",
                layer.restart_connect,
                [area.data, all.len() as u64, 0, 0, 0, 0],
            )?;
            check(&area, pid, layer, "reconnecting its queue pairs", rc)?;
            area.unmap()?;
        }
        self.connected = true;
        log::info!(
            "verbs: {} processes reconnected with {} bytes of restart blobs ({:.3} ms)",
            self.procs.len(),
            all.len(),
            started.elapsed().as_secs_f64() * 1e3
        );
        Ok(())
    }
}

/// Recreates the verbs resources of every process of the tree that ran
/// with the layer (step 1 of the module doc); the connect waits for every
/// node's blobs ([`Pending::connect`]).
pub(crate) fn restart_local(tracees: &[Held], procs: &[ProcessImages]) -> Result<Pending> {
    let mut pending = Pending::default();
    let started = std::time::Instant::now();
    for (i, (t, p)) in tracees.iter().zip(procs).enumerate() {
        let Some(layer) = p.core.ib.as_ref() else {
            continue;
        };
        let pid = p.pid;
        let mut area = CallArea::map(t, PAGE)?;
        let out = area.data;
        let rc = area.call(
            "recreating verbs resources",
            layer.restart_local,
            [0, out, out + 8, 0, 0, 0],
        )?;
        check(&area, pid, layer, "recreating its resources", rc)?;
        let mut words = [0u8; 16];
        t.read_mem(out, &mut words)?;
        let at = u64::from_le_bytes(words[..8].try_into().expect("8 bytes"));
        let len = u64::from_le_bytes(words[8..].try_into().expect("8 bytes"));
        if len > MAX_BLOB {
            return Err(err(pid, format!("restart blob of {len} bytes")));
        }
        let mut blob = vec![0u8; len as usize];
        t.read_mem(at, &mut blob)?;
        pending.blobs.extend_from_slice(&blob);
        pending.procs.push((i, pid, *layer));
        area.unmap()?;
    }
    if !pending.procs.is_empty() {
        log::info!(
            "verbs: {} processes recreated their resources ({:.3} ms)",
            pending.procs.len(),
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(pending)
}
