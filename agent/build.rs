//! Generates the evidence protocol's messages and service stubs from
//! `proto/waymark/evidence/v1/evidence.proto`.
//!
//! `protox` parses the file into a `FileDescriptorSet` in pure Rust, so the build needs no
//! `protoc` binary; `tonic-prost-build` turns the set into prost messages and tonic stubs.
//! The stubs use our own codec (`evidence::codec::ProtoCodec`): tonic-prost's maps a
//! message that does not parse to `INTERNAL`, and a reporter's malformed message is its
//! fault, `INVALID_ARGUMENT`.
//!
//! It also tells the binary which compiler built it (`WAYMARK_RUSTC`), for
//! `waymark_build_info`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/waymark/evidence/v1/evidence.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    let fds = protox::compile([PROTO], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .codec_path("crate::evidence::codec::ProtoCodec")
        .compile_fds(fds)?;
    rustc_version();
    Ok(())
}

/// `rustc --version` of the compiler cargo builds with, as `WAYMARK_RUSTC` (absent if it
/// cannot be asked: the metric then has no `rustc` label).
fn rustc_version() {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok());
    if let Some(v) = version {
        // "rustc 1.90.0 (1159e78c4 2025-09-14)" → "1.90.0"
        let v = v.split_whitespace().nth(1).unwrap_or(v.trim()).to_owned();
        println!("cargo:rustc-env=WAYMARK_RUSTC={v}");
    }
}
