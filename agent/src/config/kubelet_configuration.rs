//! The `KubeletConfiguration` (`kubelet.config.k8s.io/v1beta1`) as Rust types, with the
//! upstream defaults (`pkg/kubelet/apis/config/v1beta1/defaults.go`).
//!
//! Every upstream v1beta1 field is accepted and stored, so an upstream config file loads
//! unchanged; the module docs of [`crate::config`] list which fields have an effect today.
//! Names on the wire are the upstream camelCase names; `Default` is the defaulted upstream
//! object, and each field's doc names its default.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use serde::{Deserialize, Serialize};

use crate::types::duration::{GoDuration, string_or_nanos};

/// The Linux defaults of `evictionHard`.
pub const DEFAULT_EVICTION_HARD: [(&str, &str); 5] = [
    ("imagefs.available", "15%"),
    ("imagefs.inodesFree", "5%"),
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
];

/// The kubelet's configuration file object. See the module docs for the defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[expect(clippy::struct_excessive_bools, reason = "mirrors the upstream wire type, whose switches are plain booleans")]
pub struct KubeletConfiguration {
    /// Serve the HTTPS API on `address:port`. Default: true.
    pub enable_server: bool,
    /// Directory (or single file) of static pod manifests. Default: "" (none).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub static_pod_path: String,
    /// Root directory of pod log files. Default: "/var/log/pods".
    pub pod_logs_dir: String,
    /// Maximum period between synchronizing running containers and config. Default: "1m".
    pub sync_frequency: GoDuration,
    /// Period between checks of the static pod path. Default: "20s".
    pub file_check_frequency: GoDuration,
    /// Period between checks of the static pod URL. Default: "20s".
    pub http_check_frequency: GoDuration,
    /// URL of static pods. Default: "".
    #[serde(rename = "staticPodURL", skip_serializing_if = "String::is_empty")]
    pub static_pod_url: String,
    /// HTTP headers for `staticPodURL`. Default: none.
    #[serde(rename = "staticPodURLHeader", skip_serializing_if = "BTreeMap::is_empty")]
    pub static_pod_url_header: BTreeMap<String, Vec<String>>,
    /// IP address of the HTTPS API. Default: "0.0.0.0".
    pub address: String,
    /// Port of the HTTPS API. Default: 10250.
    pub port: i32,
    /// Port of the unauthenticated read-only API; 0 disables it. Default: 0.
    pub read_only_port: i32,
    /// Serving certificate (PEM, chain after the leaf). Default: "" (self-signed in certDir).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub tls_cert_file: String,
    /// Key of `tlsCertFile`. Default: "".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub tls_private_key_file: String,
    /// Allowed TLS 1.2 cipher suites, by Go name. Default: none (library defaults).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tls_cipher_suites: Vec<String>,
    /// Allowed key exchange curves (Go `tls.CurveID` numbers). Default: none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tls_curve_preferences: Vec<i32>,
    /// Minimum TLS version (`VersionTLS12`, `VersionTLS13`). Default: "" (TLS 1.2).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub tls_min_version: String,
    /// Rotate the client certificate through the certificates API. Default: false.
    pub rotate_certificates: bool,
    /// Request the serving certificate from the certificates API. Default: false.
    #[serde(rename = "serverTLSBootstrap")]
    pub server_tls_bootstrap: bool,
    /// How requests to the HTTPS API are authenticated.
    pub authentication: KubeletAuthentication,
    /// How requests to the HTTPS API are authorized.
    pub authorization: KubeletAuthorization,
    /// Image pulls per second; 0 means no limit. Default: 5.
    #[serde(rename = "registryPullQPS")]
    pub registry_pull_qps: i32,
    /// Burst of image pulls above `registryPullQPS`. Default: 10.
    pub registry_burst: i32,
    /// How credentials of images already on the node are verified. Default: "".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub image_pull_credentials_verification_policy: String,
    /// Images exempt from credential verification. Default: none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preloaded_images_verification_allowlist: Vec<String>,
    /// Event creations per second; 0 means no limit. Default: 50.
    #[serde(rename = "eventRecordQPS")]
    pub event_record_qps: i32,
    /// Burst of event creations. Default: 100.
    pub event_burst: i32,
    /// Serve logs, exec, attach, port-forward and the debug handlers. Default: true.
    pub enable_debugging_handlers: bool,
    /// Block profiling (with the debugging handlers). Default: false.
    pub enable_contention_profiling: bool,
    /// Port of the plain-HTTP healthz endpoint; 0 disables it. Default: 10248.
    pub healthz_port: i32,
    /// IP address of the healthz endpoint. Default: "127.0.0.1".
    pub healthz_bind_address: String,
    /// `oom_score_adj` of the agent process, in [-1000, 1000]. Default: -999.
    #[serde(rename = "oomScoreAdj")]
    pub oom_score_adj: i32,
    /// DNS domain of the cluster, added to pods' search list. Default: "".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cluster_domain: String,
    /// IP addresses of the cluster DNS servers. Default: none.
    #[serde(rename = "clusterDNS", skip_serializing_if = "Vec::is_empty")]
    pub cluster_dns: Vec<String>,
    /// Idle timeout of streaming connections (deprecated upstream). Default: "4h".
    pub streaming_connection_idle_timeout: GoDuration,
    /// Period of computing the node status. Default: "10s".
    pub node_status_update_frequency: GoDuration,
    /// Period of posting an unchanged node status. Default: "5m", or
    /// `nodeStatusUpdateFrequency` when only that one is set.
    pub node_status_report_frequency: GoDuration,
    /// Duration of the node Lease. Default: 40.
    pub node_lease_duration_seconds: i32,
    /// Minimum age of an unused image before image GC may remove it. Default: "2m".
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: GoDuration,
    /// Maximum age of an unused image; "0s" disables. Default: "0s".
    #[serde(rename = "imageMaximumGCAge")]
    pub image_maximum_gc_age: GoDuration,
    /// Disk usage percent above which image GC always runs. Default: 85.
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: i32,
    /// Disk usage percent image GC frees down to. Default: 80.
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: i32,
    /// Period of volume disk usage computation. Default: "1m".
    pub volume_stats_agg_period: GoDuration,
    /// cgroup of the agent itself. Default: "".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kubelet_cgroups: String,
    /// cgroup for non-kernel processes outside containers. Default: "".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub system_cgroups: String,
    /// Root cgroup of pods. Default: "/" (upstream's default "" means "/").
    pub cgroup_root: String,
    /// QoS-class cgroups (`kubepods/burstable`, `kubepods/besteffort`). Default: true.
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: bool,
    /// `cgroupfs` or `systemd`. Default: "cgroupfs".
    pub cgroup_driver: String,
    /// CPU manager policy (`none`, `static`). Default: "none".
    #[serde(rename = "cpuManagerPolicy")]
    pub cpu_manager_policy: String,
    /// Kill container processes one by one on OOM (cgroup v2). Default: unset (automatic).
    #[serde(rename = "singleProcessOOMKill", skip_serializing_if = "Option::is_none")]
    pub single_process_oom_kill: Option<bool>,
    /// Options of the CPU manager policy. Default: none.
    #[serde(rename = "cpuManagerPolicyOptions", skip_serializing_if = "BTreeMap::is_empty")]
    pub cpu_manager_policy_options: BTreeMap<String, String>,
    /// Reconcile period of the CPU manager. Default: "10s".
    #[serde(rename = "cpuManagerReconcilePeriod")]
    pub cpu_manager_reconcile_period: GoDuration,
    /// Reconcile period of the DRA manager. Default: "1m".
    #[serde(rename = "draManagerReconcilePeriod")]
    pub dra_manager_reconcile_period: GoDuration,
    /// Memory manager policy (`None`, `Static`). Default: "None".
    pub memory_manager_policy: String,
    /// Topology manager policy. Default: "none".
    pub topology_manager_policy: String,
    /// Topology manager scope (`container`, `pod`). Default: "container".
    pub topology_manager_scope: String,
    /// Options of the topology manager policy. Default: none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub topology_manager_policy_options: BTreeMap<String, String>,
    /// Percent of resources reserved for Guaranteed pods. Default: none.
    #[serde(rename = "qosReserved", skip_serializing_if = "BTreeMap::is_empty")]
    pub qos_reserved: BTreeMap<String, String>,
    /// Timeout of runtime requests other than pull, logs, exec and attach. Default: "2m".
    pub runtime_request_timeout: GoDuration,
    /// `promiscuous-bridge`, `hairpin-veth` or `none`. Default: "promiscuous-bridge".
    pub hairpin_mode: String,
    /// Maximum number of pods on the node. Default: 110.
    pub max_pods: i32,
    /// Pod CIDR in standalone mode. Default: "".
    #[serde(rename = "podCIDR", skip_serializing_if = "String::is_empty")]
    pub pod_cidr: String,
    /// Maximum PIDs per pod; -1 means the node allocatable limit. Default: -1.
    pub pod_pids_limit: i64,
    /// Resolver configuration the pods' DNS config is based on. Default: "/etc/resolv.conf".
    pub resolv_conf: String,
    /// Run the API pods once and exit (deprecated; rejected). Default: false.
    pub run_once: bool,
    /// Enforce CPU limits with CFS quota. Default: true.
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: bool,
    /// CFS quota period. Default: "100ms".
    #[serde(rename = "cpuCFSQuotaPeriod")]
    pub cpu_cfs_quota_period: GoDuration,
    /// Images reported in the node status; -1 means no cap. Default: 50.
    pub node_status_max_images: i32,
    /// `RLIMIT_NOFILE` of the agent. Default: 1000000.
    pub max_open_files: i64,
    /// Content type of API requests. Default: "application/vnd.kubernetes.protobuf".
    pub content_type: String,
    /// API requests per second. Default: 50.
    #[serde(rename = "kubeAPIQPS")]
    pub kube_api_qps: i32,
    /// Burst of API requests. Default: 100.
    #[serde(rename = "kubeAPIBurst")]
    pub kube_api_burst: i32,
    /// Pull one image at a time. Default: true, or false when `maxParallelImagePulls` >= 2.
    pub serialize_image_pulls: bool,
    /// Maximum parallel image pulls. Default: unset (no limit when not serialized).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_parallel_image_pulls: Option<i32>,
    /// Hard eviction thresholds by signal. Default: `memory.available` 100Mi,
    /// `nodefs.available` 10%, `nodefs.inodesFree` 5%, `imagefs.available` 15%,
    /// `imagefs.inodesFree` 5%.
    pub eviction_hard: BTreeMap<String, String>,
    /// Soft eviction thresholds by signal. Default: none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_soft: BTreeMap<String, String>,
    /// Grace periods of the soft thresholds. Default: none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    /// Time before leaving an eviction pressure condition. Default: "5m".
    pub eviction_pressure_transition_period: GoDuration,
    /// Maximum grace period (seconds) of soft evictions. Default: 0.
    pub eviction_max_pod_grace_period: i32,
    /// Minimum reclaim by signal. Default: none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_minimum_reclaim: BTreeMap<String, String>,
    /// Merge the default `evictionHard` into a given one. Default: false.
    pub merge_default_eviction_settings: bool,
    /// Maximum pods per core; 0 means no limit. Default: 0.
    pub pods_per_core: i32,
    /// Leave volume attach/detach to the controller. Default: true.
    pub enable_controller_attach_detach: bool,
    /// Fail instead of tuning kernel flags. Default: false.
    pub protect_kernel_defaults: bool,
    /// Create the `KUBE-IPTABLES-HINT` chain. Default: true.
    #[serde(rename = "makeIPTablesUtilChains")]
    pub make_iptables_util_chains: bool,
    /// No effect upstream (deprecated). Default: 14.
    pub iptables_masquerade_bit: i32,
    /// No effect upstream (deprecated). Default: 15.
    pub iptables_drop_bit: i32,
    /// Feature gates by name. Default: none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    /// Refuse to start when swap is on. Default: true.
    pub fail_swap_on: bool,
    /// Swap available to workloads.
    pub memory_swap: MemorySwapConfiguration,
    /// Size at which a container log is rotated. Default: "10Mi".
    pub container_log_max_size: String,
    /// Container log files kept per container. Default: 5.
    pub container_log_max_files: i32,
    /// Parallel log rotation workers. Default: 1.
    pub container_log_max_workers: i32,
    /// Period of the log rotation check. Default: "10s".
    pub container_log_monitor_interval: GoDuration,
    /// `Get`, `Cache` or `Watch`. Default: "Watch".
    pub config_map_and_secret_change_detection_strategy: String,
    /// Resources reserved for the system. Default: none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub system_reserved: BTreeMap<String, String>,
    /// Resources reserved for Kubernetes daemons. Default: none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub kube_reserved: BTreeMap<String, String>,
    /// CPUs reserved for system and Kubernetes daemons. Default: "".
    #[serde(rename = "reservedSystemCPUs", skip_serializing_if = "String::is_empty")]
    pub reserved_system_cpus: String,
    /// Previous version whose hidden metrics are shown. Default: "".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub show_hidden_metrics_for_version: String,
    /// cgroup that enforces `systemReserved`. Default: "".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub system_reserved_cgroup: String,
    /// cgroup that enforces `kubeReserved`. Default: "".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kube_reserved_cgroup: String,
    /// Node allocatable enforcements. Default: `["pods"]`.
    pub enforce_node_allocatable: Vec<String>,
    /// Allowed unsafe sysctls (patterns). Default: none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_unsafe_sysctls: Vec<String>,
    /// Directory of flex volume plugins.
    /// Default: "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/".
    pub volume_plugin_dir: String,
    /// Provider ID of the node. Default: "".
    #[serde(rename = "providerID", skip_serializing_if = "String::is_empty")]
    pub provider_id: String,
    /// Memcg notifications for memory eviction. Default: false.
    pub kernel_memcg_notification: bool,
    /// Log format and verbosity.
    pub logging: LoggingConfiguration,
    /// Serve `/logs/`. Default: true.
    pub enable_system_log_handler: bool,
    /// Node log query on `/logs/`. Default: false.
    pub enable_system_log_query: bool,
    /// Node shutdown delay for pod termination. Default: "0s".
    pub shutdown_grace_period: GoDuration,
    /// Part of `shutdownGracePeriod` for critical pods. Default: "0s".
    pub shutdown_grace_period_critical_pods: GoDuration,
    /// Shutdown grace periods by pod priority. Default: none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shutdown_grace_period_by_pod_priority: Vec<ShutdownGracePeriodByPodPriority>,
    /// Container restart backoff settings.
    pub crash_loop_back_off: CrashLoopBackOffConfig,
    /// Memory reserved per NUMA node. Default: none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reserved_memory: Vec<MemoryReservation>,
    /// Serve `/debug/pprof/`. Default: true.
    pub enable_profiling_handler: bool,
    /// Serve `/debug/flags/v`. Default: true.
    pub enable_debug_flags_handler: bool,
    /// `RuntimeDefault` seccomp profile for all workloads. Default: false.
    pub seccomp_default: bool,
    /// Factor of `memory.high` under `MemoryQoS`. Default: 0.9.
    pub memory_throttling_factor: f64,
    /// cgroup v2 memory protection policy (`None`, `TieredReservation`). Default: "None".
    pub memory_reservation_policy: String,
    /// Taints added when the node registers. Default: none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub register_with_taints: Vec<Taint>,
    /// Register the node with the API server. Default: true.
    pub register_node: bool,
    /// OpenTelemetry tracing. Default: unset (off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracing: Option<TracingConfiguration>,
    /// Ephemeral storage isolation. Default: true.
    pub local_storage_capacity_isolation: bool,
    /// CRI runtime endpoint. Default: `unix:///run/containerd/containerd.sock`.
    pub container_runtime_endpoint: String,
    /// CRI image endpoint; "" means `containerRuntimeEndpoint`. Default: "".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub image_service_endpoint: String,
    /// Refuse to start on cgroup v1 hosts. Default: false.
    #[serde(rename = "failCgroupV1")]
    pub fail_cgroup_v1: bool,
    /// User namespace settings. Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_namespaces: Option<UserNamespaces>,
}

