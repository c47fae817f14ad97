//! The test bed's host-path CSI driver deployed on one bench node, for the `csi-*`
//! scenarios: `swiftlet-test-csi-driver deploy --as-pod` (built from the tests crate, which
//! xtask does not depend on) runs the driver, upstream's csi-provisioner and csi-resizer as
//! a pod on the node (a `DaemonSet` the node's agent runs, swiftlet or the upstream kubelet
//! alike, as clusters deploy CSI drivers), and creates the `CSIDriver` and the storage
//! class, as the end-to-end tests deploy it; the `CSIDriver` asks for the pods'
//! service-account tokens ([`super::scenarios::CSI_TOKEN_AUDIENCE`]). It
//! says `ready` on stdout once all of it is up and removes all of it again at the end of
//! its stdin or on SIGTERM ([`CsiDeployment::stop`]; dropped, the deployment is stopped
//! too, and should xtask die, the process gets SIGTERM).
//!
//! The `CSIDriver` and the storage class are the cluster's: one deployment at a time.
//! Each phase starts its own once its node is up and stops it once the scenarios' pods
//! are gone (the agent needs the driver to unmount their volumes) and before the node
//! goes (whose agent stops the driver's pod), whether it passed or not;
//! `swiftlet-test-csi-driver deploy` itself refuses to run beside another.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc::{self, TryRecvError},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{Ctx, bench::apiserver::ApiClient, containerd};

/// How long the deployment may take to come up (the sidecars connect to the API server
/// and the driver first).
const READY_TIMEOUT: Duration = Duration::from_mins(2);
/// How long its removal may take (sidecars stopped, volumes' mounts undone, objects
/// deleted).
const STOP_TIMEOUT: Duration = Duration::from_mins(1);

/// The driver's binary: `SWIFTLET_TEST_CSI_DRIVER`, else a debug build of the tests
/// crate's ([`Ctx::build_bins`]: a relink at most when CI has built the workspace).
pub fn driver_binary(ctx: &Ctx) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("SWIFTLET_TEST_CSI_DRIVER") {
        return fs::canonicalize(&p).with_context(|| format!("SWIFTLET_TEST_CSI_DRIVER={}", p.display()));
    }
    Ok(ctx.build_bins(&["swiftlet-test-csi-driver"], false)?.join("swiftlet-test-csi-driver"))
}

/// A running `swiftlet-test-csi-driver deploy`.
#[derive(Debug)]
pub struct CsiDeployment {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    log: PathBuf,
}

impl CsiDeployment {
    /// Deploys the driver for node `node`, whose agent's `--root-dir` is `root_dir`, on
    /// the control plane `cluster_state` records; the deployment's output and, once it
    /// is removed, its processes' logs go to `log_dir`. Returns once it said `ready`.
    pub async fn start(
        driver: &Path,
        cluster_state: &Path,
        node: &str,
        root_dir: &Path,
        log_dir: &Path,
    ) -> Result<Self> {
        fs::create_dir_all(log_dir).with_context(|| format!("creating {}", log_dir.display()))?;
        let log = log_dir.join("deploy.log");
        let out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(driver);
        cmd.arg("deploy")
            .arg("--as-pod")
            .arg("--node")
            .arg(node)
            .arg("--root-dir")
            .arg(root_dir)
            .arg("--cluster-state")
            .arg(cluster_state)
            .arg("--log-dir")
            .arg(log_dir)
            .arg("--token-audience")
            .arg(super::scenarios::CSI_TOKEN_AUDIENCE)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(out)
            // Ctrl-C reaches only xtask, which removes the deployment after the node.
            .process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent. Should
        // xtask die without stopping it, the deployment gets SIGTERM and removes itself.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = cmd.spawn().with_context(|| format!("starting {} deploy", driver.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let stdin = child.stdin.take();
        eprintln!(
            "fidelity: deploying the CSI host-path driver for {node} (pid {}), log {}",
            child.id(),
            log.display()
        );
        let mut this = Self { child: Some(child), stdin, log };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let started = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(line) if line.trim() == "ready" => break,
                Ok(_) | Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => {
                    let status = this.child.as_mut().map(Child::wait).transpose()?;
                    this.child = None;
                    bail!("the CSI deployment ended ({status:?}) before it was ready:\n{}", this.log_tail(30));
                }
            }
            ensure!(
                started.elapsed() < READY_TIMEOUT,
                "the CSI deployment was not ready in {READY_TIMEOUT:?}:\n{}",
                this.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!("fidelity: the CSI host-path driver is deployed ({:.1} s)", started.elapsed().as_secs_f64());
        Ok(this)
    }

    fn log_tail(&self, lines: usize) -> String {
        containerd::log_tail(&self.log, lines)
    }

    /// Removes the deployment: the end of its stdin, SIGTERM, and SIGKILL should it not
    /// be gone within [`STOP_TIMEOUT`]. Fails if it did not end well (what it could not
    /// undo is in its log).
    pub fn stop(mut self) -> Result<()> {
        self.end()
    }

    fn end(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else { return Ok(()) };
        drop(self.stdin.take());
        if let Ok(pid) = i32::try_from(child.id()) {
            containerd::signal(pid, libc::SIGTERM);
        }
        let started = Instant::now();
        let deadline = started + STOP_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the CSI deployment did not end in {STOP_TIMEOUT:?}:\n{}", self.log_tail(30));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        ensure!(status.success(), "removing the CSI deployment failed ({status}):\n{}", self.log_tail(30));
        eprintln!("fidelity: the CSI host-path driver is removed ({:.1} s)", started.elapsed().as_secs_f64());
        Ok(())
    }
}

impl Drop for CsiDeployment {
    /// Last resort ([`CsiDeployment::stop`] is the real way): never leave it running.
    fn drop(&mut self) {
        if let Err(e) = self.end() {
            eprintln!("fidelity: {e:#}");
        }
    }
}

/// Waits until the `CSINode` of `node` lists `driver`: the agent has registered it, and
/// the pods that need it may come (as a cluster's driver `DaemonSet` runs before them).
pub async fn wait_registered(client: &mut ApiClient, node: &str, driver: &str, timeout: Duration) -> Result<()> {
    let started = Instant::now();
    let path = format!("/apis/storage.k8s.io/v1/csinodes/{node}");
    loop {
        let (code, body) = client.request("GET", &path, None).await?;
        let listed = code == 200
            && body["spec"]["drivers"].as_array().into_iter().flatten().any(|d| d["name"].as_str() == Some(driver));
        if listed {
            eprintln!("fidelity: {node} registered {driver} ({:.1} s)", started.elapsed().as_secs_f64());
            return Ok(());
        }
        ensure!(
            started.elapsed() < timeout,
            "the CSINode of {node} does not list {driver} after {timeout:?} (GET: {code}: {body})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
