//! Builds the freestanding parasite blob (`blob/main.rs`) and embeds it.
//!
//! Pipeline:
//! 1. compile `blob/main.rs` with the same `$RUSTC` as a `no_std`/`no_main` static PIE linked
//!    at address 0 with `blob/parasite.ld` (no extra target, no nightly features);
//! 2. parse the ELF with goblin and check it: `ET_DYN`, no `PT_INTERP`/`PT_TLS`, no needed
//!    libraries, only `R_X86_64_RELATIVE` relocations, no undefined symbols, `.bss` last;
//! 3. flatten the `PT_LOAD` segments into one image (addend written into every relocation
//!    slot) and write `OUT_DIR/blob.bin` plus `OUT_DIR/blob_meta.rs` (layout constants and the
//!    relocation offsets), which `src/blob.rs` embeds.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use goblin::elf::Elf;
use goblin::elf::header::{EM_X86_64, ET_DYN};
use goblin::elf::program_header::{PT_INTERP, PT_LOAD, PT_TLS};
use goblin::elf::reloc::R_X86_64_RELATIVE;
use goblin::elf::section_header::SHN_UNDEF;

#[allow(dead_code)]
#[path = "src/proto.rs"]
mod proto;

/// Sources of the blob; a change to any of them rebuilds it.
const SOURCES: &[&str] = &[
    "build.rs",
    "blob/main.rs",
    "blob/mem.rs",
    "blob/parasite.ld",
    "src/proto.rs",
];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    for s in SOURCES {
        println!("cargo:rerun-if-changed={s}");
    }

    let target_arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    assert!(
        target_arch == "x86_64" && target_os == "linux",
        "parasite blob: only x86_64 Linux is supported (target is {target_arch}-{target_os})"
    );

    let elf_path = out_dir.join("parasite.elf");
    compile_blob(&manifest_dir, &elf_path);
    let elf_bytes = fs::read(&elf_path)
        .unwrap_or_else(|e| panic!("parasite blob: cannot read {}: {e}", elf_path.display()));
    let flat = flatten(&elf_bytes);

    fs::write(out_dir.join("blob.bin"), &flat.image).expect("parasite blob: write blob.bin");
    fs::write(out_dir.join("blob_meta.rs"), flat.meta_rs())
        .expect("parasite blob: write blob_meta.rs");
}

/// Runs `$RUSTC` on `blob/main.rs`, producing the linked ELF at `elf_path`.
fn compile_blob(manifest_dir: &Path, elf_path: &Path) {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let src = manifest_dir.join("blob/main.rs");
    let ld_script = manifest_dir.join("blob/parasite.ld");
    let mut cmd = Command::new(&rustc);
    cmd.env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .args(["--edition", "2024", "--crate-type", "bin", "--crate-name"])
        .arg("ckpt_parasite_blob")
        .args(["--target", "x86_64-unknown-linux-gnu"])
        .args([
            "-C",
            "opt-level=s",
            "-C",
            "panic=abort",
            "-C",
            "relocation-model=pie",
            "-C",
            "codegen-units=1",
            "-C",
            "debuginfo=0",
            "-C",
            "force-unwind-tables=no",
            "-C",
            "link-arg=-nostartfiles",
            "-C",
            "link-arg=-nostdlib",
            "-C",
            "link-arg=-static-pie",
            "-C",
            "link-arg=-Wl,--no-dynamic-linker",
            "-C",
            "link-arg=-Wl,-z,norelro",
            "-C",
            "link-arg=-Wl,--build-id=none",
        ])
        .arg("-C")
        .arg(format!("link-arg=-Wl,-T,{}", ld_script.display()))
        .arg("-o")
        .arg(elf_path)
        .arg(&src);
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "parasite blob: cannot run rustc ({}): {e}",
            Path::new(&rustc).display()
        )
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        panic!(
            "parasite blob: compiling {} failed ({}):\n{cmd:?}\n{stderr}",
            src.display(),
            out.status
        );
    }
    // The blob is not seen by cargo's diagnostics or clippy: surface any rustc warning.
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        println!("cargo:warning=parasite blob: {line}");
    }
}

