//! `swiftlet-test-apiserver`: the in-memory API server double in the foreground; the
//! API server of `cargo xtask bench` until the bench runs on the real control plane.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use swiftlet_tests::apiserver::{Options, TestApiServer};

/// An in-memory Kubernetes API server double (for tests and demos only).
#[derive(Debug, Parser)]
#[command(name = "swiftlet-test-apiserver", version)]
struct Args {
    /// Port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 6443)]
    port: u16,
    /// Where to write the kubeconfig for clients.
    #[arg(long)]
    kubeconfig_out: PathBuf,
    /// Serve plain HTTP instead of HTTPS.
    #[arg(long)]
    insecure_http: bool,
    /// The bearer token of the kubeconfig's user.
    #[arg(long, default_value = swiftlet_tests::apiserver::DEFAULT_TOKEN)]
    token: String,
    /// Mount the service-account token volume into pods, as a real cluster does.
    #[arg(long)]
    mount_service_account_token: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("swiftlet-test-apiserver: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let opts = Options {
        port: args.port,
        tls: !args.insecure_http,
        token: args.token,
        mount_service_account_token: args.mount_service_account_token,
        ..Options::default()
    };
    let server = TestApiServer::start(opts).await?;
    let dir = args.kubeconfig_out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let written = server.write_kubeconfig(dir)?;
    if written != args.kubeconfig_out {
        std::fs::rename(&written, &args.kubeconfig_out)?;
    }
    println!("serving on {} (kubeconfig: {})", server.url(), args.kubeconfig_out.display());
    tokio::signal::ctrl_c().await?;
    server.stop().await;
    Ok(())
}
