//! `cargo xtask demo`: the agent in the foreground against the test bed, with the static
//! pods of `examples/static-pods`. Ctrl-C is forwarded as SIGTERM (the agent's graceful
//! shutdown); a second Ctrl-C sends SIGKILL. The test bed stays up afterwards.

use std::{os::unix::process::CommandExt as _, path::Path};

use anyhow::{Context as _, Result, bail};
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    Ctx, containerd,
    testbed::{self, DEMO_ROOT, Layout, State},
};

/// Port of the test API server in `demo --cluster`.
const DEMO_APISERVER_PORT: u16 = 6443;

pub async fn run(ctx: &Ctx, layout: &Layout, cluster: bool) -> Result<()> {
    let config = ctx.workspace.join("examples/kubelet-config.yaml");
    let static_pods = ctx.workspace.join("examples/static-pods");
    for p in [&config, &static_pods] {
        if !p.exists() {
            bail!("{} is missing (examples/ belongs to the agent)", p.display());
        }
    }

    let state = testbed::up(ctx, layout).await?;

    eprintln!("==> cargo build -p swiftlet -p swiftlet-tests --bins");
    let status = std::process::Command::new(&ctx.cargo)
        .args(["build", "-p", "swiftlet", "-p", "swiftlet-tests", "--bins"])
        .current_dir(&ctx.workspace)
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build failed");
    }
    // The test API server (a test double of kube-apiserver) for `--cluster`; killed by
    // pid when the demo ends.
    let apiserver = if cluster {
        let kubeconfig = std::env::temp_dir().join("swiftlet-demo-kubeconfig");
        let child = std::process::Command::new(ctx.target_dir.join("debug/swiftlet-test-apiserver"))
            .arg("--port")
            .arg(DEMO_APISERVER_PORT.to_string())
            .arg("--kubeconfig-out")
            .arg(&kubeconfig)
            .stdout(std::process::Stdio::null())
            .spawn()
            .context("starting swiftlet-test-apiserver")?;
        for _ in 0..100 {
            if kubeconfig.exists() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        if !kubeconfig.exists() {
            bail!("the test API server did not write {}", kubeconfig.display());
        }
        Some((ApiServerGuard(child), kubeconfig))
    } else {
        None
    };

    // The agent's root dir is ours to remove at `down` only if the demo creates it.
    let demo_root = Path::new(DEMO_ROOT);
    if !demo_root.exists() {
        let mut state: State = State::load(layout)?.unwrap_or(state);
        if !state.extra_dirs.iter().any(|d| d == demo_root) {
            state.extra_dirs.push(demo_root.to_path_buf());
            state.save(layout)?;
        }
    }

    let binary = ctx.target_dir.join("debug/swiftlet");
    let socket = layout.socket();
    println!();
    println!("swiftlet is starting in the foreground. Look at it with:");
    println!("  curl -s http://127.0.0.1:10248/healthz");
    println!("  curl -sk https://127.0.0.1:10250/pods");
    println!("  curl -sk https://127.0.0.1:10250/metrics");
    println!("  ctr -a {} -n k8s.io containers ls", socket.display());
    if let Some((_, kubeconfig)) = &apiserver {
        println!(
            "Joined the test API server at https://127.0.0.1:{DEMO_APISERVER_PORT} (kubeconfig {}):",
            kubeconfig.display()
        );
        println!(
            "  curl -sk -H 'Authorization: Bearer swiftlet-test-token' https://127.0.0.1:{DEMO_APISERVER_PORT}/api/v1/nodes"
        );
        println!(
            "  curl -sk -H 'Authorization: Bearer swiftlet-test-token' https://127.0.0.1:{DEMO_APISERVER_PORT}/api/v1/pods"
        );
    }
    println!("Ctrl-C stops swiftlet (SIGTERM); the test bed stays up.");
    println!();

    let mut cmd = tokio::process::Command::new(&binary);
    cmd.arg("--config")
        .arg(&config)
        .arg("--container-runtime-endpoint")
        .arg(layout.endpoint())
        .arg("--pod-manifest-path")
        .arg(&static_pods)
        .arg("--root-dir")
        .arg(DEMO_ROOT)
        .arg("--hostname-override")
        .arg("swiftlet-demo")
        .current_dir(&ctx.workspace);
    if let Some((_, kubeconfig)) = &apiserver {
        cmd.arg("--kubeconfig").arg(kubeconfig);
    }
    let (status, interrupted) = run_foreground(cmd, &binary.display().to_string()).await?;
    eprintln!("demo: swiftlet exited: {status}");
    eprintln!("The test bed is still up; `cargo xtask testbed down` cleans up.");
    if status.success() || interrupted { Ok(()) } else { bail!("swiftlet exited with {status}") }
}

/// Stops the demo's test API server (by its pid) when the demo ends.
struct ApiServerGuard(std::process::Child);

impl Drop for ApiServerGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` in its own process group until it exits. The first SIGINT/SIGTERM we get is
/// forwarded as SIGTERM (the kubelet's graceful shutdown signal), a second one as SIGKILL.
/// Returns the exit status and whether we were interrupted.
async fn run_foreground(mut cmd: tokio::process::Command, name: &str) -> Result<(std::process::ExitStatus, bool)> {
    // Its own process group: the terminal's Ctrl-C reaches only us, and we decide what
    // the child gets.
    cmd.as_std_mut().process_group(0);
    // Listen before spawning, so no early interrupt is lost.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
    let pid = child.id().and_then(|p| i32::try_from(p).ok()).with_context(|| format!("{name} pid"))?;

    let mut interrupted = false;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status?,
            _ = sigint.recv() => {}
            _ = sigterm.recv() => {}
        }
        if interrupted {
            eprintln!("demo: second interrupt, SIGKILL to {name} ({pid})");
            containerd::signal(pid, libc::SIGKILL);
        } else {
            eprintln!("demo: forwarding SIGTERM to {name} ({pid}); interrupt again to kill");
            containerd::signal(pid, libc::SIGTERM);
            interrupted = true;
        }
    };
    Ok((status, interrupted))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// An interrupt of xtask reaches the child as SIGTERM, and we wait for its exit.
    #[tokio::test]
    async fn forwards_interrupt_as_sigterm_and_waits() {
        let mut cmd = tokio::process::Command::new("sh");
        // Exit 7 only on SIGTERM: a SIGINT or SIGKILL would end it differently.
        cmd.args(["-c", "trap 'exit 7' TERM; while :; do sleep 0.05; done"]);
        let run = tokio::spawn(run_foreground(cmd, "sh"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        // SAFETY: a signal to our own process; run_foreground has a handler installed.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGINT);
        }
        let (status, interrupted) = run.await.unwrap().unwrap();
        assert!(interrupted);
        assert_eq!(status.code(), Some(7));
    }
}
