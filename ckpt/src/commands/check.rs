//! `ckpt check`.

use std::fmt::Write;
use std::process::ExitCode;

/// Arguments of `ckpt check`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// List the kinds of open files ckpt saves, and what it refuses.
    #[arg(long)]
    kinds: bool,
}

/// Runs `ckpt check`: exit 0 when every required feature is present, 1
/// when one is missing (so scripts can test it).
pub fn run(a: CheckArgs) -> anyhow::Result<ExitCode> {
    if a.kinds {
        super::print_stdout(&render_kinds(a.json))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut features = ckpt_dumper::features::probe();
    // An ordinary user's dumps and restores run in the ckpt service, which
    // has the privileges: what counts is whether it answers.
    if !nix::unistd::geteuid().is_root() {
        let socket = crate::service::socket_path();
        let service = crate::service::client::probe(&socket);
        if service.is_ok() {
            for f in features.iter_mut().filter(|f| f.privilege) {
                f.required = false;
            }
        }
        features.push(ckpt_dumper::features::Feature {
            name: "ckpt service",
            ok: service.is_ok(),
            required: true,
            privilege: false,
            detail: match service {
                Ok(()) => format!(
                    "{}: dumps and restores of your own processes go through it",
                    socket.display()
                ),
                Err(why) => format!(
                    "none at {} ({why}): an ordinary user needs it (a site runs `ckpt serve` as root)",
                    socket.display()
                ),
            },
        });
    }
    let ok = features.iter().all(|f| f.ok || !f.required);
    let mut text = String::new();
    if a.json {
        let list: Vec<_> = features
            .iter()
            .map(|f| {
                serde_json::json!({"name": f.name, "ok": f.ok, "required": f.required, "detail": f.detail})
            })
            .collect();
        writeln!(text, "{}", serde_json::json!({"ok": ok, "features": list}))?;
    } else {
        for f in &features {
            let mark = match (f.ok, f.required) {
                (true, _) => "ok  ",
                (false, true) => "FAIL",
                (false, false) => "no  ",
            };
            writeln!(text, "{mark} {:<30} {}", f.name, f.detail)?;
        }
        writeln!(
            text,
            "{}",
            if ok {
                "Looks good."
            } else {
                "Some required features are missing."
            }
        )?;
    }
    super::print_stdout(&text)?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The dumper's registry of file kinds and its refused list, so the
/// documentation cannot drift from the code.
fn render_kinds(json: bool) -> String {
    let supported: Vec<_> = ckpt_dumper::fd::supported_kinds().collect();
    let refused = ckpt_dumper::fd::REFUSED;
    if json {
        let list = |l: &[(&str, &str)]| -> Vec<serde_json::Value> {
            l.iter()
                .map(|(n, d)| serde_json::json!({"name": n, "description": d}))
                .collect()
        };
        return format!(
            "{}\n",
            serde_json::json!({"supported": list(&supported), "refused": list(refused)})
        );
    }
    let mut text = String::from("supported open files:\n");
    for (name, what) in &supported {
        text += &format!("  {name:<26} {what}\n");
    }
    text += "refused (the dump fails naming pid and fd):\n";
    for (name, what) in refused {
        text += &format!("  {name:<26} {what}\n");
    }
    text
}
