//! `swiftlet-test-device-plugin`: the test device plugin in the foreground, for trying
//! device plugins by hand against a running swiftlet (or kubelet). It registers with
//! `<dir>/kubelet.sock`, registers again whenever that socket is created anew, and
//! stops on Ctrl-C. Writing `unhealthy <i>` or `healthy <i>` lines on stdin flips the
//! health of device `dev-<i>`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use swiftlet_tests::device_plugin::{TestDevicePlugin, TestDevicePluginOptions};
use tokio::io::AsyncBufReadExt as _;

/// A fake device plugin (for tests and demos only).
#[derive(Debug, Parser)]
#[command(name = "swiftlet-test-device-plugin", version)]
struct Args {
    /// The device plugin directory (`<root-dir>/device-plugins`).
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins")]
    dir: PathBuf,
    /// The extended resource to advertise.
    #[arg(long, default_value = "swiftlet.test/fake")]
    resource_name: String,
    /// How many devices (`dev-0`..).
    #[arg(long, default_value_t = 2)]
    count: usize,
    /// The host device node behind every device (seen as `/dev/fake<i>` in containers).
    #[arg(long, default_value = "/dev/null")]
    host_path: String,
    /// An environment variable for every allocation, `NAME=VALUE` (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    envs: Vec<String>,
    /// A read-only mount for every allocation, `HOST_PATH:CONTAINER_PATH`.
    #[arg(long)]
    mount: Option<String>,
    /// Ask for `PreStartContainer` calls.
    #[arg(long)]
    pre_start_required: bool,
    /// Do not offer `GetPreferredAllocation`.
    #[arg(long)]
    no_preferred_allocation: bool,
    /// The NUMA node reported for every device.
    #[arg(long)]
    numa_node: Option<i64>,
    /// The plugin's socket file name in the directory.
    #[arg(long, default_value = "swiftlet-test-plugin.sock")]
    endpoint: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("swiftlet-test-device-plugin: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let mut envs = BTreeMap::new();
    for e in &args.envs {
        let (k, v) = e.split_once('=').with_context(|| format!("--env {e:?}: expected NAME=VALUE"))?;
        envs.insert(k.to_owned(), v.to_owned());
    }
    let mount = match &args.mount {
        Some(m) => {
            let (h, c) = m.split_once(':').with_context(|| format!("--mount {m:?}: expected HOST:CONTAINER"))?;
            Some((PathBuf::from(h), c.to_owned()))
        }
        None => None,
    };
    let count = args.count;
    let plugin = TestDevicePlugin::start(
        &args.dir,
        TestDevicePluginOptions {
            resource_name: args.resource_name.clone(),
            count,
            host_path: args.host_path,
            envs,
            mount,
            pre_start_required: args.pre_start_required,
            preferred_allocation: !args.no_preferred_allocation,
            numa_node: args.numa_node,
            endpoint: args.endpoint,
        },
    )
    .await?;
    println!("registered {} with {} devices in {}", args.resource_name, count, args.dir.display());
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    loop {
        tokio::select! {
            r = tokio::signal::ctrl_c() => { r?; break; }
            line = lines.next_line() => {
                let Some(line) = line? else {
                    // stdin closed: keep serving until Ctrl-C.
                    tokio::signal::ctrl_c().await?;
                    break;
                };
                let mut words = line.split_whitespace();
                match (words.next(), words.next().and_then(|i| i.parse::<usize>().ok())) {
                    (Some(h @ ("healthy" | "unhealthy")), Some(i)) if i < count => {
                        plugin.set_healthy(i, h == "healthy");
                        println!("dev-{i} is {h}");
                    }
                    _ => eprintln!("expected `healthy <i>` or `unhealthy <i>` with i < {count}"),
                }
            }
        }
    }
    plugin.stop().await;
    Ok(())
}
