//! Running syscalls inside a stopped task from a scratch area of ckpt's:
//! its first bytes are `syscall; int3`, the pages after them hold
//! arguments (paths, structs). The restorer maps one where neither the
//! restorer's inherited mappings nor the dumped ones lie, uses it for
//! every step of rebuilding a process, and unmaps it last. A child forked
//! from a task with the area inherits it at the same address.

use crate::batch;
use crate::error::{ParasiteError, Result};
use crate::tracee::{SYSCALL_INT3, Tracee};

/// Size of the scratch area: one page of code, the rest for arguments.
pub const SCRATCH_LEN: u64 = 4 * PAGE;
const PAGE: u64 = 4096;
/// Bytes of one argument slot.
pub const SLOT_BYTES: u64 = PAGE;
const DATA_OFFSET: u64 = PAGE;
/// Where the batch loop ([`crate::batch`]) sits in the code page, after
/// the `syscall; int3` trampoline.
const BATCH_OFFSET: u64 = 16;
/// The argument slots a batch's table uses (slot 0 stays for paths).
const BATCH_FIRST_SLOT: u64 = 1;
/// Entries of one batch run: the table fills the slots from
/// [`BATCH_FIRST_SLOT`] on.
const BATCH_ENTRIES: usize = ((SLOTS - BATCH_FIRST_SLOT) * PAGE / batch::ENTRY_LEN) as usize;
/// Argument slots, one page each, after the code page.
const SLOTS: u64 = SCRATCH_LEN / PAGE - 1;

/// Size of `struct open_how` (openat2's version 0).
const OPEN_HOW_SIZE: u64 = 24;

/// A task with a scratch area mapped at `base`.
pub struct Remote<'t> {
    /// The task.
    pub t: &'t Tracee,
    /// Start of the scratch area (the trampoline).
    pub base: u64,
}

impl<'t> Remote<'t> {
    /// Maps the scratch area at `at`, bootstrapping with a trampoline poked
    /// over the task's code at `code` (put back afterwards).
    pub fn map(t: &'t Tracee, code: u64, at: u64) -> Result<Self> {
        let base = t.bootstrap_mmap(
            code,
            "mmap (scratch)",
            at,
            SCRATCH_LEN,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
        )?;
        t.write_mem(base, &SYSCALL_INT3)?;
        t.write_mem(base + BATCH_OFFSET, batch::loop_code())?;
        Ok(Remote { t, base })
    }

    /// Runs a syscall and checks its result.
    pub fn call(&self, name: &'static str, nr: i64, args: [u64; 6]) -> Result<u64> {
        self.t.syscall_ok(self.base, name, nr, args)
    }

    /// Runs `calls` in order, a table of them per stop; stops at the first
    /// that fails (an error naming it) and returns every result otherwise.
    /// Uses the argument slots from 1 on: nothing put there before
    /// survives.
    pub fn call_many(&self, calls: &[batch::Call]) -> Result<Vec<u64>> {
        let ran = self.call_until_failure(calls)?;
        match ran.failed {
            None => Ok(ran.results),
            Some(f) => Err(ParasiteError::RemoteSyscall {
                pid: self.t.pid(),
                name: calls[f.index].name,
                errno: f.errno,
            }),
        }
    }

    /// [`Remote::call_many`] that reports the first failure instead of
    /// failing with it: what the calls before it returned stays known (the
    /// fds they opened, to be used or closed).
    pub fn call_until_failure(&self, calls: &[batch::Call]) -> Result<Ran> {
        let pid = self.t.pid();
        let code_len = batch::loop_code().len() as u64;
        let table_at = self.base + DATA_OFFSET + BATCH_FIRST_SLOT * PAGE;
        let mut results = Vec::with_capacity(calls.len());
        for (c, chunk) in calls.chunks(BATCH_ENTRIES).enumerate() {
            let table = batch::table(chunk);
            self.t.write_mem(table_at, &table)?;
            let mut r = self.t.regs()?;
            r.rip = self.base + BATCH_OFFSET;
            r.rdi = table_at;
            r.rsi = chunk.len() as u64;
            r.orig_rax = u64::MAX;
            self.t.set_regs(&r)?;
            self.t
                .run_until_trap("running a batch of remote syscalls")?;
            let after = self.t.regs()?;
            let trap = self.base + BATCH_OFFSET + code_len;
            if after.rip != trap {
                return Err(ParasiteError::UnexpectedStop {
                    pid,
                    what: "running a batch of remote syscalls",
                    status: format!("trap at {:#x}, expected {trap:#x}", after.rip),
                });
            }
            let mut done = table;
            self.t.read_mem(table_at, &mut done)?;
            let left = after.r13 as usize;
            let ran = chunk.len() - left.min(chunk.len());
            let result = |i: usize| {
                let at = i * batch::ENTRY_LEN as usize + batch::RESULT_OFFSET as usize;
                u64::from_le_bytes(done[at..at + 8].try_into().expect("8 bytes"))
            };
            results.extend((0..ran).map(result));
            if left != 0 {
                let failed = &chunk[ran];
                let ret = result(ran) as i64;
                if let Err(ParasiteError::RemoteSyscall { errno, .. }) =
                    crate::tracee::check_ret(pid, failed.name, ret)
                {
                    return Ok(Ran {
                        results,
                        failed: Some(Failed {
                            index: c * BATCH_ENTRIES + ran,
                            errno,
                        }),
                    });
                }
                return Err(ParasiteError::UnexpectedStop {
                    pid,
                    what: "running a batch of remote syscalls",
                    status: format!("stopped at {} with result {ret}", failed.name),
                });
            }
        }
        Ok(Ran {
            results,
            failed: None,
        })
    }