/// `authentication`: how the HTTPS API authenticates requests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletAuthentication {
    /// Client certificate authentication.
    pub x509: KubeletX509Authentication,
    /// Bearer token authentication through `TokenReview`.
    pub webhook: KubeletWebhookAuthentication,
    /// Anonymous requests.
    pub anonymous: KubeletAnonymousAuthentication,
}

/// `authentication.x509`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletX509Authentication {
    /// CA bundle (PEM) that verifies client certificates; user = CN, groups = O.
    /// Default: "" (client certificates are not requested).
    #[serde(rename = "clientCAFile", skip_serializing_if = "String::is_empty")]
    pub client_ca_file: String,
}

/// `authentication.webhook`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletWebhookAuthentication {
    /// Bearer tokens checked with `TokenReview`. Default: true (v1beta1).
    pub enabled: bool,
    /// Cache time of authentication results. Default: "2m".
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: GoDuration,
}

impl Default for KubeletWebhookAuthentication {
    fn default() -> Self {
        Self { enabled: true, cache_ttl: GoDuration::from_mins(2) }
    }
}

/// `authentication.anonymous`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletAnonymousAuthentication {
    /// Requests no other method authenticates are `system:anonymous`. Default: false.
    pub enabled: bool,
}

/// `authorization`: how the HTTPS API authorizes authenticated requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletAuthorization {
    /// `AlwaysAllow` or `Webhook` (`SubjectAccessReview`). Default: "Webhook" (v1beta1).
    pub mode: String,
    /// Webhook cache settings.
    pub webhook: KubeletWebhookAuthorization,
}

