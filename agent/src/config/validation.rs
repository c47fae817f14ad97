//! Validation of a defaulted [`KubeletConfiguration`] (after flags are applied), after
//! upstream's `pkg/kubelet/apis/config/validation`. Every problem is returned, each as
//! `fieldPath: message`, so one run of the agent shows everything to fix.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Component, Path};

use super::kubelet_configuration::{AUTHORIZATION_MODE_ALWAYS_ALLOW, AUTHORIZATION_MODE_WEBHOOK, KubeletConfiguration};
use crate::types::duration::GoDuration;
use crate::types::tls::{TLS_CIPHER_SUITES, tls_cipher_suite_id};

const EVICTION_SIGNALS: [&str; 9] = [
    "memory.available",
    "allocatableMemory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

/// Collects problems as `field: message` lines.
#[derive(Debug, Default)]
struct Problems(Vec<String>);

impl Problems {
    fn add(&mut self, field: &str, message: impl std::fmt::Display) {
        self.0.push(format!("{field}: {message}"));
    }

    fn one_of(&mut self, field: &str, value: &str, allowed: &[&str]) {
        if !allowed.contains(&value) {
            self.add(field, format!("unsupported value {value:?}, must be one of {allowed:?}"));
        }
    }

    fn not_negative(&mut self, field: &str, value: i64) {
        if value < 0 {
            self.add(field, format!("{value} must not be a negative number"));
        }
    }

    fn in_range(&mut self, field: &str, value: i64, min: i64, max: i64) {
        if !(min..=max).contains(&value) {
            self.add(field, format!("{value} must be between {min} and {max}, inclusive"));
        }
    }

    fn positive_duration(&mut self, field: &str, value: GoDuration) {
        if value <= GoDuration::ZERO {
            self.add(field, format!("must be greater than 0, got {value}"));
        }
    }

    fn ip(&mut self, field: &str, value: &str) {
        if value.parse::<IpAddr>().is_err() {
            self.add(field, format!("{value:?} is not a valid IP address"));
        }
    }
}

/// Every problem of `kc`, one `field: message` line each; empty when valid.
#[must_use]
pub fn validate(kc: &KubeletConfiguration) -> Vec<String> {
    let mut p = Problems::default();
    let gate = |name: &str| kc.feature_gates.get(name).copied().unwrap_or(false);

    p.positive_duration("syncFrequency", kc.sync_frequency);
    p.positive_duration("fileCheckFrequency", kc.file_check_frequency);
    p.positive_duration("httpCheckFrequency", kc.http_check_frequency);
    p.positive_duration("runtimeRequestTimeout", kc.runtime_request_timeout);
    p.positive_duration("nodeStatusUpdateFrequency", kc.node_status_update_frequency);
    p.positive_duration("nodeStatusReportFrequency", kc.node_status_report_frequency);
    p.positive_duration("volumeStatsAggPeriod", kc.volume_stats_agg_period);
    p.positive_duration("draManagerReconcilePeriod", kc.dra_manager_reconcile_period);
    p.positive_duration("evictionPressureTransitionPeriod", kc.eviction_pressure_transition_period);
    if kc.node_lease_duration_seconds <= 0 {
        p.add("nodeLeaseDurationSeconds", "must be greater than 0");
    }

    p.ip("address", &kc.address);
    p.in_range("port", kc.port.into(), 1, 65535);
    p.in_range("readOnlyPort", kc.read_only_port.into(), 0, 65535);
    p.in_range("healthzPort", kc.healthz_port.into(), 0, 65535);
    p.ip("healthzBindAddress", &kc.healthz_bind_address);
    for (i, dns) in kc.cluster_dns.iter().enumerate() {
        p.ip(&format!("clusterDNS[{i}]"), dns);
    }
    validate_tls(kc, &mut p);
    if kc.tls_cert_file.is_empty() != kc.tls_private_key_file.is_empty() {
        p.add(
            "tlsCertFile",
            "tlsCertFile and tlsPrivateKeyFile must be set together (or both left empty for a \
             self-signed certificate)",
        );
    }
    p.one_of(
        "authorization.mode",
        &kc.authorization.mode,
        &[AUTHORIZATION_MODE_ALWAYS_ALLOW, AUTHORIZATION_MODE_WEBHOOK],
    );
    if kc.server_tls_bootstrap && kc.feature_gates.get("RotateKubeletServerCertificate") == Some(&false) {
        p.add("serverTLSBootstrap", "requires feature gate RotateKubeletServerCertificate");
    }

    p.not_negative("eventRecordQPS", kc.event_record_qps.into());
    p.not_negative("eventBurst", kc.event_burst.into());
    p.not_negative("registryPullQPS", kc.registry_pull_qps.into());
    p.not_negative("registryBurst", kc.registry_burst.into());
    p.not_negative("kubeAPIQPS", kc.kube_api_qps.into());
    p.not_negative("kubeAPIBurst", kc.kube_api_burst.into());
    p.not_negative("maxOpenFiles", kc.max_open_files);
    p.not_negative("maxPods", kc.max_pods.into());
    p.not_negative("podsPerCore", kc.pods_per_core.into());
    p.not_negative("evictionMaxPodGracePeriod", kc.eviction_max_pod_grace_period.into());
    p.in_range("oomScoreAdj", kc.oom_score_adj.into(), -1000, 1000);
    p.in_range("iptablesMasqueradeBit", kc.iptables_masquerade_bit.into(), 0, 31);
    p.in_range("iptablesDropBit", kc.iptables_drop_bit.into(), 0, 31);
    if kc.node_status_max_images < -1 {
        p.add("nodeStatusMaxImages", format!("{} must be -1 or greater", kc.node_status_max_images));
    }
    if let Some(n) = kc.max_parallel_image_pulls {
        if n < 1 {
            p.add("maxParallelImagePulls", format!("{n} must be a positive number"));
        } else if n > 1 && kc.serialize_image_pulls {
            p.add("maxParallelImagePulls", "cannot be larger than 1 unless serializeImagePulls is false");
        }
    }

    validate_image_gc(kc, &mut p);
    validate_cgroups(kc, &mut p, gate("CustomCPUCFSQuotaPeriod"));
    validate_eviction(kc, &mut p);
    validate_node_allocatable(kc, &mut p);
    validate_resource_managers(kc, &mut p);

    p.one_of("hairpinMode", &kc.hairpin_mode, &["promiscuous-bridge", "hairpin-veth", "none"]);
    p.one_of(
        "configMapAndSecretChangeDetectionStrategy",
        &kc.config_map_and_secret_change_detection_strategy,
        &["Get", "Cache", "Watch"],
    );
    p.one_of("memorySwap.swapBehavior", &kc.memory_swap.swap_behavior, &["", "NoSwap", "LimitedSwap"]);
    p.one_of("logging.format", &kc.logging.format, &["text", "json"]);
    if kc.run_once {
        p.add("runOnce", "runonce mode has been deprecated and must not be set");
    }
    for (i, taint) in kc.register_with_taints.iter().enumerate() {
        let field = format!("registerWithTaints[{i}]");
        if taint.key.is_empty() {
            p.add(&format!("{field}.key"), "required value");
        }
        p.one_of(&format!("{field}.effect"), &taint.effect, &["NoSchedule", "PreferNoSchedule", "NoExecute"]);
        if taint.time_added.is_some() {
            p.add(&format!("{field}.timeAdded"), "must not be set");
        }
    }
    validate_shutdown(kc, &mut p);
    if !(kc.memory_throttling_factor > 0.0 && kc.memory_throttling_factor <= 1.0) {
        p.add(
            "memoryThrottlingFactor",
            format!("{} must be greater than 0 and less than or equal to 1.0", kc.memory_throttling_factor),
        );
    }
    if kc.container_runtime_endpoint.is_empty() {
        p.add("containerRuntimeEndpoint", "required value");
    }
    if kc.container_log_max_workers < 1 {
        p.add("containerLogMaxWorkers", "must be greater than or equal to 1");
    }
    if kc.container_log_monitor_interval < GoDuration::from_secs(3) {
        p.add("containerLogMonitorInterval", "must be a duration of at least 3s");
    }
    if kc.container_log_max_files <= 1 {
        p.add("containerLogMaxFiles", "must be greater than 1");
    }
    if !is_quantity(&kc.container_log_max_size) {
        p.add("containerLogMaxSize", format!("{:?} is not a quantity", kc.container_log_max_size));
    }
    if !is_clean_absolute(&kc.pod_logs_dir) {
        p.add("podLogsDir", format!("{:?} must be an absolute, normalized path", kc.pod_logs_dir));
    }
    validate_tracing(kc, &mut p);
    p.0
}

/// Upstream's component-base `ValidateTracingConfiguration`, with its messages.
fn validate_tracing(kc: &KubeletConfiguration, p: &mut Problems) {
    let Some(tracing) = &kc.tracing else { return };
    if let Some(rate) = tracing.sampling_rate_per_million {
        const FIELD: &str = "tracing.samplingRatePerMillion";
        if rate < 0 {
            p.add(FIELD, format!("Invalid value: {rate}: sampling rate must be positive"));
        }
        if rate > 1_000_000 {
            p.add(
                FIELD,
                format!("Invalid value: {rate}: sampling rate per million must be less than or equal to one million"),
            );
        }
    }
    if let Some(endpoint) = &tracing.endpoint
        && let Err(message) = crate::types::collector_endpoint::CollectorEndpoint::parse(endpoint)
    {
        p.add("tracing.endpoint", message);
    }
}

fn validate_tls(kc: &KubeletConfiguration, p: &mut Problems) {
    for (i, suite) in kc.tls_cipher_suites.iter().enumerate() {
        if tls_cipher_suite_id(suite).is_none() {
            p.add(
                &format!("tlsCipherSuites[{i}]"),
                format!("unsupported cipher suite {suite:?}; supported: {:?}", TLS_CIPHER_SUITES.map(|(name, _)| name)),
            );
        }
    }
    match kc.tls_min_version.as_str() {
        "" | "VersionTLS12" | "VersionTLS13" => {}
        "VersionTLS10" | "VersionTLS11" => p.add(
            "tlsMinVersion",
            format!("{:?} is not supported: TLS 1.0 and 1.1 are not implemented", kc.tls_min_version),
        ),
        other => p.add(
            "tlsMinVersion",
            format!("unsupported value {other:?}, must be one of [\"VersionTLS12\", \"VersionTLS13\"]"),
        ),
    }
}

fn validate_image_gc(kc: &KubeletConfiguration, p: &mut Problems) {
    let (high, low) = (kc.image_gc_high_threshold_percent, kc.image_gc_low_threshold_percent);
    p.in_range("imageGCHighThresholdPercent", high.into(), 0, 100);
    p.in_range("imageGCLowThresholdPercent", low.into(), 0, 100);
    if low >= high {
        p.add("imageGCLowThresholdPercent", format!("{low} must be less than imageGCHighThresholdPercent {high}"));
    }
    let (min_age, max_age) = (kc.image_minimum_gc_age, kc.image_maximum_gc_age);
    if min_age.is_negative() {
        p.add("imageMinimumGCAge", format!("{min_age} must not be negative"));
    }
    if max_age.is_negative() {
        p.add("imageMaximumGCAge", format!("{max_age} must not be negative"));
    }
    if max_age > GoDuration::ZERO && max_age <= min_age {
        p.add("imageMaximumGCAge", format!("{max_age} must be greater than imageMinimumGCAge {min_age}"));
    }
}

fn validate_cgroups(kc: &KubeletConfiguration, p: &mut Problems, custom_cfs_period: bool) {
    p.one_of("cgroupDriver", &kc.cgroup_driver, &["cgroupfs", "systemd"]);
    if !kc.cgroup_root.starts_with('/') {
        p.add("cgroupRoot", format!("{:?} must be an absolute cgroup path", kc.cgroup_root));
    }
    if !kc.system_cgroups.is_empty() && kc.cgroup_root.is_empty() {
        p.add("systemCgroups", "was specified and cgroupRoot was not specified");
    }
    p.one_of("cpuManagerPolicy", &kc.cpu_manager_policy, &["none", "static"]);
    p.one_of("memoryManagerPolicy", &kc.memory_manager_policy, &["None", "Static"]);
    p.one_of(
        "topologyManagerPolicy",
        &kc.topology_manager_policy,
        &["none", "best-effort", "restricted", "single-numa-node"],
    );
    p.one_of("topologyManagerScope", &kc.topology_manager_scope, &["container", "pod"]);
    p.one_of("memoryReservationPolicy", &kc.memory_reservation_policy, &["None", "TieredReservation"]);
    let period = kc.cpu_cfs_quota_period;
    if !custom_cfs_period && period != GoDuration::from_millis(100) {
        p.add("cpuCFSQuotaPeriod", format!("{period} requires feature gate CustomCPUCFSQuotaPeriod"));
    }
    if custom_cfs_period && !(GoDuration::from_millis(1)..=GoDuration::from_secs(1)).contains(&period) {
        p.add("cpuCFSQuotaPeriod", format!("{period} must be between 1ms and 1s, inclusive"));
    }
}

fn validate_eviction(kc: &KubeletConfiguration, p: &mut Problems) {
    let maps = [
        ("evictionHard", &kc.eviction_hard),
        ("evictionSoft", &kc.eviction_soft),
        ("evictionMinimumReclaim", &kc.eviction_minimum_reclaim),
    ];
    for (field, map) in maps {
        for (signal, value) in map {
            if !EVICTION_SIGNALS.contains(&signal.as_str()) {
                p.add(&format!("{field}[{signal}]"), "unsupported eviction signal");
            } else if let Some(problem) = crate::types::eviction::check_threshold(field, signal, value) {
                p.add(&format!("{field}[{signal}]"), problem);
            }
        }
    }
    for signal in kc.eviction_soft.keys() {
        if !kc.eviction_soft_grace_period.contains_key(signal) {
            p.add(
                &format!("evictionSoftGracePeriod[{signal}]"),
                "required: every soft eviction threshold needs a grace period",
            );
        }
    }
    for (signal, grace) in &kc.eviction_soft_grace_period {
        match grace.parse::<GoDuration>() {
            Ok(d) if d.is_negative() => {
                p.add(&format!("evictionSoftGracePeriod[{signal}]"), "must not be negative");
            }
            Ok(_) => {}
            Err(e) => p.add(&format!("evictionSoftGracePeriod[{signal}]"), e),
        }
    }
}

fn validate_node_allocatable(kc: &KubeletConfiguration, p: &mut Problems) {
    const FIELD: &str = "enforceNodeAllocatable";
    let all = &kc.enforce_node_allocatable;
    let has = |key: &str| all.iter().any(|v| v == key);
    for (plain, compressible) in
        [("system-reserved", "system-reserved-compressible"), ("kube-reserved", "kube-reserved-compressible")]
    {
        if has(plain) && has(compressible) {
            p.add(FIELD, format!("{plain:?} and {compressible:?} cannot be specified together"));
        }
    }
    let mut seen = BTreeSet::new();
    for value in all {
        if !seen.insert(value.as_str()) {
            p.add(FIELD, format!("duplicated enforcement {value:?}"));
            continue;
        }
        match value.as_str() {
            "pods" => {}
            "system-reserved" | "system-reserved-compressible" => {
                if kc.system_reserved_cgroup.is_empty() {
                    p.add("systemReservedCgroup", format!("must be specified when {value:?} is in {FIELD}"));
                }
            }
            "kube-reserved" | "kube-reserved-compressible" => {
                if kc.kube_reserved_cgroup.is_empty() {
                    p.add("kubeReservedCgroup", format!("must be specified when {value:?} is in {FIELD}"));
                }
            }
            "none" => {
                if all.len() > 1 {
                    p.add(FIELD, "may not contain additional enforcements when \"none\" is specified");
                }
                continue;
            }
            other => {
                p.one_of(
                    FIELD,
                    other,
                    &[
                        "pods",
                        "system-reserved",
                        "system-reserved-compressible",
                        "kube-reserved",
                        "kube-reserved-compressible",
                        "none",
                    ],
                );
                continue;
            }
        }
        if !kc.cgroups_per_qos {
            p.add("cgroupsPerQOS", format!("must be true when {value:?} is in {FIELD}"));
        }
    }
}

/// `reservedSystemCPUs` and `reservedMemory`, as upstream's `ValidateKubeletConfiguration`.
fn validate_resource_managers(kc: &KubeletConfiguration, p: &mut Problems) {
    if !kc.reserved_system_cpus.is_empty() {
        if !kc.system_reserved_cgroup.is_empty() || !kc.kube_reserved_cgroup.is_empty() {
            p.add(
                "reservedSystemCPUs",
                "can't use reservedSystemCPUs (--reserved-cpus) with systemReservedCgroup (--system-reserved-cgroup) or kubeReservedCgroup (--kube-reserved-cgroup)",
            );
        }
        if let Err(e) = crate::types::cpuset::CpuSet::parse(&kc.reserved_system_cpus) {
            p.add(
                "reservedSystemCPUs",
                format!("unable to parse reservedSystemCPUs (--reserved-cpus) {}, error: {e}", kc.reserved_system_cpus),
            );
        }
    }
    let mut seen = std::collections::HashSet::new();
    for r in &kc.reserved_memory {
        let node = r.numa_node;
        for (name, q) in &r.limits {
            if name != "memory" && !name.starts_with("hugepages-") {
                p.add(
                    "reservedMemory",
                    format!("the limit type {name:?} for NUMA node {node} is not supported, only [memory hugepages-<HugePageSize>] is accepted"),
                );
            }
            if crate::types::quantity::parse(q).is_ok_and(crate::types::quantity::ParsedQuantity::is_zero) {
                p.add(
                    "reservedMemory",
                    format!("reserved memory may not be zero for NUMA node {node} and resource {name:?}"),
                );
            }
            if !seen.insert((node, name.clone())) {
                p.add(
                    "reservedMemory",
                    format!("the reserved memory has a duplicate value for NUMA node {node} and resource {name:?}"),
                );
            }
        }
    }
}

fn validate_shutdown(kc: &KubeletConfiguration, p: &mut Problems) {
    let (total, critical) = (kc.shutdown_grace_period, kc.shutdown_grace_period_critical_pods);
    if critical > total {
        p.add("shutdownGracePeriodCriticalPods", format!("{critical} must be <= shutdownGracePeriod {total}"));
    }
    for (field, value) in [("shutdownGracePeriod", total), ("shutdownGracePeriodCriticalPods", critical)] {
        if value.is_negative() || (!value.is_zero() && value < GoDuration::from_secs(1)) {
            p.add(field, format!("{value} must be either zero or otherwise >= 1 sec"));
        }
    }
    let gate_off = |name: &str| kc.feature_gates.get(name) == Some(&false);
    if total > GoDuration::ZERO && gate_off("GracefulNodeShutdown") {
        p.add("shutdownGracePeriod", "requires feature gate GracefulNodeShutdown");
    }
    if !kc.shutdown_grace_period_by_pod_priority.is_empty() && gate_off("GracefulNodeShutdownBasedOnPodPriority") {
        p.add("shutdownGracePeriodByPodPriority", "requires feature gate GracefulNodeShutdownBasedOnPodPriority");
    }
    if !kc.shutdown_grace_period_by_pod_priority.is_empty() && (!total.is_zero() || !critical.is_zero()) {
        p.add(
            "shutdownGracePeriodByPodPriority",
            "cannot be specified together with shutdownGracePeriod or shutdownGracePeriodCriticalPods",
        );
    }
}

/// A Kubernetes quantity: `<number><suffix>` with a binary (`Ki`..`Ei`), decimal (`n`, `u`,
/// `m`, `k`, `M`..`E`) or exponent (`e3`) suffix.
fn is_quantity(text: &str) -> bool {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let number_len = unsigned.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_len);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return false;
    }
    match suffix {
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E" => true,
        exponent => exponent
            .strip_prefix(['e', 'E'])
            .map(|e| e.strip_prefix(['+', '-']).unwrap_or(e))
            .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())),
    }
}

