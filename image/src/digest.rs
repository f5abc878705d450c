//! The checksums the manifest keeps of every file, computed in parallel.
//!
//! A file is cut into [`BLOCK`]-sized blocks (the last may be shorter).
//! Its CRC32C is the ordinary CRC of the whole file (blocks combined with
//! `crc32c_combine`), and its digest is the BLAKE3 hash of the
//! concatenated BLAKE3 hashes of its blocks. Hashing the blocks is
//! independent work, so a gigabyte of pages is hashed by every core at once
//! on dump and on restore, instead of by one core after the data is
//! written.
//!
//! BLAKE3 rather than SHA-256: both are collision-resistant, which is what
//! carrying the manifest's seal to each file needs, but BLAKE3 hashes about
//! 2.5 times faster per core here (4.4 GB/s against 1.8 GB/s with the
//! CPU's SHA extensions), and the digest was a quarter of the CPU time of a
//! dump or restore on tmpfs.

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

/// A file's checksums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sums {
    /// CRC32C of the whole file.
    pub crc32c: u32,
    /// BLAKE3 over the blocks' BLAKE3 digests.
    pub blake3: Digest,
}

/// CRC32C's polynomial, bit-reflected (the crate computes the reflected
/// form, as every CRC32C user does).
const CRC32C_POLY_REFLECTED: u32 = 0x82f6_3b78;
/// The polynomial 1 (x^0) in the reflected representation.
const X0: u32 = 1 << 31;
/// Entries of [`X2N`]: enough for any byte count below 2^64 (bit counts
/// below 2^67).
const X2N_LEN: usize = 67;

/// `a(x) * b(x) mod p(x)` over GF(2), reflected representation.
const fn mul_mod_p(a: u32, mut b: u32) -> u32 {
    let mut m = X0;
    let mut p = 0u32;
    while m != 0 {
        if a & m != 0 {
            p ^= b;
        }
        m >>= 1;
        b = if b & 1 != 0 {
            (b >> 1) ^ CRC32C_POLY_REFLECTED
        } else {
            b >> 1
        };
    }
    p
}

/// `X2N[k]` = x^(2^k) mod p(x).
const X2N: [u32; X2N_LEN] = {
    let mut t = [0u32; X2N_LEN];
    // x^1.
    t[0] = X0 >> 1;
    let mut k = 1;
    while k < X2N_LEN {
        t[k] = mul_mod_p(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
};

/// The CRC32C of `A ‖ B` from `crc_a`, `crc_b` and `len_b` (the length of
/// B in bytes): `crc_a · x^(8·len_b) ⊕ crc_b` mod p(x), the power built from
/// the squares table in at most 64 multiplications. The crate's own combine
/// builds the power from 32×32 matrices at every call, some 20 µs each,
/// which became most of a dump's CPU with tens of thousands of small page
/// ranges.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    let mut power = X0;
    let mut n = len_b;
    // 8·len_b bits: start at x^(2^3).
    let mut k = 3;
    while n != 0 {
        if n & 1 != 0 {
            power = mul_mod_p(X2N[k], power);
        }
        n >>= 1;
        k += 1;
    }
    mul_mod_p(power, crc_a) ^ crc_b
}

/// One block's checksums.
struct BlockSums {
    crc32c: u32,
    len: usize,
    blake3: Digest,
}

fn block_sums(data: &[u8]) -> BlockSums {
    BlockSums {
        crc32c: crc32c::crc32c(data),
        len: data.len(),
        blake3: block_digest(data),
    }
}

/// The BLAKE3 digest of one block (what [`of_file_with_blocks`] lists).
pub fn block_digest(data: &[u8]) -> Digest {
    blake3::hash(data).into()
}

/// The file's digest from its blocks' digests, concatenated.
pub fn digest_of_block_list(list: &[u8]) -> Digest {
    blake3::hash(list).into()
}

fn combine(blocks: &[BlockSums]) -> Sums {
    let mut crc = 0u32;
    let mut list = blake3::Hasher::new();
    for (i, b) in blocks.iter().enumerate() {
        crc = if i == 0 {
            b.crc32c
        } else {
            crc32c_combine(crc, b.crc32c, b.len as u64)
        };
        list.update(&b.blake3);
    }
    Sums {
        crc32c: crc,
        blake3: list.finalize().into(),
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
    of_file_with_blocks(file, size, path).map(|(sums, _)| sums)
}

/// [`of_file`], with the blocks' digests concatenated (in order).
pub fn of_file_with_blocks(
    file: &File,
    size: u64,
    path: &Path,
) -> Result<(Sums, Vec<u8>), ImageError> {
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
    let list = blocks.iter().flat_map(|b| b.blake3).collect();
    Ok((combine(&blocks), list))
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
            let (sums, list) = of_file_with_blocks(file, size, path)?;
            return Ok((sums.blake3, list));
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
    fn own_file_digests_equal_the_read_ones() {
        for len in [0, 1, BLOCK as usize, BLOCK as usize * 2 + 12345] {
            let data = sample(len);
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&data).unwrap();
            let (read, read_list) = of_file_with_blocks(&f, len as u64, Path::new("x")).unwrap();
            let (mapped, mapped_list) = blake3_of_own_file(&f, len as u64, Path::new("x")).unwrap();
            assert_eq!(mapped, read.blake3, "len {len}");
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
            assert_ne!(of_bytes(&d).blake3, sums.blake3, "byte {at}");
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

#[cfg(test)]
mod combine_tests {
    use super::*;

    #[test]
    fn combining_crcs_equals_the_crc_of_the_concatenation() {
        let data: Vec<u8> = (0..100_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for cut in [0, 1, 7, 4096, 65_537, 99_999, 100_000] {
            let (a, b) = data.split_at(cut);
            assert_eq!(
                crc32c_combine(crc32c::crc32c(a), crc32c::crc32c(b), b.len() as u64),
                crc32c::crc32c(&data),
                "cut at {cut}"
            );
        }
        // Lengths far beyond what fits in memory agree with the crate.
        for len in [1u64 << 20, (1 << 33) + 12_345, u64::from(u32::MAX) * 3] {
            assert_eq!(
                crc32c_combine(0x1234_5678, 0x9abc_def0, len),
                crc32c::crc32c_combine(0x1234_5678, 0x9abc_def0, len as usize),
                "len {len}"
            );
        }
    }
}