impl Default for KubeletAuthorization {
    fn default() -> Self {
        Self { mode: AUTHORIZATION_MODE_WEBHOOK.to_owned(), webhook: KubeletWebhookAuthorization::default() }
    }
}

pub use crate::types::authorization::{AUTHORIZATION_MODE_ALWAYS_ALLOW, AUTHORIZATION_MODE_WEBHOOK};

/// `authorization.webhook`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletWebhookAuthorization {
    /// Cache time of allowed decisions. Default: "5m".
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: GoDuration,
    /// Cache time of denied decisions. Default: "30s".
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: GoDuration,
}

impl Default for KubeletWebhookAuthorization {
    fn default() -> Self {
        Self { cache_authorized_ttl: GoDuration::from_mins(5), cache_unauthorized_ttl: GoDuration::from_secs(30) }
    }
}

/// `logging` (component-base `LoggingConfiguration`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LoggingConfiguration {
    /// `text` or `json`. Default: "text".
    pub format: String,
    /// Maximum time between log flushes (a duration, or nanoseconds). Default: "5s".
    #[serde(deserialize_with = "string_or_nanos::deserialize")]
    pub flush_frequency: GoDuration,
    /// Log verbosity (`-v`). Default: 0.
    pub verbosity: u32,
    /// Per-file verbosity. Default: none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub vmodule: Vec<VModuleItem>,
    /// Format-specific options.
    pub options: FormatOptions,
}

