//! ckpt runs as root on other users' jobs: an image must not grant more
//! than the dumped process had, a user who can write the dump's parent
//! directory must not be able to redirect or lose a checkpoint, and a
//! crafted image must fail with a clear error, never abort or hang ckpt.
//! Victims run as the unprivileged test user (tests/c/counter.c).

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;
use ckpt_image::header;
use ckpt_image::manifest::Manifest;
use ckpt_image::mm::Mm;
use ckpt_image::task::Core;
use ckpt_image::{ImageKey, ImageKind};

/// Restore and show must give up on a crafted image at once; a hang is a failure.
const QUICK: Duration = Duration::from_secs(10);

/// A counter victim of the test user, ready, in `env`.
fn user_victim(env: &TestEnv) -> Victim {
    let user = test_user();
    env.give_work_to(user);
    let mut v = Victim::spawn_as(env, "counter", &[], user);
    v.wait_ready();
    v
}

fn read_manifest(img: &Path) -> Manifest {
    let path = img.join("manifest.img");
    header::decode(ImageKind::Manifest, &path, &fs::read(&path).unwrap()).unwrap()
}

/// Rewrites metadata image `name` as `msg` and updates its size and
/// checksums in the manifest, as someone who can write the directory
/// would. With `key`, also reseals the manifest (what only the site can do).
fn rewrite<M: prost::Message>(
    img: &Path,
    name: &str,
    kind: ImageKind,
    msg: &M,
    key: Option<&ImageKey>,
) {
    let bytes = header::encode(kind, msg);
    fs::write(img.join(name), &bytes).unwrap();
    let mut m = read_manifest(img);
    let d = m.files.iter_mut().find(|d| d.name == name).unwrap();
    d.size = bytes.len() as u64;
    d.blake3 = ckpt_image::digest::of_bytes(&bytes).to_vec();
    let manifest = header::encode(ImageKind::Manifest, &m);
    fs::write(img.join("manifest.img"), &manifest).unwrap();
    if let Some(k) = key {
        fs::write(img.join("manifest.mac"), k.seal(&manifest)).unwrap();
    }
}

fn read_meta<M: prost::Message + Default>(img: &Path, name: &str, kind: ImageKind) -> M {
    let path = img.join(name);
    header::decode(kind, &path, &fs::read(&path).unwrap()).unwrap()
}

/// Restore fails with an error containing `needle`, quickly, and nothing
/// of the victim runs.
fn assert_restore_refused(env: &TestEnv, v: &Victim, needle: &str) -> String {
    v.go();
    let out = spawn_restore(env, &[]).wait_with(QUICK, || v.diag());
    let err = out.assert_error();
    assert!(
        err.contains(needle),
        "error should contain {needle:?}: {err}"
    );
    assert!(
        wait_until(Duration::from_secs(2), || victim_gone(
            v.pid, &v.bin, &v.work
        )),
        "a process for pid {} runs after the refused restore",
        v.pid
    );
    assert!(v.result().is_none(), "the victim ran: {}", v.diag());
    err
}

fn creds_of_root(core: &mut Core) {
    let c = core.creds.as_mut().expect("creds");
    c.uids = vec![0; 4];
    c.gids = vec![0; 4];
    c.cap_eff = !0 >> 23;
    c.cap_prm = !0 >> 23;
    c.cap_bnd = !0 >> 23;
}

/// Item 4: the reported attack. The user owns the images, edits the core's
/// credentials to root with every capability and fixes every checksum.
#[test]
fn core_edited_to_root_with_checksums_fixed_is_refused() {
    let env = TestEnv::new("sec-root-creds");
    let mut v = user_victim(&env);
    dump_kill_reap(&env, &mut v);
    let core_name = format!("core-{}.img", v.pid);
    let mut core: Core = read_meta(&env.img, &core_name, ImageKind::Core);
    creds_of_root(&mut core);
    rewrite(&env.img, &core_name, ImageKind::Core, &core, None);
    // The recorded owner too: without the seal, nothing stops that.
    let mut m = read_manifest(&env.img);
    m.processes[0].uids = vec![0; 4];
    m.processes[0].gids = vec![0; 4];
    fs::write(
        env.img.join("manifest.img"),
        header::encode(ImageKind::Manifest, &m),
    )
    .unwrap();
    let user = test_user();
    let status = Command::new("chown")
        .args(["-R", &format!("{}:{}", user.uid, user.gid)])
        .arg(&env.img)
        .status()
        .unwrap();
    assert!(status.success());
    let err = assert_restore_refused(&env, &v, "manifest.img: not sealed by this site's key");
    assert!(
        err.contains(path_str(&env.image_key())),
        "error should name the key file: {err}"
    );
    let out = ckpt(&env, &["show", path_str(&env.img)], QUICK);
    assert!(out.assert_error().contains("not sealed by this site's key"));
}

