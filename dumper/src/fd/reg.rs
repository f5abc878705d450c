//! Regular files, including files unlinked while open (saved whole as
//! ghost images, recreated and unlinked again on restore).

use std::io::Read;

use ckpt_image::files::{FdEntry, FdKind};

use super::{FdParams, Ghost};
use crate::error::{DumpError, Result};
use crate::procfile;

const DELETED: &str = " (deleted)";

/// Describes a regular-file fd.
pub fn dump_regular(p: &FdParams, ghosts: &mut Vec<Ghost>) -> Result<FdEntry> {
    if p.link.starts_with("/memfd:") {
        return Err(p.unsupported("memfd"));
    }
    if let Some(path) = p.link.strip_suffix(DELETED)
        && std::os::unix::fs::MetadataExt::nlink(&p.meta) == 0
    {
        let mut e = p.entry(FdKind::Unlinked);
        e.path = path.to_string();
        e.ghost = ckpt_image::ghost_name(p.pid, ghosts.len() as u32);
        ghosts.push(Ghost {
            name: e.ghost.clone(),
            data: read_contents(p)?,
        });
        return Ok(e);
    }
    Ok(p.entry(FdKind::Regular))
}

fn read_contents(p: &FdParams) -> Result<Vec<u8>> {
    let path = procfile::path(p.pid, &format!("fd/{}", p.fd));
    let mut data = Vec::new();
    std::fs::File::open(&path)
        .and_then(|mut f| f.read_to_end(&mut data))
        .map_err(|source| DumpError::Proc {
            pid: p.pid,
            path,
            source,
        })?;
    Ok(data)
}