impl Default for LoggingConfiguration {
    fn default() -> Self {
        Self {
            format: "text".to_owned(),
            flush_frequency: GoDuration::from_secs(5),
            verbosity: 0,
            vmodule: Vec::new(),
            options: FormatOptions::default(),
        }
    }
}

/// One `logging.vmodule` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VModuleItem {
    /// File name pattern.
    pub file_pattern: String,
    /// Verbosity for matching files.
    pub verbosity: u32,
}

/// `logging.options`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FormatOptions {
    /// Options of the `text` format.
    pub text: OutputRoutingOptions,
    /// Options of the `json` format.
    pub json: OutputRoutingOptions,
}

/// `logging.options.text` / `logging.options.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OutputRoutingOptions {
    /// Errors to stderr, info to buffered stdout. Default: false.
    pub split_stream: bool,
    /// Buffer size of the info stream (a quantity). Default: "0".
    #[serde(deserialize_with = "crate::types::quantity::deserialize_text")]
    pub info_buffer_size: String,
}

impl Default for OutputRoutingOptions {
    fn default() -> Self {
        Self { split_stream: false, info_buffer_size: "0".to_owned() }
    }
}

/// `tracing` (component-base `TracingConfiguration`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TracingConfiguration {
    /// OTLP gRPC collector endpoint. Default: unset ("localhost:4317" when tracing is on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Sampled spans per million. Default: unset (0: only spans of sampled parents).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampling_rate_per_million: Option<i32>,
}

