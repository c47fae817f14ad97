//! Upstream's DRA test driver (`k8s.io/kubernetes/test/e2e/dra/test-driver`, built into
//! the control plane's binary directory by `cargo xtask upstream build` as
//! `test-driver`) as the kubelet plugin of one node: it publishes the node's
//! `ResourceSlice` (devices `device-00`..), registers with the agent through
//! `<root-dir>/plugins_registry`, serves `NodePrepareResources` on
//! `<root-dir>/plugins/<driver>/dra.sock`, and writes one CDI spec per prepared claim
//! request (a device that sets `claim_<claim>_<request>=true` in the container).
//!
//! On the host it runs as a child process; when the agent runs in the node container
//! ([`crate::node::node_target`]) it runs there as a transient systemd unit, so that the
//! node's containerd (2.x, with CDI) reads the specs it writes to the node's
//! `/var/run/cdi`. Stopped by pid or by unit, never by name.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};

use crate::cluster::Cluster;

/// The driver's name (its default).
pub const DRIVER: &str = "test-driver.cdi.k8s.io";
/// The unit the driver runs as in the node container.
const UNIT: &str = "swiftlet-dra-test-driver";

/// The verbosity the driver runs with: from 6 on it logs every gRPC call it serves
/// (`handling request`, with the request), which [`DraTestDriver::calls`] counts.
const VERBOSITY: &str = "-v=6";

/// The running driver.
#[derive(Debug)]
pub struct DraTestDriver {
    /// The registration socket, as the host sees it.
    pub registration_socket: PathBuf,
    /// The CDI spec directory, as the host sees it.
    pub cdi_dir: PathBuf,
    /// The driver's log (host path).
    pub log: PathBuf,
    child: Option<Child>,
    in_node: bool,
    _dir: tempfile::TempDir,
}

