//! The mapping from the loaded configuration to each subsystem's own settings (upstream's
//! `cmd/kubelet/app`, which turns the `KubeletConfiguration` into the `Dependencies` and
//! the subsystems' configs).
//!
//! `config` is a leaf: it parses, defaults and validates, and knows no subsystem. Each
//! subsystem takes a settings struct of its own, documented there with the
//! `KubeletConfiguration` fields that feed it, and never the [`Config`] or the
//! [`KubeletConfiguration`]. The functions here are the one place that reads those fields
//! for them; `main.rs` and `agent` (the wiring) call them. This module sits above the
//! subsystems and may use both them and `config`; nothing but the wiring (and tests)
//! uses it.
//!
//! The functions are pure, except [`server`] (reads the hostname for the serving
//! certificate's names) and the defaults that depend on the machine
//! ([`runtime_start_concurrency`]). They take a validated configuration: where a value
//! could still be unusable they return an error rather than panic.
//!

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::cm::CgroupConfig;
use crate::cm::allocatable::AllocatableSettings;
use crate::cm::cpumanager::CpuManagerConfig;
use crate::cm::memorymanager::MemoryManagerConfig;
use crate::cm::resource_managers::ResourceManagerSettings;
use crate::cm::resources::ContainerResourceSettings;
use crate::cm::topology::TopologyManagerConfig;
use crate::config::{Config, DEFAULT_EVICTION_HARD, GoDuration, KubeletConfiguration};
use crate::eviction::thresholds::ThresholdSettings;
use crate::gc::ContainerGcPolicy;
use crate::images::gc::ImageGcPolicy;
use crate::images::puller::PullerConfig;
use crate::logs::rotation::RotationPolicy;
use crate::nodeshutdown::{PriorityPeriod, ShutdownSettings};
use crate::pressure::MemcgThresholdSettings;
use crate::runtime::manager::RuntimeManagerConfig;
use crate::runtime::manager::dns::DnsSettings;
use crate::server::{DebuggingHandlers, Limits, SYSTEM_LOG_DIR, ServerSettings, TlsSettings};
use crate::stats::provider::StatsSettings;
use crate::telemetry::{CollectorEndpoint, DEFAULT_ENDPOINT, TracingSettings};
use crate::types::cpuset::CpuSet;
use crate::types::quantity;

/// A feature gate: as set, else on (the gates read here all default to on).
fn gate(kc: &KubeletConfiguration, name: &str) -> bool {
    kc.feature_gates.get(name).copied().unwrap_or(true)
}

/// Trace export: `tracing` and the node name; `None` when `tracing` is not set (no traces
/// at all).
///
/// # Errors
/// `tracing.endpoint` is unusable (validation refuses it first).
pub fn tracing(config: &Config) -> crate::telemetry::Result<Option<TracingSettings>> {
    let Some(tracing) = &config.kubelet.tracing else { return Ok(None) };
    let endpoint = CollectorEndpoint::parse(tracing.endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT))
        .map_err(crate::telemetry::Error::Endpoint)?;
    let rate = tracing.sampling_rate_per_million.unwrap_or(0).clamp(0, 1_000_000);
    Ok(Some(TracingSettings {
        endpoint,
        sampling_rate_per_million: u32::try_from(rate).unwrap_or(0),
        node_name: config.node_name.clone(),
    }))
}

