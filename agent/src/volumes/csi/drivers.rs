//! [`CsiDrivers`]: the CSI drivers registered on this node, their node service, and the
//! runtime their calls run on.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use tonic::transport::Channel;

use super::node_info::{NoNodeInfo, NodeInfoUpdater};
use super::proto::node_client::NodeClient;
use super::proto::node_service_capability::{Type as CapType, rpc::Type as Rpc};
use super::{CALL_TIMEOUT, Error, proto};

/// What a driver's node service offers (`NodeGetCapabilities`).
#[expect(clippy::struct_excessive_bools, reason = "one flag per capability, as the CSI spec lists them")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCapabilities {
    pub stage_unstage: bool,
    pub get_volume_stats: bool,
    pub expand: bool,
    pub volume_mount_group: bool,
    pub single_node_multi_writer: bool,
}

impl NodeCapabilities {
    fn from_response(r: &proto::NodeGetCapabilitiesResponse) -> Self {
        let mut caps = Self::default();
        for c in &r.capabilities {
            let Some(CapType::Rpc(rpc)) = &c.r#type else { continue };
            match Rpc::try_from(rpc.r#type) {
                Ok(Rpc::StageUnstageVolume) => caps.stage_unstage = true,
                Ok(Rpc::GetVolumeStats) => caps.get_volume_stats = true,
                Ok(Rpc::ExpandVolume) => caps.expand = true,
                Ok(Rpc::VolumeMountGroup) => caps.volume_mount_group = true,
                Ok(Rpc::SingleNodeMultiWriter) => caps.single_node_multi_writer = true,
                _ => {}
            }
        }
        caps
    }
}

/// One registered driver.
#[derive(Debug, Clone)]
pub struct Driver {
    /// Its node service's socket.
    pub endpoint: PathBuf,
    /// The versions it registered with.
    pub versions: Vec<String>,
    /// `NodeGetInfo`.
    pub node_id: String,
    pub max_volumes_per_node: i64,
    pub topology: BTreeMap<String, String>,
    pub capabilities: NodeCapabilities,
    channel: Channel,
}

impl Driver {
    /// A client of its node service.
    #[must_use]
    pub fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }
}

/// The CSI drivers registered on this node (upstream's `csiDrivers` store and the
/// registration handler of the CSI plugin).
#[derive(Debug)]
pub struct CsiDrivers {
    node_name: String,
    node_info: Arc<dyn NodeInfoUpdater>,
    drivers: Mutex<HashMap<String, Driver>>,
    runtime: OnceLock<crate::pluginmanager::calls::CallRuntime>,
    /// One lock per volume (`driver/handle`): stage, publish, unpublish and the decision
    /// to unstage of one volume never run at once.
    pub(super) volume_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// `storage_operation_duration_seconds` of tear-downs and unstaging.
    pub(super) metrics: crate::volumes::metrics::VolumeMetrics,
}

impl Default for CsiDrivers {
    /// No node name and no node objects (standalone, tests).
    fn default() -> Self {
        Self::new(String::new(), Arc::new(NoNodeInfo))
    }
}

/// Upstream accepts drivers whose versions include a 1.x.
fn supports_version(versions: &[String]) -> bool {
    versions.iter().any(|v| {
        let v = v.trim().trim_start_matches('v');
        v.split('.').next().is_some_and(|major| major == "1")
    })
}

impl CsiDrivers {
    /// A registry for node `node_name`, recording drivers through `node_info`.
    #[must_use]
    pub fn new(node_name: String, node_info: Arc<dyn NodeInfoUpdater>) -> Self {
        Self {
            node_name,
            node_info,
            drivers: Mutex::default(),
            runtime: OnceLock::new(),
            volume_locks: Mutex::default(),
            metrics: crate::volumes::metrics::VolumeMetrics::default(),
        }
    }

    /// Records tear-downs and unstaging into `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: crate::volumes::metrics::VolumeMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The node's name.
    #[must_use]
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Where node objects are written.
    #[must_use]
    pub fn node_info(&self) -> &Arc<dyn NodeInfoUpdater> {
        &self.node_info
    }

