//! The vDSO proxy: restoring a process on a kernel whose vDSO differs from
//! the dumping kernel's, as CRIU does.
//!
//! The process keeps calling the vDSO at the addresses it had (libc looked
//! them up once, from the ELF image at `AT_SYSINFO_EHDR`), and the old code
//! there cannot run on this kernel: it reads a `[vvar]` whose layout and
//! place belong to the old kernel. So the dumped vDSO's bytes go back to
//! where they were as an ordinary private mapping, and every function it
//! exports starts with an absolute jump to the same-named function of this
//! kernel's vDSO, which stays mapped elsewhere with its own `[vvar]`. This
//! module is the pure part: reading both images' dynamic symbols (goblin)
//! and building the patched copy; `mm.rs` maps it.

use std::collections::BTreeMap;

use ckpt_image::task::Core;
use goblin::elf::Elf;
use goblin::elf::program_header::PT_LOAD;
use goblin::elf::section_header::SHN_UNDEF;
use goblin::elf::sym::{STB_GLOBAL, STB_WEAK, STT_FUNC};

/// `jmp *0(%rip)` followed by the 8-byte absolute target.
const JMP_RIP_INDIRECT: [u8; 6] = [0xff, 0x25, 0, 0, 0, 0];

/// Bytes of the redirecting jump written over a function's entry.
pub const JUMP_LEN: usize = JMP_RIP_INDIRECT.len() + 8;

/// Which of the two vDSO images something concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The dumped one, from the image.
    Dumped,
    /// This kernel's.
    Here,
}

impl std::fmt::Display for Which {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Which::Dumped => "the dumped",
            Which::Here => "this kernel's",
        })
    }
}

/// Why the dumped vDSO cannot be redirected to this kernel's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VdsoError {
    /// An image is not an ELF shared object goblin can read.
    #[error("{which} vDSO is not a readable ELF image: {what}")]
    Elf {
        /// Which image.
        which: Which,
        /// goblin's complaint.
        what: String,
    },
    /// A symbol lies outside the image's loaded bytes.
    #[error("{which} vDSO's symbol {name} lies outside its {len} bytes")]
    OutOfImage {
        /// Which image.
        which: Which,
        /// The symbol.
        name: String,
        /// The image's length.
        len: usize,
    },
    /// The dumped vDSO exports a function this kernel's lacks.
    #[error("vDSO symbol {name} missing on this kernel")]
    Missing {
        /// The symbol.
        name: String,
    },
    /// A dumped function is shorter than the jump that redirects it.
    #[error(
        "vDSO symbol {name} is {size} bytes, too short to redirect (the jump takes {JUMP_LEN})"
    )]
    TooShort {
        /// The symbol.
        name: String,
        /// Its size.
        size: u64,
    },
    /// Two dumped functions overlap, so their jumps would overwrite each
    /// other.
    #[error("vDSO symbols {first} and {second} overlap and cannot both be redirected")]
    Overlap {
        /// The one at the lower address.
        first: String,
        /// The other.
        second: String,
    },
    /// A thread was stopped inside the old vDSO code, past an entry point:
    /// it would go on in code that reads the old kernel's `[vvar]`.
    #[error(
        "thread {tid} was stopped inside the vDSO at {rip:#x}, in code that cannot run on this kernel; dump it again"
    )]
    ThreadInside {
        /// The thread.
        tid: i32,
        /// Where it was.
        rip: u64,
    },
}

/// A function a vDSO exports: where its code starts in the image, and how
/// long it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Function {
    /// Offset of its first byte in the image (as mapped).
    pub offset: u64,
    /// Its size (`st_size`).
    pub size: u64,
}