/// The HTTPS API, read-only port and healthz listeners: addresses, TLS, authentication,
/// authorization and the `/configz` document. The serving certificate's names are the
/// node name and, when it differs, this machine's hostname.
///
/// # Errors
/// An address or port is unusable (validation refuses it first).
pub fn server(config: &Config) -> crate::server::Result<ServerSettings> {
    use crate::server::Error;
    let kc = &config.kubelet;
    let addr = |ip_field, ip: &str, port_field, port: i32| {
        let ip = ip.parse::<IpAddr>().map_err(|_| Error::InvalidSetting {
            field: ip_field,
            message: format!("{ip:?} is not a valid IP address"),
        })?;
        let port = u16::try_from(port).ok().filter(|&p| p != 0).ok_or_else(|| Error::InvalidSetting {
            field: port_field,
            message: format!("{port} must be between 1 and 65535, inclusive"),
        })?;
        Ok::<_, Error>(SocketAddr::new(ip, port))
    };
    let https_addr = if kc.enable_server { Some(addr("address", &kc.address, "port", kc.port)?) } else { None };
    let read_only_addr = if kc.read_only_port == 0 {
        None
    } else {
        Some(addr("address", &kc.address, "readOnlyPort", kc.read_only_port)?)
    };
    let healthz_addr = if kc.healthz_port == 0 {
        None
    } else {
        Some(addr("healthzBindAddress", &kc.healthz_bind_address, "healthzPort", kc.healthz_port)?)
    };
    let mut names = vec![config.node_name.clone()];
    if let Ok(hostname) = crate::config::os_hostname().map(|h| h.to_lowercase())
        && !hostname.is_empty()
        && !names.contains(&hostname)
    {
        names.push(hostname);
    }
    let non_empty = |s: &str| (!s.is_empty()).then(|| PathBuf::from(s));
    let cert_and_key = non_empty(&kc.tls_cert_file).zip(non_empty(&kc.tls_private_key_file));
    Ok(ServerSettings {
        https_addr,
        read_only_addr,
        healthz_addr,
        tls: TlsSettings {
            cert_and_key,
            cert_dir: config.cert_dir.clone(),
            names,
            client_ca_file: non_empty(&kc.authentication.x509.client_ca_file),
            cipher_suites: kc.tls_cipher_suites.clone(),
            min_version: kc.tls_min_version.clone(),
            bootstrap: None,
        },
        node_name: config.node_name.clone(),
        anonymous_auth: kc.authentication.anonymous.enabled,
        webhook_authentication: kc.authentication.webhook.enabled,
        token_cache_ttl: kc.authentication.webhook.cache_ttl.to_std(),
        authorization_mode: kc.authorization.mode.clone(),
        authorized_ttl: kc.authorization.webhook.cache_authorized_ttl.to_std(),
        unauthorized_ttl: kc.authorization.webhook.cache_unauthorized_ttl.to_std(),
        configz: kc.to_configz_json(),
        limits: Limits::default(),
        shutdown_grace_period: Duration::from_secs(5),
    })
}

/// The debugging handlers over `runtime`: `enableDebuggingHandlers`,
/// `enableSystemLogHandler`, `streamingConnectionIdleTimeout`; `/logs/` serves
/// [`SYSTEM_LOG_DIR`].
#[must_use]
pub fn debugging_handlers(
    runtime: Arc<dyn crate::container::RuntimeService>,
    kc: &KubeletConfiguration,
) -> DebuggingHandlers {
    DebuggingHandlers {
        runtime,
        enable_debugging_handlers: kc.enable_debugging_handlers,
        enable_system_log_handler: kc.enable_system_log_handler,
        streaming_connection_idle_timeout: kc.streaming_connection_idle_timeout.to_std(),
        system_log_dir: PathBuf::from(SYSTEM_LOG_DIR),
    }
}

/// The eviction settings; `evictionHard` with `mergeDefaultEvictionSettings` gets the
/// Linux defaults ([`DEFAULT_EVICTION_HARD`]) for the signals it leaves out.
#[must_use]
pub fn eviction(kc: &KubeletConfiguration) -> ThresholdSettings {
    let mut hard = kc.eviction_hard.clone();
    if kc.merge_default_eviction_settings {
        for (signal, value) in DEFAULT_EVICTION_HARD {
            hard.entry(signal.to_owned()).or_insert_with(|| value.to_owned());
        }
    }
    ThresholdSettings {
        hard,
        soft: kc.eviction_soft.clone(),
        soft_grace_period: kc.eviction_soft_grace_period.clone(),
        minimum_reclaim: kc.eviction_minimum_reclaim.clone(),
        enforce_pods_allocatable: kc.enforce_node_allocatable.iter().any(|k| k == "pods"),
        pressure_transition_period: kc.eviction_pressure_transition_period.to_std(),
        max_pod_grace_period_seconds: i64::from(kc.eviction_max_pod_grace_period),
        local_storage_capacity_isolation: kc.local_storage_capacity_isolation,
    }
}

