//! The agent's configuration: the upstream `KubeletConfiguration` file
//! (`kubelet.config.k8s.io/v1beta1`), the kubelet's command-line flags on top of it, the
//! upstream defaults, and validation. [`load`] turns [`Flags`] into a [`Config`] or into
//! one error that lists every problem.
//!
//! `config` is a leaf module: it uses nothing of the crate but other leaves (`types`),
//! and no subsystem reads it. The `settings` module turns a [`Config`] into each
//! subsystem's own settings; the value types and checks that validation shares with a
//! subsystem (Go durations, CPU sets, eviction thresholds, the tracing endpoint, TLS
//! cipher suites) live in the `types` leaf.
//!
//! # Order
//! As in the kubelet: read the `--config` file (YAML or JSON), apply the v1beta1 defaults,
//! then the flags that were given (a flag wins over the file), then validate everything.
//!
//! # Which fields have an effect
//! Every upstream v1beta1 field is accepted and kept (and shown by `/configz`), so an
//! upstream config file loads unchanged. The agent acts on a growing subset; as of now:
//! - server: `enableServer`, `address`, `port`, `readOnlyPort`, `healthzPort`,
//!   `healthzBindAddress`, `tlsCertFile`, `tlsPrivateKeyFile`, `tlsCipherSuites`,
//!   `tlsMinVersion`, `authentication.x509.clientCAFile`, `authentication.anonymous.enabled`,
//!   `authentication.webhook.enabled`/`cacheTTL`, `authorization.mode` and
//!   `authorization.webhook.cacheAuthorizedTTL`/`cacheUnauthorizedTTL` (the webhooks need
//!   `--kubeconfig`; see [`crate::server`]).
//! - used by the modules being written (sources, sync loop, runtime, node, cm, eviction,
//!   images, gc, telemetry): `staticPodPath`, `syncFrequency`, `fileCheckFrequency`,
//!   `containerRuntimeEndpoint`, `imageServiceEndpoint`, `runtimeRequestTimeout`,
//!   `cgroupRoot`, `cgroupDriver`, `cgroupsPerQOS`, `maxPods`, `podPidsLimit`,
//!   `nodeStatus*Frequency`, `nodeLeaseDurationSeconds`, `registerNode`,
//!   `registerWithTaints`, `eviction*`, `imageGC*`, `serializeImagePulls`,
//!   `maxParallelImagePulls`, `registryPullQPS`/`registryBurst`, `containerLog*`,
//!   `clusterDomain`, `clusterDNS`, `resolvConf`, `failSwapOn`, `tracing`,
//!   `logging.verbosity`/`logging.format`. Each module documents what it honours.
//! - everything else is stored only.
//!
//! # Deliberate differences from the upstream kubelet
//! - Unknown fields are errors, all listed with their paths (`unknown field
//!   "authentication.x509.caFile"`); upstream falls back to lenient decoding and only logs.
//!   A misspelt security setting must not be silently ignored.
//! - Unknown feature gates are accepted (the agent does not know every upstream gate).
//! - `tlsMinVersion` below TLS 1.2 and non-AEAD cipher suites are refused (rustls has
//!   none).
//! - `cgroupRoot` defaults to "/" (upstream stores "" and reads it as "/").

mod decode;
mod flags;
mod kubelet_configuration;
mod validation;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

pub use crate::types::duration::{GoDuration, ParseDurationError};
pub use decode::{API_VERSION, KIND};
pub use flags::Flags;
pub use kubelet_configuration::{
    AUTHORIZATION_MODE_ALWAYS_ALLOW, AUTHORIZATION_MODE_WEBHOOK, CrashLoopBackOffConfig, DEFAULT_EVICTION_HARD,
    FormatOptions, KubeletAnonymousAuthentication, KubeletAuthentication, KubeletAuthorization, KubeletConfiguration,
    KubeletWebhookAuthentication, KubeletWebhookAuthorization, KubeletX509Authentication, LoggingConfiguration,
    MemoryReservation, MemorySwapConfiguration, OutputRoutingOptions, ShutdownGracePeriodByPodPriority,
    TracingConfiguration, UserNamespaces, VModuleItem, default_eviction_hard,
};
pub use validation::validate;

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `--config` file could not be read.
    #[error("reading kubelet config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The `--config` file is not a YAML or JSON object.
    #[error("parsing kubelet config file {}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The hostname (the node name without `--hostname-override`) could not be read.
    #[error("reading the hostname for the node name (or set --hostname-override): {source}")]
    Hostname {
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The configuration has problems: every one of them, one per line.
    #[error("{}", invalid_message(config_file.as_deref(), problems))]
    Invalid {
        /// The `--config` file, if one was given.
        config_file: Option<PathBuf>,
        /// `field: message`, one per problem.
        problems: Vec<String>,
    },
}

