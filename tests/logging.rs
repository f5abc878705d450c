//! Logging and statistics as CRIU users expect them: `-v`/`-vv` on stderr,
//! `--log-file`, and `dump.log` / `stats-dump.json` kept with the images
//! (docs/usage.md, "Commands").

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::*;
use serde_json::Value;

/// A log line: `(   0.012) LEVEL message`.
fn is_log_line(line: &str) -> bool {
    line.strip_prefix('(')
        .and_then(|rest| rest.split_once(") "))
        .is_some_and(|(t, _)| t.trim().parse::<f64>().is_ok())
}

fn log_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| is_log_line(l)).collect()
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn dump_to(env: &TestEnv, v: &Victim, dir: &Path, args: &[&str]) -> CkptOutput {
    let pid = v.pid.to_string();
    let mut all = vec!["dump", "--tree", &pid, "--dir", path_str(dir)];
    all.extend_from_slice(args);
    let out = CkptCmd::spawn(env, &all).wait_with(DUMP_TIMEOUT, || v.diag());
    out.assert_success();
    out
}

#[test]
fn default_is_quiet_and_verbose_shows_phases_with_timings() {
    let env = TestEnv::new("log-verbose");
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();

    let quiet = dump_to(&env, &v, &env.root.join("quiet"), &[]);
    assert!(
        log_lines(&quiet.stderr).is_empty(),
        "no log lines without -v:\n{}",
        quiet.stderr
    );
    assert_eq!(quiet.stderr.lines().count(), 1, "{}", quiet.stderr);

    // -v after the subcommand.
    let verbose = dump_to(&env, &v, &env.root.join("verbose"), &["-v"]);
    let lines = log_lines(&verbose.stderr);
    let pid = v.pid;
    for phase in [
        "INFO  freeze:".to_string(),
        format!("INFO  collect pid {pid} "),
        format!("INFO  write pages pid {pid}:"),
        "INFO  metadata:".to_string(),
        "INFO  commit:".to_string(),
        "INFO  resume:".to_string(),
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&phase) && l.contains(" ms")),
            "no `{phase}` line with a timing:\n{}",
            verbose.stderr
        );
    }
    assert!(
        !lines.iter().any(|l| l.contains("DEBUG")),
        "-v shows no per-object lines:\n{}",
        verbose.stderr
    );

    // -vv before the subcommand: every object.
    let pid_s = pid.to_string();
    let out = CkptCmd::spawn(
        &env,
        &[
            "-vv",
            "dump",
            "--tree",
            &pid_s,
            "--dir",
            path_str(&env.root.join("vv")),
        ],
    )
    .wait_with(DUMP_TIMEOUT, || v.diag());
    out.assert_success();
    for object in [
        format!("DEBUG pid {pid}: VMA "),
        format!("DEBUG pid {pid}: fd 0: "),
        format!("DEBUG pid {pid}: thread {pid}"),
    ] {
        assert!(
            out.stderr.contains(&object),
            "-vv shows no `{object}`:\n{}",
            out.stderr
        );
    }
    v.assert_unharmed_and_passes("after three dumps");
}