/// The memcg threshold watchers' settings: `cgroupRoot` and the hard `memory.available`
/// and `allocatableMemory.available` thresholds as written.
#[must_use]
pub fn memcg_thresholds(kc: &KubeletConfiguration) -> MemcgThresholdSettings {
    MemcgThresholdSettings {
        pods_cgroup: crate::cm::cgroupfs::kubepods_cgroup(&kc.cgroup_root, &kc.cgroup_driver),
        memory_available: kc.eviction_hard.get("memory.available").cloned(),
        allocatable_memory_available: kc.eviction_hard.get("allocatableMemory.available").cloned(),
    }
}

/// Upstream's `server.go`: `reservedSystemCPUs` replaces the cpu of `kubeReserved` and
/// `systemReserved` (systemReserved.cpu becomes the number of reserved CPUs), so node
/// allocatable matches the CPUs pods can use. Applied once, before any settings are taken
/// from `kc` (and after `/configz` is rendered, which shows the file as given).
pub fn apply_reserved_system_cpus(kc: &mut KubeletConfiguration) {
    let Ok(set) = CpuSet::parse(&kc.reserved_system_cpus) else { return };
    if set.is_empty() {
        return;
    }
    kc.kube_reserved.remove("cpu");
    kc.system_reserved.insert("cpu".into(), set.len().to_string());
}

/// Node allocatable enforcement: `kubeReserved`, `systemReserved`, their cgroups,
/// `enforceNodeAllocatable`, `cgroupsPerQOS`.
#[must_use]
pub fn allocatable(kc: &KubeletConfiguration) -> AllocatableSettings {
    AllocatableSettings {
        kube_reserved: kc.kube_reserved.clone(),
        system_reserved: kc.system_reserved.clone(),
        kube_reserved_cgroup: kc.kube_reserved_cgroup.clone(),
        system_reserved_cgroup: kc.system_reserved_cgroup.clone(),
        enforce_node_allocatable: kc.enforce_node_allocatable.clone(),
        cgroups_per_qos: kc.cgroups_per_qos,
    }
}

/// What shapes container resources: `cpuCFSQuota`, `singleProcessOOMKill`, and
/// `memorySwap.swapBehavior: LimitedSwap` with the `NodeSwap` gate.
#[must_use]
pub fn container_resources(kc: &KubeletConfiguration) -> ContainerResourceSettings {
    ContainerResourceSettings {
        cpu_cfs_quota: kc.cpu_cfs_quota,
        single_process_oom_kill: kc.single_process_oom_kill,
        limited_swap: kc.memory_swap.swap_behavior == "LimitedSwap" && gate(kc, "NodeSwap"),
    }
}

/// A quantity of a reservation map in milli-CPU (0 when absent or unparsable).
fn milli_cpu(list: &std::collections::BTreeMap<String, String>) -> i64 {
    list.get("cpu").and_then(|q| quantity::parse_milli_cpu(q).ok()).unwrap_or(0)
}

/// A quantity of a reservation map in bytes (0 when absent, unparsable or negative).
fn bytes(list: &std::collections::BTreeMap<String, String>, key: &str) -> u64 {
    list.get(key).and_then(|q| quantity::parse_bytes(q).ok()).map_or(0, |b| u64::try_from(b).unwrap_or(0))
}

