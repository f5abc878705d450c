//! File handles (`name_to_handle_at`, `open_by_handle_at`): how a file
//! with no name left to the dumper (an inotify watch's, or one whose name
//! was removed while other hard links remain) is found again.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Largest file handle the kernel hands out (`MAX_HANDLE_SZ`).
const MAX_HANDLE_SZ: usize = 128;

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
struct FileHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

/// `open_by_handle_at(mount_fd, handle, O_PATH)`: the inode a file handle
/// names, on the filesystem of `mount_fd` (needs CAP_DAC_READ_SEARCH).
pub fn open_by_handle(
    mount_fd: &impl std::os::fd::AsRawFd,
    handle_type: i32,
    bytes: &[u8],
) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    if bytes.len() > MAX_HANDLE_SZ {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut h = FileHandle {
        handle_bytes: bytes.len() as u32,
        handle_type,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    h.f_handle[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: the handle is a live local struct of the kernel's layout with
    // handle_bytes no larger than its buffer; the kernel only reads it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd.as_raw_fd(),
            &mut h as *mut FileHandle,
            libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us, and nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// A file's handle, as its filesystem encodes it.
pub struct SavedHandle {
    /// The filesystem's handle type.
    pub handle_type: i32,
    /// The opaque handle.
    pub bytes: Vec<u8>,
}

/// The handle of the file `path` leads to (a `/proc/PID/fd/N` link is
/// followed to the open file itself).
pub fn file_handle_of(path: &Path) -> std::io::Result<SavedHandle> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let mut h = FileHandle {
        handle_bytes: MAX_HANDLE_SZ as u32,
        handle_type: 0,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `c` is a NUL-terminated path; `h` is a live local struct of
    // the kernel's layout whose `handle_bytes` says how much room follows,
    // and `mount_id` a live int: the kernel writes within those bounds.
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            c.as_ptr(),
            (&mut h as *mut FileHandle).cast::<libc::file_handle>(),
            &mut mount_id,
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let len = (h.handle_bytes as usize).min(MAX_HANDLE_SZ);
    Ok(SavedHandle {
        handle_type: h.handle_type,
        bytes: h.f_handle[..len].to_vec(),
    })
}