#[test]
fn dump_keeps_its_log_and_stats_with_the_images() {
    let env = TestEnv::new("log-stats");
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    // Raw page data: the figures below compare bytes written with planned.
    let out = dump(&env, &v, &["--kill", "--json", "--compress=none"]);
    v.reap_killed(std::time::Duration::from_secs(10));
    let report: Value = serde_json::from_str(out.stdout.trim()).expect("dump --json");

    for name in ["dump.log", "stats-dump.json"] {
        let p = env.img.join(name);
        assert_eq!(mode(&p), 0o600, "{}", p.display());
    }
    let key = env.image_key();
    let show = ckpt(
        &env,
        &[
            "show",
            path_str(&env.img),
            "--json",
            "--image-key",
            path_str(&key),
        ],
        FAIL_TIMEOUT,
    );
    show.assert_success();
    let listed: Value = serde_json::from_str(show.stdout.trim()).expect("show --json");
    let names: Vec<&str> = listed["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    for name in ["dump.log", "stats-dump.json"] {
        assert!(
            names.contains(&name),
            "{name} not in the manifest: {names:?}"
        );
    }

    let stats: Value =
        serde_json::from_slice(&fs::read(env.img.join("stats-dump.json")).unwrap()).unwrap();
    for (field, in_report) in [
        ("processes", "processes"),
        ("vmas", "vmas"),
        ("fds", "fds"),
        ("pages_planned_bytes", "pages_bytes"),
    ] {
        assert_eq!(stats[field], report[in_report], "{field}: {stats}");
        assert_eq!(stats[field], report["stats"][field], "{field}: {report}");
    }
    assert_eq!(stats["threads"], 1, "{stats}");
    assert!(
        stats["frozen_ms"].as_f64().is_some_and(|t| t >= 0.0),
        "{stats}"
    );
    for phase in ["freeze_ms", "collect_ms", "pages_ms", "metadata_ms"] {
        assert!(
            stats["phases"][phase].as_f64().is_some_and(|t| t >= 0.0),
            "{phase}: {stats}"
        );
    }
    assert_eq!(
        stats["pages_written_bytes"], stats["pages_planned_bytes"],
        "uncompressed pages are written as planned: {stats}"
    );
    assert!(stats.get("compression_ratio").is_none(), "{stats}");
    assert!(
        stats["disk_bytes"].as_u64().unwrap() >= stats["pages_written_bytes"].as_u64().unwrap()
    );

    // dump.log holds the -vv log although the dump ran without -v.
    let log = fs::read_to_string(env.img.join("dump.log")).unwrap();
    assert!(log.contains("INFO  freeze:"), "{log}");
    assert!(
        log.contains(&format!("DEBUG pid {}: fd 1: ", v.pid)),
        "{log}"
    );
    assert!(log_lines(&out.stderr).is_empty(), "{}", out.stderr);

    // The images dir is input to restore: the stats go where asked.
    let rstats = env.root.join("stats-restore.json");
    let rlog = env.root.join("restore.log");
    let restore = spawn_restore(
        &env,
        &[
            "--stats-file",
            path_str(&rstats),
            "--log-file",
            path_str(&rlog),
        ],
    );
    v.go();
    finish_restore(&v, restore);
    let r: Value = serde_json::from_slice(&fs::read(&rstats).unwrap()).unwrap();
    assert_eq!(r["processes"], stats["processes"], "{r}");
    assert_eq!(r["vmas"], stats["vmas"], "{r}");
    assert_eq!(r["fds"], stats["fds"], "{r}");
    assert!(r["phases"]["rebuild_ms"].as_f64().is_some(), "{r}");
    assert_eq!(mode(&rstats), 0o600);
    let rlog = fs::read_to_string(&rlog).unwrap();
    assert!(rlog.contains("INFO  rebuild pid"), "{rlog}");
    assert!(
        rlog.contains(&format!("DEBUG pid {}: fd 0: ", v.pid)),
        "{rlog}"
    );
}

#[test]
fn log_file_gets_every_fd_at_vv_level() {
    let env = TestEnv::new("log-file");
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    let log = env.root.join("dump.log");
    let out = dump(&env, &v, &["--log-file", path_str(&log)]);
    assert!(log_lines(&out.stderr).is_empty(), "{}", out.stderr);
    assert_eq!(mode(&log), 0o600);
    let text = fs::read_to_string(&log).unwrap();
    for fd in 0..3 {
        assert!(
            text.contains(&format!("DEBUG pid {}: fd {fd}: ", v.pid)),
            "no line for fd {fd}:\n{text}"
        );
    }
    assert!(text.contains("INFO  commit:"), "{text}");
    v.assert_unharmed_and_passes("after a logged dump");
}

#[test]
fn log_file_through_a_symlink_or_not_a_file_is_refused() {
    let env = TestEnv::new("log-symlink");
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    let target = env.root.join("precious");
    fs::write(&target, "keep me").unwrap();
    let link = env.root.join("link.log");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let fifo = env.root.join("fifo.log");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let pid = v.pid.to_string();
    for bad in [&link, &fifo] {
        let out = ckpt(
            &env,
            &[
                "dump",
                "--tree",
                &pid,
                "--dir",
                path_str(&env.img),
                "--log-file",
                path_str(bad),
            ],
            FAIL_TIMEOUT,
        );
        let err = out.assert_error();
        assert_eq!(out.code(), 2, "{err}");
        assert!(err.contains(path_str(bad)), "{err}");
        assert!(!env.img.exists(), "a refused dump wrote images");
    }
    assert_eq!(fs::read_to_string(&target).unwrap(), "keep me");
    assert!(
        fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    v.assert_unharmed_and_passes("after refused log files");
}
