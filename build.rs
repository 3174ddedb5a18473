//! Compiles the .proto files with protox (pure Rust, no system `protoc`) and generates tonic
//! code plus the descriptor set that gRPC reflection serves.

use prost::Message;

const PROTOS: &[&str] = &[
    "proto/statestore/v1/state.proto",
    "proto/dapr/proto/common/v1/common.proto",
    "proto/dapr/proto/runtime/v1/dapr.proto",
    "proto/dapr/proto/components/v1/common.proto",
    "proto/dapr/proto/components/v1/state.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for p in PROTOS {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("stategate_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