impl DraTestDriver {
    /// Starts the driver for node `node_name` whose agent uses `root_dir` (a host path)
    /// and waits until its registration socket is there.
    ///
    /// # Errors
    /// No driver binary (run `cargo xtask upstream build`), or it did not come up.
    pub async fn start(cluster: &Cluster, node_name: &str, root_dir: &Path) -> Result<Self> {
        let bin = cluster.state.bin_dir.join("test-driver");
        ensure!(bin.is_file(), "no {}: run `cargo xtask upstream build`", bin.display());
        let dir = tempfile::Builder::new().prefix("swiftlet-dra-").tempdir()?;
        let registration_socket = root_dir.join("plugins_registry").join(format!("{DRIVER}-reg.sock"));
        // The driver's socket directory and the registration directory, as a node's
        // DaemonSet would have them mounted.
        std::fs::create_dir_all(root_dir.join("plugins").join(DRIVER))?;
        std::fs::create_dir_all(root_dir.join("plugins_registry"))?;
        // The admin's credentials inline: the node does not see the test bed's files.
        let pki = cluster.state.ca_cert.parent().map(Path::to_path_buf).unwrap_or_default();
        let cert = std::fs::read_to_string(pki.join("admin.crt"))?;
        let key = std::fs::read_to_string(pki.join("admin.key"))?;
        let (child, in_node, cdi_dir, log) = if let Some((node, _)) = crate::node::node_target()? {
            // In the node: the binary, a kubeconfig (the API server is forwarded to the
            // same address) and the node's own paths.
            node.forward_api_server(&cluster.state.server)?;
            std::fs::create_dir_all(node.file("/usr/local/lib/swiftlet-test"))?;
            std::fs::copy(&bin, node.file("/usr/local/lib/swiftlet-test/dra-test-driver"))?;
            std::fs::create_dir_all(node.file("/etc/swiftlet-test"))?;
            cluster.write_cert_kubeconfig(&node.file("/etc/swiftlet-test"), "dra-test-driver.conf", &cert, &key)?;
            let root = node.inside(root_dir)?;
            let _ = node.run(&["systemctl", "reset-failed", UNIT]);
            node.ok(&[
                "systemd-run",
                &format!("--unit={UNIT}"),
                "--property=StandardOutput=append:/var/log/swiftlet-dra-test-driver.log",
                "--property=StandardError=append:/var/log/swiftlet-dra-test-driver.log",
                "/usr/local/lib/swiftlet-test/dra-test-driver",
                "--kubeconfig=/etc/swiftlet-test/dra-test-driver.conf",
                VERBOSITY,
                "kubelet-plugin",
                &format!("--node-name={node_name}"),
                &format!("--plugin-registration-path={}", root.join("plugins_registry").display()),
                &format!("--datadir={}", root.join("plugins").display()),
                "--cdi-dir=/var/run/cdi",
            ])?;
            // `/var/run` is `/run`, the node's own tmpfs: seen through its root.
            let cdi_dir = PathBuf::from(format!("/proc/{}/root/run/cdi", node.init_pid));
            (None, true, cdi_dir, node.file("/var/log/swiftlet-dra-test-driver.log"))
        } else {
            let kubeconfig = cluster.write_cert_kubeconfig(dir.path(), "admin.conf", &cert, &key)?;
            let cdi_dir = dir.path().join("cdi");
            std::fs::create_dir_all(&cdi_dir)?;
            let log = dir.path().join("driver.log");
            let out = std::fs::File::create(&log)?;
            let child = Command::new(&bin)
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg(VERBOSITY)
                .arg("kubelet-plugin")
                .arg(format!("--node-name={node_name}"))
                .arg(format!("--plugin-registration-path={}", root_dir.join("plugins_registry").display()))
                .arg(format!("--datadir={}", root_dir.join("plugins").display()))
                .arg(format!("--cdi-dir={}", cdi_dir.display()))
                .stdin(Stdio::null())
                .stdout(out.try_clone()?)
                .stderr(out)
                .spawn()?;
            (Some(child), false, cdi_dir, log)
        };
        let mut driver = Self { registration_socket, cdi_dir, log, child, in_node, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !driver.registration_socket.exists() {
            if let Some(c) = driver.child.as_mut()
                && let Some(status) = c.try_wait()?
            {
                anyhow::bail!("the DRA test driver exited with {status}:\n{}", driver.log_text());
            }
            if driver.in_node
                && let Some((node, _)) = crate::node::node_target()?
                && node.run(&["systemctl", "is-active", "--quiet", UNIT])?.status.code() == Some(3)
            {
                anyhow::bail!("the DRA test driver's unit ended:\n{}", driver.log_text());
            }
            ensure!(
                Instant::now() < deadline,
                "no {} after 30 s:\n{}",
                driver.registration_socket.display(),
                driver.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(driver)
    }

    /// The driver's log so far.
    #[must_use]
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How often the driver was called with `method` (`NodePrepareResources`,
    /// `NodeUnprepareResources`, `NotifyRegistrationStatus`, ...) for claim `uid` (any,
    /// if empty), from its log.
    #[must_use]
    pub fn calls(&self, method: &str, uid: &str) -> usize {
        count_calls(&self.log_text(), method, uid)
    }

    /// The CDI spec files the driver has written for claim `uid`.
    #[must_use]
    pub fn cdi_specs_of(&self, uid: &str) -> Vec<PathBuf> {
        std::fs::read_dir(&self.cdi_dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().contains(uid)))
            .collect()
    }

    /// Stops the driver (its own pid, or its unit in the node).
    ///
    /// # Errors
    /// The unit could not be stopped.
    pub fn stop(mut self) -> Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if self.in_node {
            self.in_node = false;
            if let Some((node, _)) = crate::node::node_target()? {
                let _ = node.run(&["systemctl", "stop", UNIT]);
                let _ = node.run(&["systemctl", "reset-failed", UNIT]);
            }
        }
        Ok(())
    }
}

/// The calls of `method` (for claim `uid`, any if empty) that the driver's `log` shows:
/// one `handling request` line each, naming the method and holding the request.
fn count_calls(log: &str, method: &str, uid: &str) -> usize {
    let method = format!("/{method}\"");
    log.lines().filter(|l| l.contains("\"handling request\"") && l.contains(&method) && l.contains(uid)).count()
}

impl Drop for DraTestDriver {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_by_method_and_claim_from_the_grpc_log() {
        let log = r#"I1206 1 nonblockinggrpcserver.go:150] "handling request" requestID=1 method="/pluginregistration.Registration/NotifyRegistrationStatus" request="plugin_registered:true"
I1206 1 nonblockinggrpcserver.go:150] "handling request" requestID=2 method="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources" request="claims:{namespace:\"ns\" uid:\"u-1\" name:\"gpu\"}"
I1206 1 nonblockinggrpcserver.go:161] "handling request succeeded" requestID=2 method="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources" response="claims:{key:\"u-1\"}"
I1206 1 nonblockinggrpcserver.go:150] "handling request" requestID=3 method="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources" request="claims:{uid:\"u-1\"}"
"#;
        assert_eq!(count_calls(log, "NodePrepareResources", "u-1"), 1);
        assert_eq!(count_calls(log, "NodePrepareResources", "u-2"), 0);
        assert_eq!(count_calls(log, "NodeUnprepareResources", "u-1"), 1);
        assert_eq!(count_calls(log, "NotifyRegistrationStatus", ""), 1);
    }
}
