//! The Summary API (`stats/v1alpha1`, `k8s.io/kubelet/pkg/apis/stats/v1alpha1/types.go`):
//! what `/stats/summary` serves and metrics-server reads.
//!
//! Field names, order and omit-empty behaviour are the Go structs': every `*T` with
//! `omitempty` is an `Option` skipped when `None`, every slice with `omitempty` is a `Vec`
//! skipped when empty, and the fields without `omitempty` are always written (a
//! [`NetworkStats`] without an `eth0` still carries `"name": ""`, as upstream's inlined
//! `InterfaceStats` does). Times are `metav1.Time`: RFC 3339 in UTC truncated to the second,
//! and `null` for the zero time ([`Time`]).
//!
//! Includes the fields newer kubelets added after 1.28 (`runtime.containerFs`, the PSI
//! `psi` blocks in [`CpuStats`]/[`MemoryStats`] and the `io` [`IoStats`] of nodes, pods and
//! containers, `KEP-4205`); they are omitted when empty, so a 1.28-shaped document
//! round-trips unchanged. PSI `total` is the kernel's `total=` value verbatim
//! (microseconds), as upstream passes it through despite its "nanoseconds" comment.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `metav1.Time`: an instant serialized as RFC 3339 UTC with whole seconds, or `null`
/// when zero. Keeps full precision in memory (the `/metrics/resource` sample timestamps
/// are milliseconds of the same times).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(pub Option<SystemTime>);

impl Time {
    /// The zero time (`null` on the wire).
    #[must_use]
    pub const fn zero() -> Self {
        Self(None)
    }

    /// Whether this is the zero time.
    #[must_use]
    pub const fn is_zero(&self) -> bool {
        self.0.is_none()
    }

    /// Milliseconds since the Unix epoch (negative before it), as the Prometheus client
    /// computes sample timestamps; `None` for the zero time.
    #[must_use]
    pub fn unix_millis(&self) -> Option<i64> {
        let t = self.0?;
        Some(match t.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_secs() as i64 * 1000 + i64::from(d.subsec_millis()),
            Err(e) => -(e.duration().as_millis() as i64),
        })
    }

    /// Seconds since the Unix epoch with the sub-second part (`UnixNano()/1e9`).
    #[must_use]
    pub fn unix_seconds_f64(&self) -> Option<f64> {
        let t = self.0?;
        Some(match t.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_secs_f64(),
            Err(e) => -e.duration().as_secs_f64(),
        })
    }

    /// Whole seconds since the epoch (`Unix()`), flooring; `None` for the zero time.
    fn unix_seconds(self) -> Option<i64> {
        let t = self.0?;
        Some(match t.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_secs() as i64,
            Err(e) => {
                let d = e.duration();
                -(d.as_secs() as i64) - i64::from(d.subsec_nanos() > 0)
            }
        })
    }
}

impl From<SystemTime> for Time {
    fn from(t: SystemTime) -> Self {
        Self(Some(t))
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.unix_seconds().and_then(|s| jiff::Timestamp::from_second(s).ok()) {
            // jiff prints no fractional part for a whole second: `2026-11-30T17:28:09Z`.
            Some(ts) => serializer.collect_str(&ts),
            None => serializer.serialize_none(),
        }
    }
}

impl<'de> Deserialize<'de> for Time {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Some(s) = Option::<String>::deserialize(deserializer)? else {
            return Ok(Self::zero());
        };
        if s.is_empty() {
            return Ok(Self::zero());
        }
        let ts: jiff::Timestamp = s.parse().map_err(serde::de::Error::custom)?;
        let nanos = ts.as_nanosecond();
        let t = if nanos >= 0 {
            UNIX_EPOCH + Duration::from_nanos(nanos as u64)
        } else {
            UNIX_EPOCH - Duration::from_nanos(nanos.unsigned_abs() as u64)
        };
        Ok(Self(Some(t)))
    }
}

/// Deserializes `null` as the default value (Go writes `null` for a nil slice).
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// Serializes a float as Go's `encoding/json` does for the values these documents hold:
/// integral values without a fractional part (`0`, not `0.0`).
#[allow(clippy::trivially_copy_pass_by_ref)] // serde's `serialize_with` signature
fn go_float<S: Serializer>(v: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        serializer.serialize_i64(*v as i64)
    } else {
        serializer.serialize_f64(*v)
    }
}