/// The exported functions of a vDSO image, by name: defined, global or
/// weak `STT_FUNC` dynamic symbols (aliases such as `clock_gettime` and
/// `__vdso_clock_gettime` each appear).
pub fn functions(which: Which, code: &[u8]) -> Result<BTreeMap<String, Function>, VdsoError> {
    let elf = Elf::parse(code).map_err(|e| VdsoError::Elf {
        which,
        what: e.to_string(),
    })?;
    let mut out = BTreeMap::new();
    for sym in elf.dynsyms.iter() {
        if sym.st_type() != STT_FUNC
            || !matches!(sym.st_bind(), STB_GLOBAL | STB_WEAK)
            || sym.st_shndx == SHN_UNDEF as usize
            || sym.st_value == 0
        {
            continue;
        }
        let Some(name) = elf.dynstrtab.get_at(sym.st_name) else {
            return Err(VdsoError::Elf {
                which,
                what: format!("symbol name at {} outside .dynstr", sym.st_name),
            });
        };
        let out_of_image = || VdsoError::OutOfImage {
            which,
            name: name.to_string(),
            len: code.len(),
        };
        // The vDSO is mapped as its file image: a symbol's place in memory
        // is its file offset.
        let offset = elf
            .program_headers
            .iter()
            .filter(|ph| ph.p_type == PT_LOAD)
            .find(|ph| sym.st_value >= ph.p_vaddr && sym.st_value - ph.p_vaddr < ph.p_filesz.max(1))
            .map(|ph| sym.st_value - ph.p_vaddr + ph.p_offset)
            .ok_or_else(out_of_image)?;
        if offset
            .checked_add(sym.st_size)
            .is_none_or(|end| end > code.len() as u64)
        {
            return Err(out_of_image());
        }
        out.insert(
            name.to_string(),
            Function {
                offset,
                size: sym.st_size,
            },
        );
    }
    Ok(out)
}

/// One jump to write into the dumped vDSO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// The function (the first of its aliases by name).
    pub name: String,
    /// Its offset in the dumped image.
    pub offset: u64,
    /// The absolute address of the same-named function of this kernel's
    /// vDSO, mapped at the base the plan was made for.
    pub target: u64,
}

/// Plans a jump at every function `old` exports to the same-named one of
/// `new`, mapped at `new_base`. Refused by name when `new` lacks one or one
/// is too short for the jump. Aliases at one address give one jump.
pub fn plan(old: &[u8], new: &[u8], new_base: u64) -> Result<Vec<Redirect>, VdsoError> {
    let here = functions(Which::Here, new)?;
    let mut by_offset: BTreeMap<u64, (Redirect, u64)> = BTreeMap::new();
    for (name, f) in functions(Which::Dumped, old)? {
        let Some(to) = here.get(&name) else {
            return Err(VdsoError::Missing { name });
        };
        if f.size < JUMP_LEN as u64 {
            return Err(VdsoError::TooShort { name, size: f.size });
        }
        let target = new_base + to.offset;
        match by_offset.get(&f.offset) {
            Some((r, _)) if r.target == target => {}
            Some((r, _)) => {
                return Err(VdsoError::Overlap {
                    first: r.name.clone(),
                    second: name,
                });
            }
            None => {
                let r = Redirect {
                    name,
                    offset: f.offset,
                    target,
                };
                by_offset.insert(f.offset, (r, f.size));
            }
        }
    }
    // Each jump must stay inside its own function: none may reach into the
    // next one's entry.
    let mut out: Vec<Redirect> = Vec::with_capacity(by_offset.len());
    for (r, _) in by_offset.into_values() {
        if let Some(prev) = out.last()
            && prev.offset + JUMP_LEN as u64 > r.offset
        {
            return Err(VdsoError::Overlap {
                first: prev.name.clone(),
                second: r.name,
            });
        }
        out.push(r);
    }
    Ok(out)
}

/// The absolute jump to `target`: `jmp *0(%rip)` and the address.
pub fn jump(target: u64) -> [u8; JUMP_LEN] {
    let mut j = [0u8; JUMP_LEN];
    j[..JMP_RIP_INDIRECT.len()].copy_from_slice(&JMP_RIP_INDIRECT);
    j[JMP_RIP_INDIRECT.len()..].copy_from_slice(&target.to_le_bytes());
    j
}

/// The target of a jump [`jump`] made, or None for other bytes.
#[cfg(test)]
pub fn jump_target(bytes: &[u8]) -> Option<u64> {
    let (op, addr) = bytes.get(..JUMP_LEN)?.split_at(JMP_RIP_INDIRECT.len());
    (op == JMP_RIP_INDIRECT).then(|| u64::from_le_bytes(addr.try_into().expect("8 bytes")))
}