/// The CPU, memory and topology managers' settings.
#[must_use]
pub fn resource_managers(kc: &KubeletConfiguration) -> ResourceManagerSettings {
    let cpu = CpuManagerConfig {
        policy: kc.cpu_manager_policy.clone(),
        options: kc.cpu_manager_policy_options.clone(),
        reserved_system_cpus: kc.reserved_system_cpus.clone(),
        reserved_milli_cpu: milli_cpu(&kc.kube_reserved).saturating_add(milli_cpu(&kc.system_reserved)),
        topology_policy: kc.topology_manager_policy.clone(),
        feature_gates: kc.feature_gates.clone(),
        reconcile_period: kc.cpu_manager_reconcile_period.to_std(),
    };
    let mut reserved_memory: std::collections::BTreeMap<usize, crate::cm::memorymanager::Requests> =
        std::collections::BTreeMap::new();
    for r in &kc.reserved_memory {
        let node = reserved_memory.entry(usize::try_from(r.numa_node.max(0)).unwrap_or(0)).or_default();
        for kind in r.limits.keys() {
            let total = node.entry(kind.clone()).or_default();
            *total = total.saturating_add(bytes(&r.limits, kind));
        }
    }
    // Node allocatable's reservation per memory type (upstream's
    // nodeAllocatableReservation): kube + system reserved, plus the hard eviction
    // threshold for memory (absolute only: a percentage is not a size).
    let eviction = kc.eviction_hard.get("memory.available").filter(|v| !v.ends_with('%'));
    let mut node_allocatable_reservation = crate::cm::memorymanager::Requests::new();
    for kind in kc.kube_reserved.keys().chain(kc.system_reserved.keys()).filter(|k| k.starts_with("hugepages-")) {
        node_allocatable_reservation
            .insert(kind.clone(), bytes(&kc.kube_reserved, kind).saturating_add(bytes(&kc.system_reserved, kind)));
    }
    // Saturating, as in `allocatable::plan`: reservations are not bounded by validation.
    let memory =
        bytes(&kc.kube_reserved, "memory").saturating_add(bytes(&kc.system_reserved, "memory")).saturating_add(
            eviction.and_then(|v| quantity::parse_bytes(v).ok()).map_or(0, |b| u64::try_from(b).unwrap_or(0)),
        );
    if memory > 0 {
        node_allocatable_reservation.insert("memory".to_owned(), memory);
    }
    ResourceManagerSettings {
        cpu,
        memory: MemoryManagerConfig {
            policy: kc.memory_manager_policy.clone(),
            reserved_memory,
            node_allocatable_reservation,
        },
        topology: TopologyManagerConfig {
            policy: kc.topology_manager_policy.clone(),
            scope: kc.topology_manager_scope.clone(),
            options: kc.topology_manager_policy_options.clone(),
            feature_gates: kc.feature_gates.clone(),
        },
    }
}

/// The image manager's pull settings: `serializeImagePulls`, `maxParallelImagePulls`,
/// `registryPullQPS`, `registryBurst`.
#[must_use]
pub fn image_puller(kc: &KubeletConfiguration) -> PullerConfig {
    PullerConfig {
        serialize_image_pulls: kc.serialize_image_pulls,
        max_parallel_image_pulls: kc.max_parallel_image_pulls,
        registry_pull_qps: kc.registry_pull_qps,
        registry_burst: kc.registry_burst,
    }
}

/// Image GC: `imageGCHighThresholdPercent`, `imageGCLowThresholdPercent`,
/// `imageMinimumGCAge`, `imageMaximumGCAge`.
#[must_use]
pub fn image_gc(kc: &KubeletConfiguration) -> ImageGcPolicy {
    ImageGcPolicy {
        high_threshold_percent: kc.image_gc_high_threshold_percent,
        low_threshold_percent: kc.image_gc_low_threshold_percent,
        min_age: kc.image_minimum_gc_age.to_std(),
        max_age: kc.image_maximum_gc_age.to_std(),
    }
}

/// How often image GC runs: `--image-gc-period`, else image GC's own period
/// ([`crate::images::gc::IMAGE_GC_PERIOD`]).
#[must_use]
pub fn image_gc_period(config: &Config) -> Duration {
    config.swiftlet.image_gc_period.unwrap_or(crate::images::gc::IMAGE_GC_PERIOD)
}

