//! Links libpmix when the `pmix` feature is on; does nothing otherwise.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_PMIX");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    if std::env::var_os("CARGO_FEATURE_PMIX").is_none() {
        return;
    }
    // `pkg-config --libs-only-L pmix` gives Debian's /usr/lib/x86_64-linux-gnu/pmix2/lib;
    // libpmix.so.2 is also linked into /usr/lib/x86_64-linux-gnu, so the loader finds it
    // without an rpath.
    let mut dirs: Vec<String> = Command::new("pkg-config")
        .args(["--libs-only-L", "pmix"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|a| a.strip_prefix("-L"))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    if dirs.is_empty() {
        dirs.push("/usr/lib/x86_64-linux-gnu".to_string());
    }
    for d in dirs {
        println!("cargo:rustc-link-search=native={d}");
    }
    println!("cargo:rustc-link-lib=pmix");
}
