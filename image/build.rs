//! Generates the image messages from `proto/*.proto`.
//!
//! protox parses the schema in Rust, so building ckpt needs no `protoc`;
//! prost-build turns the parsed descriptors into the structs that `task`,
//! `mm` and `manifest` re-export.

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").ok_or("no CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("no OUT_DIR")?);
    let proto_dir = manifest_dir.join("proto");
    println!("cargo:rerun-if-changed={}", proto_dir.display());

    // Every file in the directory, sorted so the generated code does not
    // depend on directory order.
    let mut protos = Vec::new();
    for entry in std::fs::read_dir(&proto_dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "proto") {
            protos.push(path);
        }
    }
    protos.sort();

    let fds = protox::compile(&protos, [&proto_dir])?;
    // Kept for the test that decodes images through the descriptors alone,
    // as a tool in another language would.
    std::fs::write(out_dir.join("ckpt.fds"), fds.encode_to_vec())?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
