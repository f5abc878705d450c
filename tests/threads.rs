//! A multi-threaded process: every thread comes back with its tid, TLS,
//! registers, signal mask and name, keeps running, and pthread_join still
//! works (victim: tests/c/threads.c). A restore whose process dies on the
//! way, killed or of its own state, ends and leaves nothing.

use crate::common::*;

#[test]
fn threads_restored_with_their_state() {
    let env = TestEnv::new("threads");
    let mut v = Victim::spawn(&env, "threads", &[]);
    v.wait_ready();
    let tids = |pid: i32| -> Vec<String> {
        let mut t: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        t.sort();
        t
    };
    let before = tids(v.pid);
    assert_eq!(before.len(), 4, "victim should run 4 threads: {before:?}");

    dump_kill_reap(&env, &mut v);
    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    assert_eq!(tids(v.pid), before, "thread ids changed");
    let names: Vec<String> = before
        .iter()
        .map(|t| {
            read_to_string_lossy(std::path::Path::new(&format!(
                "/proc/{}/task/{t}/comm",
                v.pid
            )))
        })
        .collect();
    assert_eq!(
        names[1..].iter().map(|n| n.trim()).collect::<Vec<_>>(),
        ["worker0", "worker1", "worker2"]
    );
    v.go();
    finish_restore(&v, restore);
}