/// Container GC: the `--minimum-container-ttl-duration`,
/// `--maximum-dead-containers-per-container` and `--maximum-dead-containers` flags.
#[must_use]
pub fn container_gc(config: &Config) -> ContainerGcPolicy {
    let gc = &config.container_gc;
    ContainerGcPolicy {
        min_age: gc.minimum_container_ttl_duration,
        max_per_pod_container: gc.maximum_dead_containers_per_container,
        max_containers: gc.maximum_dead_containers,
    }
}

/// Sandbox starts and container create+start pairs sent to the runtime at once:
/// `--runtime-start-concurrency`, else the runtime's default
/// ([`crate::runtime::start_gate::default_limit`]: twice the CPUs, at least 4).
#[must_use]
pub fn runtime_start_concurrency(config: &Config) -> usize {
    config.swiftlet.runtime_start_concurrency.unwrap_or_else(crate::runtime::start_gate::default_limit)
}

/// Container log rotation: `containerLogMaxSize` (in bytes), `containerLogMaxFiles` (at
/// least 2), `containerLogMaxWorkers` (at least 1), `containerLogMonitorInterval`.
///
/// # Errors
/// `containerLogMaxSize` is not a quantity (validation refuses it first).
pub fn log_rotation(kc: &KubeletConfiguration) -> Result<RotationPolicy, String> {
    let size: quantity::ParsedQuantity = kc
        .container_log_max_size
        .parse()
        .map_err(|e| format!("containerLogMaxSize {:?}: {e}", kc.container_log_max_size))?;
    Ok(RotationPolicy {
        max_size: u64::try_from(size.value_saturating()).unwrap_or(0),
        max_files: usize::try_from(kc.container_log_max_files).unwrap_or(2).max(2),
        max_workers: usize::try_from(kc.container_log_max_workers).unwrap_or(1).max(1),
        monitor_interval: kc.container_log_monitor_interval.to_std(),
    })
}

/// Graceful node shutdown: the `GracefulNodeShutdown` and
/// `GracefulNodeShutdownBasedOnPodPriority` gates, `shutdownGracePeriod`,
/// `shutdownGracePeriodCriticalPods`, `shutdownGracePeriodByPodPriority`.
#[must_use]
pub fn node_shutdown(kc: &KubeletConfiguration) -> ShutdownSettings {
    ShutdownSettings {
        graceful_node_shutdown: gate(kc, "GracefulNodeShutdown"),
        based_on_pod_priority: gate(kc, "GracefulNodeShutdownBasedOnPodPriority"),
        shutdown_grace_period: kc.shutdown_grace_period.to_std(),
        shutdown_grace_period_critical_pods: kc.shutdown_grace_period_critical_pods.to_std(),
        by_pod_priority: kc
            .shutdown_grace_period_by_pod_priority
            .iter()
            .map(|p| PriorityPeriod { priority: p.priority, grace_seconds: p.shutdown_grace_period_seconds })
            .collect(),
    }
}

/// The node manager's settings: `--node-ip` (as resolved by the wiring), `--node-labels`,
/// `registerWithTaints`, `maxPods`, `port`, the reservations and hard eviction thresholds
/// (node allocatable), `nodeStatusUpdateFrequency`, `nodeStatusReportFrequency`,
/// `nodeLeaseDurationSeconds`.
#[must_use]
pub fn node(config: &Config, node_ip: Option<IpAddr>) -> crate::node::NodeSettings {
    let kc = &config.kubelet;
    crate::node::NodeSettings {
        node_name: config.node_name.clone(),
        // As upstream: the hostname is --hostname-override when given (which is also
        // the node name without a cloud provider).
        hostname: config.node_name.clone(),
        node_ip,
        labels: config.node_labels.clone(),
        taints: kc.register_with_taints.clone(),
        max_pods: kc.max_pods,
        port: kc.port,
        kube_reserved: kc.kube_reserved.clone(),
        system_reserved: kc.system_reserved.clone(),
        eviction_hard: kc.eviction_hard.clone(),
        update_frequency: kc.node_status_update_frequency.to_std(),
        report_frequency: kc.node_status_report_frequency.to_std(),
        lease_duration_secs: kc.node_lease_duration_seconds,
        kubelet_version: format!("v1.37.0-swiftlet.{}", env!("CARGO_PKG_VERSION")),
    }
}

