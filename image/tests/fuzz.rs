//! A deterministic mutation fuzzer for everything that reads images, run as
//! an ordinary test on stable Rust (cargo-fuzz needs nightly).
//!
//! Seeds are real images (`image/fuzz/corpus/`); mutations are bit flips,
//! random bytes, truncation, extension, header length edits, huge protobuf
//! varints and splices, drawn from a fixed-seed PRNG. Each input goes to
//! every decoder (`header::decode` for each kind with each message type,
//! also with a valid header around the mutated payload so the protobuf
//! decoder is reached), to the page layout check (`Mm::page_copies`), and
//! every few rounds through `ImageDir::open` on a real directory, resealed
//! with the test key so the checks behind the seal are reached too.
//! Nothing may panic, and no single allocation may exceed
//! [`ALLOCATION_LIMIT`]. Runs for `CKPT_FUZZ_SECS` seconds (default 10);
//! `CKPT_FUZZ_SEED` picks another sequence.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ckpt_image::fd::{FdTable, Files};
use ckpt_image::header::{self, HEADER_LEN};
use ckpt_image::manifest::Manifest;
use ckpt_image::mm::Mm;
use ckpt_image::shmem::ShmemObjects;
use ckpt_image::task::Core;
use ckpt_image::{ImageDir, ImageKey, ImageKind, ImageWriter};

/// No single allocation while reading an image may be larger than this:
/// every length is bounded before it is used to allocate.
const ALLOCATION_LIMIT: usize = 64 << 20;

const DEFAULT_SECS: u64 = 10;
const DEFAULT_SEED: u64 = 0x636b_7074_6675_7a7a;
/// One round in this many also goes through a real image directory (slower).
const DIR_ROUND_EVERY: u64 = 16;

/// Records the largest allocation request.
struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; only a counter is updated on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// xorshift64*: small, fast, and the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// One seed input: an image file and the kind it is.
struct Seed {
    name: &'static str,
    kind: ImageKind,
    bytes: Vec<u8>,
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus")
}

fn load_corpus() -> (Vec<Seed>, Vec<u8>) {
    let read = |n: &str| fs::read(corpus_dir().join(n)).unwrap_or_else(|e| panic!("{n}: {e}"));
    let seeds = [
        ("manifest.bin", ImageKind::Manifest),
        ("core.bin", ImageKind::Core),
        ("mm.bin", ImageKind::Mm),
        ("mm-compressed.bin", ImageKind::Mm),
        ("fds.bin", ImageKind::FdTable),
        ("files.bin", ImageKind::Files),
        ("shmem.bin", ImageKind::Shmem),
    ]
    .into_iter()
    .map(|(name, kind)| Seed {
        name,
        kind,
        bytes: read(name),
    })
    .collect();
    (seeds, read("pages-compressed.bin"))
}

/// Applies 1–4 random mutations.
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut b = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(9) {
            0 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] = rng.next() as u8;
            }
            2 => b.truncate(rng.below(b.len() + 1)),
            3 => {
                for _ in 0..rng.below(64) {
                    b.push(rng.next() as u8);
                }
            }
            // The header's payload length: small, huge, or off by a little.
            4 if b.len() >= HEADER_LEN => {
                let len = match rng.below(3) {
                    0 => rng.next(),
                    1 => 1u64 << rng.below(64),
                    _ => (b.len() - HEADER_LEN) as u64 ^ (1 << rng.below(8)),
                };
                b[16..24].copy_from_slice(&len.to_le_bytes());
            }
            // A protobuf length or varint made huge.
            5 if !b.is_empty() => {
                let i = rng.below(b.len());
                for j in i..(i + 1 + rng.below(10)).min(b.len()) {
                    b[j] = 0xff;
                }
            }
            // A splice from another seed.
            6 if !other.is_empty() && !b.is_empty() => {
                let from = rng.below(other.len());
                let n = rng.below(other.len() - from + 1).min(256);
                let at = rng.below(b.len());
                b.splice(
                    at..(at + n).min(b.len()),
                    other[from..from + n].iter().copied(),
                );
            }
            // A duplicated range (repeated fields, nested messages).
            7 if !b.is_empty() => {
                let from = rng.below(b.len());
                let n = rng.below(b.len() - from + 1).min(512);
                let chunk = b[from..from + n].to_vec();
                let at = rng.below(b.len() + 1);
                b.splice(at..at, chunk);
            }
            _ => {
                if let Some(x) = b.last_mut() {
                    *x = x.wrapping_add(1);
                }
            }
        }
    }
    b
}

