//! eventfd(2) objects: the counter and the semaphore mode, both reported
//! by `/proc/PID/fdinfo` (nothing is read from the fd, which would change
//! the counter).

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
        "eventfds: counter and semaphore mode (Linux 6.6+)"
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
        // Kernels before 6.6 do not report the mode; guessing it would
        // change what reads return.
        let semaphore = match p.info_field("eventfd-semaphore") {
            Ok("0") => false,
            Ok("1") => true,
            Ok(_) => return Err(bad("eventfd-semaphore is neither 0 nor 1")),
            Err(_) => {
                return Err(p.unsupported(
                    "eventfd on a kernel that does not report its semaphore mode (needs Linux 6.6+)",
                ));
            }
        };
        Ok(Kind::Eventfd(EventfdFile { count, semaphore }))
    }
}