    /// The driver called `name`, when it is registered.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<Driver> {
        self.drivers.lock().unwrap().get(name).cloned()
    }

    /// The registered drivers' names, sorted.
    #[must_use]
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.drivers.lock().unwrap().keys().cloned().collect();
        names.sort();
        names
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime.get_or_init(|| crate::pluginmanager::calls::CallRuntime::start("csi-calls")).handle()
    }

    /// Runs `call` on the call runtime and waits for it from async code.
    pub async fn run<T: Send + 'static>(&self, call: impl Future<Output = T> + Send + 'static) -> T {
        self.handle().spawn(call).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }

    /// Runs `call` on the call runtime and waits for it from a blocking thread.
    pub fn run_blocking<T: Send + 'static>(&self, call: impl Future<Output = T> + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        self.handle().spawn(async move {
            let _ = tx.send(call.await);
        });
        rx.recv().expect("the CSI call runtime runs as long as the registry")
    }

    /// Registers driver `name` serving its node service on `endpoint` (upstream
    /// `RegistrationHandler.RegisterPlugin`): asks it `NodeGetInfo` and
    /// `NodeGetCapabilities`, then records it in the node objects. A driver registering
    /// again (restarted) replaces its earlier registration.
    ///
    /// # Errors
    /// The message the plugin is told: unsupported versions, a failed call, the node
    /// objects not written.
    pub async fn register(&self, name: &str, endpoint: &Path, versions: &[String]) -> Result<(), String> {
        if !supports_version(versions) {
            return Err(format!(
                "none of the CSI versions reported by this driver ({versions:?}) is supported: this kubelet supports 1.x"
            ));
        }
        let endpoint_owned = endpoint.to_owned();
        let (info, caps, channel) = self
            .run(async move {
                let channel = crate::pluginmanager::calls::unix_channel(&endpoint_owned, CALL_TIMEOUT);
                let mut node = NodeClient::new(channel.clone());
                let info = node.node_get_info(proto::NodeGetInfoRequest {}).await?.into_inner();
                let caps = node.node_get_capabilities(proto::NodeGetCapabilitiesRequest {}).await?.into_inner();
                Ok::<_, tonic::Status>((info, caps, channel))
            })
            .await
            .map_err(|s| {
                format!("error during CSI NodeGetInfo call of driver {name}: {}", Error::rpc("NodeGetInfo", &s))
            })?;
        if info.node_id.is_empty() {
            return Err(format!("driver {name} returned an empty node id"));
        }
        let topology = info.accessible_topology.map(|t| t.segments.into_iter().collect()).unwrap_or_default();
        let driver = Driver {
            endpoint: endpoint.to_owned(),
            versions: versions.to_vec(),
            node_id: info.node_id,
            max_volumes_per_node: info.max_volumes_per_node,
            topology,
            capabilities: NodeCapabilities::from_response(&caps),
            channel,
        };
        // Known before the node objects say so: a pod waiting on the driver may mount.
        self.drivers.lock().unwrap().insert(name.to_owned(), driver.clone());
        if let Err(e) =
            self.node_info.add_driver(name, &driver.node_id, driver.max_volumes_per_node, &driver.topology).await
        {
            self.drivers.lock().unwrap().remove(name);
            return Err(format!("error updating the node objects for CSI driver {name}: {e}"));
        }
        tracing::info!(driver = name, endpoint = %endpoint.display(), node_id = %driver.node_id, "CSI driver registered");
        Ok(())
    }

    /// Forgets driver `name` and removes it from the node objects (upstream
    /// `DeRegisterPlugin`).
    pub async fn deregister(&self, name: &str) {
        if self.drivers.lock().unwrap().remove(name).is_none() {
            return;
        }
        if let Err(e) = self.node_info.remove_driver(name).await {
            tracing::warn!(driver = name, error = %e, "failed to remove a CSI driver from the node objects");
        }
        tracing::info!(driver = name, "CSI driver deregistered");
    }
}

#[async_trait::async_trait]
impl crate::pluginmanager::PluginHandler for CsiDrivers {
    async fn register(&self, name: &str, endpoint: &Path, versions: &[String]) -> Result<(), String> {
        Self::register(self, name, endpoint, versions).await
    }

    async fn deregister(&self, name: &str) {
        Self::deregister(self, name).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_needs_a_1_x_version() {
        assert!(supports_version(&["1.0.0".into()]));
        assert!(supports_version(&["0.3.0".into(), "v1.2.0".into()]));
        assert!(!supports_version(&["0.3.0".into()]));
        assert!(!supports_version(&[]));
    }
}
