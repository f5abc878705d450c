//! eventfd(2) objects: the counter and the semaphore mode, both reported
//! by `/proc/PID/fdinfo` since Linux 6.6. Older kernels (the 4.18 and 5.14
//! of the enterprise distributions, Debian 12's 6.1) report only the
//! counter, so the mode is found by a read, which the two modes answer
//! differently (see [`probe_semaphore`]); the counter is put back.

use ckpt_image::fd::eventfd::EventfdFile;
use ckpt_image::fd::file::Kind;

use super::{Blobs, FdParams, FileDumper};
use crate::error::{DumpError, Result};

/// `anon_inode:[eventfd]`.
pub struct Eventfd;

impl FileDumper for Eventfd {
    fn name(&self) -> &'static str {
        "eventfd"
    }

    fn description(&self) -> &'static str {
        "eventfds: counter and semaphore mode"
    }

    fn claims(&self, p: &FdParams) -> bool {
        p.link == "anon_inode:[eventfd]"
    }

    fn collect(&self, p: &FdParams, _file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        let bad = |what: &str| DumpError::Parse {
            pid: p.pid,
            path: format!("fdinfo/{}", p.fd),
            what: what.into(),
        };
        let count = u64::from_str_radix(p.info_field("eventfd-count")?.trim(), 16)
            .map_err(|_| bad("eventfd-count is not a hex number"))?;
        let semaphore = match p.info_field("eventfd-semaphore") {
            Ok("0") => false,
            Ok("1") => true,
            Ok(_) => return Err(bad("eventfd-semaphore is neither 0 nor 1")),
            // A kernel before 6.6: guessing the mode would change what
            // the process's reads return after restore.
            Err(_) => probe_semaphore(p.pid, p.fd, count).map_err(|e| DumpError::Proc {
                pid: p.pid,
                path: format!("fd/{} (eventfd mode probe)", p.fd).into(),
                source: e,
            })?,
        };
        Ok(Kind::Eventfd(EventfdFile { count, semaphore }))
    }
}

/// The smallest counter at which one read tells the modes apart: a
/// semaphore read takes 1, a plain read takes it all.
const TELLING_COUNT: u64 = 2;

/// Whether fd `fd` of the frozen `pid`, an eventfd whose counter is
/// `count`, is in semaphore mode: the counter is raised to
/// [`TELLING_COUNT`] if it is lower, read once through ckpt's own copy of
/// the fd, and put back to `count`. Nothing blocks: every read and write
/// is of a counter known to allow it. Writers outside the tree (a kernel
/// completion, a process sharing the fd) only add, which a plain read
/// shows as more than 1 and which is given back with the rest.
///
/// The process sees nothing: it is frozen throughout, and its pollers
/// find the counter as it was (an edge-triggered epoll may report one
/// more edge when the counter was not 0, which such readers handle). If
/// ckpt is killed between the write and the last read, the counter is
/// left off by at most [`TELLING_COUNT`].
fn probe_semaphore(pid: i32, fd: i32, count: u64) -> std::io::Result<bool> {
    let file = std::fs::File::from(crate::sys::take_fd(pid, fd)?);
    let raise = TELLING_COUNT.saturating_sub(count);
    if raise > 0 {
        add(&file, raise)?;
    }
    let took = take(&file)?;
    let semaphore = took == 1;
    // Back to `count`: a semaphore read took 1 of `count + raise`, a
    // plain read took everything, raise included.
    if semaphore {
        if raise == 0 {
            add(&file, 1)?;
        }
        for _ in 1..raise {
            take(&file)?;
        }
    } else if took > raise {
        add(&file, took - raise)?;
    }
    Ok(semaphore)
}

/// An eventfd write of `n`.
fn add(mut file: &std::fs::File, n: u64) -> std::io::Result<()> {
    use std::io::Write;
    file.write_all(&n.to_ne_bytes())
}

/// An eventfd read.
fn take(mut file: &std::fs::File) -> std::io::Result<u64> {
    use std::io::Read;
    let mut b = [0u8; 8];
    file.read_exact(&mut b)?;
    Ok(u64::from_ne_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// Both modes, every counter below and above the telling count: the
    /// mode is found and the counter is what it was.
    #[test]
    fn the_probe_finds_the_mode_and_leaves_the_counter() {
        for semaphore in [false, true] {
            for count in [0u64, 1, 2, 3, 1000] {
                let flags = if semaphore {
                    nix::sys::eventfd::EfdFlags::EFD_SEMAPHORE
                } else {
                    nix::sys::eventfd::EfdFlags::empty()
                };
                let efd = nix::sys::eventfd::EventFd::from_value_and_flags(count as u32, flags)
                    .expect("eventfd");
                let pid = std::process::id() as i32;
                let got = probe_semaphore(pid, efd.as_raw_fd(), count).expect("probe");
                assert_eq!(got, semaphore, "count {count}");
                let info =
                    std::fs::read_to_string(format!("/proc/self/fdinfo/{}", efd.as_raw_fd()))
                        .expect("fdinfo");
                let left = info
                    .lines()
                    .find_map(|l| l.strip_prefix("eventfd-count:"))
                    .map(|v| u64::from_str_radix(v.trim(), 16).expect("hex"));
                assert_eq!(left, Some(count), "semaphore {semaphore}, count {count}");
            }
        }
    }
}
