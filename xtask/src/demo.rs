//! `cargo xtask demo`: the agent in the foreground against the test bed, with the static
//! pods of `examples/static-pods`. Ctrl-C is forwarded as SIGTERM (the agent's graceful
//! shutdown); a second Ctrl-C sends SIGKILL. The test bed stays up afterwards.
//!
//! `--cluster`: the test bed's real control plane as well (see `cluster`); the agent
//! joins it by TLS bootstrap, and once the node is Ready a Deployment is applied and the
//! kubectl commands to look at it are printed.

use std::{os::unix::process::CommandExt as _, path::Path};

use anyhow::{Context as _, Result, bail};
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    Ctx, cluster, containerd,
    testbed::{self, DEMO_ROOT, Layout, State},
    upstream::Upstream,
};

pub async fn run(ctx: &Ctx, layout: &Layout, with_cluster: bool) -> Result<()> {
    let config = if with_cluster {
        ctx.workspace.join("examples/cluster/kubelet-config.yaml")
    } else {
        ctx.workspace.join("examples/kubelet-config.yaml")
    };
    let static_pods = ctx.workspace.join("examples/static-pods");
    let deployment = ctx.workspace.join("examples/cluster/web.yaml");
    for p in [&config, &static_pods, &deployment] {
        if !p.exists() {
            bail!("{} is missing (examples/ belongs to the agent)", p.display());
        }
    }

    let state = testbed::up(ctx, layout).await?;
    // The real control plane for `--cluster` (stays up with the test bed).
    let control_plane = if with_cluster { Some(cluster::up(&Upstream::new(ctx), layout)?) } else { None };

    let bin_dir = ctx.build_bins(&["swiftlet"], false)?;

    // The agent's root dir is ours to remove at `down` only if the demo creates it.
    let demo_root = Path::new(DEMO_ROOT);
    if !demo_root.exists() {
        let mut state: State = State::load(layout)?.unwrap_or(state);
        if !state.extra_dirs.iter().any(|d| d == demo_root) {
            state.extra_dirs.push(demo_root.to_path_buf());
            state.save(layout)?;
        }
    }

    let binary = bin_dir.join("swiftlet");
    let socket = layout.socket();
    println!();
    println!("swiftlet is starting in the foreground. Look at it with:");
    println!("  curl -s http://127.0.0.1:10248/healthz");
    if control_plane.is_none() {
        println!("  curl -sk https://127.0.0.1:10250/pods");
        println!("  curl -sk https://127.0.0.1:10250/metrics");
    }
    println!("  ctr -a {} -n k8s.io containers ls", socket.display());
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
        .arg(DEMO_NODE)
        .current_dir(&ctx.workspace);
    let mut guide = None;
    if let Some(cp) = &control_plane {
        // TLS bootstrap, as a kubeadm join: the bootstrap token's kubeconfig, and the
        // kubeconfig with the signed client certificate written next to the agent's pki.
        cmd.arg("--bootstrap-kubeconfig")
            .arg(&cp.bootstrap_kubeconfig)
            .arg("--kubeconfig")
            .arg(demo_root.join("kubelet.conf"))
            .arg("--client-ca-file")
            .arg(&cp.ca_cert)
            .arg("--node-ip")
            .arg("127.0.0.1");
        guide = Some(tokio::spawn(show_cluster(cp.clone(), deployment)));
    }
    let (status, interrupted) = run_foreground(cmd, &binary.display().to_string()).await?;
    if let Some(g) = guide {
        g.abort();
    }
    eprintln!("demo: swiftlet exited: {status}");
    eprintln!("The test bed is still up; `cargo xtask testbed down` cleans up.");
    if status.success() || interrupted { Ok(()) } else { bail!("swiftlet exited with {status}") }
}

/// The demo's node name.
const DEMO_NODE: &str = "swiftlet-demo";

/// Waits for the demo node to be Ready, applies the demo Deployment and prints what to
/// type with the real kubectl.
async fn show_cluster(cp: cluster::State, deployment: std::path::PathBuf) {
    let kubectl = format!("{} --kubeconfig {}", cp.kubectl.display(), cp.admin_kubeconfig.display());
    let ready = "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}";
    for _ in 0..240 {
        let out = tokio::process::Command::new(&cp.kubectl)
            .arg("--kubeconfig")
            .arg(&cp.admin_kubeconfig)
            .args(["get", "node", DEMO_NODE, "-o", ready])
            .output()
            .await;
        if out.is_ok_and(|o| o.stdout == b"True") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let applied = tokio::process::Command::new(&cp.kubectl)
        .arg("--kubeconfig")
        .arg(&cp.admin_kubeconfig)
        .arg("apply")
        .arg("-f")
        .arg(&deployment)
        .output()
        .await;
    match applied {
        Ok(o) if o.status.success() => {}
        Ok(o) => eprintln!("demo: kubectl apply failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => eprintln!("demo: kubectl apply failed: {e}"),
    }
    println!();
    println!("swiftlet joined the {} control plane at {} as node {DEMO_NODE}", cp.version, cp.server);
    println!("(TLS bootstrap: its CSR was approved and signed by kube-controller-manager).");
    println!("The Deployment {} is applied; kube-scheduler places its pods on the node:", deployment.display());
    println!("  alias kubectl='{kubectl}'");
    println!("  kubectl get nodes -o wide");
    println!("  kubectl get pods -o wide -l app=web");
    println!("  kubectl logs deploy/web");
    println!("  kubectl exec deploy/web -- hostname");
    println!("  kubectl port-forward deploy/web 8080:8080 &  curl -s http://127.0.0.1:8080/");
    println!("  kubectl get pods -A     # the static pods' mirror pods too");
    println!();
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
