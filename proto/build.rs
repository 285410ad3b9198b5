//! Generates the gRPC code from `proto/minibroker.proto` with a vendored `protoc`, so a fresh
//! checkout builds with `cargo` alone.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // `PROTOC` is read by prost-build below; build scripts are single-threaded.
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto");
    // The descriptor set is what gRPC server reflection answers with (`FILE_DESCRIPTOR_SET`).
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("minibroker_descriptor.bin"))
        .compile_protos(&["proto/minibroker.proto"], &["proto"])?;
    Ok(())
}