/// System container name: the kubelet's own cgroup (`kubeletCgroups`).
pub const SYSTEM_CONTAINER_KUBELET: &str = "kubelet";
/// System container name: the container runtime's cgroup (`runtimeCgroups`).
pub const SYSTEM_CONTAINER_RUNTIME: &str = "runtime";
/// System container name: non-Kubernetes processes (`systemCgroups`).
pub const SYSTEM_CONTAINER_MISC: &str = "misc";
/// System container name: the cgroup holding all pods (`kubepods`).
pub const SYSTEM_CONTAINER_PODS: &str = "pods";

/// The whole document: node-level stats and per-pod stats.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Overall node stats.
    pub node: NodeStats,
    /// Per-pod stats.
    #[serde(default, deserialize_with = "null_as_default")]
    pub pods: Vec<PodStats>,
}

/// Node-level stats.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    /// The node's name.
    #[serde(default)]
    pub node_name: String,
    /// System daemons tracked as raw cgroups (`pods`, `kubelet`, `runtime`, `misc`).
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "null_as_default")]
    pub system_containers: Vec<ContainerStats>,
    /// When node-level collection (re)started: the boot time.
    #[serde(default)]
    pub start_time: Time,
    /// CPU of the whole node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory of the whole node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// IO pressure of the node (newer kubelets, PSI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
    /// Network of the host network namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// The filesystem holding the kubelet's root directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    /// Container runtime filesystems.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    /// Process limits of the OS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
    /// Swap of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
}

/// Process limits (`RlimitStats`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RlimitStats {
    /// When read.
    #[serde(default)]
    pub time: Time,
    /// The task ceiling: the smaller of `kernel.pid_max` and `kernel.threads-max`.
    #[serde(default, rename = "maxpid", skip_serializing_if = "Option::is_none")]
    pub max_pid: Option<i64>,
    /// The number of tasks (threads) in the OS.
    #[serde(default, rename = "curproc", skip_serializing_if = "Option::is_none")]
    pub num_of_running_processes: Option<i64>,
}

/// Container runtime filesystems (`RuntimeStats`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    /// Where images are stored; `usedBytes` is what images occupy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
    /// Where writable layers are stored (newer kubelets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_fs: Option<FsStats>,
}

/// Number of processes (`ProcessStats`; the JSON names are snake case upstream).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStats {
    /// Number of processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_count: Option<u64>,
}

/// Pod-level stats.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    /// Which pod.
    #[serde(default)]
    pub pod_ref: PodReference,
    /// The sandbox creation time.
    #[serde(default)]
    pub start_time: Time,
    /// The pod's running containers (not the sandbox).
    #[serde(default, deserialize_with = "null_as_default")]
    pub containers: Vec<ContainerStats>,
    /// CPU of the pod cgroup (containers and overhead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory of the pod cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// Network of the pod's network namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// Volumes: local ephemeral ones first, then the others.
    #[serde(default, rename = "volume", skip_serializing_if = "Vec::is_empty", deserialize_with = "null_as_default")]
    pub volume_stats: Vec<VolumeStats>,
    /// Writable layers, logs, local ephemeral volumes and `etc-hosts` together.
    #[serde(default, rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<FsStats>,
    /// Processes of the containers.
    #[serde(default, rename = "process_stats", skip_serializing_if = "Option::is_none")]
    pub process_stats: Option<ProcessStats>,
    /// Swap of the pod cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
    /// IO pressure of the pod cgroup (newer kubelets, PSI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
}

/// Container-level stats (also used for system containers).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    /// Container name (or system container name).
    #[serde(default)]
    pub name: String,
    /// The container creation time.
    #[serde(default)]
    pub start_time: Time,
    /// CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// Accelerators (never filled by swiftlet).
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "null_as_default")]
    pub accelerators: Vec<AcceleratorStats>,
    /// The writable layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    /// The container's log files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
    /// User-defined metrics (never filled by swiftlet; CRI has none either).
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "null_as_default")]
    pub user_defined_metrics: Vec<UserDefinedMetric>,
    /// Swap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapStats>,
    /// IO pressure (newer kubelets, PSI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
}

/// Identifies a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PodReference {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Namespace.
    #[serde(default)]
    pub namespace: String,
    /// UID.
    #[serde(default)]
    pub uid: String,
}

/// One network interface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    /// Interface name (always written, even empty).
    #[serde(default)]
    pub name: String,
    /// Bytes received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    /// Receive errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_errors: Option<u64>,
    /// Bytes transmitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    /// Transmit errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_errors: Option<u64>,
}

