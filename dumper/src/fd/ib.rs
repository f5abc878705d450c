//! InfiniBand verbs descriptors: saved as placeholders, the process's
//! verbs layer recreates them at restart; without the layer in the
//! process they are refused.

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::ib::IbFile;

use super::{Blobs, FdParams, FileDumper};
use crate::error::Result;

/// `/dev/infiniband/uverbsN` and `anon_inode:[infinibandevent]`.
pub struct Ib;

impl FileDumper for Ib {
    fn name(&self) -> &'static str {
        "ib"
    }

    fn description(&self) -> &'static str {
        "InfiniBand verbs descriptors of a job run with the verbs layer (ckpt run --ib): recreated by the layer at restart"
    }

    fn claims(&self, p: &FdParams) -> bool {
        crate::ib::is_verbs_fd(&p.link)
    }

    fn collect(&self, p: &FdParams, _file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        if !crate::ib::has_layer(p.pid)? {
            return Err(crate::error::DumpError::Ib {
                pid: p.pid,
                what: format!("fd {}: {}", p.fd, crate::ib::without_layer("verbs device")),
            });
        }
        Ok(Kind::Ib(IbFile {
            path: p.link.clone(),
        }))
    }
}
