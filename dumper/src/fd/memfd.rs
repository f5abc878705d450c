//! memfds held by fds. The memfd itself (name, size, contents, seals) is a
//! shared memory object (`crate::shmem`), the same one its mappings refer
//! to, so it is saved once; the open file only names it. The object is
//! resolved once every fd is collected (`shmem::Objects::link_files`).

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::memfd::MemfdFile;

use super::{Blobs, FdParams, FileDumper};
use crate::error::{DumpError, Result};
use crate::mm::MEMFD_PREFIX;

/// statfs(2) `f_type` of hugetlbfs, where MFD_HUGETLB memfds live.
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// `/memfd:NAME (deleted)`, a regular file.
pub struct Memfd;

impl FileDumper for Memfd {
    fn name(&self) -> &'static str {
        "memfd"
    }

    fn description(&self) -> &'static str {
        "memfds: name, size, contents (one copy with their mappings), seals; not MFD_HUGETLB"
    }

    fn claims(&self, p: &FdParams) -> bool {
        use std::os::unix::fs::MetadataExt;
        p.meta.mode() & libc::S_IFMT == libc::S_IFREG && p.link.starts_with(MEMFD_PREFIX)
    }

    fn collect(&self, p: &FdParams, _file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        let fs = nix::sys::statfs::statfs(&p.proc_path()).map_err(|e| DumpError::Proc {
            pid: p.pid,
            path: p.proc_path(),
            source: e.into(),
        })?;
        if fs.filesystem_type().0 as i64 == HUGETLBFS_MAGIC {
            return Err(p.unsupported(&format!("hugetlb memfd {}", p.link)));
        }
        // The object id is filled in once the whole tree is collected.
        Ok(Kind::Memfd(MemfdFile { shmem_id: 0 }))
    }
}