fn is_clean_absolute(path: &str) -> bool {
    let p = Path::new(path);
    p.is_absolute()
        && !path.contains("//")
        && (path == "/" || !path.ends_with('/'))
        && p.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(validate(&KubeletConfiguration::default()), Vec::<String>::new());
    }

    #[test]
    fn quantities_and_thresholds() {
        for ok in ["10Mi", "100", "1.5Gi", "500m", "1e3", "0", "+1k", ".5"] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["", "Mi", "10MB", "1.2.3", "ten", "1e", "10 Mi"] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn clean_absolute_paths() {
        assert!(is_clean_absolute("/var/log/pods"));
        assert!(!is_clean_absolute("var/log"));
        assert!(!is_clean_absolute("/var/log/"));
        assert!(!is_clean_absolute("/var/../log"));
        assert!(!is_clean_absolute("/var//log"));
    }

    #[test]
    fn eviction_and_allocatable_rules() {
        let mut kc = KubeletConfiguration::default();
        kc.eviction_soft.insert("memory.available".into(), "200Mi".into());
        kc.eviction_hard.insert("disk.full".into(), "1%".into());
        kc.eviction_hard.insert("nodefs.available".into(), "0".into());
        kc.eviction_minimum_reclaim.insert("memory.available".into(), "0%".into());
        kc.enforce_node_allocatable = vec!["pods".into(), "system-reserved".into(), "pods".into()];
        let problems = validate(&kc);
        let expected = [
            "evictionHard[disk.full]: unsupported eviction signal",
            "evictionHard[nodefs.available]: eviction threshold nodefs.available must be positive: 0",
            "evictionMinimumReclaim[memory.available]: eviction percentage minimum reclaim memory.available must be \
             positive: 0%",
            "evictionSoftGracePeriod[memory.available]: required",
            "systemReservedCgroup: must be specified",
            "enforceNodeAllocatable: duplicated enforcement \"pods\"",
        ];
        for want in expected {
            assert!(problems.iter().any(|p| p.starts_with(want)), "{want} in {problems:#?}");
        }
        assert_eq!(problems.len(), expected.len(), "{problems:#?}");
    }

    #[test]
    fn tracing_as_upstream_validates_it() {
        use crate::config::TracingConfiguration;
        let with = |endpoint: Option<&str>, rate: Option<i32>| KubeletConfiguration {
            tracing: Some(TracingConfiguration {
                endpoint: endpoint.map(str::to_owned),
                sampling_rate_per_million: rate,
            }),
            ..KubeletConfiguration::default()
        };
        for (endpoint, rate) in [
            (None, None),
            (Some("localhost:4317"), Some(0)),
            (Some("unix:///run/otel.sock"), Some(1_000_000)),
            (Some("dns:///collector.monitoring:4317"), Some(100)),
            (Some("https://collector.example:4317"), None),
        ] {
            assert_eq!(validate(&with(endpoint, rate)), Vec::<String>::new(), "{endpoint:?} {rate:?}");
        }
        assert_eq!(
            validate(&with(None, Some(-1))),
            ["tracing.samplingRatePerMillion: Invalid value: -1: sampling rate must be positive"]
        );
        assert_eq!(
            validate(&with(None, Some(1_000_001))),
            ["tracing.samplingRatePerMillion: Invalid value: 1000001: sampling rate per million must be less \
                 than or equal to one million"]
        );
        let problems = validate(&with(Some("tcp://collector:4317"), None));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with(
                "tracing.endpoint: Invalid value: \"tcp://collector:4317\": unsupported scheme: tcp.  Options \
                 are none, dns, unix, or unix-abstract.  See https://github.com/grpc/grpc/blob/master/doc/naming.md"
            ),
            "{problems:?}"
        );
        let problems = validate(&with(Some("collector:otlp"), None));
        assert!(problems[0].starts_with("tracing.endpoint: Invalid value: \"dns://collector:otlp\": "), "{problems:?}");
    }

    #[test]
    fn cipher_suites_by_go_name() {
        assert_eq!(tls_cipher_suite_id("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"), Some(0xc02f));
        assert_eq!(tls_cipher_suite_id("TLS_RSA_WITH_AES_128_CBC_SHA"), None);
        let kc = KubeletConfiguration {
            tls_cipher_suites: vec!["TLS_RSA_WITH_AES_128_CBC_SHA".into()],
            tls_min_version: "VersionTLS10".into(),
            ..KubeletConfiguration::default()
        };
        let problems = validate(&kc);
        assert!(problems[0].starts_with("tlsCipherSuites[0]: unsupported cipher suite"), "{problems:?}");
        assert!(problems[1].starts_with("tlsMinVersion: \"VersionTLS10\" is not supported"), "{problems:?}");
    }

    #[test]
    fn reserved_cpus_and_memory_are_validated_as_upstream() {
        let kc = KubeletConfiguration {
            reserved_system_cpus: "0-x".into(),
            kube_reserved_cgroup: "/kube".into(),
            reserved_memory: vec![
                crate::config::kubelet_configuration::MemoryReservation {
                    numa_node: 0,
                    limits: [("memory".to_owned(), "0".to_owned()), ("cpu".to_owned(), "1".to_owned())].into(),
                },
                crate::config::kubelet_configuration::MemoryReservation {
                    numa_node: 0,
                    limits: [("memory".to_owned(), "1Gi".to_owned())].into(),
                },
            ],
            ..KubeletConfiguration::default()
        };
        let problems = validate(&kc);
        let has = |s: &str| problems.iter().any(|p| p.contains(s));
        assert!(
            has("reservedSystemCPUs: can't use reservedSystemCPUs (--reserved-cpus) with systemReservedCgroup"),
            "{problems:#?}"
        );
        assert!(
            has("reservedSystemCPUs: unable to parse reservedSystemCPUs (--reserved-cpus) 0-x, error: invalid cpuset"),
            "{problems:#?}"
        );
        assert!(has("reservedMemory: the limit type \"cpu\" for NUMA node 0 is not supported"), "{problems:#?}");
        assert!(
            has("reservedMemory: reserved memory may not be zero for NUMA node 0 and resource \"memory\""),
            "{problems:#?}"
        );
        assert!(
            has("reservedMemory: the reserved memory has a duplicate value for NUMA node 0 and resource \"memory\""),
            "{problems:#?}"
        );
    }
}
