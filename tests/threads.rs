//! A multi-threaded process: every thread comes back with its tid, TLS,
//! registers, signal mask and name, keeps running, and pthread_join still
//! works (victim: tests/c/threads.c).

mod common;

use common::*;

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
