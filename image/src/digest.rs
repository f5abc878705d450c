//! The checksums the manifest keeps of every file, computed in parallel.
//!
//! A file is cut into [`BLOCK`]-sized blocks (the last may be shorter).
//! Its CRC32C is the ordinary CRC of the whole file (blocks combined with
//! `crc32c_combine`), and its SHA-256 digest is the SHA-256 of the
//! concatenated SHA-256s of its blocks. Hashing the blocks is independent
//! work, so a gigabyte of pages is hashed by every core at once on dump and
//! on restore, instead of by one core after the data is written; a plain
//! SHA-256 of the whole file could only be computed in sequence.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::error::ImageError;

/// Size of a hashed block.
pub const BLOCK: u64 = 4 << 20;

/// A file's checksums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sums {
    /// CRC32C of the whole file.
    pub crc32c: u32,
    /// SHA-256 over the blocks' SHA-256s.
    pub sha256: [u8; 32],
}

/// One block's checksums.
struct BlockSums {
    crc32c: u32,
    len: usize,
    sha256: [u8; 32],
}

fn block_sums(data: &[u8]) -> BlockSums {
    BlockSums {
        crc32c: crc32c::crc32c(data),
        len: data.len(),
        sha256: Sha256::digest(data).into(),
    }
}

fn combine(blocks: &[BlockSums]) -> Sums {
    let mut crc = 0u32;
    let mut sha = Sha256::new();
    for (i, b) in blocks.iter().enumerate() {
        crc = if i == 0 {
            b.crc32c
        } else {
            crc32c::crc32c_combine(crc, b.crc32c, b.len)
        };
        sha.update(b.sha256);
    }
    Sums {
        crc32c: crc,
        sha256: sha.finalize().into(),
    }
}

/// The checksums of bytes in memory.
pub fn of_bytes(data: &[u8]) -> Sums {
    let blocks: Vec<BlockSums> = data.par_chunks(BLOCK as usize).map(block_sums).collect();
    combine(&blocks)
}

/// The checksums of the first `size` bytes of `file`, read block by block
/// in parallel; a file shorter than `size` is an error naming `path`.
pub fn of_file(file: &File, size: u64, path: &Path) -> Result<Sums, ImageError> {
    let count = size.div_ceil(BLOCK);
    let blocks = (0..count)
        .into_par_iter()
        .map_init(
            || vec![0u8; BLOCK as usize],
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
                Ok(block_sums(&buf[..len]))
            },
        )
        .collect::<Result<Vec<_>, ImageError>>()?;
    Ok(combine(&blocks))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4099) as u8).collect()
    }

    #[test]
    fn crc_is_the_plain_crc_and_file_and_bytes_agree() {
        for len in [0, 1, 4095, BLOCK as usize, BLOCK as usize * 2 + 12345] {
            let data = sample(len);
            let sums = of_bytes(&data);
            assert_eq!(sums.crc32c, crc32c::crc32c(&data), "len {len}");
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&data).unwrap();
            assert_eq!(of_file(&f, len as u64, Path::new("x")).unwrap(), sums);
        }
    }

    #[test]
    fn any_changed_byte_changes_the_digest() {
        let data = sample(BLOCK as usize + 100);
        let sums = of_bytes(&data);
        for at in [0, BLOCK as usize - 1, BLOCK as usize, data.len() - 1] {
            let mut d = data.clone();
            d[at] ^= 1;
            assert_ne!(of_bytes(&d).sha256, sums.sha256, "byte {at}");
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
