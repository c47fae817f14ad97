//! Dynamic Resource Allocation beside one fidelity node, for the `dra-*` scenarios:
//! upstream's DRA test driver (`k8s.io/kubernetes/test/e2e/dra/test-driver`, built by
//! `cargo xtask upstream build` as `test-driver`) runs as the node's kubelet plugin, as
//! the end-to-end tests run it (`tests/src/dra_driver.rs`): it publishes the node's
//! `ResourceSlice` (4 devices), registers with the agent through
//! `<root-dir>/plugins_registry` and prepares claims by writing CDI specs, which the
//! runner reads to tell whether a claim is prepared on the node.
//!
//! The cluster's side ([`DraObjects`]): the device classes the scenarios ask for (one of
//! the test driver's devices; one of a driver no node runs, published by a
//! `ResourceSlice` the runner writes for the node; one naming an extended resource, which
//! the scheduler then serves by DRA), created when the node is up and deleted at the
//! end of the phase. Device classes are the cluster's: one phase at a time, as the
//! runner does.
//!
//! Both agents run on the test bed's containerd 1.6, which has no CDI: the containers do
//! not see the devices on either, so the comparison is of what the API shows and of
//! whether the driver was asked to prepare and unprepare.

use std::{
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::{Value, json};

use crate::{bench::apiserver::ApiClient, containerd};

/// The test driver's name (its default).
pub const DRIVER: &str = "test-driver.cdi.k8s.io";
/// The device class of one of the test driver's devices.
pub const CLASS: &str = "swiftlet-fidelity-dra";
/// A driver that no node runs, and its device class.
pub const ABSENT_DRIVER: &str = "absent.fidelity.swiftlet.dev";
pub const ABSENT_CLASS: &str = "swiftlet-fidelity-dra-absent";
/// The device class that serves an extended resource by DRA, and that resource.
pub const EXTENDED_CLASS: &str = "swiftlet-fidelity-dra-extended";
pub const EXTENDED_RESOURCE: &str = "fidelity.swiftlet.dev/device";

/// The API's collection of device classes.
const CLASSES: &str = "/apis/resource.k8s.io/v1/deviceclasses";

/// How long the driver may take to register with the agent.
const REGISTER_TIMEOUT: Duration = Duration::from_mins(1);

/// The running test driver of one node.
#[derive(Debug)]
pub struct DraDriver {
    child: Option<Child>,
    log: PathBuf,
    cdi_dir: PathBuf,
}

impl DraDriver {
    /// Starts `binary` as the kubelet plugin of node `node`, whose agent's `--root-dir` is
    /// `root_dir`, with the cluster admin's `kubeconfig`; its CDI specs and log go to
    /// `dir`.
    pub fn start(binary: &Path, kubeconfig: &Path, node: &str, root_dir: &Path, dir: &Path) -> Result<Self> {
        ensure!(binary.is_file(), "no {}: run `cargo xtask upstream build`", binary.display());
        let cdi_dir = dir.join("cdi");
        fs::create_dir_all(&cdi_dir).with_context(|| format!("creating {}", cdi_dir.display()))?;
        // The plugin's socket directory and the registration directory, as a node's
        // DaemonSet would have them mounted.
        for d in [root_dir.join("plugins").join(DRIVER), root_dir.join("plugins_registry")] {
            fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        }
        let log = dir.join("driver.log");
        let out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(binary);
        cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
            // 6: the gRPC calls it serves are logged, the registration among them.
            .arg("-v=6")
            .arg("kubelet-plugin")
            .arg(format!("--node-name={node}"))
            .arg(format!("--plugin-registration-path={}", root_dir.join("plugins_registry").display()))
            .arg(format!("--datadir={}", root_dir.join("plugins").display()))
            .arg(format!("--cdi-dir={}", cdi_dir.display()))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent. Should
        // xtask die without stopping it, the driver goes too.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("starting {}", binary.display()))?;
        eprintln!("fidelity: the DRA test driver for {node} (pid {}), log {}", child.id(), log.display());
        Ok(Self { child: Some(child), log, cdi_dir })
    }

    /// Waits until the agent has registered the driver: the driver was told so
    /// (`NotifyRegistrationStatus`), as a node's pods that need it would come after.
    pub async fn wait_registered(&mut self) -> Result<()> {
        let started = Instant::now();
        loop {
            let text = fs::read_to_string(&self.log).unwrap_or_default();
            if registered(&text) {
                eprintln!("fidelity: the DRA test driver is registered ({:.1} s)", started.elapsed().as_secs_f64());
                return Ok(());
            }
            if let Some(c) = self.child.as_mut()
                && let Some(status) = c.try_wait()?
            {
                self.child = None;
                bail!("the DRA test driver exited with {status}:\n{}", containerd::log_tail(&self.log, 30));
            }
            ensure!(
                started.elapsed() < REGISTER_TIMEOUT,
                "the agent did not register the DRA test driver in {REGISTER_TIMEOUT:?}:\n{}",
                containerd::log_tail(&self.log, 30)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether the driver holds claim `uid` prepared: it keeps a CDI spec per prepared
    /// claim and removes it when the claim is unprepared.
    pub fn prepared(&self, uid: &str) -> bool {
        !uid.is_empty()
            && fs::read_dir(&self.cdi_dir)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().contains(uid))
    }

    /// Stops the driver (its own pid).
    pub fn stop(mut self) {
        self.end();
    }

    fn end(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            eprintln!("fidelity: the DRA test driver is stopped");
        }
    }
}

impl Drop for DraDriver {
    fn drop(&mut self) {
        self.end();
    }
}

/// Whether the driver's log says that an agent registered it.
fn registered(log: &str) -> bool {
    log.lines().any(|l| l.contains("handling request succeeded") && l.contains("NotifyRegistrationStatus"))
}

/// The cluster's objects the DRA scenarios need for node `node`: (collection path,
/// object), created in this order and deleted in the reverse.
pub fn cluster_objects(node: &str) -> Vec<(&'static str, Value)> {
    let class = |name: &str, driver: &str, extra: Value| {
        let mut spec = json!({ "selectors": [{ "cel": { "expression": format!("device.driver == \"{driver}\"") } }] });
        for (k, v) in extra.as_object().into_iter().flatten() {
            spec[k] = v.clone();
        }
        json!({ "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": { "name": name }, "spec": spec })
    };
    vec![
        (CLASSES, class(CLASS, DRIVER, json!({}))),
        (CLASSES, class(ABSENT_CLASS, ABSENT_DRIVER, json!({}))),
        (CLASSES, class(EXTENDED_CLASS, DRIVER, json!({ "extendedResourceName": EXTENDED_RESOURCE }))),
        (
            "/apis/resource.k8s.io/v1/resourceslices",
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": { "name": absent_slice(node) },
                "spec": {
                    "driver": ABSENT_DRIVER,
                    "nodeName": node,
                    "pool": { "name": node, "generation": 1, "resourceSliceCount": 1 },
                    "devices": [{ "name": "absent-0" }],
                },
            }),
        ),
    ]
}

