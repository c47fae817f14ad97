//! `swiftlet-test-csi-driver`: the test bed's host-path CSI driver
//! (`swiftlet_tests::csi_driver`) in the foreground. It serves CSI's identity, controller
//! and node services on `--endpoint` and, with `--registration-dir`, the kubelet's plugin
//! registration API as node-driver-registrar would. It stops on SIGTERM or Ctrl-C and
//! leaves its volumes, mounts and loop devices as they are (a restarted driver finds
//! them); `swiftlet_tests::csi_hostpath` cleans up after a test.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use swiftlet_tests::csi_driver::{DEFAULT_NAME, DriverOptions, serve};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// A host-path CSI driver (for tests and demos only).
#[derive(Debug, Parser)]
#[command(name = "swiftlet-test-csi-driver", version)]
struct Args {
    /// The CSI socket to serve on.
    #[arg(long)]
    endpoint: PathBuf,
    /// The node's name (`NodeGetInfo`'s node id).
    #[arg(long)]
    node_id: String,
    /// Where volumes and their records live.
    #[arg(long)]
    state_dir: PathBuf,
    /// Also serve the plugin registration API on `<dir>/<name>-reg.sock` (the agent's
    /// `<root-dir>/plugins_registry`).
    #[arg(long)]
    registration_dir: Option<PathBuf>,
    /// The CSI endpoint the registration names, when the agent sees the socket at
    /// another path than `--endpoint` (default: `--endpoint`).
    #[arg(long)]
    registration_endpoint: Option<String>,
    /// Append one JSON line per call to this file.
    #[arg(long)]
    calls_log: Option<PathBuf>,
    /// `NodeGetInfo`'s `max_volumes_per_node` (0: no limit).
    #[arg(long, default_value_t = 0)]
    max_volumes_per_node: i64,
    /// The driver's name.
    #[arg(long, default_value = DEFAULT_NAME)]
    name: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let Ok(mut term) = signal(SignalKind::terminate()) else { return };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        stop.cancel();
    });
    let opts = DriverOptions {
        name: args.name,
        node_id: args.node_id,
        endpoint: args.endpoint,
        state_dir: args.state_dir,
        registration_dir: args.registration_dir,
        registration_endpoint: args.registration_endpoint,
        calls_log: args.calls_log,
        max_volumes_per_node: args.max_volumes_per_node,
    };
    match serve(opts, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("swiftlet-test-csi-driver: {e:#}");
            ExitCode::FAILURE
        }
    }
}
