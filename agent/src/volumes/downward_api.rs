//! The downward API: pod fields and container resources as file contents (the
//! `downwardAPI` volume and the `downwardAPI` source of a projected volume) and as
//! environment values (`resourceFieldRef`). Upstream `pkg/fieldpath`,
//! `pkg/api/v1/resource` (`ExtractContainerResourceValue`) and
//! `pkg/volume/downwardapi` (`CollectData`).
//!
//! Resources a container does not limit are reported as the node's allocatable amount
//! (upstream `defaultPodLimitsForDownwardAPI`), after the pod-level limit when the pod has
//! one. This agent reserves nothing yet, so allocatable is the node's capacity:
//! [`NodeAllocatable::detect`].

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, DownwardAPIVolumeFile, Pod, ResourceFieldSelector};

use super::atomic_writer::{FileProjection, Payload};
use crate::types::pod_resources::{self, ResourceList};
use crate::types::quantity::{self, ParsedQuantity};
use crate::types::resource_names::{CPU, EPHEMERAL_STORAGE, MEMORY, is_hugepage_resource_name};

/// Errors of the downward API.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A `fieldRef.fieldPath` this source cannot provide.
    #[error("unsupported fieldPath: {0}")]
    UnsupportedFieldPath(String),
    /// A `resourceFieldRef.resource` that is not a container resource.
    #[error("unsupported container resource : {0}")]
    UnsupportedResource(String),
    /// `resourceFieldRef.containerName` names no container of the pod.
    #[error("container {0} not found")]
    ContainerNotFound(String),
    /// A `divisor` that does not parse.
    #[error("invalid divisor: {0}")]
    Divisor(#[from] quantity::Error),
    /// An item has neither `fieldRef` nor `resourceFieldRef`.
    #[error("downward API item {0:?} has neither fieldRef nor resourceFieldRef")]
    EmptyItem(String),
    /// Several items failed (Go's `utilerrors.NewAggregate` format).
    #[error("[{}]", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    Aggregate(Vec<Error>),
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a node offers to pods: the defaults for limits a container does not set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeAllocatable {
    /// CPU in millicores.
    pub cpu_milli: i64,
    /// Memory in bytes.
    pub memory: i64,
    /// Ephemeral storage in bytes (the file system of the root dir).
    pub ephemeral_storage: i64,
}

impl NodeAllocatable {
    /// The node's capacity: CPUs this process may run on (what `nproc` prints), `MemTotal`
    /// of `/proc/meminfo` (the cm module's probe), and the size of the file system holding
    /// `root_dir` (its nearest existing ancestor).
    #[must_use]
    pub fn detect(root_dir: &Path) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let memory = crate::cm::resources::ContainerResourceOptions::host().memory_capacity;
        let ephemeral_storage = root_dir.ancestors().find_map(fs_capacity).unwrap_or(0);
        Self { cpu_milli: cpus as i64 * 1000, memory, ephemeral_storage }
    }

    fn as_limits(&self) -> ResourceList {
        ResourceList::from([
            (CPU.to_string(), ParsedQuantity::from_milli(self.cpu_milli)),
            (MEMORY.to_string(), ParsedQuantity::from_units(self.memory)),
            (EPHEMERAL_STORAGE.to_string(), ParsedQuantity::from_units(self.ephemeral_storage)),
        ])
    }
}

/// Total bytes of the file system holding `path`, if `path` exists.
fn fs_capacity(path: &Path) -> Option<i64> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid NUL-terminated path and `st` points to writable memory of the
    // right type; statvfs(2) fills it on success, and we read it only then.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so the struct is initialized.
    let st = unsafe { st.assume_init() };
    Some((u128::from(st.f_blocks) * u128::from(st.f_frsize)).min(i64::MAX as u128) as i64)
}

/// Upstream `FormatMap`: `key="value"` lines sorted by key, values quoted as Go does.
#[must_use]
pub fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", crate::probe::format::quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Upstream `ExtractFieldPathAsString` for the metadata fields both volumes and env offer:
/// name, namespace, uid, labels, annotations and `labels['k']` / `annotations['k']` (empty
/// when the key is absent).
pub fn metadata_field(pod: &Pod, path: &str) -> Result<String> {
    let m = &pod.metadata;
    let subscript = |prefix: &str, map: Option<&BTreeMap<String, String>>| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix("']"))
            .map(|k| map.and_then(|m| m.get(k)).cloned().unwrap_or_default())
    };
    Ok(match path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(m.labels.as_ref()),
        "metadata.annotations" => format_map(m.annotations.as_ref()),
        _ => subscript("metadata.labels['", m.labels.as_ref())
            .or_else(|| subscript("metadata.annotations['", m.annotations.as_ref()))
            .ok_or_else(|| Error::UnsupportedFieldPath(path.to_owned()))?,
    })
}

