//! The node objects that tell the control plane which CSI drivers run on this node
//! (upstream `nodeinfomanager`): the `CSINode` object named after the node (owned by the
//! `Node`), one entry per driver with its node id, topology keys and volume limit; the
//! node's `csi.volume.kubernetes.io/nodeid` annotation (a JSON map of driver → node id);
//! and the driver's topology segments as node labels.

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

use super::NODE_ID_ANNOTATION;

/// Writes what drivers the node has.
#[async_trait]
pub trait NodeInfoUpdater: Send + Sync + std::fmt::Debug {
    /// Creates the node's `CSINode` when it has none (at start, before any driver).
    async fn init(&self) -> Result<(), String>;
    /// Records driver `driver`.
    async fn add_driver(
        &self,
        driver: &str,
        node_id: &str,
        max_volumes: i64,
        topology: &BTreeMap<String, String>,
    ) -> Result<(), String>;
    /// Removes driver `driver`.
    async fn remove_driver(&self, driver: &str) -> Result<(), String>;
}

/// No API server: nothing to write (standalone mode, tests).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoNodeInfo;

#[async_trait]
impl NodeInfoUpdater for NoNodeInfo {
    async fn init(&self) -> Result<(), String> {
        Ok(())
    }

    async fn add_driver(&self, _: &str, _: &str, _: i64, _: &BTreeMap<String, String>) -> Result<(), String> {
        Ok(())
    }

    async fn remove_driver(&self, _: &str) -> Result<(), String> {
        Ok(())
    }
}

/// The node objects on the API server.
#[derive(Clone)]
pub struct KubeNodeInfo {
    client: kube::Client,
    node_name: String,
}

impl std::fmt::Debug for KubeNodeInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeNodeInfo").field("node_name", &self.node_name).finish_non_exhaustive()
    }
}

/// How often a conflicting `CSINode` update is tried again.
const CONFLICT_RETRIES: usize = 5;

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// The driver entry of a `CSINode`.
#[must_use]
pub fn driver_entry(
    driver: &str,
    node_id: &str,
    max_volumes: i64,
    topology: &BTreeMap<String, String>,
) -> CSINodeDriver {
    CSINodeDriver {
        name: driver.to_owned(),
        node_id: node_id.to_owned(),
        topology_keys: (!topology.is_empty()).then(|| topology.keys().cloned().collect()),
        allocatable: (max_volumes > 0)
            .then(|| VolumeNodeResources { count: Some(i32::try_from(max_volumes).unwrap_or(i32::MAX)) }),
    }
}

/// The annotation's value with `driver` set to `node_id` (or removed when `None`); `None`
/// when no driver is left.
#[must_use]
pub fn updated_annotation(current: Option<&str>, driver: &str, node_id: Option<&str>) -> Option<String> {
    let mut ids: BTreeMap<String, String> = current.and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default();
    match node_id {
        Some(id) => ids.insert(driver.to_owned(), id.to_owned()),
        None => ids.remove(driver),
    };
    (!ids.is_empty()).then(|| serde_json::to_string(&ids).expect("a string map serializes"))
}

impl KubeNodeInfo {
    #[must_use]
    pub fn new(client: kube::Client, node_name: String) -> Self {
        Self { client, node_name }
    }

    async fn node(&self) -> Result<Node, String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes.get(&self.node_name).await.map_err(|e| format!("getting node {:?}: {e}", self.node_name))
    }

    /// Sets or removes the driver in the node's annotation and adds its topology labels.
    async fn update_node(
        &self,
        driver: &str,
        node_id: Option<&str>,
        topology: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        let node = self.node().await?;
        let current = node.metadata.annotations.as_ref().and_then(|a| a.get(NODE_ID_ANNOTATION));
        let value = updated_annotation(current.map(String::as_str), driver, node_id);
        if value.as_ref() == current
            && topology.iter().all(|(k, v)| node.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v))
        {
            return Ok(());
        }
        let patch = serde_json::json!({
            "metadata": {
                "annotations": { NODE_ID_ANNOTATION: value },
                "labels": topology,
            }
        });
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes
            .patch(&self.node_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| format!("updating node {:?}: {e}", self.node_name))
    }

    /// Applies `edit` to the node's `CSINode` (created when missing), retrying conflicts.
    async fn update_csi_node(&self, edit: impl Fn(&mut Vec<CSINodeDriver>)) -> Result<(), String> {
        let api: Api<CSINode> = Api::all(self.client.clone());
        for _ in 0..CONFLICT_RETRIES {
            let existing = api.get_opt(&self.node_name).await.map_err(|e| format!("getting CSINode: {e}"))?;
            let result = if let Some(mut csi_node) = existing {
                let before = csi_node.spec.drivers.clone();
                edit(&mut csi_node.spec.drivers);
                if csi_node.spec.drivers == before {
                    return Ok(());
                }
                api.replace(&self.node_name, &PostParams::default(), &csi_node).await.map(|_| ())
            } else {
                let node = self.node().await?;
                let mut drivers = Vec::new();
                edit(&mut drivers);
                let csi_node = CSINode {
                    metadata: kube::api::ObjectMeta {
                        name: Some(self.node_name.clone()),
                        owner_references: Some(vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            name: self.node_name.clone(),
                            uid: node.metadata.uid.unwrap_or_default(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    },
                    spec: CSINodeSpec { drivers },
                    status: None,
                };
                api.create(&PostParams::default(), &csi_node).await.map(|_| ())
            };
            match result {
                Ok(()) => return Ok(()),
                Err(e) if is_conflict(&e) => {}
                Err(e) => return Err(format!("writing CSINode {:?}: {e}", self.node_name)),
            }
        }
        Err(format!("writing CSINode {:?}: conflicts {CONFLICT_RETRIES} times in a row", self.node_name))
    }
}

#[async_trait]
impl NodeInfoUpdater for KubeNodeInfo {
    async fn init(&self) -> Result<(), String> {
        self.update_csi_node(|_| {}).await
    }

    async fn add_driver(
        &self,
        driver: &str,
        node_id: &str,
        max_volumes: i64,
        topology: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        self.update_node(driver, Some(node_id), topology).await?;
        let entry = driver_entry(driver, node_id, max_volumes, topology);
        self.update_csi_node(|drivers| {
            drivers.retain(|d| d.name != entry.name);
            drivers.push(entry.clone());
        })
        .await
    }

    async fn remove_driver(&self, driver: &str) -> Result<(), String> {
        self.update_csi_node(|drivers| drivers.retain(|d| d.name != driver)).await?;
        self.update_node(driver, None, &BTreeMap::new()).await
    }
}
