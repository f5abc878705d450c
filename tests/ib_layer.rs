//! The verbs layer in processes that hold no verbs object.
//!
//! `ckpt run --ib` preloads the layer into the whole job: the batch
//! shell, `mpirun` and the launcher's daemons get it as well as the ranks
//! that open a device. A process with the layer and no verbs object (here
//! a shell and its child, which never load libibverbs at all) must dump
//! and restore as if the layer were not there. Runs on any host: no
//! device is opened.

use std::path::Path;

use crate::common::*;

/// `ckpt run --ib -- sh -c 'counter WORK; echo …'`: the shell waits for
/// the counter victim, then records its exit status. Dumped with `--kill`
/// and restored, the counter goes on from where it was and the shell
/// still reports it.
#[test]
fn a_launcher_with_the_verbs_layer_and_no_verbs_object_comes_back() {
    let env = TestEnv::new("ib-layer-launcher");
    verbs_layer_library();
    let counter = victim_bin("counter");
    let script = r#""$0" "$1"; echo "counter exit $?" >"$1/launcher""#;
    let mut v = Victim::spawn_program(
        &env,
        Path::new(CKPT),
        &[
            "run",
            "--ib",
            "--",
            "sh",
            "-c",
            script,
            path_str(&counter),
            path_str(&env.work),
        ],
    );
    v.wait_ready();
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", v.pid)).unwrap_or_default();
    assert!(
        maps.contains("libckpt_ibverbs.so") && !maps.contains("libibverbs"),
        "the shell runs with the layer and without libibverbs:\n{maps}"
    );
    dump_kill_reap(&env, &mut v);
    let restore = spawn_restore(&env, &[]);
    v.go();
    finish_restore(&v, restore);
    let launcher = std::fs::read_to_string(v.path("launcher")).unwrap_or_default();
    assert_eq!(launcher.trim(), "counter exit 0", "{}", v.diag());
}
