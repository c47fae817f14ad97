//! `swiftlet-test-csi-driver`: the test bed's host-path CSI driver
//! (`swiftlet_tests::csi_driver`) in the foreground. It serves CSI's identity, controller
//! and node services on `--endpoint` and, with `--registration-dir`, the kubelet's plugin
//! registration API as node-driver-registrar would. It stops on SIGTERM or Ctrl-C and
//! leaves its volumes, mounts and loop devices as they are (a restarted driver finds
//! them); `swiftlet_tests::csi_hostpath` cleans up after a test.
//!
//! `swiftlet-test-csi-driver deploy --node <name> --root-dir <dir>` instead deploys the
//! driver for one node of the test bed's control plane as
//! `swiftlet_tests::csi_hostpath::CsiHostPath` does in a test (this binary as the driver,
//! upstream's csi-provisioner and csi-resizer, the `CSIDriver` and the storage class),
//! prints `ready` on stdout once all of it is up, and removes all of it again on SIGTERM,
//! Ctrl-C or the end of its stdin. This is how `cargo xtask fidelity`, which does not
//! depend on the tests crate, deploys it beside each agent. The `CSIDriver` and storage
//! class are the cluster's, so only one deployment runs at a time: a second one waits
//! for the first to end (`--lock-timeout`) and fails if it does not.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use swiftlet_tests::cluster::Cluster;
use swiftlet_tests::csi_driver::{DEFAULT_NAME, DriverOptions, serve};
use swiftlet_tests::csi_hostpath::{CsiHostPath, CsiHostPathOptions, Deployment};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// A host-path CSI driver (for tests and demos only). `swiftlet-test-csi-driver deploy
/// --help`: deploy it for a node of the test bed's control plane.
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

/// Deploys the driver for one node of the test bed's control plane until told to stop.
#[derive(Debug, Parser)]
#[command(name = "swiftlet-test-csi-driver deploy")]
struct DeployArgs {
    /// The node the driver serves (its agent's node name).
    #[arg(long)]
    node: String,
    /// The node's agent's `--root-dir`: the driver's sockets go under it, and the agent
    /// finds the driver in its `plugins_registry`.
    #[arg(long)]
    root_dir: PathBuf,
    /// The test bed's record of its control plane (default: `SWIFTLET_CLUSTER_STATE`,
    /// else `/run/swiftlet-testbed/cluster.json`).
    #[arg(long)]
    cluster_state: Option<PathBuf>,
    /// Copy the processes' logs (`driver.log`, `csi-provisioner.log`, `csi-resizer.log`)
    /// and the driver's calls (`calls.jsonl`) here before removing the deployment.
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Stop on SIGTERM or Ctrl-C only, not at the end of stdin.
    #[arg(long)]
    ignore_stdin: bool,
    /// Run the driver and its sidecars as a pod on the node (a `DaemonSet`, as clusters
    /// deploy CSI drivers; the node's agent runs it) instead of as processes beside it.
    #[arg(long)]
    as_pod: bool,
    /// Ask for the pod's service-account token for this audience when a volume is
    /// published (the `CSIDriver`'s `tokenRequests`, one per flag): an inline volume then
    /// holds what the tokens say of themselves (`swiftlet_tests::csi_driver::TOKENS_FILE`).
    #[arg(long = "token-audience")]
    token_audiences: Vec<String>,
    /// How long to wait, in seconds, for another deployment to end.
    #[arg(long, default_value_t = 60)]
    lock_timeout: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let outcome = if argv.get(1).is_some_and(|a| a == "deploy") {
        argv.remove(1);
        deploy(DeployArgs::parse_from(argv)).await
    } else {
        drive(Args::parse()).await
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("swiftlet-test-csi-driver: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A token cancelled on SIGTERM or Ctrl-C.
fn on_signal() -> Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let cancel = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        cancel.cancel();
    });
    Ok(token)
}

async fn drive(args: Args) -> Result<()> {
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
    serve(opts, on_signal()?).await
}

async fn deploy(args: DeployArgs) -> Result<()> {
    let stop = on_signal()?;
    if !args.ignore_stdin {
        // A thread of its own: a blocked read of stdin would hold up the runtime's end.
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 256];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Err(e) if e.kind() != std::io::ErrorKind::Interrupted => break,
                    _ => {}
                }
            }
            stop.cancel();
        });
    }
    let state = args.cluster_state.clone().unwrap_or_else(Cluster::state_path);
    let lock_path = state.parent().unwrap_or_else(|| Path::new("/run")).join("csi-hostpath.lock");
    let _lock = tokio::select! {
        lock = lock_deployment(&lock_path, Duration::from_secs(args.lock_timeout)) => lock?,
        () = stop.cancelled() => bail!("stopped while waiting for another deployment to end"),
    };
    let cluster = Cluster::connect_to(&state).await?;
    let deployment = if args.as_pod { Deployment::Pods } else { Deployment::default() };
    let opts = CsiHostPathOptions {
        deployment,
        token_requests: args.token_audiences.iter().map(|a| serde_json::json!({ "audience": a })).collect(),
        ..CsiHostPathOptions::default()
    };
    // Dropped half-way by a stop, the harness removes what it had made.
    let csi = tokio::select! {
        csi = CsiHostPath::start(&cluster, &args.node, &args.root_dir, opts) => csi?,
        () = stop.cancelled() => bail!("stopped before the deployment was up"),
    };
    eprintln!(
        "swiftlet-test-csi-driver: {} deployed for node {} (storage class {}, CSI socket {})",
        csi.driver_name,
        csi.node_name,
        csi.storage_class,
        csi.csi_socket.display()
    );
    // Whoever reads stdout may be gone already; the stop tells.
    let _ = writeln!(std::io::stdout(), "ready").and_then(|()| std::io::stdout().flush());
    stop.cancelled().await;
    eprintln!("swiftlet-test-csi-driver: removing the deployment for node {}", csi.node_name);
    if let Some(dir) = &args.log_dir {
        keep_logs(&csi, dir);
    }
    csi.stop()
}

/// Takes the deployments' lock at `path` (an exclusive `flock`, written with our pid),
/// waiting up to `timeout` for whoever holds it.
async fn lock_deployment(path: &Path, timeout: Duration) -> Result<File> {
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let deadline = Instant::now() + timeout;
    loop {
        // SAFETY: flock on a descriptor this function owns; the lock goes with the file.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(err).with_context(|| format!("locking {}", path.display()));
        }
        if Instant::now() >= deadline {
            let holder = std::fs::read_to_string(path).unwrap_or_default();
            bail!(
                "another CSI host-path deployment (pid {}) still holds {} after {timeout:?}",
                holder.trim(),
                path.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    file.set_len(0)?;
    write!(file, "{}", std::process::id())?;
    Ok(file)
}

/// Copies the deployment's logs to `dir`; a failure is only told.
fn keep_logs(csi: &CsiHostPath, dir: &Path) {
    let copied = std::fs::create_dir_all(dir).and_then(|()| {
        for name in ["driver", "csi-provisioner", "csi-resizer"] {
            std::fs::write(dir.join(format!("{name}.log")), csi.log(name))?;
        }
        match std::fs::copy(&csi.calls_log, dir.join("calls.jsonl")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    });
    if let Err(e) = copied {
        eprintln!("swiftlet-test-csi-driver: keeping the logs in {}: {e}", dir.display());
    }
}