fn invalid_message(config_file: Option<&Path>, problems: &[String]) -> String {
    let source = match config_file {
        Some(path) => format!("{} and flags", path.display()),
        None => "flags".to_owned(),
    };
    let mut message = format!("invalid configuration ({source}):");
    for problem in problems {
        message.push_str("\n  ");
        message.push_str(problem);
    }
    message
}

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The agent's loaded configuration: the `KubeletConfiguration` with flags applied, and the
/// flag-only settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The defaulted, validated configuration (file + flags).
    pub kubelet: KubeletConfiguration,
    /// `--hostname-override` lowercased, else the hostname lowercased.
    pub node_name: String,
    /// `--kubeconfig`; `None` means standalone mode.
    pub kubeconfig: Option<PathBuf>,
    /// `--bootstrap-kubeconfig` (needs `--kubeconfig`, where the result is written).
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// `--root-dir`. Default: /var/lib/kubelet.
    pub root_dir: PathBuf,
    /// `--cert-dir`. Default: /var/lib/kubelet/pki.
    pub cert_dir: PathBuf,
    /// `logging.verbosity` after `-v` (capped at 255).
    pub verbosity: u8,
    /// `--node-ip`, as given.
    pub node_ip: Option<String>,
    /// `--node-labels`.
    pub node_labels: BTreeMap<String, String>,
    /// `--config`.
    pub config_file: Option<PathBuf>,
    /// `--pod-infra-container-image`: the sandbox image image GC keeps (`None`: ask the
    /// runtime).
    pub pod_infra_container_image: Option<String>,
    /// Container garbage collection (upstream's flag-only `GCPolicy`).
    pub container_gc: ContainerGcOptions,
    /// Settings that exist only in swiftlet (flags; not part of `KubeletConfiguration`).
    pub swiftlet: SwiftletOptions,
}

/// The container GC flags (upstream's flag-only `GCPolicy`, not part of
/// `KubeletConfiguration`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerGcOptions {
    /// `--minimum-container-ttl-duration`: minimum age of a dead container before it may
    /// be removed. Default: 0.
    pub minimum_container_ttl_duration: std::time::Duration,
    /// `--maximum-dead-containers-per-container`: dead containers kept per (pod,
    /// container); below 0: no limit. Default: 1.
    pub maximum_dead_containers_per_container: i32,
    /// `--maximum-dead-containers`: dead containers kept on the node; below 0: no limit.
    /// Default: -1.
    pub maximum_dead_containers: i32,
}

/// swiftlet's own settings, given as flags so that a `KubeletConfiguration` file stays
/// exactly the upstream type.
#[derive(Debug, Clone, PartialEq)]
pub struct SwiftletOptions {
    /// `--evented-pleg`: use the eBPF sensors. Default: true.
    pub evented_pleg: bool,
    /// `--pleg-relist-period`: the safety-net relist under the evented PLEG. Default: 30s.
    pub pleg_relist_period: std::time::Duration,
    /// `--evented-pleg-ring-buffer-bytes`: the eBPF sensors' ring buffer, in bytes (a power
    /// of two and a multiple of the page size). Default: 262144 (256 KiB).
    pub evented_pleg_ring_buffer_bytes: u32,
    /// `--image-gc-period`: how often image GC runs. `None` (the default): image GC's
    /// own period, 5m (upstream's constant).
    pub image_gc_period: Option<std::time::Duration>,
    /// `--event-api-socket`: `None` turns the event API off. Default:
    /// `<root-dir>/swiftlet/events.sock`.
    pub event_api_socket: Option<PathBuf>,
    /// `--eviction-kernel-signals`: kernel memory-pressure signals (PSI, memcg
    /// thresholds, eBPF) wake the eviction manager; false leaves the 10 s pass alone.
    /// Default: true.
    pub eviction_kernel_signals: bool,
    /// `--runtime-start-concurrency`: sandbox starts and container create+start pairs sent
    /// to the runtime at once; 0: no limit. `None` (the default): the runtime's own
    /// default (twice the CPUs, at least 4).
    pub runtime_start_concurrency: Option<usize>,
}

/// Reads the `--config` file, applies defaults and flags, and validates the result.
pub fn load(flags: Flags) -> Result<Config> {
    load_with_hostname(flags, os_hostname)
}

/// The machine's hostname, as Go's `os.Hostname` reads it on Linux.
pub fn os_hostname() -> io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/hostname")?.trim().to_owned())
}