/// `memorySwap`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MemorySwapConfiguration {
    /// "", `NoSwap` or `LimitedSwap`. Default: "".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub swap_behavior: String,
}

/// `crashLoopBackOff`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CrashLoopBackOffConfig {
    /// Maximum container restart backoff. Default: unset (300s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_container_restart_period: Option<GoDuration>,
}

/// One `shutdownGracePeriodByPodPriority` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ShutdownGracePeriodByPodPriority {
    /// Lowest priority of the range.
    pub priority: i32,
    /// Grace period of pods in the range.
    pub shutdown_grace_period_seconds: i64,
}

/// One `reservedMemory` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MemoryReservation {
    /// NUMA node id.
    pub numa_node: i32,
    /// Reserved quantities by resource name.
    #[serde(deserialize_with = "crate::types::quantity::deserialize_text_map")]
    pub limits: BTreeMap<String, String>,
}

/// `userNamespaces`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct UserNamespaces {
    /// UIDs/GIDs per pod. Default: unset (65536).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ids_per_pod: Option<i64>,
}

impl Default for KubeletConfiguration {
    fn default() -> Self {
        Self {
            enable_server: true,
            static_pod_path: String::new(),
            pod_logs_dir: "/var/log/pods".to_owned(),
            sync_frequency: GoDuration::from_mins(1),
            file_check_frequency: GoDuration::from_secs(20),
            http_check_frequency: GoDuration::from_secs(20),
            static_pod_url: String::new(),
            static_pod_url_header: BTreeMap::new(),
            address: "0.0.0.0".to_owned(),
            port: 10250,
            read_only_port: 0,
            tls_cert_file: String::new(),
            tls_private_key_file: String::new(),
            tls_cipher_suites: Vec::new(),
            tls_curve_preferences: Vec::new(),
            tls_min_version: String::new(),
            rotate_certificates: false,
            server_tls_bootstrap: false,
            authentication: KubeletAuthentication::default(),
            authorization: KubeletAuthorization::default(),
            registry_pull_qps: 5,
            registry_burst: 10,
            image_pull_credentials_verification_policy: String::new(),
            preloaded_images_verification_allowlist: Vec::new(),
            event_record_qps: 50,
            event_burst: 100,
            enable_debugging_handlers: true,
            enable_contention_profiling: false,
            healthz_port: 10248,
            healthz_bind_address: "127.0.0.1".to_owned(),
            oom_score_adj: -999,
            cluster_domain: String::new(),
            cluster_dns: Vec::new(),
            streaming_connection_idle_timeout: GoDuration::from_hours(4),
            node_status_update_frequency: GoDuration::from_secs(10),
            node_status_report_frequency: GoDuration::from_mins(5),
            node_lease_duration_seconds: 40,
            image_minimum_gc_age: GoDuration::from_mins(2),
            image_maximum_gc_age: GoDuration::ZERO,
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
            volume_stats_agg_period: GoDuration::from_mins(1),
            kubelet_cgroups: String::new(),
            system_cgroups: String::new(),
            cgroup_root: "/".to_owned(),
            cgroups_per_qos: true,
            cgroup_driver: "cgroupfs".to_owned(),
            cpu_manager_policy: "none".to_owned(),
            single_process_oom_kill: None,
            cpu_manager_policy_options: BTreeMap::new(),
            cpu_manager_reconcile_period: GoDuration::from_secs(10),
            dra_manager_reconcile_period: GoDuration::from_mins(1),
            memory_manager_policy: "None".to_owned(),
            topology_manager_policy: "none".to_owned(),
            topology_manager_scope: "container".to_owned(),
            topology_manager_policy_options: BTreeMap::new(),
            qos_reserved: BTreeMap::new(),
            runtime_request_timeout: GoDuration::from_mins(2),
            hairpin_mode: "promiscuous-bridge".to_owned(),
            max_pods: 110,
            pod_cidr: String::new(),
            pod_pids_limit: -1,
            resolv_conf: "/etc/resolv.conf".to_owned(),
            run_once: false,
            cpu_cfs_quota: true,
            cpu_cfs_quota_period: GoDuration::from_millis(100),
            node_status_max_images: 50,
            max_open_files: 1_000_000,
            content_type: "application/vnd.kubernetes.protobuf".to_owned(),
            kube_api_qps: 50,
            kube_api_burst: 100,
            serialize_image_pulls: true,
            max_parallel_image_pulls: None,
            eviction_hard: default_eviction_hard(),
            eviction_soft: BTreeMap::new(),
            eviction_soft_grace_period: BTreeMap::new(),
            eviction_pressure_transition_period: GoDuration::from_mins(5),
            eviction_max_pod_grace_period: 0,
            eviction_minimum_reclaim: BTreeMap::new(),
            merge_default_eviction_settings: false,
            pods_per_core: 0,
            enable_controller_attach_detach: true,
            protect_kernel_defaults: false,
            make_iptables_util_chains: true,
            iptables_masquerade_bit: 14,
            iptables_drop_bit: 15,
            feature_gates: BTreeMap::new(),
            fail_swap_on: true,
            memory_swap: MemorySwapConfiguration::default(),
            container_log_max_size: "10Mi".to_owned(),
            container_log_max_files: 5,
            container_log_max_workers: 1,
            container_log_monitor_interval: GoDuration::from_secs(10),
            config_map_and_secret_change_detection_strategy: "Watch".to_owned(),
            system_reserved: BTreeMap::new(),
            kube_reserved: BTreeMap::new(),
            reserved_system_cpus: String::new(),
            show_hidden_metrics_for_version: String::new(),
            system_reserved_cgroup: String::new(),
            kube_reserved_cgroup: String::new(),
            enforce_node_allocatable: vec!["pods".to_owned()],
            allowed_unsafe_sysctls: Vec::new(),
            volume_plugin_dir: "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/".to_owned(),
            provider_id: String::new(),
            kernel_memcg_notification: false,
            logging: LoggingConfiguration::default(),
            enable_system_log_handler: true,
            enable_system_log_query: false,
            shutdown_grace_period: GoDuration::ZERO,
            shutdown_grace_period_critical_pods: GoDuration::ZERO,
            shutdown_grace_period_by_pod_priority: Vec::new(),
            crash_loop_back_off: CrashLoopBackOffConfig::default(),
            reserved_memory: Vec::new(),
            enable_profiling_handler: true,
            enable_debug_flags_handler: true,
            seccomp_default: false,
            memory_throttling_factor: 0.9,
            memory_reservation_policy: "None".to_owned(),
            register_with_taints: Vec::new(),
            register_node: true,
            tracing: None,
            local_storage_capacity_isolation: true,
            container_runtime_endpoint: "unix:///run/containerd/containerd.sock".to_owned(),
            image_service_endpoint: String::new(),
            fail_cgroup_v1: false,
            user_namespaces: None,
        }
    }
}