/// Item 4, defence in depth: even an image sealed by the site cannot give
/// a process other ids than the dumper saw it run with.
#[test]
fn sealed_core_asking_for_other_ids_than_the_owner_is_refused() {
    let env = TestEnv::new("sec-owner");
    let mut v = user_victim(&env);
    dump_kill_reap(&env, &mut v);
    let m = read_manifest(&env.img);
    let user = test_user();
    assert_eq!(m.processes[0].uids, vec![user.uid; 4], "owner not recorded");
    assert_eq!(m.processes[0].gids, vec![user.gid; 4], "owner not recorded");
    let core_name = format!("core-{}.img", v.pid);
    let mut core: Core = read_meta(&env.img, &core_name, ImageKind::Core);
    creds_of_root(&mut core);
    let key = ImageKey::load(&env.image_key()).unwrap();
    rewrite(&env.img, &core_name, ImageKind::Core, &core, Some(&key));
    assert_restore_refused(
        &env,
        &v,
        &format!("{core_name}: invalid image: credentials"),
    );
}

/// Item 4: the directory is 0700 and every file 0600 even under umask 000,
/// and the key file the dump created is 0600.
#[test]
fn images_are_private_under_umask_000() {
    let env = TestEnv::new("sec-umask");
    let mut v = user_victim(&env);
    let status = Command::new("sh")
        .args([
            "-c",
            "umask 000; exec \"$0\" dump --tree \"$1\" --dir \"$2\" --kill",
        ])
        .arg(CKPT)
        .arg(v.pid.to_string())
        .arg(&env.img)
        .env("CKPT_IMAGE_KEY", env.image_key())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "dump under umask 000 failed: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    v.reap_killed(Duration::from_secs(10));
    let mode = |p: &Path| fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&env.img), 0o700, "images dir");
    for e in fs::read_dir(&env.img).unwrap() {
        let p = e.unwrap().path();
        assert_eq!(mode(&p), 0o600, "{}", p.display());
        assert_eq!(fs::metadata(&p).unwrap().uid(), 0, "{}", p.display());
    }
    assert_eq!(mode(&env.image_key()), 0o600, "key file");
}

/// A directory the test user can write, like a job's scratch directory.
fn user_writable_parent(env: &TestEnv) -> PathBuf {
    let user = test_user();
    let jobs = env.root.join("jobs");
    fs::create_dir(&jobs).unwrap();
    nix::unistd::chown(
        &jobs,
        Some(nix::unistd::Uid::from_raw(user.uid)),
        Some(nix::unistd::Gid::from_raw(user.gid)),
    )
    .unwrap();
    // The test root is root's 0700; let the user reach its directory.
    fs::set_permissions(&env.root, fs::Permissions::from_mode(0o711)).unwrap();
    jobs
}

/// Runs `ckpt dump --kill` into `dir` paused at `point`; once paused, runs
/// `swap(ckpt's pid)` and lets ckpt go on. Returns ckpt's result.
fn dump_with_swap_at(
    env: &TestEnv,
    v: &Victim,
    dir: &Path,
    point: &str,
    swap: impl FnOnce(i32),
) -> CkptOutput {
    let gate = env.root.join("gate");
    let reached = env.root.join("gate.reached");
    let pid = v.pid.to_string();
    let fault = format!("pause:{point}");
    let cmd = CkptCmd::spawn_with_env(
        env,
        &["dump", "--tree", &pid, "--dir", path_str(dir), "--kill"],
        &[
            ("CKPT_FAULT", Path::new(&fault)),
            ("CKPT_FAULT_GATE", &gate),
        ],
    );
    assert!(
        wait_for_file(&reached, DUMP_TIMEOUT),
        "ckpt never reached {point}: {}",
        cmd.stderr_now()
    );
    swap(cmd.pid());
    fs::write(&gate, "go").unwrap();
    cmd.wait_with(DUMP_TIMEOUT, || v.diag())
}

/// Item 5: the reported attack. The user's helper moves `DIR.tmp.<pid>`
/// away and puts a symlink to its own directory in its place before the
/// manifest is written: the dump fails, nothing is written through the
/// link, nothing is committed, and the job keeps running.
#[test]
fn hijacked_tmp_dir_fails_the_dump_and_spares_the_job() {
    let env = TestEnv::new("sec-hijack-tmp");
    let mut v = user_victim(&env);
    let jobs = user_writable_parent(&env);
    let dir = jobs.join("ckpt");
    let theirs = jobs.join("theirs");
    let out = dump_with_swap_at(&env, &v, &dir, "before-commit", |ckpt_pid| {
        let tmp = jobs.join(format!("ckpt.tmp.{ckpt_pid}"));
        fs::rename(&tmp, jobs.join("stolen")).unwrap();
        fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::symlink(&theirs, &tmp).unwrap();
    });
    let err = out.assert_error();
    assert!(err.contains("the checkpoint was not committed"), "{err}");
    assert_eq!(
        fs::read_dir(&theirs).unwrap().count(),
        0,
        "ckpt wrote through the symlink"
    );
    assert!(
        fs::symlink_metadata(&dir).is_err(),
        "something was committed as {}",
        dir.display()
    );
    v.assert_unharmed_and_passes("after a hijacked dump");
}