/// The pod cgroups: `cgroupRoot` (`/` when empty), `cgroupsPerQOS`, `cgroupDriver`,
/// `podPidsLimit`, `cpuCFSQuota`, and node allocatable's `enforcement` (planned from
/// [`allocatable`] and the machine).
#[must_use]
pub fn cgroups(kc: &KubeletConfiguration, enforcement: crate::cm::allocatable::Enforcement) -> CgroupConfig {
    CgroupConfig {
        cgroup_root: if kc.cgroup_root.is_empty() { "/".into() } else { kc.cgroup_root.clone() },
        cgroups_per_qos: kc.cgroups_per_qos,
        cgroup_driver: kc.cgroup_driver.clone(),
        pod_pids_limit: kc.pod_pids_limit,
        cpu_cfs_quota: kc.cpu_cfs_quota,
        enforcement,
        ..CgroupConfig::default()
    }
}

/// In-place resize: whether the CPU (`cpuManagerPolicy`) and memory
/// (`memoryManagerPolicy`) managers are static.
#[must_use]
pub fn node_resize(kc: &KubeletConfiguration) -> crate::allocation::NodeResizeConfig {
    crate::allocation::NodeResizeConfig {
        static_cpu_policy: kc.cpu_manager_policy.eq_ignore_ascii_case("static"),
        static_memory_policy: kc.memory_manager_policy.eq_ignore_ascii_case("static"),
    }
}

/// The crash-loop back-off's cap: `crashLoopBackOff.maxContainerRestartPeriod`, else
/// upstream's 5 minutes ([`crate::container::backoff::MAX`]).
#[must_use]
pub fn crash_loop_max(kc: &KubeletConfiguration) -> Duration {
    kc.crash_loop_back_off.max_container_restart_period.map_or(crate::container::backoff::MAX, GoDuration::to_std)
}

/// The runtime manager's paths and names: `podLogsDir`, `--root-dir`, the node name and
/// the host IP (as resolved by the wiring).
#[must_use]
pub fn runtime_manager(config: &Config, host_ip: Option<String>) -> RuntimeManagerConfig {
    RuntimeManagerConfig {
        pod_logs_dir: config.kubelet.pod_logs_dir.clone().into(),
        root_dir: config.root_dir.clone(),
        node_name: config.node_name.clone(),
        host_ip,
    }
}

/// The pods' DNS: `clusterDNS`, `clusterDomain`, `resolvConf`.
#[must_use]
pub fn dns(kc: &KubeletConfiguration) -> DnsSettings {
    DnsSettings {
        cluster_dns: kc.cluster_dns.clone(),
        cluster_domain: kc.cluster_domain.clone(),
        resolv_conf: kc.resolv_conf.clone(),
    }
}

/// The stats provider: the node name, `--root-dir`, `podLogsDir` and the pods' cgroup
/// (with `cgroupsPerQOS`: `<cgroupRoot>/kubepods`, or its slice under the systemd driver,
/// named as the cgroup manager names it).
#[must_use]
pub fn stats(config: &Config) -> StatsSettings {
    let kc = &config.kubelet;
    StatsSettings {
        node_name: config.node_name.clone(),
        root_dir: config.root_dir.clone(),
        pod_logs_dir: kc.pod_logs_dir.clone().into(),
        // A root or driver the cgroup manager refuses stops the agent before stats start.
        pods_cgroup: kc
            .cgroups_per_qos
            .then(|| crate::cm::cgroupfs::kubepods_cgroup(&kc.cgroup_root, &kc.cgroup_driver))
            .flatten(),
    }
}

#[cfg(test)]
mod tests;
