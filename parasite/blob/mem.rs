//! `memcpy`, `memmove`, `memset`, `memcmp` and `bcmp` for the freestanding blob.
//!
//! With `-nostdlib` on the gnu target nothing provides these symbols (compiler_builtins is
//! built without its `mem` feature), yet LLVM emits calls to them for struct copies and
//! zeroing. They are written with inline assembly / volatile reads so that LLVM cannot turn
//! their bodies back into calls to themselves. The entry stub clears DF (`cld`), which the
//! string instructions below rely on.

use core::arch::asm;

/// Copies `n` bytes from `src` to `dest` (non-overlapping).
///
/// # Safety
/// `src` must be readable and `dest` writable for `n` bytes, and the ranges must not overlap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees both ranges are valid for `n` bytes; DF is clear.
    unsafe {
        asm!(
            "rep movsb",
            inout("rcx") n => _,
            inout("rdi") dest => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags)
        );
    }
    dest
}

/// Copies `n` bytes from `src` to `dest`; the ranges may overlap.
///
/// # Safety
/// `src` must be readable and `dest` writable for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dest as usize).wrapping_sub(src as usize) >= n {
        // dest is below src, or the ranges do not overlap: a forward copy is safe.
        // SAFETY: forwarded caller contract; forward copy is correct for this overlap case.
        unsafe { memcpy(dest, src, n) }
    } else {
        // dest overlaps the tail of src: copy backwards, then restore DF.
        // SAFETY: the caller guarantees both ranges are valid for `n` bytes (n > 0 here, so
        // the `n - 1` offsets stay inside them).
        unsafe {
            asm!(
                "std",
                "rep movsb",
                "cld",
                inout("rcx") n => _,
                inout("rdi") dest.add(n - 1) => _,
                inout("rsi") src.add(n - 1) => _,
                options(nostack)
            );
        }
        dest
    }
}

/// Fills `n` bytes at `dest` with the low byte of `c`.
///
/// # Safety
/// `dest` must be writable for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(dest: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees `dest` is valid for `n` bytes; DF is clear.
    unsafe {
        asm!(
            "rep stosb",
            inout("rcx") n => _,
            inout("rdi") dest => _,
            in("al") c as u8,
            options(nostack, preserves_flags)
        );
    }
    dest
}

/// Compares `n` bytes; returns the difference of the first differing bytes (as unsigned).
///
/// # Safety
/// `a` and `b` must be readable for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: `i < n` and the caller guarantees both ranges are readable for `n` bytes.
        // Volatile reads keep LLVM from recognising this loop as a `memcmp`/`bcmp` call.
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
        i += 1;
    }
    0
}

/// Returns 0 if the `n` bytes at `a` and `b` are equal, non-zero otherwise.
///
/// # Safety
/// `a` and `b` must be readable for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: forwarded caller contract.
    unsafe { memcmp(a, b, n) }
}