/// The name of the `ResourceSlice` the runner writes for node `node`.
fn absent_slice(node: &str) -> String {
    format!("{node}-absent")
}

/// Creates [`cluster_objects`], deleting what an interrupted run left first.
pub async fn create_objects(client: &mut ApiClient, node: &str) -> Result<()> {
    delete_objects(client, node).await?;
    for (path, object) in cluster_objects(node) {
        let (code, body) = client.request("POST", path, Some(&object)).await?;
        ensure!(code == 201, "creating {}: {code}: {body}", object["metadata"]["name"]);
    }
    Ok(())
}

/// Deletes [`cluster_objects`] (those that are there).
pub async fn delete_objects(client: &mut ApiClient, node: &str) -> Result<()> {
    for (path, object) in cluster_objects(node).into_iter().rev() {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let (code, body) = client.request("DELETE", &format!("{path}/{name}"), None).await?;
        ensure!(matches!(code, 200 | 202 | 404), "deleting {name}: {code}: {body}");
    }
    Ok(())
}

/// Whether `claim` is released: reserved for no pod and deallocated (or gone).
pub fn released(claim: Option<&Value>) -> bool {
    claim.is_none_or(|c| {
        c["status"]["reservedFor"].as_array().is_none_or(Vec::is_empty) && c["status"]["allocation"].is_null()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registration_is_read_from_the_drivers_grpc_log() {
        let asked = r#"I1206 18:00:00.1 1 nonblockinggrpcserver.go:150] "handling request" requestID=2 method="/pluginregistration.Registration/NotifyRegistrationStatus""#;
        let done = r#"I1206 18:00:00.2 1 nonblockinggrpcserver.go:161] "handling request succeeded" requestID=2 method="/pluginregistration.Registration/NotifyRegistrationStatus" response="""#;
        let info = r#"I1206 18:00:00.0 1 nonblockinggrpcserver.go:161] "handling request succeeded" requestID=1 method="/pluginregistration.Registration/GetInfo""#;
        assert!(!registered(&format!("{info}\n{asked}\n")));
        assert!(registered(&format!("{info}\n{asked}\n{done}\n")));
    }

    #[test]
    fn the_cluster_objects_name_the_node_and_the_classes_their_drivers() {
        let objects = cluster_objects("n1");
        let names: Vec<&str> = objects.iter().filter_map(|(_, o)| o["metadata"]["name"].as_str()).collect();
        assert_eq!(names, [CLASS, ABSENT_CLASS, EXTENDED_CLASS, "n1-absent"]);
        let slice = &objects[3].1;
        assert_eq!(slice["spec"]["nodeName"], "n1");
        assert_eq!(slice["spec"]["driver"], ABSENT_DRIVER);
        assert_eq!(objects[2].1["spec"]["extendedResourceName"], EXTENDED_RESOURCE);
        assert!(objects[1].1["spec"]["selectors"][0]["cel"]["expression"].as_str().unwrap().contains(ABSENT_DRIVER));
    }

    #[test]
    fn a_claim_is_released_once_no_pod_holds_it_and_it_is_deallocated() {
        assert!(released(None));
        assert!(released(Some(&json!({ "status": {} }))));
        assert!(released(Some(&json!({ "status": { "reservedFor": [] } }))));
        assert!(!released(Some(&json!({ "status": { "reservedFor": [{ "name": "p" }], "allocation": {} } }))));
        assert!(!released(Some(&json!({ "status": { "allocation": { "devices": {} } } }))));
    }
}
