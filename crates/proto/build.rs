//! Compiles the .proto files with protox (pure Rust, no system `protoc`) and generates tonic
//! code plus the descriptor set that gRPC reflection serves.

use prost::Message;

/// The files, under the repository's `proto/` (the include root).
const PROTOS: &[&str] = &[
    "statestore/v1/state.proto",
    "statestore/v1/election.proto",
    "dapr/proto/common/v1/common.proto",
    "dapr/proto/runtime/v1/dapr.proto",
    "dapr/proto/components/v1/common.proto",
    "dapr/proto/components/v1/state.proto",
];
const ROOT: &str = "../../proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files: Vec<String> = PROTOS.iter().map(|p| format!("{ROOT}/{p}")).collect();
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(&files, [ROOT])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("stategate_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