/// [`load`] with the hostname lookup injected (tests must not depend on the machine).
fn load_with_hostname(flags: Flags, hostname: impl FnOnce() -> io::Result<String>) -> Result<Config> {
    let mut problems = Vec::new();
    let mut kubelet = match &flags.config {
        None => KubeletConfiguration::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| Error::Read { path: path.clone(), source })?;
            let decoded =
                decode::decode(&text).map_err(|e| Error::Parse { path: path.clone(), message: e.to_string() })?;
            problems = decoded.problems;
            match decoded.config {
                Some(config) => config,
                // Values of the wrong type: nothing typed to validate further.
                None => return Err(invalid(&flags, problems)),
            }
        }
    };
    flags.apply_to(&mut kubelet);
    problems.extend(validate(&kubelet));

    let node_name = match &flags.hostname_override {
        Some(name) => name.trim().to_lowercase(),
        None => hostname().map_err(|source| Error::Hostname { source })?.trim().to_lowercase(),
    };
    if node_name.is_empty() {
        problems.push("--hostname-override: the node name must not be empty".to_owned());
    }
    if let Some(ips) = &flags.node_ip {
        for ip in ips.split(',') {
            if ip.trim().parse::<std::net::IpAddr>().is_err() {
                problems.push(format!("--node-ip: {ip:?} is not a valid IP address"));
            }
        }
    }
    if flags.bootstrap_kubeconfig.is_some() && flags.kubeconfig.is_none() {
        problems.push(
            "--bootstrap-kubeconfig: needs --kubeconfig, the file the bootstrapped credentials are written to"
                .to_owned(),
        );
    }
    if flags.pleg_relist_period.is_some_and(|d| d.to_std().is_zero()) {
        problems.push("--pleg-relist-period: must be greater than 0".to_owned());
    }
    if let Some(bytes) = flags.evented_pleg_ring_buffer_bytes {
        let sensors = swiftlet_ebpf::SensorConfig { ring_buffer_bytes: bytes, ..Default::default() };
        if sensors.validate().is_err() {
            problems.push(format!(
                "--evented-pleg-ring-buffer-bytes: {bytes} must be a power of two and a multiple of the page size ({})",
                page_size()
            ));
        }
    }
    if flags.image_gc_period.is_some_and(|d| d.is_negative() || d.to_std().is_zero()) {
        problems.push("--image-gc-period: must be greater than 0".to_owned());
    }
    if flags.minimum_container_ttl_duration.is_some_and(GoDuration::is_negative) {
        problems.push("--minimum-container-ttl-duration: must not be negative".to_owned());
    }
    if !problems.is_empty() {
        return Err(invalid(&flags, problems));
    }
    Ok(Config {
        pod_infra_container_image: flags.pod_infra_container_image.clone().filter(|i| !i.is_empty()),
        container_gc: ContainerGcOptions {
            minimum_container_ttl_duration: flags
                .minimum_container_ttl_duration
                .map_or(std::time::Duration::ZERO, GoDuration::to_std),
            maximum_dead_containers_per_container: flags.maximum_dead_containers_per_container.unwrap_or(1),
            maximum_dead_containers: flags.maximum_dead_containers.unwrap_or(-1),
        },
        verbosity: u8::try_from(kubelet.logging.verbosity).unwrap_or(u8::MAX),
        kubelet,
        node_name,
        kubeconfig: flags.kubeconfig.clone(),
        bootstrap_kubeconfig: flags.bootstrap_kubeconfig.clone(),
        root_dir: flags.root_dir.clone(),
        cert_dir: flags.cert_dir.clone(),
        node_ip: flags.node_ip.clone(),
        node_labels: flags.node_labels(),
        swiftlet: SwiftletOptions {
            evented_pleg: flags.evented_pleg.unwrap_or(true),
            pleg_relist_period: flags.pleg_relist_period.map_or(std::time::Duration::from_secs(30), GoDuration::to_std),
            evented_pleg_ring_buffer_bytes: flags
                .evented_pleg_ring_buffer_bytes
                .unwrap_or(swiftlet_ebpf::SensorConfig::default().ring_buffer_bytes),
            image_gc_period: flags.image_gc_period.map(GoDuration::to_std),
            event_api_socket: match &flags.event_api_socket {
                Some(p) if p.as_os_str().is_empty() => None,
                Some(p) => Some(p.clone()),
                None => Some(flags.root_dir.join("swiftlet").join("events.sock")),
            },
            eviction_kernel_signals: flags.eviction_kernel_signals.unwrap_or(true),
            runtime_start_concurrency: flags.runtime_start_concurrency,
        },
        config_file: flags.config,
    })
}

/// The memory page size, for the message of a bad ring buffer size.
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

fn invalid(flags: &Flags, problems: Vec<String>) -> Error {
    Error::Invalid { config_file: flags.config.clone(), problems }
}

#[cfg(test)]
mod tests;
