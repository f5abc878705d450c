//! Memory: anonymous, heap/brk, stack, private/shared file mappings, shared
//! anonymous memory and PROT_NONE / mprotect-ed regions must come back with
//! the same contents, layout and semantics (victim: tests/c/memory.c).

use std::fmt;
use std::fs;

use crate::common::*;

#[test]
fn memory_restored_after_dump_kill() {
    standard_cycle("memory-kill", "memory", &[]);
}

/// The same with raw page data (`--compress=none`; images are
/// LZ4-compressed by default).
#[test]
fn memory_restored_from_raw_images() {
    cycle_with_page_data("memory-raw", "--compress=none", |p| {
        assert_eq!(p["pages_compressed"], false, "{p}");
    });
}

/// The same with LZ4-compressed page data: smaller than the memory it
/// holds, and restored byte for byte.
#[test]
fn memory_restored_from_compressed_images() {
    cycle_with_page_data("memory-compressed", "--compress", |p| {
        assert_eq!(p["pages_compressed"], true, "{p}");
        assert!(
            p["pages_file_bytes"].as_u64() < p["pages_bytes"].as_u64(),
            "compressed pages are not smaller: {p}"
        );
    });
}

/// Dumps the memory victim with `--kill` and `compress` (the page data option under
/// test), has `check` look at `ckpt show`'s entry for the process, then restores it and
/// lets the victim check its memory from inside.
fn cycle_with_page_data(test: &str, compress: &str, check: impl FnOnce(&serde_json::Value)) {
    let env = TestEnv::new(test);
    let mut v = Victim::spawn(&env, "memory", &[]);
    v.wait_ready();
    dump(&env, &v, &["--kill", compress]);
    v.reap_killed(std::time::Duration::from_secs(10));
    let show = ckpt(&env, &["show", "--json", path_str(&env.img)], FAIL_TIMEOUT);
    let j: serde_json::Value = serde_json::from_str(&show.assert_success().stdout).unwrap();
    check(&j["processes"][0]);
    restore_and_check(&env, &v);
}

/// A pages file of several of the restorer's 16 MiB read windows, raw (so
/// pieces straddle the windows' edges) and compressed, comes back byte for
/// byte; on a disk it is read with direct I/O, and the test makes sure that
/// path ran.
#[test]
fn large_memory_read_in_windows_comes_back_whole() {
    for compress in ["--compress=none", "--compress=lz4"] {
        let env = TestEnv::new("memory-windows");
        let mut v = Victim::spawn(&env, "lazy", &["72", "2"]);
        v.wait_ready();
        dump(&env, &v, &["--kill", compress]);
        v.reap_killed(std::time::Duration::from_secs(10));
        let pages = env.img.join(format!("pages-{}.img", v.pid));
        let restore = CkptCmd::spawn(&env, &["-vv", "restore", "--dir", path_str(&env.img)]);
        v.go();
        let out = finish_restore(&v, restore);
        if on_disk(&env.img) {
            assert!(
                out.stderr.contains(&format!(
                    "pages-{}.img: read directly, each block checked as it arrives",
                    v.pid
                )),
                "{compress}: not read with direct I/O ({} bytes):\n{}",
                fs::metadata(&pages).map(|m| m.len()).unwrap_or(0),
                out.stderr
            );
        }
    }
}

/// Default dump leaves the process running, unchanged; the images it wrote
/// while the process was live must still restore into a passing victim.
#[test]
fn memory_dump_leaves_original_running() {
    let env = TestEnv::new("memory-leave-running");
    let mut v = Victim::spawn(&env, "memory", &[]);
    v.wait_ready();

    dump(&env, &v, &[]);
    v.assert_unharmed_and_passes("after a default (leave-running) dump");

    // The original is gone and reaped: its pid is free for the restore.
    v.clear_protocol_files();
    restore_and_check(&env, &v);
}

