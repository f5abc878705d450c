//! signalfd objects: the signal mask, reported by `/proc/PID/fdinfo`
//! (reading the fd would take a pending signal from the process).

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::signalfd::SignalfdFile;

use super::{Blobs, FdParams, FileDumper};
use crate::error::{DumpError, Result};

/// `anon_inode:[signalfd]`.
pub struct Signalfd;

impl FileDumper for Signalfd {
    fn name(&self) -> &'static str {
        "signalfd"
    }

    fn description(&self) -> &'static str {
        "signalfds: the signal mask"
    }

    fn claims(&self, p: &FdParams) -> bool {
        p.link == "anon_inode:[signalfd]"
    }

    fn collect(&self, p: &FdParams, _file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        let sigmask =
            u64::from_str_radix(p.info_field("sigmask")?, 16).map_err(|_| DumpError::Parse {
                pid: p.pid,
                path: format!("fdinfo/{}", p.fd),
                what: "sigmask is not a 64-bit hex number".into(),
            })?;
        Ok(Kind::Signalfd(SignalfdFile { sigmask }))
    }
}
