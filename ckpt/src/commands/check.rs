//! `ckpt check`.

use std::process::ExitCode;

/// Arguments of `ckpt check`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `ckpt check`: exit 0 when every required feature is present.
pub fn run(a: CheckArgs) -> anyhow::Result<ExitCode> {
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