/// The flattened blob and its layout.
struct Flat {
    /// File image: every `PT_LOAD` `p_filesz` range copied to its `p_vaddr`, relocation slots
    /// holding their addend.
    image: Vec<u8>,
    /// In-memory size (`max(p_vaddr + p_memsz)`); the tail beyond `image` must be zero.
    mem_size: u64,
    /// Offset of `parasite_entry`.
    entry: u64,
    /// Offset of `__parasite_args`.
    args: u64,
    /// Offset of `__parasite_stack_top`.
    stack_top: u64,
    /// Offsets of the 8-byte R_X86_64_RELATIVE slots.
    relocs: Vec<u64>,
    /// Offset of `parasite_done` (just after the "done" marker syscall).
    done: u64,
    /// Offset of `parasite_trampoline` (`syscall`, then marker and rescue).
    trampoline: u64,
    /// Offset of `parasite_call_return` (a called function's return value
    /// into rdi, then marker and rescue).
    call_return: u64,
    /// Offset of the `PARASITE_RESCUE_SP` static.
    rescue_sp: u64,
}

impl Flat {
    /// Rust source of `blob_meta.rs`.
    fn meta_rs(&self) -> String {
        let mut s = String::from("// @generated by parasite/build.rs; do not edit.\n");
        writeln!(s, "pub const MEM_SIZE: usize = {:#x};", self.mem_size).unwrap();
        writeln!(s, "pub const ENTRY: usize = {:#x};", self.entry).unwrap();
        writeln!(s, "pub const ARGS_OFFSET: usize = {:#x};", self.args).unwrap();
        writeln!(s, "pub const STACK_TOP: usize = {:#x};", self.stack_top).unwrap();
        writeln!(s, "pub const DONE: usize = {:#x};", self.done).unwrap();
        writeln!(s, "pub const TRAMPOLINE: usize = {:#x};", self.trampoline).unwrap();
        writeln!(s, "pub const CALL_RETURN: usize = {:#x};", self.call_return).unwrap();
        writeln!(s, "pub const RESCUE_SP: usize = {:#x};", self.rescue_sp).unwrap();
        s.push_str("pub const RELOCS: &[u64] = &[");
        for r in &self.relocs {
            write!(s, "{r:#x}, ").unwrap();
        }
        s.push_str("];\n");
        s
    }
}

