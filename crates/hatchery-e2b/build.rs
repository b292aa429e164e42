//! Generates the envd message types from E2B's vendored protos: prost for
//! the structs, pbjson for their proto3 JSON mapping (int64 as strings,
//! bytes as base64, enums by name), which is what the SDKs speak. protox
//! parses the protos in Rust, so no `protoc` is needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/process.proto", "proto/filesystem.proto"];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out.join("descriptors.bin");
    std::fs::write(&descriptors, prost::Message::encode_to_vec(&fds))?;
    let mut cfg = prost_build::Config::new();
    cfg.compile_well_known_types()
        .extern_path(".google.protobuf", "::pbjson_types");
    cfg.compile_fds(fds)?;
    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptors)?)?
        .build(&[".process", ".filesystem"])?;
    Ok(())
}
