//! aio contexts (`io_setup(2)`) made again inside the process: a context
//! of the same size whose ring is moved to the old address (the context id
//! the program holds is that address), the kernel's tail brought to where
//! it was, and the completions the program had not reaped put back.

use ckpt_image::aio::{AioRing, header};
use ckpt_image::mm::Mm;
use ckpt_parasite::remote::Remote;

use crate::error::{RestoreError, Result};

/// `IOCB_CMD_PWRITE`.
const IOCB_CMD_PWRITE: u16 = 1;

/// `struct iocb` (`linux/aio_abi.h`): its size and the offsets of the
/// fields a request to /dev/null sets.
mod iocb {
    pub const LEN: u64 = 64;
    pub const LIO_OPCODE: usize = 16;
    pub const FILDES: usize = 20;
    pub const BUF: usize = 24;
    pub const NBYTES: usize = 32;
}

/// Where in the scratch buffer the one byte the requests write sits, and
/// where the array of iocb pointers starts.
const BYTE_OFFSET: u64 = iocb::LEN;
const POINTERS_OFFSET: u64 = 2 * iocb::LEN;

/// The address ranges the rings take, which nothing else may be put at
/// while the process is rebuilt.
pub fn spans(mm: &Mm) -> impl Iterator<Item = (u64, u64)> + '_ {
    mm.aio_rings
        .iter()
        .map(|a| (a.id, a.id.saturating_add(a.ring_len)))
}

/// Checks every ring of the image (see [`AioRing::validate`]) and that no
/// ring overlaps a VMA or another ring (moving a ring over it would unmap
/// it).
pub fn validate(mm: &Mm) -> std::result::Result<(), String> {
    for (i, a) in mm.aio_rings.iter().enumerate() {
        a.validate()?;
        let end = a.id.saturating_add(a.ring_len);
        let taken = mm
            .vmas
            .iter()
            .map(|v| (v.start, v.end))
            .chain(spans(mm).take(i));
        if let Some((start, stop)) = taken.into_iter().find(|&(s, e)| s < end && a.id < e) {
            return Err(format!(
                "aio ring {:#x} overlaps mapping {start:#x}-{stop:#x}",
                a.id
            ));
        }
    }
    Ok(())
}

/// Makes every aio context of the image again in the process `r` stands
/// for.
pub fn restore(r: &Remote<'_>, mm: &Mm) -> Result<()> {
    for a in &mm.aio_rings {
        restore_one(r, a)?;
    }
    Ok(())
}

fn restore_one(r: &Remote<'_>, a: &AioRing) -> Result<()> {
    let pid = r.t.pid();
    // The old address is free, so the kernel could put the new ring
    // there or across it, where no mremap can move it: held until the
    // ring replaces the hold.
    let held = r.call(
        "mmap (aio ring's place)",
        libc::SYS_mmap,
        [
            a.id,
            a.ring_len,
            libc::PROT_NONE as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64,
            u64::MAX,
            0,
        ],
    )?;
    if held != a.id {
        return Err(RestoreError::Host {
            pid,
            what: format!("aio context {:#x}: its place is taken", a.id),
        });
    }
    let (buf, _) = r.scratch_buffer();
    r.t.write_mem(buf, &0u64.to_ne_bytes())?;
    r.call(
        "io_setup",
        libc::SYS_io_setup,
        [u64::from(a.nr_requests()), buf, 0, 0, 0, 0],
    )?;
    let mut id = [0u8; 8];
    r.t.read_mem(buf, &mut id)?;
    let ring = u64::from_ne_bytes(id);
    let nr = read_word(r, ring, header::NR)?;
    if nr != a.nr {
        // The kernel sizes a ring after the request and the number of
        // possible CPUs; one of another size cannot take the old slots.
        r.call("io_destroy", libc::SYS_io_destroy, [ring, 0, 0, 0, 0, 0])?;
        return Err(RestoreError::Host {
            pid,
            what: format!(
                "aio context {:#x}: this kernel makes a ring of {nr} slots for it, not {}",
                a.id, a.nr
            ),
        });
    }
    advance_tail(r, ring, a)?;
    for (i, e) in a.events.iter().enumerate() {
        let slot = (a.head as usize + i) % a.nr as usize;
        r.t.write_mem(ring + AioRing::slot_offset(slot as u32), &e.to_bytes())?;
    }
    write_word(r, ring, header::HEAD, a.head)?;
    let moved = r.call(
        "mremap (aio ring)",
        libc::SYS_mremap,
        [
            ring,
            a.ring_len,
            a.ring_len,
            (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) as u64,
            a.id,
            0,
        ],
    )?;
    if moved != a.id {
        return Err(RestoreError::Host {
            pid,
            what: format!("aio context {:#x}: ring moved to {moved:#x}", a.id),
        });
    }
    log::debug!(
        "pid {pid}: aio context {:#x}: {} slots, head {}, tail {}, {} completions put back",
        a.id,
        a.nr,
        a.head,
        a.tail,
        a.events.len()
    );
    Ok(())
}