/// Checks the linked ELF and flattens it. Panics with a description of the first problem.
fn flatten(bytes: &[u8]) -> Flat {
    let elf = Elf::parse(bytes).unwrap_or_else(|e| panic!("parasite blob: bad ELF: {e}"));
    let fail = |msg: String| -> ! { panic!("parasite blob: {msg}") };

    if !elf.is_64 || !elf.little_endian || elf.header.e_machine != EM_X86_64 {
        fail("not a little-endian x86_64 ELF64".into());
    }
    if elf.header.e_type != ET_DYN {
        fail(format!(
            "e_type is {}, expected ET_DYN (static-pie link did not happen?)",
            elf.header.e_type
        ));
    }
    for ph in &elf.program_headers {
        match ph.p_type {
            PT_INTERP => fail("has PT_INTERP (needs a dynamic loader)".into()),
            PT_TLS => fail("has PT_TLS (thread-local statics are not supported)".into()),
            _ => {}
        }
    }
    if !elf.libraries.is_empty() {
        fail(format!("needs shared libraries: {:?}", elf.libraries));
    }

    // No undefined symbols may remain (e.g. a mem function or a libcall nobody provides).
    let mut undefined = Vec::new();
    for (tab, strtab) in [(&elf.syms, &elf.strtab), (&elf.dynsyms, &elf.dynstrtab)] {
        for sym in tab.iter() {
            let name = strtab.get_at(sym.st_name).unwrap_or("");
            if sym.st_shndx == SHN_UNDEF as usize && !name.is_empty() {
                undefined.push(name.to_owned());
            }
        }
    }
    if !undefined.is_empty() {
        fail(format!("undefined symbols: {undefined:?}"));
    }

    // Flatten the PT_LOAD segments.
    let loads: Vec<_> = elf
        .program_headers
        .iter()
        .filter(|ph| ph.p_type == PT_LOAD)
        .collect();
    if loads.is_empty() {
        fail("no PT_LOAD segments".into());
    }
    let file_size = loads
        .iter()
        .map(|ph| ph.p_vaddr + ph.p_filesz)
        .max()
        .unwrap();
    let mem_size = loads
        .iter()
        .map(|ph| ph.p_vaddr + ph.p_memsz)
        .max()
        .unwrap();
    if file_size > 1 << 20 || mem_size > 1 << 20 {
        fail(format!(
            "unexpectedly large: file {file_size:#x}, memory {mem_size:#x}"
        ));
    }
    let mut image = vec![0u8; file_size as usize];
    for ph in &loads {
        let (off, va, fsz) = (
            ph.p_offset as usize,
            ph.p_vaddr as usize,
            ph.p_filesz as usize,
        );
        let src = bytes
            .get(off..off + fsz)
            .unwrap_or_else(|| fail(format!("PT_LOAD {ph:?} beyond end of file")));
        image[va..va + fsz].copy_from_slice(src);
        // Zero-fill (NOBITS) parts must lie beyond the file image, or the host's "file image
        // then zeros" model breaks.
        if ph.p_memsz > ph.p_filesz && ph.p_vaddr + ph.p_filesz < file_size {
            fail(format!(
                "PT_LOAD at {:#x} has a zero-filled tail before the end of the file image; \
                 .bss must be the last section (check parasite.ld)",
                ph.p_vaddr
            ));
        }
    }

    // Relocations: only R_X86_64_RELATIVE, applied (addend only) into the image.
    if !elf.dynrels.is_empty() || !elf.pltrelocs.is_empty() {
        fail("REL or PLT relocations present (expected RELA only)".into());
    }
    let mut relocs = Vec::new();
    for r in elf.dynrelas.iter() {
        if r.r_type != R_X86_64_RELATIVE {
            fail(format!(
                "relocation type {} at {:#x} (only R_X86_64_RELATIVE = {R_X86_64_RELATIVE} is supported)",
                r.r_type, r.r_offset
            ));
        }
        let off = r.r_offset as usize;
        let slot = image.get_mut(off..off + 8).unwrap_or_else(|| {
            panic!("parasite blob: relocation at {off:#x} outside the file image ({file_size:#x})")
        });
        slot.copy_from_slice(&(r.r_addend.unwrap_or(0) as u64).to_le_bytes());
        relocs.push(r.r_offset);
    }
    relocs.sort_unstable();

    let sym = |want: &str| -> goblin::elf::Sym {
        elf.syms
            .iter()
            .find(|s| elf.strtab.get_at(s.st_name) == Some(want))
            .unwrap_or_else(|| fail(format!("symbol {want} not found")))
    };
    let entry = sym("parasite_entry").st_value;
    let args = sym("__parasite_args").st_value;
    let stack_top = sym("__parasite_stack_top").st_value;
    let args_static = sym("PARASITE_ARGS");
    let done = sym("parasite_done").st_value;
    let trampoline = sym("parasite_trampoline").st_value;
    let call_return = sym("parasite_call_return").st_value;
    let rescue_sp = sym("PARASITE_RESCUE_SP").st_value;
    if done >= file_size
        || trampoline >= file_size
        || call_return >= file_size
        || rescue_sp % 8 != 0
        || rescue_sp + 8 > mem_size
    {
        fail(format!(
            "done {done:#x}, trampoline {trampoline:#x} or rescue sp {rescue_sp:#x} out of range"
        ));
    }

    if elf.header.e_entry != entry {
        fail(format!(
            "e_entry {:#x} != parasite_entry {entry:#x}",
            elf.header.e_entry
        ));
    }
    if entry >= file_size {
        fail(format!("entry {entry:#x} outside the file image"));
    }
    let args_size = std::mem::size_of::<proto::Args>() as u64;
    if args_static.st_value != args || args_static.st_size != args_size {
        fail(format!(
            "PARASITE_ARGS at {:#x} (size {}) but __parasite_args at {args:#x} and \
             size_of::<Args>() = {args_size}; .parasite.args must come first in .data",
            args_static.st_value, args_static.st_size
        ));
    }
    if args % 8 != 0 || args + args_size > mem_size {
        fail(format!(
            "args block at {args:#x} misaligned or out of range"
        ));
    }
    if stack_top % 16 != 0 || stack_top < 0x4000 || stack_top > mem_size {
        fail(format!(
            "stack top {stack_top:#x} misaligned or out of range"
        ));
    }

    Flat {
        image,
        mem_size,
        entry,
        args,
        stack_top,
        relocs,
        done,
        trampoline,
        call_return,
        rescue_sp,
    }
}