/// One entry of /proc/PID/maps after normalisation.
#[derive(Clone, PartialEq, Eq)]
struct Vma {
    start: u64,
    end: u64,
    perms: String,
    offset: u64,
    /// dev:inode, only for real (not deleted) files: a restored shmem or
    /// deleted-file mapping legitimately gets a new inode.
    file_id: Option<String>,
    path: String,
}

impl fmt::Debug for Vma {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:x}-{:x} {} {:08x} {} {}",
            self.start,
            self.end,
            self.perms,
            self.offset,
            self.file_id.as_deref().unwrap_or("-"),
            self.path
        )
    }
}

fn parse_maps(text: &str) -> Vec<Vma> {
    let mut out: Vec<Vma> = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(range), Some(perms), Some(off), Some(dev), Some(inode)) =
            (it.next(), it.next(), it.next(), it.next(), it.next())
        else {
            panic!("malformed maps line: {line:?}");
        };
        // The path is the rest of the line (may contain spaces: " (deleted)").
        let path = it.collect::<Vec<_>>().join(" ");
        let (s, e) = range.split_once('-').expect("maps range");
        let vma = Vma {
            start: u64::from_str_radix(s, 16).expect("start"),
            end: u64::from_str_radix(e, 16).expect("end"),
            perms: perms.to_string(),
            offset: u64::from_str_radix(off, 16).expect("offset"),
            file_id: (path.starts_with('/') && !path.ends_with("(deleted)"))
                .then(|| format!("{dev}:{inode}")),
            path,
        };
        // Merge a mapping the kernel (or a restorer) split into adjacent
        // VMAs: same perms and path, and for files a continuous offset.
        if let Some(prev) = out.last_mut()
            && prev.end == vma.start
            && prev.perms == vma.perms
            && prev.path == vma.path
            && prev.file_id == vma.file_id
            && (vma.path.is_empty() || vma.offset == prev.offset + (prev.end - prev.start))
        {
            prev.end = vma.end;
            continue;
        }
        out.push(vma);
    }
    out
}

fn maps_diff(before: &[Vma], after: &[Vma]) -> String {
    let mut s = String::new();
    for v in before.iter().filter(|v| !after.contains(v)) {
        s.push_str(&format!("  only before: {v:?}\n"));
    }
    for v in after.iter().filter(|v| !before.contains(v)) {
        s.push_str(&format!("  only after:  {v:?}\n"));
    }
    s
}

#[test]
fn merge_keeps_distinct_mappings_apart() {
    // Guards the normaliser itself: it must merge only true continuations.
    let maps = "\
1000-2000 rw-p 00000000 00:00 0 \n\
2000-3000 rw-p 00000000 00:00 0 \n\
3000-4000 r--p 00000000 00:00 0 \n\
4000-5000 r--p 00001000 08:01 12 /bin/x\n\
5000-6000 r--p 00002000 08:01 12 /bin/x\n\
6000-7000 r--p 00009000 08:01 12 /bin/x\n\
7000-8000 rw-s 00000000 00:01 5 /dev/zero (deleted)\n";
    let v = parse_maps(maps);
    let ranges: Vec<(u64, u64)> = v.iter().map(|m| (m.start, m.end)).collect();
    assert_eq!(
        ranges,
        vec![
            (0x1000, 0x3000),
            (0x3000, 0x4000),
            (0x4000, 0x6000),
            (0x6000, 0x7000),
            (0x7000, 0x8000)
        ]
    );
    assert_eq!(v[4].path, "/dev/zero (deleted)");
    assert_eq!(v[4].file_id, None);
    assert_eq!(v[2].file_id.as_deref(), Some("08:01:12"));
}

