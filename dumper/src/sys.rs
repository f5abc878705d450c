//! Raw syscalls of the dumper that neither nix nor the parasite crate wrap.

/// `kcmp` type: compare two file descriptors' open file descriptions.
const KCMP_FILE: libc::c_int = 0;

/// True when fd `a` and fd `b` of `pid` refer to the same open file
/// description (share offset and flags), per `kcmp(2)`.
pub fn same_file_description(pid: i32, a: i32, b: i32) -> std::io::Result<bool> {
    // SAFETY: kcmp takes only integers and touches no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid, pid, KCMP_FILE, a, b) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r == 0)
    }
}

/// Raw `syscall(2)` returning the errno on failure, for feature probes.
///
/// # Safety
/// Every pointer among `args` must be null or valid for what syscall `nr`
/// does with it.
pub unsafe fn probe_syscall(
    nr: libc::c_long,
    args: [libc::c_long; 5],
) -> Result<libc::c_long, i32> {
    // SAFETY: the caller guarantees the pointer arguments (see above).
    let r = unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3], args[4]) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r)
    }
}
