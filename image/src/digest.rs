//! The digests the manifest keeps of every file, computed in parallel.
//!
//! A file is cut into [`BLOCK`]-sized blocks (the last may be shorter). Its
//! digest is the BLAKE3 hash of the concatenated BLAKE3 hashes of its
//! blocks. Hashing the blocks is independent work, so a gigabyte of pages
//! is hashed by every core at once on dump and on restore, instead of by
//! one core after the data is written.
//!
//! BLAKE3 rather than SHA-256: both are collision-resistant, which is what
//! carrying the manifest's seal to each file needs, but BLAKE3 hashes about
//! 2.5 times faster per core here (4.4 GB/s against 1.8 GB/s with the
//! CPU's SHA extensions). Files carry no CRC beside it (image format 5):
//! the digest already catches every corruption a CRC would, and the CRC32C
//! was a tenth of a restore's CPU.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rayon::prelude::*;

use crate::error::ImageError;

/// Size of a hashed block.
pub const BLOCK: u64 = 4 << 20;

/// Length of a BLAKE3 digest.
pub const DIGEST_LEN: usize = blake3::OUT_LEN;

/// A BLAKE3 digest.
pub type Digest = [u8; DIGEST_LEN];

/// The BLAKE3 digest of one block (what [`of_file_with_blocks`] lists).
pub fn block_digest(data: &[u8]) -> Digest {
    blake3::hash(data).into()
}

/// The file's digest from its blocks' digests, concatenated.
pub fn digest_of_block_list(list: &[u8]) -> Digest {
    blake3::hash(list).into()
}

fn of_block_digests(blocks: &[Digest]) -> Digest {
    let mut list = blake3::Hasher::new();
    for b in blocks {
        list.update(b);
    }
    list.finalize().into()
}

/// The digest of bytes in memory.
pub fn of_bytes(data: &[u8]) -> Digest {
    let blocks: Vec<Digest> = data.par_chunks(BLOCK as usize).map(block_digest).collect();
    of_block_digests(&blocks)
}

/// The digest of the first `size` bytes of `file`, read block by block
/// in parallel; a file shorter than `size` is an error naming `path`.
pub fn of_file(file: &File, size: u64, path: &Path) -> Result<Digest, ImageError> {
    of_file_with_blocks(file, size, path).map(|(digest, _)| digest)
}

/// [`of_file`], with the blocks' digests concatenated (in order).
pub fn of_file_with_blocks(
    file: &File,
    size: u64,
    path: &Path,
) -> Result<(Digest, Vec<u8>), ImageError> {
    let count = size.div_ceil(BLOCK);
    let blocks = (0..count)
        .into_par_iter()
        .map_init(
            // A small file (most of a checkpoint's) needs a small buffer.
            || vec![0u8; BLOCK.min(size) as usize],
            |buf, i| {
                let start = i * BLOCK;
                let len = BLOCK.min(size - start) as usize;
                file.read_exact_at(&mut buf[..len], start).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        ImageError::Size {
                            path: path.into(),
                            found: start,
                            expected: size,
                        }
                    } else {
                        ImageError::io(path, "read", e)
                    }
                })?;
                Ok(block_digest(&buf[..len]))
            },
        )
        .collect::<Result<Vec<_>, ImageError>>()?;
    let list = blocks.concat();
    Ok((of_block_digests(&blocks), list))
}

/// The BLAKE3 digest of a file ckpt has just written, and its blocks'
/// digests concatenated (in order), hashed in parallel straight from a
/// read-only mapping of the file, so no byte is copied out of the page
/// cache. Only for files in ckpt's own unfinished checkpoint directory,
/// which no one else can open: a mapping of a file someone truncates under
/// it would fault (`SIGBUS`) instead of failing a read.
pub fn blake3_of_own_file(
    file: &File,
    size: u64,
    path: &Path,
) -> Result<(Digest, Vec<u8>), ImageError> {
    let on_disk = file
        .metadata()
        .map_err(|e| ImageError::io(path, "stat", e))?
        .len();
    if on_disk != size {
        return Err(ImageError::Size {
            path: path.into(),
            found: on_disk,
            expected: size,
        });
    }
    if size == 0 {
        return Ok((digest_of_block_list(&[]), Vec::new()));
    }
    let len = usize::try_from(size).map_err(|_| ImageError::Size {
        path: path.into(),
        found: size,
        expected: usize::MAX as u64,
    })?;
    // Some file systems cannot map files (9p without a cache, some FUSE
    // ones): read the blocks instead, as for any other file.
    let map = match crate::sys::map_own_file(file, len) {
        Ok(map) => map,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENODEV | libc::EINVAL)) => {
            return of_file_with_blocks(file, size, path);
        }
        Err(e) => return Err(ImageError::io(path, "mmap", e)),
    };
    let digests: Vec<Digest> = map.par_chunks(BLOCK as usize).map(block_digest).collect();
    let list: Vec<u8> = digests.concat();
    Ok((digest_of_block_list(&list), list))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4099) as u8).collect()
    }

    #[test]
    fn file_and_bytes_agree() {
        for len in [0, 1, 4095, BLOCK as usize, BLOCK as usize * 2 + 12345] {
            let data = sample(len);
            let sums = of_bytes(&data);
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&data).unwrap();
            assert_eq!(of_file(&f, len as u64, Path::new("x")).unwrap(), sums);
        }
    }

    #[test]
    fn own_file_digests_equal_the_read_ones() {
        for len in [0, 1, BLOCK as usize, BLOCK as usize * 2 + 12345] {
            let data = sample(len);
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&data).unwrap();
            let (read, read_list) = of_file_with_blocks(&f, len as u64, Path::new("x")).unwrap();
            let (mapped, mapped_list) = blake3_of_own_file(&f, len as u64, Path::new("x")).unwrap();
            assert_eq!(mapped, read, "len {len}");
            assert_eq!(mapped_list, read_list, "len {len}");
        }
        let f = tempfile::tempfile().unwrap();
        assert!(matches!(
            blake3_of_own_file(&f, 1, Path::new("x")),
            Err(ImageError::Size { .. })
        ));
    }

    #[test]
    fn any_changed_byte_changes_the_digest() {
        let data = sample(BLOCK as usize + 100);
        let sums = of_bytes(&data);
        for at in [0, BLOCK as usize - 1, BLOCK as usize, data.len() - 1] {
            let mut d = data.clone();
            d[at] ^= 1;
            assert_ne!(of_bytes(&d), sums, "byte {at}");
        }
    }

    #[test]
    fn short_file_is_a_size_error() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&sample(10)).unwrap();
        assert!(matches!(
            of_file(&f, BLOCK + 1, Path::new("x")),
            Err(ImageError::Size { .. })
        ));
    }
}