/// The restored process's whole address space, as seen from outside, must
/// match the original's: every mapping including [heap], [stack], [vdso],
/// [vvar] and [vvar_vclock].
#[test]
fn memory_maps_identical_from_outside() {
    let env = TestEnv::new("memory-maps");
    let mut v = Victim::spawn(&env, "memory", &[]);
    v.wait_ready();
    let before_text = fs::read_to_string(format!("/proc/{}/maps", v.pid)).expect("read maps");
    let before = parse_maps(&before_text);

    dump_kill_reap(&env, &mut v);
    let mut restore = spawn_restore(&env, &[]);
    // Only once the victim's own loop answers is the restore complete.
    wait_restored_and_running(&v, &mut restore);
    let after_text = fs::read_to_string(format!("/proc/{}/maps", v.pid)).expect("read maps");
    let after = parse_maps(&after_text);

    v.go();
    let diff = maps_diff(&before, &after);
    assert!(
        before == after,
        "/proc/{}/maps differs after restore:\n{diff}\n--- before:\n{before_text}\n--- after:\n{after_text}",
        v.pid
    );
    finish_restore(&v, restore);
}

/// Adjacent anonymous VMAs with the same protection that the kernel keeps
/// apart (each has its own anon_vma) come back apart, with their contents
/// (tests/c/adjacent.c checks its maps entries and bytes from inside).
#[test]
fn adjacent_anonymous_vmas_are_not_merged() {
    standard_cycle("memory-adjacent", "adjacent", &[]);
}

/// Regions advised MADV_DONTFORK, MADV_WIPEONFORK, MADV_DONTDUMP,
/// MADV_HUGEPAGE and MADV_NOHUGEPAGE keep their advice: tests/c/madvise.c
/// checks each region's VmFlags and bytes from inside, and that a child
/// forked after the restore does not get the DONTFORK region and gets the
/// WIPEONFORK one zeroed.
#[test]
fn memory_advice_comes_back() {
    standard_cycle("memory-madvise", "madvise", &[]);
}

/// Memory the process cannot read: guard pages (MADV_GUARD_INSTALL) inside
/// a mapping still fault after the restore and the pages around them keep
/// their bytes; a PROT_NONE region keeps the bytes written before it was
/// closed (tests/c/guard.c checks from inside, with a SIGSEGV handler).
#[test]
fn guard_pages_and_prot_none_memory_come_back() {
    standard_cycle("memory-guard", "guard", &[]);
}

/// aio contexts come back on their old ids: the completions left unreaped
/// at the dump are reaped after the restore (exactly them, in order, one
/// ring gone round past its end), new reads complete, and io_destroy
/// works (tests/c/aio.c).
/// `ckpt show --json` lists both rings with the four completions each
/// left, one gone round past its end.
#[test]
fn aio() {
    let env = TestEnv::new("memory-aio");
    let mut v = Victim::spawn(&env, "aio", &[]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let show = ckpt(&env, &["show", "--json", path_str(&env.img)], FAIL_TIMEOUT);
    let j: serde_json::Value = serde_json::from_str(&show.assert_success().stdout).unwrap();
    let rings = j["processes"][0]["aio_rings"]
        .as_array()
        .expect("aio_rings");
    assert_eq!(rings.len(), 2, "{rings:?}");
    assert!(rings.iter().all(|r| r["unreaped"] == 4), "{rings:?}");
    assert!(
        rings
            .iter()
            .any(|r| r["tail"].as_u64() < r["head"].as_u64()),
        "no ring went round: {rings:?}"
    );
    restore_and_check(&env, &v);
}

/// A child forked after io_setup maps its parent's ring without the
/// context: the dump refuses it naming the context, and both go on
/// unharmed (tests/c/aio.c "inherited").
#[test]
fn aio_ring_inherited_without_its_context_is_refused() {
    let env = TestEnv::new("memory-aio-inherited");
    let mut v = Victim::spawn(&env, "aio", &["inherited"]);
    v.wait_ready();
    let err = dump_expect_error(&env, &v);
    assert!(
        err.contains("aio context 0x") && err.contains("inherited from a parent"),
        "{err}"
    );
    v.assert_unharmed_and_passes("after the refused dump");
}
