//! The `swiftlet` binary: parse flags and the config file, then run the agent until
//! SIGTERM/SIGINT. Bad configuration exits with status 2 and names every bad setting; an
//! agent that stops with an error (a task's fatal error included) exits with status 1,
//! after the same drain and span export as a SIGTERM. SIGTERM ends the process within
//! 2 s: the agent's tasks get `agent::SHUTDOWN_GRACE`, the span export
//! `telemetry::SHUTDOWN_TIMEOUT`, and blocking file system work still running after that
//! is abandoned ([`BLOCKING_WAIT`]); pods are left running.

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser as _;
use tokio_util::sync::CancellationToken;

/// How long the exit waits for blocking tasks (a housekeeping pass, a cgroup write) that
/// are still running once the agent has stopped.
const BLOCKING_WAIT: Duration = Duration::from_millis(250);

fn main() -> ExitCode {
    swiftlet::memory::limit_malloc_arenas();
    let _ = swiftlet::memory::raise_open_files_limit();
    let flags = swiftlet::config::Flags::parse();
    let cfg = match swiftlet::config::load(flags) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("swiftlet: {e}");
            return ExitCode::from(2);
        }
    };
    // Both ring and aws-lc-rs may be linked through dependencies; pick one explicitly.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("swiftlet").build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("swiftlet: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The span exporter's gRPC channel lives on the runtime: set it up inside it.
    let telemetry = {
        let _runtime = runtime.enter();
        let json = cfg.kubelet.logging.format == "json";
        match swiftlet::settings::tracing(&cfg)
            .and_then(|tracing| swiftlet::telemetry::init(cfg.verbosity, json, tracing.as_ref()))
        {
            Ok(t) => t,
            Err(e) => {
                eprintln!("swiftlet: {e}");
                return ExitCode::from(2);
            }
        }
    };
    let code = runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        let signals = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown requested");
            signals.cancel();
        });
        match swiftlet::agent::run(cfg, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = %e, "swiftlet failed");
                eprintln!("swiftlet: {e}");
                ExitCode::FAILURE
            }
        }
    });
    // Queued spans go out while the runtime (and so the exporter's channel) still runs.
    telemetry.shutdown();
    runtime.shutdown_timeout(BLOCKING_WAIT);
    code
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