/// No thread of a restored process runs before the tree resumes: at
/// pre-resume (the whole tree rebuilt, the verbs layers and TCP
/// connections not yet let go) every task of the process, its other
/// threads as well as its leader, is still in a tracing stop.
#[test]
fn every_thread_stays_stopped_until_the_tree_resumes() {
    let env = TestEnv::new("threads-held");
    let log = env.root.join("states.log");
    let hook = env.root.join("hook.sh");
    write_executable(
        &hook,
        &format!(
            "#!/bin/sh
             [ \"$CKPT_SCRIPT_ACTION\" = pre-resume ] || exit 0
             for s in /proc/$CKPT_PID/task/*/stat; do
                 awk '{{print $1, $3}}' \"$s\" >> {log}
             done
",
            log = log.display()
        ),
    );
    let mut v = Victim::spawn(&env, "threads", &[]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let restore = spawn_restore(&env, &["--action-script", path_str(&hook)]);
    v.go();
    finish_restore(&v, restore);
    let states = read_to_string_lossy(&log);
    let tasks: Vec<&str> = states.lines().collect();
    assert_eq!(tasks.len(), 4, "pre-resume saw: {states}");
    assert!(
        tasks.iter().all(|l| l.ends_with(" t")),
        "a task of the restored process ran before resume: {states}"
    );
}

/// The dump stops each thread with a signal the process ignores
/// (SIGURG first): with SIGURG handled it takes SIGWINCH, and the
/// program's handler never runs.
#[test]
fn threads_of_a_process_handling_sigurg_are_stopped_with_another_signal() {
    handlers_cycle("threads-urg", "1");
}

/// A process handling SIGURG, SIGWINCH and SIGCHLD has its threads asked
/// syscall by syscall instead: same state back, no handler run.
#[test]
fn threads_of_a_process_handling_every_quiet_signal_are_asked_syscall_by_syscall() {
    handlers_cycle("threads-handlers", "3");
}

fn handlers_cycle(test: &str, handled: &str) {
    let env = TestEnv::new(test);
    let mut v = Victim::spawn(&env, "threads", &["handlers", handled]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    restore_and_check(&env, &v);
}

/// Rounds of [`process_killed_while_restored_ends_the_restore`]: the old
/// hang needed the kill to land while the restorer waited on the leader,
/// one run in six or so.
const KILL_ROUNDS: u32 = 20;

/// A process killed while it is being restored, once its threads exist
/// (an out-of-memory killer, an admin): the restore ends, with an error
/// naming the pid, whatever moment the kill lands at (while every task is
/// held, or a few milliseconds into the rest of the rebuild), and nothing
/// of the process is left. The restorer used to wait on the leader, whose
/// death the kernel reports only after its traced threads' deaths are
/// collected, by that same restorer.
#[test]
fn process_killed_while_restored_ends_the_restore() {
    let env = TestEnv::new("threads-killed");
    let mut v = Victim::spawn(&env, "threads", &[]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let point = std::path::Path::new("pause:restore-threads-created");
    for round in 0..KILL_ROUNDS {
        let gate = env.root.join(format!("gate-{round}"));
        let reached = env.root.join(format!("gate-{round}.reached"));
        let restore = CkptCmd::spawn_with_env(
            &env,
            &["restore", "--dir", path_str(&env.img)],
            &[("CKPT_FAULT", point), ("CKPT_FAULT_GATE", &gate)],
        );
        assert!(
            wait_for_file(&reached, RESTORE_TIMEOUT),
            "round {round}: the restore never created the threads: {}",
            restore.stderr_now()
        );
        let kill = || {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(v.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        };
        // Even rounds: killed while held; odd ones: killed 0-5 ms after
        // the restorer is let go (it looks at its gate every 10 ms).
        if round % 2 == 0 {
            kill();
            write_atomic(&gate, "go");
        } else {
            write_atomic(&gate, "go");
            std::thread::sleep(std::time::Duration::from_micros(u64::from(round) * 250));
            kill();
        }
        let out = restore.wait_with(FAIL_TIMEOUT, || v.diag());
        // A kill after the resume: the restore waited for the process and
        // exits as it died.
        assert_restore_ended(&v, &out, round, libc::SIGKILL);
    }
}

/// Rewrites the core image of `pid` in `env`'s checkpoint with `edit`,
/// fixing its checksum in the manifest and resealing it with the test's
/// key, as only the site could.
fn reseal_core(env: &TestEnv, pid: i32, edit: impl FnOnce(&mut ckpt_image::task::Core)) {
    use ckpt_image::{ImageKind, header};
    let name = format!("core-{pid}.img");
    let path = env.img.join(&name);
    let mut core: ckpt_image::task::Core =
        header::decode(ImageKind::Core, &path, &std::fs::read(&path).unwrap()).unwrap();
    edit(&mut core);
    let bytes = header::encode(ImageKind::Core, &core);
    std::fs::write(&path, &bytes).unwrap();
    let mpath = env.img.join("manifest.img");
    let mut m: ckpt_image::manifest::Manifest =
        header::decode(ImageKind::Manifest, &mpath, &std::fs::read(&mpath).unwrap()).unwrap();
    let d = m.files.iter_mut().find(|d| d.name == name).unwrap();
    d.size = bytes.len() as u64;
    d.blake3 = ckpt_image::digest::of_bytes(&bytes).to_vec();
    let manifest = header::encode(ImageKind::Manifest, &m);
    std::fs::write(&mpath, &manifest).unwrap();
    let key = ckpt_image::ImageKey::load(&env.image_key()).unwrap();
    std::fs::write(env.img.join("manifest.mac"), key.seal(&manifest)).unwrap();
}

/// A process whose restored state kills it the moment a thread runs (a
/// sealed image whose threads resume at address 0) while the restorer
/// still lets go of its other tasks: the restore ends, with an error
/// naming the pid or with the process's death, and nothing is left.
#[test]
fn process_dying_of_its_own_state_as_it_is_let_go_ends_the_restore() {
    let env = TestEnv::new("threads-crash");
    let mut v = Victim::spawn(&env, "threads", &[]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    reseal_core(&env, v.pid, |core| {
        for t in &mut core.threads {
            let regs = t.regs.as_mut().expect("thread registers");
            regs.rip = 0;
            regs.orig_rax = u64::MAX;
        }
    });
    for round in 0..5 {
        let out = spawn_restore(&env, &[]).wait_with(FAIL_TIMEOUT, || v.diag());
        assert_restore_ended(&v, &out, round, libc::SIGSEGV);
    }
}

/// A restore whose process died ended: with the process's death (`signal`)
/// if it was already running, else with an error naming its pid; and no
/// process is left.
fn assert_restore_ended(v: &Victim, out: &CkptOutput, round: u32, signal: i32) {
    let pid = v.pid.to_string();
    if out.stderr.contains("ckpt: restored pid") {
        assert_eq!(out.code(), 128 + signal, "round {round}: {}", out.stderr);
    } else {
        let err = out.assert_error();
        assert!(
            err.contains(&pid),
            "round {round}: error should name pid {pid}: {err}"
        );
    }
    assert!(
        wait_until(std::time::Duration::from_secs(5), || victim_gone(
            v.pid, &v.bin, &v.work
        )),
        "round {round}: pid {} left (state {:?})",
        v.pid,
        proc_state(v.pid)
    );
}