/// Finds a container (regular, init, restartable init) by name.
fn find_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == name)
}

fn ceil_div(value: i128, divisor: i128) -> i64 {
    if divisor <= 0 {
        return 0;
    }
    let q = value.div_euclid(divisor) + i128::from(value.rem_euclid(divisor) != 0);
    q.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// Upstream `ExtractContainerResourceValue` over a container whose missing limits were
/// defaulted (pod-level limit, then node allocatable): `limits.*` / `requests.*` of cpu,
/// memory, ephemeral-storage and huge pages, divided by `divisor` and rounded up.
pub fn container_resource_value(
    pod: &Pod,
    container: &Container,
    selector: &ResourceFieldSelector,
    node: &NodeAllocatable,
) -> Result<String> {
    let divisor = match &selector.divisor {
        Some(q) if !quantity::parse(&q.0)?.is_zero() => quantity::parse(&q.0)?,
        _ => ParsedQuantity::from_units(1),
    };
    let (kind, name) =
        selector.resource.split_once('.').ok_or_else(|| Error::UnsupportedResource(selector.resource.clone()))?;
    let is_huge = is_hugepage_resource_name(name);
    if ![CPU, MEMORY, EPHEMERAL_STORAGE].contains(&name) && !is_huge {
        return Err(Error::UnsupportedResource(selector.resource.clone()));
    }
    let list = match kind {
        "limits" => defaulted_limits(pod, container, node),
        "requests" => pod_resources::container_requests(container),
        _ => return Err(Error::UnsupportedResource(selector.resource.clone())),
    };
    let value = pod_resources::get(&list, name);
    let n = if name == CPU {
        ceil_div(i128::from(value.milli_value_saturating()), i128::from(divisor.milli_value_saturating()))
    } else {
        ceil_div(i128::from(value.value_saturating()), i128::from(divisor.value_saturating()))
    };
    Ok(n.to_string())
}

/// The container's limits with cpu, memory and ephemeral-storage filled in where absent:
/// from the pod-level limits, else from the node.
fn defaulted_limits(pod: &Pod, container: &Container, node: &NodeAllocatable) -> ResourceList {
    let mut limits = pod_resources::container_limits(container);
    let pod_limits = pod_resources::pod_level_limits(pod);
    for (name, node_value) in node.as_limits() {
        if pod_resources::get(&limits, &name).is_zero() {
            let v = pod_limits.get(&name).copied().filter(|q| !q.is_zero()).unwrap_or(node_value);
            limits.insert(name, v);
        }
    }
    limits
}

/// Like [`container_resource_value`], for `selector.containerName` (required in volumes).
pub fn resource_value_by_container_name(
    pod: &Pod,
    selector: &ResourceFieldSelector,
    node: &NodeAllocatable,
) -> Result<String> {
    let name = selector.container_name.clone().unwrap_or_default();
    let c = find_container(pod, &name).ok_or(Error::ContainerNotFound(name))?;
    container_resource_value(pod, c, selector, node)
}

/// Upstream `downwardapi.CollectData`: the payload of a downwardAPI volume (or projection).
/// Every item is tried; the errors of all failing items are reported together.
pub fn collect_data(
    items: &[DownwardAPIVolumeFile],
    pod: &Pod,
    node: &NodeAllocatable,
    default_mode: u32,
) -> Result<Payload> {
    let mut payload = Payload::new();
    let mut errors = Vec::new();
    for item in items {
        let data = if let Some(f) = &item.field_ref {
            metadata_field(pod, &f.field_path)
        } else if let Some(r) = &item.resource_field_ref {
            resource_value_by_container_name(pod, r, node)
        } else {
            Err(Error::EmptyItem(item.path.clone()))
        };
        match data {
            Ok(data) => {
                let mode = item.mode.map_or(default_mode, |m| m as u32);
                payload.insert(item.path.clone(), FileProjection::new(data, mode));
            }
            Err(e) => errors.push(e),
        }
    }
    match errors.len() {
        0 => Ok(payload),
        1 => Err(errors.remove(0)),
        _ => Err(Error::Aggregate(errors)),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    const NODE: NodeAllocatable = NodeAllocatable { cpu_milli: 4000, memory: 8 << 30, ephemeral_storage: 100 << 30 };

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1",
                         "labels": {"b": "2", "a": "x\"y\n"}, "annotations": {"k": "v"}},
            "spec": {"containers": [
                {"name": "c", "resources": {"limits": {"cpu": "500m", "memory": "128Mi"},
                                            "requests": {"cpu": "250m"}}},
                {"name": "free"}
            ]}
        }))
        .unwrap()
    }

    fn sel(resource: &str, container: &str, divisor: Option<&str>) -> ResourceFieldSelector {
        ResourceFieldSelector {
            resource: resource.into(),
            container_name: Some(container.into()),
            divisor: divisor.map(|d| Quantity(d.into())),
        }
    }

    #[test]
    fn metadata_fields() {
        let p = pod();
        assert_eq!(metadata_field(&p, "metadata.name").unwrap(), "p");
        assert_eq!(metadata_field(&p, "metadata.uid").unwrap(), "u-1");
        assert_eq!(metadata_field(&p, "metadata.labels").unwrap(), "a=\"x\\\"y\\n\"\nb=\"2\"");
        assert_eq!(metadata_field(&p, "metadata.labels['b']").unwrap(), "2");
        assert_eq!(metadata_field(&p, "metadata.annotations['none']").unwrap(), "");
        assert_eq!(
            metadata_field(&p, "spec.nodeName").unwrap_err().to_string(),
            "unsupported fieldPath: spec.nodeName"
        );
    }

    #[test]
    fn resources_with_divisors_and_node_defaults() {
        let p = pod();
        let v = |r: &str, c: &str, d: Option<&str>| resource_value_by_container_name(&p, &sel(r, c, d), &NODE);
        assert_eq!(v("limits.cpu", "c", None).unwrap(), "1"); // 500m rounds up to 1
        assert_eq!(v("limits.cpu", "c", Some("1m")).unwrap(), "500");
        assert_eq!(v("requests.cpu", "c", Some("1m")).unwrap(), "250");
        assert_eq!(v("limits.memory", "c", Some("1Mi")).unwrap(), "128");
        assert_eq!(v("requests.memory", "c", None).unwrap(), "134217728"); // defaulted from the limit
        assert_eq!(v("limits.cpu", "free", Some("1m")).unwrap(), "4000");
        assert_eq!(v("limits.memory", "free", Some("1Gi")).unwrap(), "8");
        assert_eq!(v("limits.ephemeral-storage", "free", Some("1Gi")).unwrap(), "100");
        assert_eq!(v("requests.cpu", "free", None).unwrap(), "0");
        assert_eq!(v("limits.cpu", "nope", None).unwrap_err().to_string(), "container nope not found");
        assert_eq!(v("limits.gpu", "c", None).unwrap_err().to_string(), "unsupported container resource : limits.gpu");
    }

    #[test]
    fn pod_level_limits_come_before_the_node() {
        let p = pod_resources::test_pods::with_pod_resources(pod(), &[], &[("cpu", "2")]);
        let v = resource_value_by_container_name(&p, &sel("limits.cpu", "free", Some("1m")), &NODE).unwrap();
        assert_eq!(v, "2000");
    }

    #[test]
    fn collects_a_payload() {
        let items: Vec<DownwardAPIVolumeFile> = serde_json::from_value(serde_json::json!([
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
            {"path": "dir/labels", "fieldRef": {"fieldPath": "metadata.labels"}, "mode": 0o400},
            {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu", "divisor": "1m"}}
        ]))
        .unwrap();
        let payload = collect_data(&items, &pod(), &NODE, 0o644).unwrap();
        assert_eq!(payload["name"], FileProjection::new("p", 0o644));
        assert_eq!(payload["dir/labels"].mode, 0o400);
        assert_eq!(payload["cpu"].data, b"500");
        let bad: Vec<DownwardAPIVolumeFile> = serde_json::from_value(serde_json::json!([
            {"path": "a", "fieldRef": {"fieldPath": "spec.nodeName"}},
            {"path": "b", "resourceFieldRef": {"containerName": "x", "resource": "limits.cpu"}}
        ]))
        .unwrap();
        let err = collect_data(&bad, &pod(), &NODE, 0o644).unwrap_err().to_string();
        assert_eq!(err, "[unsupported fieldPath: spec.nodeName, container x not found]");
        assert!(NodeAllocatable::detect(Path::new("/nonexistent/dir")).cpu_milli >= 1000);
    }
}