/// `payload` with a valid header of `kind` in front, so the protobuf
/// decoder sees it.
fn reframe(kind: ImageKind, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&kind.magic());
    out.extend_from_slice(&ckpt_image::FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32c_of(payload).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// CRC32C (bitwise; inputs are small).
fn crc32c_of(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

const KINDS: [ImageKind; 6] = [
    ImageKind::Manifest,
    ImageKind::Core,
    ImageKind::Mm,
    ImageKind::FdTable,
    ImageKind::Files,
    ImageKind::Ipc,
];

/// Every decoder on `bytes`, and the page layout check on any `Mm`.
fn decode_everything(bytes: &[u8], pages_len: u64, rng: &mut Rng) {
    let p = Path::new("fuzz");
    for kind in KINDS {
        let _ = header::decode::<Manifest>(kind, p, bytes);
        let _ = header::decode::<Core>(kind, p, bytes);
        let _ = header::decode::<FdTable>(kind, p, bytes);
        let _ = header::decode::<Files>(kind, p, bytes);
        if let Ok(ipc) = header::decode::<ckpt_image::ipc::Ipc>(kind, p, bytes) {
            for s in &ipc.shm {
                let _ = (s.saved_bytes(), s.mapped_len());
            }
        }
        if let Ok(mm) = header::decode::<Mm>(kind, p, bytes) {
            for len in [pages_len, rng.next(), 0, u64::MAX] {
                let _ = mm.page_copies(len);
            }
        }
    }
}

fn key() -> ImageKey {
    ImageKey::from_secret(Path::new("fuzz.key"), [0x42; ckpt_image::seal::KEY_LEN])
}

/// Writes the seed checkpoint (pid 13442, compressed pages) under `root`.
fn write_seed_dir(root: &Path, seeds: &[Seed], pages: &[u8]) -> PathBuf {
    let dir = root.join("ck");
    let mut w = ImageWriter::create(&dir).expect("create seed checkpoint");
    let names = [
        ("core.bin", "core-13442.img"),
        ("mm-compressed.bin", "mm-13442.img"),
        ("fds.bin", "fds-13442.img"),
        ("files.bin", "files.img"),
    ];
    for (seed, name) in names {
        let s = seeds.iter().find(|s| s.name == seed).expect("seed");
        w.write_raw(name, &s.bytes).expect("write seed file");
    }
    let pw = w.pages("pages-13442.img").expect("pages");
    pw.write_at(0, pages).expect("write pages");
    w.finish_pages(pw).expect("finish pages");
    let m = seeds
        .iter()
        .find(|s| s.name == "manifest.bin")
        .expect("manifest");
    let manifest: Manifest =
        header::decode(ImageKind::Manifest, Path::new("manifest.bin"), &m.bytes).expect("seed");
    w.commit(manifest, &key()).expect("commit seed checkpoint");
    dir
}

/// Mutates one file of a copy of the seed checkpoint (updating its digest
/// and resealing the manifest when asked, as the site could), then opens
/// it and reads everything it lists.
fn through_the_directory(rng: &mut Rng, seed_dir: &Path, work: &Path) {
    let dir = work.join(format!("round-{}", rng.next()));
    fs::create_dir(&dir).unwrap();
    let mut names: Vec<String> = fs::read_dir(seed_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    for n in &names {
        fs::copy(seed_dir.join(n), dir.join(n)).unwrap();
    }
    let victim = &names[rng.below(names.len())];
    let original = fs::read(dir.join(victim)).unwrap();
    let mutated = mutate(rng, &original, &[]);
    fs::write(dir.join(victim), &mutated).unwrap();
    let manifest_bytes = fs::read(dir.join("manifest.img")).unwrap();
    if rng.below(2) == 0
        && let Ok(mut m) =
            header::decode::<Manifest>(ImageKind::Manifest, Path::new("m"), &manifest_bytes)
    {
        if let Some(d) = m.files.iter_mut().find(|d| &d.name == victim) {
            d.size = mutated.len() as u64;
            d.blake3 = ckpt_image::digest::of_bytes(&mutated).to_vec();
        }
        let bytes = header::encode(ImageKind::Manifest, &m);
        fs::write(dir.join("manifest.img"), &bytes).unwrap();
        fs::write(dir.join("manifest.mac"), key().seal(&bytes)).unwrap();
    } else if victim == "manifest.img" && rng.below(2) == 0 {
        fs::write(dir.join("manifest.mac"), key().seal(&mutated)).unwrap();
    }
    if let Ok(images) = ImageDir::open(&dir, &key()) {
        for d in images.manifest().files.clone() {
            let _ = images.read_meta::<Core>(&d.name, ImageKind::Core);
            let _ = images.read_meta::<FdTable>(&d.name, ImageKind::FdTable);
            let _ = images.read_meta::<Files>(&d.name, ImageKind::Files);
            if let Ok(objects) = images.read_meta::<ShmemObjects>(&d.name, ImageKind::Shmem) {
                for o in &objects.objects {
                    let _ = o.check_runs(d.size);
                }
            }
            let _ = images.read_meta::<ckpt_image::ipc::Ipc>(&d.name, ImageKind::Ipc);
            if let Ok(mm) = images.read_meta::<Mm>(&d.name, ImageKind::Mm) {
                let _ = mm.page_copies(d.size);
            }
            let _ = images.open_pages(&d.name);
        }
    }
    fs::remove_dir_all(&dir).unwrap();
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Saves a failing input where a developer can find it.
fn save_crash(bytes: &[u8]) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ckpt-fuzz-crash.bin");
    let _ = fs::write(&path, bytes);
    path
}

#[test]
fn image_readers_survive_mutated_images() {
    let secs = env_u64("CKPT_FUZZ_SECS", DEFAULT_SECS);
    let mut rng = Rng(env_u64("CKPT_FUZZ_SEED", DEFAULT_SEED) | 1);
    let (seeds, pages) = load_corpus();
    for s in &seeds {
        // The corpus must decode, or the fuzzer explores nothing.
        decode_everything(&s.bytes, pages.len() as u64, &mut rng);
        let p = Path::new(s.name);
        let decodes = match s.kind {
            ImageKind::Manifest => header::decode::<Manifest>(s.kind, p, &s.bytes).is_ok(),
            ImageKind::Core => header::decode::<Core>(s.kind, p, &s.bytes).is_ok(),
            ImageKind::Mm => header::decode::<Mm>(s.kind, p, &s.bytes).is_ok(),
            ImageKind::FdTable => header::decode::<FdTable>(s.kind, p, &s.bytes).is_ok(),
            ImageKind::Files => header::decode::<Files>(s.kind, p, &s.bytes).is_ok(),
            ImageKind::Shmem => header::decode::<ShmemObjects>(s.kind, p, &s.bytes).is_ok(),
            ImageKind::Ipc => header::decode::<ckpt_image::ipc::Ipc>(s.kind, p, &s.bytes).is_ok(),
        };
        assert!(decodes, "seed {} does not decode", s.name);
    }
    let tmp = tempfile::tempdir().unwrap();
    let seed_dir = write_seed_dir(tmp.path(), &seeds, &pages);
    ImageDir::open(&seed_dir, &key()).expect("the seed checkpoint verifies");
    let work = tmp.path().join("work");
    fs::create_dir(&work).unwrap();

    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut rounds = 0u64;
    while Instant::now() < deadline {
        let s = &seeds[rng.below(seeds.len())];
        let other = &seeds[rng.below(seeds.len())].bytes;
        let input = mutate(&mut rng, &s.bytes, other);
        let framed = reframe(s.kind, input.get(HEADER_LEN..).unwrap_or(&input));
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            decode_everything(&input, pages.len() as u64, &mut rng);
            decode_everything(&framed, pages.len() as u64, &mut rng);
            if rounds.is_multiple_of(DIR_ROUND_EVERY) {
                through_the_directory(&mut rng, &seed_dir, &work);
            }
        }));
        if let Err(panic) = outcome {
            let saved = save_crash(&input);
            eprintln!(
                "fuzz: panic on a mutation of {} in round {rounds}, input saved to {}",
                s.name,
                saved.display()
            );
            std::panic::resume_unwind(panic);
        }
        let largest = LARGEST.load(Ordering::Relaxed);
        if largest > ALLOCATION_LIMIT {
            let saved = save_crash(&input);
            panic!(
                "round {rounds}: an allocation of {largest} bytes (limit {ALLOCATION_LIMIT}) on a \
                 mutation of {}, input saved to {}",
                s.name,
                saved.display()
            );
        }
        rounds += 1;
    }
    eprintln!(
        "fuzz: {rounds} rounds in {secs} s, largest allocation {} bytes",
        LARGEST.load(Ordering::Relaxed)
    );
    assert!(rounds > 0);
}