/// The dumped vDSO with every planned jump written in.
pub fn patched(old: &[u8], redirects: &[Redirect]) -> Vec<u8> {
    let mut code = old.to_vec();
    for r in redirects {
        let at = r.offset as usize;
        code[at..at + JUMP_LEN].copy_from_slice(&jump(r.target));
    }
    code
}

/// Refuses a process one of whose threads was stopped inside the dumped
/// vDSO (mapped at `start..end`) other than at an entry point or in a
/// system call the old code made: it would go on in old code that reads
/// the old kernel's `[vvar]`, which is not there. At an entry it takes the
/// jump; after a system call the fallback path only returns.
pub fn check_threads(
    core: &Core,
    start: u64,
    end: u64,
    redirects: &[Redirect],
) -> Result<(), VdsoError> {
    let leader = core.regs.as_ref().map(|r| (core.pid, r));
    let threads = core
        .threads
        .iter()
        .filter_map(|t| t.regs.as_ref().map(|r| (t.tid, r)));
    for (tid, regs) in leader.into_iter().chain(threads) {
        let inside = (start..end).contains(&regs.rip);
        let at_entry = redirects.iter().any(|r| start + r.offset == regs.rip);
        let in_syscall = (regs.orig_rax as i64) >= 0;
        if inside && !at_entry && !in_syscall {
            return Err(VdsoError::ThreadInside { tid, rip: regs.rip });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's own vDSO, found at `AT_SYSINFO_EHDR`, its length from
    /// /proc/self/maps, read through /proc/self/mem.
    fn own_vdso() -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let base = crate::sys::sysinfo_ehdr();
        assert_ne!(base, 0, "no AT_SYSINFO_EHDR");
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let line = maps
            .lines()
            .find(|l| l.ends_with("[vdso]"))
            .expect("a [vdso] line");
        let (a, b) = line
            .split_whitespace()
            .next()
            .and_then(|r| r.split_once('-'))
            .expect("range");
        let start = u64::from_str_radix(a, 16).unwrap();
        let end = u64::from_str_radix(b, 16).unwrap();
        assert_eq!(start, base, "AT_SYSINFO_EHDR is the [vdso] mapping");
        let mut code = vec![0u8; (end - start) as usize];
        std::fs::File::open("/proc/self/mem")
            .expect("/proc/self/mem")
            .read_exact_at(&mut code, start)
            .expect("read the vDSO");
        code
    }

    /// `code` with the first occurrence of `from` (a symbol name in
    /// .dynstr) replaced by `to`, which has the same length.
    fn rename(code: &[u8], from: &str, to: &str) -> Vec<u8> {
        assert_eq!(from.len(), to.len());
        let needle: Vec<u8> = [from.as_bytes(), b"\0"].concat();
        let at = code
            .windows(needle.len())
            .position(|w| w == needle.as_slice())
            .unwrap_or_else(|| panic!("{from} not in the image"));
        let mut out = code.to_vec();
        out[at..at + from.len()].copy_from_slice(to.as_bytes());
        out
    }

    #[test]
    fn every_exported_function_jumps_to_its_namesake() {
        let code = own_vdso();
        let old = functions(Which::Dumped, &code).expect("parse the vDSO");
        assert!(
            old.contains_key("__vdso_clock_gettime") && old.contains_key("__vdso_gettimeofday"),
            "unexpected vDSO symbols: {:?}",
            old.keys().collect::<Vec<_>>()
        );
        let base = 0x7f00_1234_0000;
        let redirects = plan(&code, &code, base).expect("plan");
        let proxy = patched(&code, &redirects);
        assert_eq!(proxy.len(), code.len());
        for (name, f) in &old {
            let at = f.offset as usize;
            assert_eq!(
                jump_target(&proxy[at..]),
                Some(base + f.offset),
                "{name} does not jump to its namesake"
            );
        }
        // Nothing but the jumps changed.
        let mut patched_bytes = vec![false; code.len()];
        for r in &redirects {
            patched_bytes[r.offset as usize..][..JUMP_LEN].fill(true);
        }
        for (i, (a, b)) in code.iter().zip(&proxy).enumerate() {
            assert!(patched_bytes[i] || a == b, "byte {i:#x} changed");
        }
        // The proxy is still the dumped ELF image: libc may look its
        // symbols up again through AT_SYSINFO_EHDR.
        assert_eq!(functions(Which::Dumped, &proxy).expect("parse"), old);
    }

    #[test]
    fn a_function_this_kernel_lacks_is_refused_by_name() {
        let code = own_vdso();
        let new = rename(&code, "__vdso_getcpu", "__vdso_getcpX");
        assert_eq!(
            plan(&code, &new, 0x7f00_0000_0000),
            Err(VdsoError::Missing {
                name: "__vdso_getcpu".into()
            })
        );
        assert_eq!(
            VdsoError::Missing {
                name: "__vdso_getcpu".into()
            }
            .to_string(),
            "vDSO symbol __vdso_getcpu missing on this kernel"
        );
    }

    #[test]
    fn a_function_too_short_for_the_jump_is_refused_by_name() {
        let code = own_vdso();
        let elf = Elf::parse(&code).unwrap();
        let dynsym = elf
            .section_headers
            .iter()
            .find(|s| elf.shdr_strtab.get_at(s.sh_name) == Some(".dynsym"))
            .expect(".dynsym");
        let (i, _) = elf
            .dynsyms
            .iter()
            .enumerate()
            .find(|(_, s)| elf.dynstrtab.get_at(s.st_name) == Some("__vdso_time"))
            .expect("__vdso_time");
        // st_size is the last 8 bytes of an Elf64_Sym (24 bytes).
        let at = dynsym.sh_offset as usize + i * 24 + 16;
        let mut old = code.clone();
        old[at..at + 8].copy_from_slice(&5u64.to_le_bytes());
        assert_eq!(
            plan(&old, &code, 0x7f00_0000_0000),
            Err(VdsoError::TooShort {
                name: "__vdso_time".into(),
                size: 5
            })
        );
    }

    #[test]
    fn garbage_is_no_vdso() {
        let code = own_vdso();
        assert!(matches!(
            plan(&code, &[0u8; 64], 0),
            Err(VdsoError::Elf {
                which: Which::Here,
                ..
            })
        ));
    }

    #[test]
    fn a_thread_inside_the_old_code_is_refused() {
        use ckpt_image::task::{GpRegs, ThreadCore};
        let (start, end) = (0x7fff_0000_0000u64, 0x7fff_0000_2000u64);
        let redirects = [Redirect {
            name: "__vdso_time".into(),
            offset: 0xac0,
            target: 0x7f00_0000_0ac0,
        }];
        let regs = |rip: u64, orig_rax: u64| GpRegs {
            rip,
            orig_rax,
            ..Default::default()
        };
        let no_syscall = u64::MAX;
        let core = |thread: GpRegs| Core {
            pid: 100,
            regs: Some(regs(0x5555_0000_1000, no_syscall)),
            threads: vec![ThreadCore {
                tid: 101,
                regs: Some(thread),
                ..Default::default()
            }],
            ..Default::default()
        };
        let check = |thread| check_threads(&core(thread), start, end, &redirects);
        // Outside, at an entry (it takes the jump), in a system call the
        // old code made (its fallback path only returns): fine.
        assert_eq!(check(regs(0x5555_0000_2000, no_syscall)), Ok(()));
        assert_eq!(check(regs(start + 0xac0, no_syscall)), Ok(()));
        assert_eq!(check(regs(start + 0xb10, 228)), Ok(()));
        // Past an entry, outside a system call: refused, naming the thread.
        assert_eq!(
            check(regs(start + 0xad0, no_syscall)),
            Err(VdsoError::ThreadInside {
                tid: 101,
                rip: start + 0xad0
            })
        );
    }

    #[test]
    fn jumps_decode_back() {
        for t in [0, 1, 0x7fff_ffff_f000, u64::MAX] {
            assert_eq!(jump_target(&jump(t)), Some(t));
        }
        assert_eq!(jump_target(&[0x90; JUMP_LEN]), None);
        assert_eq!(jump_target(&jump(1)[..JUMP_LEN - 1]), None);
    }
}