/// The Linux default `evictionHard` map.
#[must_use]
pub fn default_eviction_hard() -> BTreeMap<String, String> {
    DEFAULT_EVICTION_HARD.iter().map(|&(signal, value)| (signal.to_owned(), value.to_owned())).collect()
}

impl KubeletConfiguration {
    /// Upstream defaulting treats the zero value of a non-pointer field as "unset" and
    /// replaces it with the default (`port: 0` becomes 10250); serde's `default` only
    /// covers absent fields, so the file decoder calls this to match. Pointer fields
    /// upstream (`healthzPort`, `registryPullQPS`, ...) keep an explicit zero.
    pub(crate) fn default_zero_values(&mut self) {
        let defaults = Self::default();
        macro_rules! zero_to_default {
            ($($field:ident).+ , $zero:expr) => {
                if self.$($field).+ == $zero {
                    self.$($field).+ = defaults.$($field).+.clone();
                }
            };
        }
        zero_to_default!(sync_frequency, GoDuration::ZERO);
        zero_to_default!(file_check_frequency, GoDuration::ZERO);
        zero_to_default!(http_check_frequency, GoDuration::ZERO);
        zero_to_default!(address, "");
        zero_to_default!(port, 0);
        zero_to_default!(authentication.webhook.cache_ttl, GoDuration::ZERO);
        zero_to_default!(authorization.mode, "");
        zero_to_default!(authorization.webhook.cache_authorized_ttl, GoDuration::ZERO);
        zero_to_default!(authorization.webhook.cache_unauthorized_ttl, GoDuration::ZERO);
        zero_to_default!(registry_burst, 0);
        zero_to_default!(event_burst, 0);
        zero_to_default!(healthz_bind_address, "");
        zero_to_default!(streaming_connection_idle_timeout, GoDuration::ZERO);
        zero_to_default!(node_lease_duration_seconds, 0);
        zero_to_default!(image_minimum_gc_age, GoDuration::ZERO);
        zero_to_default!(volume_stats_agg_period, GoDuration::ZERO);
        zero_to_default!(cgroup_driver, "");
        zero_to_default!(cpu_manager_policy, "");
        zero_to_default!(cpu_manager_reconcile_period, GoDuration::ZERO);
        zero_to_default!(dra_manager_reconcile_period, GoDuration::ZERO);
        zero_to_default!(memory_manager_policy, "");
        zero_to_default!(topology_manager_policy, "");
        zero_to_default!(topology_manager_scope, "");
        zero_to_default!(runtime_request_timeout, GoDuration::ZERO);
        zero_to_default!(hairpin_mode, "");
        zero_to_default!(max_pods, 0);
        zero_to_default!(max_open_files, 0);
        zero_to_default!(content_type, "");
        zero_to_default!(kube_api_burst, 0);
        zero_to_default!(eviction_pressure_transition_period, GoDuration::ZERO);
        zero_to_default!(container_log_max_size, "");
        zero_to_default!(config_map_and_secret_change_detection_strategy, "");
        zero_to_default!(volume_plugin_dir, "");
        zero_to_default!(container_runtime_endpoint, "");
        zero_to_default!(pod_logs_dir, "");
        zero_to_default!(memory_reservation_policy, "");
        zero_to_default!(logging.format, "");
        zero_to_default!(logging.flush_frequency, GoDuration::ZERO);
        // Upstream's cgroupRoot default is "" and the kubelet reads it as "/" when
        // cgroupsPerQOS is on; storing "/" says the same thing once, here.
        zero_to_default!(cgroup_root, "");
        if self.pod_pids_limit < 0 {
            self.pod_pids_limit = -1;
        }
        if self.merge_default_eviction_settings {
            for (signal, value) in DEFAULT_EVICTION_HARD {
                self.eviction_hard.entry(signal.to_owned()).or_insert_with(|| value.to_owned());
            }
        }
    }

    /// The `/configz` document: `{"kubeletconfig": {...}}`, as the upstream kubelet serves
    /// it (without `kind` and `apiVersion`).
    #[must_use]
    pub fn to_configz_json(&self) -> serde_json::Value {
        serde_json::json!({ "kubeletconfig": self })
    }
}