/// Brings the kernel's own tail (which the header's copy does not set)
/// to the saved one: requests writing one byte to /dev/null complete as
/// they are submitted, each filling the next slot. Past the saved head
/// the program's completions go round once more, so the kernel counts
/// the slots between head and tail as taken, as they were.
fn advance_tail(r: &Remote<'_>, ring: u64, a: &AioRing) -> Result<()> {
    let count = if a.tail < a.head {
        a.nr + a.tail
    } else {
        a.tail
    };
    if count == 0 {
        return Ok(());
    }
    let (buf, buf_len) = r.scratch_buffer();
    let room = (buf_len as u64 - POINTERS_OFFSET) / 8;
    let batch = u64::from(a.nr - 1).min(room);
    let fd = r.open("/dev/null", libc::O_WRONLY | libc::O_CLOEXEC, 0)?;
    let mut request = [0u8; iocb::LEN as usize];
    let mut set = |at: usize, bytes: &[u8]| request[at..at + bytes.len()].copy_from_slice(bytes);
    set(iocb::LIO_OPCODE, &IOCB_CMD_PWRITE.to_ne_bytes());
    set(iocb::FILDES, &(fd as u32).to_ne_bytes());
    set(iocb::BUF, &(buf + BYTE_OFFSET).to_ne_bytes());
    set(iocb::NBYTES, &1u64.to_ne_bytes());
    r.t.write_mem(buf, &request)?;
    let pointers: Vec<u8> = (0..batch).flat_map(|_| buf.to_ne_bytes()).collect();
    r.t.write_mem(buf + POINTERS_OFFSET, &pointers)?;
    let mut done = 0u32;
    let submitted = (|| -> Result<()> {
        while done < count {
            let want = u64::from(count - done).min(batch);
            let n = r.call(
                "io_submit (aio tail)",
                libc::SYS_io_submit,
                [ring, want, buf + POINTERS_OFFSET, 0, 0, 0],
            )?;
            if n == 0 {
                return Err(RestoreError::Host {
                    pid: r.t.pid(),
                    what: format!("aio context {:#x}: io_submit took no request", a.id),
                });
            }
            done += n as u32;
            // Reaping by hand (the head is the program's to move) frees
            // the slots for the next batch.
            write_word(r, ring, header::HEAD, done.min(a.head))?;
        }
        Ok(())
    })();
    r.close(fd)?;
    submitted?;
    let tail = read_word(r, ring, header::TAIL)?;
    if tail != a.tail {
        return Err(RestoreError::Host {
            pid: r.t.pid(),
            what: format!(
                "aio context {:#x}: tail at {tail} after {count} requests, not {}",
                a.id, a.tail
            ),
        });
    }
    Ok(())
}

fn read_word(r: &Remote<'_>, ring: u64, offset: usize) -> Result<u32> {
    let mut b = [0u8; 4];
    r.t.read_mem(ring + offset as u64, &mut b)?;
    Ok(u32::from_ne_bytes(b))
}

fn write_word(r: &Remote<'_>, ring: u64, offset: usize, value: u32) -> Result<()> {
    r.t.write_mem(ring + offset as u64, &value.to_ne_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ckpt_image::aio;

    #[test]
    fn a_ring_over_a_mapping_or_another_ring_is_refused() {
        let ring = AioRing {
            id: 0x10000,
            ring_len: 0x3000,
            nr: aio::slots_in(0x3000) as u32,
            ..Default::default()
        };
        let vma = ckpt_image::mm::Vma {
            start: 0x12000,
            end: 0x14000,
            ..Default::default()
        };
        let mm = |vmas| Mm {
            vmas,
            aio_rings: vec![ring.clone()],
            ..Default::default()
        };
        assert_eq!(validate(&mm(Vec::new())), Ok(()));
        assert!(validate(&mm(vec![vma])).is_err());
        let mut twice = mm(Vec::new());
        twice.aio_rings.push(ring.clone());
        assert!(validate(&twice).is_err());
    }
}
