//! Generates the evidence protocol's messages and service stubs from
//! `proto/waymark/evidence/v1/evidence.proto`.
//!
//! `protox` parses the file into a `FileDescriptorSet` in pure Rust, so the build needs no
//! `protoc` binary; `tonic-prost-build` turns the set into prost messages and tonic stubs.
//! The stubs use our own codec (`evidence::codec::ProtoCodec`): tonic-prost's maps a
//! message that does not parse to `INTERNAL`, and a reporter's malformed message is its
//! fault, `INVALID_ARGUMENT`.

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
    Ok(())
}