/// Network stats: the default interface (`eth0`) inline, then every interface.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkStats {
    /// When read.
    #[serde(default)]
    pub time: Time,
    /// The default interface (`eth0`), if found; empty otherwise.
    #[serde(flatten)]
    pub default_interface: InterfaceStats,
    /// All interfaces but the ignored ones (`lo`, `veth*`, `docker*`, `nerdctl*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "null_as_default")]
    pub interfaces: Vec<InterfaceStats>,
}

/// CPU stats.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// When read.
    #[serde(default)]
    pub time: Time,
    /// CPU usage in nano-cores averaged since the previous collection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// Cumulative CPU time in nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
    /// CPU pressure (newer kubelets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

/// Memory stats.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// When read.
    #[serde(default)]
    pub time: Time,
    /// Limit minus working set; omitted without a limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// All memory charged to the cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    /// Usage minus inactive file pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// Anonymous and swap cache memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Minor page faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    /// Major page faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
    /// Memory pressure (newer kubelets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

/// IO stats: pressure only (newer kubelets).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IoStats {
    /// When read.
    #[serde(default)]
    pub time: Time,
    /// IO pressure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

/// Pressure stall information of one resource.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PsiStats {
    /// At least some tasks stalled.
    #[serde(default)]
    pub some: PsiData,
    /// All non-idle tasks stalled at once.
    #[serde(default)]
    pub full: PsiData,
}

/// One PSI line.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PsiData {
    /// Cumulative stall time (the kernel's `total=`, microseconds).
    #[serde(default)]
    pub total: u64,
    /// Percentage over 10 s.
    #[serde(default, serialize_with = "go_float")]
    pub avg10: f64,
    /// Percentage over 60 s.
    #[serde(default, serialize_with = "go_float")]
    pub avg60: f64,
    /// Percentage over 300 s.
    #[serde(default, serialize_with = "go_float")]
    pub avg300: f64,
}

/// Swap stats.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SwapStats {
    /// When read.
    #[serde(default)]
    pub time: Time,
    /// Swap limit minus swap usage; omitted without a limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_available_bytes: Option<u64>,
    /// Swap in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_usage_bytes: Option<u64>,
}

/// An accelerator (GPU) of a container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcceleratorStats {
    /// Vendor.
    #[serde(default)]
    pub make: String,
    /// Model.
    #[serde(default)]
    pub model: String,
    /// Device id.
    #[serde(default, rename = "id")]
    pub id: String,
    /// Total memory, bytes.
    #[serde(default)]
    pub memory_total: u64,
    /// Memory in use, bytes.
    #[serde(default)]
    pub memory_used: u64,
    /// Busy percentage over the last sample period.
    #[serde(default)]
    pub duty_cycle: u64,
}

/// Volume usage: [`FsStats`] inline, then the volume's name and claim.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    /// Usage of the volume's directory and its filesystem.
    #[serde(flatten)]
    pub fs: FsStats,
    /// The volume's name in the pod spec.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The claim, for persistent volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_ref: Option<PvcReference>,
    /// Volume health (CSI volumes only; never filled by swiftlet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_health_stats: Option<VolumeHealthStats>,
}

/// Health of a volume.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeHealthStats {
    /// Whether the volume is abnormal.
    #[serde(default)]
    pub abnormal: bool,
}

/// A persistent volume claim.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PvcReference {
    /// Claim name.
    #[serde(default)]
    pub name: String,
    /// Claim namespace.
    #[serde(default)]
    pub namespace: String,
}

/// Filesystem usage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    /// When measured.
    #[serde(default)]
    pub time: Time,
    /// Bytes available to unprivileged users on the filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// Size of the filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// Bytes used by what this entry measures (not necessarily the whole filesystem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// Free inodes of the filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    /// Inodes of the filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    /// Inodes used by what this entry measures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

/// How a user-defined metric is interpreted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UserDefinedMetricType {
    /// An instantaneous value.
    #[default]
    Gauge,
    /// A counter.
    Cumulative,
    /// A rate over a period.
    Delta,
}

/// A metric exposed by a container (cAdvisor custom metrics; never filled by swiftlet).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UserDefinedMetric {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Type.
    #[serde(default, rename = "type")]
    pub metric_type: UserDefinedMetricType,
    /// Display units.
    #[serde(default)]
    pub units: String,
    /// Labels.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// When sampled.
    #[serde(default)]
    pub time: Time,
    /// The value.
    #[serde(default, serialize_with = "go_float")]
    pub value: f64,
}
