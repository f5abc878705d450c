//! The embedded parasite code blob (built from `parasite/blob/` by `build.rs`).
//!
//! The blob is a flat, position-independent image meant to be mapped in a ptrace-stopped
//! target and run there:
//!
//! 1. map [`BlobImage::mem_size`] bytes of private anonymous memory in the target, **RWX**
//!    (text, GOT, data and stack share one mapping; pages are not separated by permission);
//! 2. write [`BlobImage::relocated`]`(base)` there, then a [`crate::proto::Args`] block at
//!    `base + args_offset`;
//! 3. set `rip = base + entry` (the blob switches to its own stack, so `rsp` does not matter,
//!    and the target's red zone is never touched), continue, and wait for the `SIGTRAP` from
//!    the blob's final `int3` (any other stop means the blob faulted or a signal arrived —
//!    block signals in the target beforehand);
//! 4. read the `Args` block back and check `ret`.
//!
//! The blob is compiled Rust and may use SSE registers: save and restore the target's full
//! register and FPU/xstate around the call.

use crate::proto::Args;

mod meta {
    include!(concat!(env!("OUT_DIR"), "/blob_meta.rs"));
}

/// Layout of a flattened parasite image. All offsets are relative to the load base.
#[derive(Clone, Copy, Debug)]
pub struct BlobImage {
    /// File image: the bytes from offset 0 up to the end of the initialized data. Relocation
    /// slots hold their addend only; use [`BlobImage::relocated`] to get loadable bytes.
    pub bytes: &'static [u8],
    /// Size of the image in memory (file image followed by zero-filled `.bss` and the blob's
    /// 16 KiB stack). Not page-rounded.
    pub mem_size: usize,
    /// Offset of the entry point (`parasite_entry`).
    pub entry: usize,
    /// Offset of the [`Args`] block (`__parasite_args`, 64-byte aligned).
    pub args_offset: usize,
    /// Offset of the top of the blob's own stack (16-byte aligned).
    pub stack_top: usize,
    /// Offsets of the 8-byte little-endian `R_X86_64_RELATIVE` slots; each holds its addend
    /// and must have the load base added.
    pub relocs: &'static [u64],
    /// Offset just after the "done" marker syscall (getpid) every command
    /// ends with; the host stops the task at that syscall's entry.
    pub done: usize,
    /// Offset of `syscall` followed by the marker and the rescue path: where
    /// remote syscalls run once the blob is loaded.
    pub trampoline: usize,
    /// Offset of the return address for a function of the task's own the
    /// host calls ([`crate::Infection::call_function`]).
    pub call_return: usize,
    /// Offset of the 8-byte rescue stack pointer the host must fill in.
    pub rescue_sp: usize,
}

/// The parasite blob built from `parasite/blob/main.rs`.
pub const BLOB: BlobImage = BlobImage {
    bytes: include_bytes!(concat!(env!("OUT_DIR"), "/blob.bin")),
    mem_size: meta::MEM_SIZE,
    entry: meta::ENTRY,
    args_offset: meta::ARGS_OFFSET,
    stack_top: meta::STACK_TOP,
    relocs: meta::RELOCS,
    done: meta::DONE,
    trampoline: meta::TRAMPOLINE,
    call_return: meta::CALL_RETURN,
    rescue_sp: meta::RESCUE_SP,
};

impl BlobImage {
    /// Returns the in-memory image for load address `base`: `mem_size` bytes (zero beyond the
    /// file image) with `base` added (wrapping) to every relocation slot.
    pub fn relocated(&self, base: u64) -> Vec<u8> {
        let mut buf = vec![0u8; self.mem_size.max(self.bytes.len())];
        buf[..self.bytes.len()].copy_from_slice(self.bytes);
        for &off in self.relocs {
            let off = usize::try_from(off).expect("relocation offset fits usize");
            let slot: &mut [u8; 8] = (&mut buf[off..off + 8])
                .try_into()
                .expect("slice of length 8");
            *slot = u64::from_le_bytes(*slot).wrapping_add(base).to_le_bytes();
        }
        buf
    }

    /// Size of the [`Args`] block the blob expects at [`BlobImage::args_offset`].
    pub const fn args_size(&self) -> usize {
        core::mem::size_of::<Args>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_sane() {
        let b = BLOB;
        assert!(!b.bytes.is_empty());
        assert!(b.bytes.len() <= b.mem_size);
        assert!(b.entry < b.bytes.len(), "entry must be in the file image");
        assert!(b.args_offset < b.mem_size);
        assert_eq!(b.args_offset % 8, 0);
        assert!(b.args_offset + core::mem::size_of::<Args>() <= b.mem_size);
        assert!(b.stack_top <= b.mem_size && b.stack_top >= 0x4000);
        assert_eq!(b.stack_top % 16, 0);
        for &r in b.relocs {
            assert!(r as usize + 8 <= b.bytes.len());
        }
    }

    #[test]
    fn relocated_differs_exactly_at_slots() {
        let (b1, b2) = (0x7f00_0000_0000u64, 0x5555_1234_5000u64);
        let i1 = BLOB.relocated(b1);
        let i2 = BLOB.relocated(b2);
        assert_eq!(i1.len(), BLOB.mem_size);
        assert_eq!(i2.len(), BLOB.mem_size);
        assert!(i1[BLOB.bytes.len()..].iter().all(|&x| x == 0));

        let mut is_slot = vec![false; BLOB.mem_size];
        for &r in BLOB.relocs {
            let r = r as usize;
            let v1 = u64::from_le_bytes(i1[r..r + 8].try_into().unwrap());
            let v2 = u64::from_le_bytes(i2[r..r + 8].try_into().unwrap());
            assert_eq!(v1.wrapping_sub(v2), b1.wrapping_sub(b2), "slot {r:#x}");
            let addend = u64::from_le_bytes(BLOB.bytes[r..r + 8].try_into().unwrap());
            assert_eq!(v1, addend + b1);
            assert!(
                addend < BLOB.mem_size as u64,
                "addend points inside the blob"
            );
            is_slot[r..r + 8].iter_mut().for_each(|s| *s = true);
        }
        for (i, s) in is_slot.iter().enumerate() {
            if !s {
                assert_eq!(i1[i], i2[i], "byte {i:#x} is not a relocation slot");
                if i < BLOB.bytes.len() {
                    assert_eq!(i1[i], BLOB.bytes[i]);
                }
            }
        }
    }
}
