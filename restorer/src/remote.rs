//! Running syscalls inside the process being restored, from a scratch area
//! ckpt maps where neither the restorer's inherited mappings nor the
//! dumped ones lie. The area's first bytes are `syscall; int3`; the rest
//! holds syscall arguments (paths, structs). It is unmapped last.

use ckpt_parasite::{SYSCALL_INT3, Tracee};

use crate::error::{RestoreError, Result};

/// Size of the scratch area: one page of code, the rest for arguments.
pub const SCRATCH_LEN: u64 = 4 * 4096;
const DATA_OFFSET: u64 = 4096;

/// A mapped scratch area in the restored process.
pub struct Remote<'t> {
    /// The process.
    pub t: &'t Tracee,
    /// Start of the scratch area (the trampoline).
    pub base: u64,
}

impl<'t> Remote<'t> {
    /// Maps the scratch area at `at`, bootstrapping with a trampoline poked
    /// over the child's own (inherited, soon discarded) code at `code`.
    pub fn map(t: &'t Tracee, code: u64, at: u64) -> Result<Self> {
        t.write_mem(code, &SYSCALL_INT3)?;
        let base = t.syscall_ok(
            code,
            "mmap (scratch)",
            libc::SYS_mmap,
            [
                at,
                SCRATCH_LEN,
                (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64,
                u64::MAX,
                0,
            ],
        )?;
        t.write_mem(base, &SYSCALL_INT3)?;
        Ok(Remote { t, base })
    }

    /// Runs a syscall and checks its result.
    pub fn call(&self, name: &'static str, nr: i64, args: [u64; 6]) -> Result<u64> {
        Ok(self.t.syscall_ok(self.base, name, nr, args)?)
    }

    /// Copies `bytes` into argument slot `slot` (each slot is one page) and
    /// returns its remote address.
    pub fn put(&self, slot: u64, bytes: &[u8]) -> Result<u64> {
        let addr = self.base + DATA_OFFSET + slot * 4096;
        if bytes.len() > 4096 || addr + 4096 > self.base + SCRATCH_LEN {
            return Err(RestoreError::Host {
                pid: self.t.pid(),
                what: format!("syscall argument of {} bytes too large", bytes.len()),
            });
        }
        self.t.write_mem(addr, bytes)?;
        Ok(addr)
    }

    /// Copies a NUL-terminated path into slot `slot`.
    pub fn put_path(&self, slot: u64, path: &str) -> Result<u64> {
        let mut b = path.as_bytes().to_vec();
        b.push(0);
        self.put(slot, &b)
    }

    /// Copies a plain-old-data value into slot `slot`.
    pub fn put_u64s(&self, slot: u64, words: &[u64]) -> Result<u64> {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.put(slot, &bytes)
    }

    /// `open(path, flags, mode)` inside the process.
    pub fn open(&self, path: &str, flags: i32, mode: u32) -> Result<i32> {
        let p = self.put_path(0, path)?;
        let fd = self.t.syscall_at(
            self.base,
            libc::SYS_open,
            [p, flags as u64, mode as u64, 0, 0, 0],
        )?;
        if fd < 0 {
            return Err(RestoreError::File {
                pid: self.t.pid(),
                path: path.into(),
                what: format!(
                    "cannot open: {}",
                    std::io::Error::from_raw_os_error(-fd as i32)
                ),
            });
        }
        Ok(fd as i32)
    }

    /// `close(fd)` inside the process.
    pub fn close(&self, fd: i32) -> Result<()> {
        self.call("close", libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0])
            .map(|_| ())
    }
}
