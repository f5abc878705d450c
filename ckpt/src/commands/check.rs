//! `ckpt check`.

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

/// Runs `ckpt check`: exit 0 when every required feature is present.
pub fn run(a: CheckArgs) -> anyhow::Result<ExitCode> {
    if a.kinds {
        print_kinds(a.json);
        return Ok(ExitCode::SUCCESS);
    }
    let features = ckpt_dumper::features::probe();
    let ok = features.iter().all(|f| f.ok || !f.required);
    if a.json {
        let list: Vec<_> = features
            .iter()
            .map(|f| {
                serde_json::json!({"name": f.name, "ok": f.ok, "required": f.required, "detail": f.detail})
            })
            .collect();
        println!("{}", serde_json::json!({"ok": ok, "features": list}));
    } else {
        for f in &features {
            let mark = match (f.ok, f.required) {
                (true, _) => "ok  ",
                (false, true) => "FAIL",
                (false, false) => "no  ",
            };
            println!("{mark} {:<30} {}", f.name, f.detail);
        }
        println!(
            "{}",
            if ok {
                "Looks good."
            } else {
                "Some required features are missing."
            }
        );
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Prints the dumper's registry of file kinds and its refused list, so the
/// documentation cannot drift from the code.
fn print_kinds(json: bool) {
    let supported: Vec<_> = ckpt_dumper::fd::supported_kinds().collect();
    let refused = ckpt_dumper::fd::REFUSED;
    if json {
        let list = |l: &[(&str, &str)]| -> Vec<serde_json::Value> {
            l.iter()
                .map(|(n, d)| serde_json::json!({"name": n, "description": d}))
                .collect()
        };
        println!(
            "{}",
            serde_json::json!({"supported": list(&supported), "refused": list(refused)})
        );
        return;
    }
    println!("supported open files:");
    for (name, what) in &supported {
        println!("  {name:<26} {what}");
    }
    println!("refused (the dump fails naming pid and fd):");
    for (name, what) in refused {
        println!("  {name:<26} {what}");
    }
}