    /// The argument slots from 1 on as one buffer (what [`Remote::put`]
    /// does not use for paths): address and length.
    pub fn scratch_buffer(&self) -> (u64, usize) {
        (
            self.base + DATA_OFFSET + PAGE,
            ((SLOTS - 1) * PAGE) as usize,
        )
    }

    /// Copies `bytes` into argument slot `slot` (each slot is one page) and
    /// returns its remote address.
    pub fn put(&self, slot: u64, bytes: &[u8]) -> Result<u64> {
        self.put_at(slot, 0, bytes)
    }

    /// Copies `bytes` into argument slot `slot` at `offset` in it, and
    /// returns their remote address: arguments of several calls of one
    /// batch in slot 0, the one a batch leaves alone.
    pub fn put_at(&self, slot: u64, offset: u64, bytes: &[u8]) -> Result<u64> {
        let fits = offset
            .checked_add(bytes.len() as u64)
            .is_some_and(|end| end <= PAGE);
        if !fits || slot >= SLOTS {
            return Err(ParasiteError::Layout {
                pid: self.t.pid(),
                what: format!(
                    "syscall argument of {} bytes at {offset} in slot {slot} does not fit the scratch area",
                    bytes.len()
                ),
            });
        }
        let addr = self.base + DATA_OFFSET + slot * PAGE + offset;
        self.t.write_mem(addr, bytes)?;
        Ok(addr)
    }

    /// Copies a NUL-terminated path into slot `slot`.
    pub fn put_path(&self, slot: u64, path: &str) -> Result<u64> {
        let mut b = path.as_bytes().to_vec();
        b.push(0);
        self.put(slot, &b)
    }

    /// Copies 64-bit words into slot `slot`.
    pub fn put_u64s(&self, slot: u64, words: &[u64]) -> Result<u64> {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.put(slot, &bytes)
    }

    /// `open(path, flags, mode)` inside the task; an error names the path.
    pub fn open(&self, path: &str, flags: i32, mode: u32) -> Result<i32> {
        let p = self.put_path(0, path)?;
        let fd = self.t.syscall_at(
            self.base,
            libc::SYS_open,
            [p, flags as u64, mode as u64, 0, 0, 0],
        )?;
        self.opened(path, fd)
    }

    /// `openat2(AT_FDCWD, path, {flags, 0, RESOLVE_NO_SYMLINKS})` inside
    /// the task: no symbolic link is followed in any component. For paths
    /// the dump read from /proc (exe, cwd, root), where the kernel had
    /// resolved every link: a link on the path now was put there since,
    /// maybe by the user, to aim a root-run lookup elsewhere. Uses argument
    /// slots 0 (the path) and 1 (`struct open_how`); an error names the
    /// path.
    pub fn open_no_symlinks(&self, path: &str, flags: i32) -> Result<i32> {
        let p = self.put_path(0, path)?;
        // struct open_how: flags, mode, resolve (u64 each).
        let how = self.put_u64s(1, &[flags as u64, 0, libc::RESOLVE_NO_SYMLINKS])?;
        let fd = self.t.syscall_at(
            self.base,
            libc::SYS_openat2,
            [libc::AT_FDCWD as u64, p, how, OPEN_HOW_SIZE, 0, 0],
        )?;
        self.opened(path, fd)
    }

    /// The fd an open of `path` returned, or its errno as an error naming
    /// the path.
    fn opened(&self, path: &str, ret: i64) -> Result<i32> {
        if ret < 0 {
            return Err(ParasiteError::RemoteOpen {
                pid: self.t.pid(),
                path: path.into(),
                errno: nix::errno::Errno::from_raw(-ret as i32),
            });
        }
        Ok(ret as i32)
    }

    /// `close(fd)` inside the task.
    pub fn close(&self, fd: i32) -> Result<()> {
        self.call("close", libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0])
            .map(|_| ())
    }
}

/// What [`Remote::call_until_failure`] ran.
pub struct Ran {
    /// The results of the calls that succeeded, in order: every call's, or
    /// those before the one that failed.
    pub results: Vec<u64>,
    /// The call that failed, if one did.
    pub failed: Option<Failed>,
}

/// A call of a batch that failed.
pub struct Failed {
    /// Its index among the calls.
    pub index: usize,
    /// What it returned.
    pub errno: nix::errno::Errno,
}