/// Item 5: the committed `DIR` is swapped for a symlink between the
/// rename and the kill: the job is not killed.
#[test]
fn checkpoint_swapped_before_the_kill_spares_the_job() {
    let env = TestEnv::new("sec-hijack-final");
    let mut v = user_victim(&env);
    let jobs = user_writable_parent(&env);
    let dir = jobs.join("ckpt");
    let out = dump_with_swap_at(&env, &v, &dir, "before-kill", |_| {
        fs::rename(&dir, jobs.join("stolen")).unwrap();
        std::os::unix::fs::symlink("/nonexistent", &dir).unwrap();
    });
    let err = out.assert_error();
    assert!(err.contains("the checkpoint was not committed"), "{err}");
    v.assert_unharmed_and_passes("after a swapped checkpoint");
}

/// Item 6: an LZ4 block claiming 2^43 bytes (inside a VMA made that large)
/// is refused with a clear error instead of an allocation abort.
#[test]
fn huge_compressed_block_is_refused_not_allocated() {
    let env = TestEnv::new("sec-huge-block");
    let mut v = user_victim(&env);
    dump(&env, &v, &["--compress", "--kill"]);
    v.reap_killed(Duration::from_secs(10));
    let mm_name = format!("mm-{}.img", v.pid);
    let mut mm: Mm = read_meta(&env.img, &mm_name, ImageKind::Mm);
    let at = 1u64 << 44;
    let i = mm
        .chunks
        .iter()
        .position(|c| !c.stored_raw)
        .expect("a compressed block");
    mm.chunks[i].addr = at;
    mm.chunks[i].raw_len = 1 << 43;
    mm.vmas.push(ckpt_image::mm::Vma {
        start: at,
        end: at + (1 << 44),
        ..Default::default()
    });
    let key = ImageKey::load(&env.image_key()).unwrap();
    rewrite(&env.img, &mm_name, ImageKind::Mm, &mm, Some(&key));
    let err = assert_restore_refused(&env, &v, &mm_name);
    assert!(err.contains("decompresses to 8796093022208 bytes"), "{err}");
}

/// Item 6: a file of the checkpoint replaced by a symlink to /dev/zero or
/// by a FIFO fails restore and show at once, naming it.
#[test]
fn symlink_to_dev_zero_or_fifo_fails_fast() {
    let env = TestEnv::new("sec-fifo");
    let mut v = user_victim(&env);
    dump_kill_reap(&env, &mut v);
    let name = format!("pages-{}.img", v.pid);
    let pages = env.img.join(&name);
    let saved = env.root.join("pages.saved");
    fs::rename(&pages, &saved).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &pages).unwrap();
    let err = ckpt(&env, &["show", path_str(&env.img)], QUICK).assert_error();
    assert!(
        err.contains(&name) && err.contains("not a regular file"),
        "{err}"
    );
    assert_restore_refused(&env, &v, "not a regular file");
    fs::remove_file(&pages).unwrap();
    nix::unistd::mkfifo(&pages, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let err = ckpt(&env, &["show", path_str(&env.img)], QUICK).assert_error();
    assert!(
        err.contains(&name) && err.contains("not a regular file"),
        "{err}"
    );
    assert_restore_refused(&env, &v, "not a regular file");
    let manifest = env.img.join("manifest.img");
    fs::remove_file(&manifest).unwrap();
    nix::unistd::mkfifo(&manifest, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    assert_restore_refused(&env, &v, "manifest.img");
}

/// A sealed manifest listing the root process 100,000 times (3 MB): `show`
/// goes through the same tree check as restore and refuses it at once.
/// Before: show read the process's images 100,000 times (34 s, 8.3 GB).
#[test]
fn sealed_manifest_repeating_a_process_is_refused_by_show_and_restore() {
    let env = TestEnv::new("sec-repeated");
    let mut v = user_victim(&env);
    dump_kill_reap(&env, &mut v);
    let mut m = read_manifest(&env.img);
    m.processes = vec![m.processes[0].clone(); 100_000];
    let bytes = header::encode(ImageKind::Manifest, &m);
    fs::write(env.img.join("manifest.img"), &bytes).unwrap();
    let key = ImageKey::load(&env.image_key()).unwrap();
    fs::write(env.img.join("manifest.mac"), key.seal(&bytes)).unwrap();
    let needle = format!("manifest.img: invalid image: lists pid {} twice", v.pid);
    let err = ckpt(&env, &["show", path_str(&env.img)], QUICK).assert_error();
    assert!(err.contains(&needle), "{err}");
    assert_restore_refused(&env, &v, &needle);
}
