//! Build script: compiles the project's own gRPC API (`../proto`, the node-local event
//! API) into Rust with protox and tonic-prost-build. protox is a pure-Rust protobuf
//! compiler, so building swiftlet needs no `protoc` on the machine.

use std::error::Error;
use std::path::PathBuf;

/// The `.proto` files to compile, relative to the proto root.
const PROTOS: &[&str] = &[
    "swiftlet/events/v1/events.proto",
    "deviceplugin/v1beta1/api.proto",
    "pluginregistration/v1/api.proto",
    "csi/v1/csi.proto",
    "dra/v1/api.proto",
    "dra/health/v1/api.proto",
    "dra/health/v1alpha1/api.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("../proto");
    // Cargo watches a directory recursively, so new or renamed .proto files rebuild too.
    println!("cargo:rerun-if-changed={}", proto_root.display());

    let files: Vec<PathBuf> = PROTOS.iter().map(|p| proto_root.join(p)).collect();
    // protox's errors carry the file, line and column of the problem; Debug shows them.
    let fds = protox::compile(&files, [&proto_root]).map_err(|e| format!("{e:?}"))?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
