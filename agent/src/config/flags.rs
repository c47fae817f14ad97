//! The command-line flags, named and spelled as the kubelet's (`cmd/kubelet/app/options`).
//!
//! As in the kubelet, a flag given on the command line wins over the same setting in the
//! `--config` file (upstream re-parses the command line on top of the loaded file), and a
//! flag that is not given changes nothing. Boolean flags take their value after `=` only
//! (`--fail-swap-on=false`), as Go's pflag does; `--fail-swap-on` alone means true.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Parser;

use super::kubelet_configuration::KubeletConfiguration;
use crate::types::duration::GoDuration;

/// The agent's command line.
#[derive(Debug, Clone, PartialEq, Parser)]
#[command(name = "swiftlet", version, about = "A Kubernetes node agent (kubelet)")]
pub struct Flags {
    /// `KubeletConfiguration` file (YAML or JSON). Flags override its values.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// kubeconfig of the API server; without it the agent runs standalone (static pods).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig whose credentials (a bootstrap token) request the agent's client
    /// certificate when the `--kubeconfig` file is missing or its certificate expired; the
    /// `--kubeconfig` file is then written, pointing at the certificate in `--cert-dir`.
    #[arg(long, value_name = "FILE")]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Rotate the client certificate before it expires (rotateCertificates).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub rotate_certificates: Option<bool>,
    /// CRI runtime endpoint (containerRuntimeEndpoint).
    #[arg(long, value_name = "URL")]
    pub container_runtime_endpoint: Option<String>,
    /// CRI image endpoint (imageServiceEndpoint).
    #[arg(long, value_name = "URL")]
    pub image_service_endpoint: Option<String>,
    /// Node name instead of the hostname (lowercased).
    #[arg(long, value_name = "NAME")]
    pub hostname_override: Option<String>,
    /// IP address(es) of the node, comma separated (one per family).
    #[arg(long, value_name = "IP[,IP]")]
    pub node_ip: Option<String>,
    /// Static pod manifest directory or file (staticPodPath).
    #[arg(long, value_name = "PATH")]
    pub pod_manifest_path: Option<String>,
    /// Directory of the agent's files (volume mounts, plugins, ...).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet")]
    pub root_dir: PathBuf,
    /// Directory of the TLS certificates; the self-signed serving certificate is written
    /// here when tlsCertFile is not set.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/kubelet/pki")]
    pub cert_dir: PathBuf,
    /// Log verbosity (logging.verbosity).
    #[arg(short = 'v', long = "v", value_name = "LEVEL")]
    pub verbosity: Option<u32>,
    /// Labels to add when registering the node, `key=value,...` (repeatable).
    #[arg(long, value_name = "KEY=VALUE,...", value_delimiter = ',', value_parser = parse_label)]
    pub node_labels: Vec<(String, String)>,
    /// Register the node with the API server (registerNode).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub register_node: Option<bool>,
    /// Root cgroup of pods (cgroupRoot).
    #[arg(long, value_name = "PATH")]
    pub cgroup_root: Option<String>,
    /// cgroupfs or systemd (cgroupDriver).
    #[arg(long, value_name = "DRIVER")]
    pub cgroup_driver: Option<String>,
    /// Maximum number of pods (maxPods).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_pods: Option<i32>,
    /// Maximum period between pod syncs (syncFrequency).
    #[arg(long, value_name = "DURATION")]
    pub sync_frequency: Option<GoDuration>,
    /// Period of static pod directory checks (fileCheckFrequency).
    #[arg(long, value_name = "DURATION")]
    pub file_check_frequency: Option<GoDuration>,
    /// Timeout of runtime requests (runtimeRequestTimeout).
    #[arg(long, value_name = "DURATION")]
    pub runtime_request_timeout: Option<GoDuration>,
    /// Port of the HTTPS API (port).
    #[arg(long, value_name = "PORT", allow_negative_numbers = true)]
    pub port: Option<i32>,
    /// IP address of the HTTPS API (address).
    #[arg(long, value_name = "IP")]
    pub address: Option<String>,
    /// Port of the healthz endpoint, 0 to disable (healthzPort).
    #[arg(long, value_name = "PORT", allow_negative_numbers = true)]
    pub healthz_port: Option<i32>,
    /// IP address of the healthz endpoint (healthzBindAddress).
    #[arg(long, value_name = "IP")]
    pub healthz_bind_address: Option<String>,
    /// Allow anonymous requests (authentication.anonymous.enabled).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub anonymous_auth: Option<bool>,
    /// CA bundle that verifies client certificates (authentication.x509.clientCAFile).
    #[arg(long, value_name = "FILE")]
    pub client_ca_file: Option<String>,
    /// `AlwaysAllow` or `Webhook` (authorization.mode).
    #[arg(long, value_name = "MODE")]
    pub authorization_mode: Option<String>,
    /// Serving certificate (tlsCertFile).
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<String>,
    /// Serving key (tlsPrivateKeyFile).
    #[arg(long, value_name = "FILE")]
    pub tls_private_key_file: Option<String>,
    /// Read-only port, 0 to disable (readOnlyPort).
    #[arg(long, value_name = "PORT", allow_negative_numbers = true)]
    pub read_only_port: Option<i32>,
    /// Refuse to start when swap is on (failSwapOn).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub fail_swap_on: Option<bool>,
    /// swiftlet only: use the eBPF sensors for the PLEG. `--evented-pleg=false` runs the
    /// 1 s relisting PLEG alone, as the upstream kubelet does.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub evented_pleg: Option<bool>,
    /// The sandbox (pause) image, kept by image GC. Default: the runtime's own, from its
    /// verbose CRI status.
    #[arg(long, value_name = "IMAGE")]
    pub pod_infra_container_image: Option<String>,
    /// Minimum age of a dead container before garbage collection (upstream's deprecated
    /// flag; default 0).
    #[arg(long, value_name = "DURATION")]
    pub minimum_container_ttl_duration: Option<GoDuration>,
    /// Dead containers kept per (pod, container); below 0: no limit (default 1).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub maximum_dead_containers_per_container: Option<i32>,
    /// Dead containers kept on the node; below 0: no limit (default -1).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub maximum_dead_containers: Option<i32>,
    /// swiftlet only: how often image GC runs (upstream's constant `ImageGCPeriod`, 5m).
    #[arg(long, value_name = "DURATION")]
    pub image_gc_period: Option<GoDuration>,
    /// swiftlet only: period of the safety-net relist that runs under the evented PLEG.
    /// Default 30s. (Without eBPF the relist period is the upstream 1s.)
    #[arg(long, value_name = "DURATION")]
    pub pleg_relist_period: Option<GoDuration>,
    /// swiftlet only: size of the eBPF sensors' ring buffer, in bytes: a power of two and a
    /// multiple of the page size. Default 262144 (256 KiB).
    #[arg(long, value_name = "BYTES")]
    pub evented_pleg_ring_buffer_bytes: Option<u32>,
    /// swiftlet only: unix socket of the node-local event API. Default
    /// `<root-dir>/swiftlet/events.sock`; an empty value turns the API off.
    #[arg(long, value_name = "PATH")]
    pub event_api_socket: Option<PathBuf>,
    /// swiftlet only: wake the eviction manager on the kernel's memory-pressure signals
    /// (PSI triggers, memcg thresholds, eBPF reclaim and OOM events). Default true;
    /// `--eviction-kernel-signals=false` leaves only the periodic 10 s pass, as the
    /// upstream kubelet without `kernelMemcgNotification`.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub eviction_kernel_signals: Option<bool>,
    /// swiftlet only: at most N sandbox starts and N container create+start pairs sent to
    /// the runtime at once; a call that takes over 5 s gives its slot back. Default: twice
    /// the CPUs, at least 4; 0: no limit, as upstream.
    #[arg(long, value_name = "N")]
    pub runtime_start_concurrency: Option<usize>,
}

impl Default for Flags {
    /// The flags of a command line that gives none.
    fn default() -> Self {
        Self::parse_from(["swiftlet"])
    }
}

impl Flags {
    /// Writes every flag that was given over the corresponding configuration field.
    pub fn apply_to(&self, kc: &mut KubeletConfiguration) {
        fn set<T: Clone>(field: &mut T, flag: Option<&T>) {
            if let Some(value) = flag {
                field.clone_from(value);
            }
        }
        set(&mut kc.container_runtime_endpoint, self.container_runtime_endpoint.as_ref());
        set(&mut kc.image_service_endpoint, self.image_service_endpoint.as_ref());
        set(&mut kc.static_pod_path, self.pod_manifest_path.as_ref());
        set(&mut kc.logging.verbosity, self.verbosity.as_ref());
        set(&mut kc.register_node, self.register_node.as_ref());
        set(&mut kc.cgroup_root, self.cgroup_root.as_ref());
        set(&mut kc.cgroup_driver, self.cgroup_driver.as_ref());
        set(&mut kc.max_pods, self.max_pods.as_ref());
        set(&mut kc.sync_frequency, self.sync_frequency.as_ref());
        set(&mut kc.file_check_frequency, self.file_check_frequency.as_ref());
        set(&mut kc.runtime_request_timeout, self.runtime_request_timeout.as_ref());
        set(&mut kc.port, self.port.as_ref());
        set(&mut kc.address, self.address.as_ref());
        set(&mut kc.healthz_port, self.healthz_port.as_ref());
        set(&mut kc.healthz_bind_address, self.healthz_bind_address.as_ref());
        set(&mut kc.authentication.anonymous.enabled, self.anonymous_auth.as_ref());
        set(&mut kc.authentication.x509.client_ca_file, self.client_ca_file.as_ref());
        set(&mut kc.authorization.mode, self.authorization_mode.as_ref());
        set(&mut kc.tls_cert_file, self.tls_cert_file.as_ref());
        set(&mut kc.tls_private_key_file, self.tls_private_key_file.as_ref());
        set(&mut kc.read_only_port, self.read_only_port.as_ref());
        set(&mut kc.fail_swap_on, self.fail_swap_on.as_ref());
        set(&mut kc.rotate_certificates, self.rotate_certificates.as_ref());
    }

    /// `--node-labels` as a map; a key given twice keeps its last value, as in the kubelet.
    #[must_use]
    pub fn node_labels(&self) -> BTreeMap<String, String> {
        self.node_labels.iter().cloned().collect()
    }
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => Ok((key.trim().to_owned(), value.trim().to_owned())),
        _ => Err(format!("{text:?} must be formatted as key=value")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Flags {
        Flags::try_parse_from(std::iter::once("swiftlet").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn parses_kubelet_spellings() {
        let flags = parse(&[
            "--config=/etc/kubelet.yaml",
            "--kubeconfig",
            "/etc/kubelet.conf",
            "-v=4",
            "--node-labels=a=b,c=d",
            "--node-labels",
            "e=f",
            "--sync-frequency=1m30s",
            "--fail-swap-on=false",
            "--anonymous-auth",
            "--bootstrap-kubeconfig=/etc/bootstrap-kubelet.conf",
            "--rotate-certificates",
            "--max-pods",
            "-1",
        ]);
        assert_eq!(flags.config, Some(PathBuf::from("/etc/kubelet.yaml")));
        assert_eq!(flags.kubeconfig, Some(PathBuf::from("/etc/kubelet.conf")));
        assert_eq!(flags.verbosity, Some(4));
        assert_eq!(flags.node_labels().len(), 3);
        assert_eq!(flags.node_labels()["c"], "d");
        assert_eq!(flags.sync_frequency, Some(GoDuration::from_secs(90)));
        assert_eq!(flags.fail_swap_on, Some(false));
        assert_eq!(flags.anonymous_auth, Some(true));
        assert_eq!(flags.bootstrap_kubeconfig, Some(PathBuf::from("/etc/bootstrap-kubelet.conf")));
        assert_eq!(flags.rotate_certificates, Some(true));
        assert_eq!(flags.max_pods, Some(-1));
        assert_eq!(flags.root_dir, PathBuf::from("/var/lib/kubelet"));
        assert_eq!(flags.cert_dir, PathBuf::from("/var/lib/kubelet/pki"));
        assert_eq!(parse(&["--v", "2"]).verbosity, Some(2));
        assert_eq!(parse(&[]).eviction_kernel_signals, None);
        assert_eq!(parse(&["--eviction-kernel-signals=false"]).eviction_kernel_signals, Some(false));
        assert_eq!(parse(&["--eviction-kernel-signals"]).eviction_kernel_signals, Some(true));
        assert_eq!(parse(&[]).runtime_start_concurrency, None);
        assert_eq!(parse(&["--runtime-start-concurrency=0"]).runtime_start_concurrency, Some(0));
        assert_eq!(parse(&["--runtime-start-concurrency", "8"]).runtime_start_concurrency, Some(8));
        assert!(Flags::try_parse_from(["swiftlet", "--runtime-start-concurrency=-1"]).is_err());
        assert_eq!(parse(&["-v", "3"]).verbosity, Some(3));
        assert_eq!(parse(&[]).evented_pleg_ring_buffer_bytes, None);
        assert_eq!(parse(&["--evented-pleg-ring-buffer-bytes=4096"]).evented_pleg_ring_buffer_bytes, Some(4096));
    }

    #[test]
    fn rejects_bad_values_naming_the_flag() {
        for args in [
            &["--sync-frequency=10"][..],
            &["--node-labels=novalue"],
            &["--port=http"],
            &["--fail-swap-on=maybe"],
            &["--evented-pleg-ring-buffer-bytes=-4096"],
            &["--evented-pleg-ring-buffer-bytes=256Ki"],
        ] {
            let err =
                Flags::try_parse_from(std::iter::once("swiftlet").chain(args.iter().copied())).expect_err("must fail");
            let flag = args[0].split('=').next().unwrap();
            assert!(err.to_string().contains(flag), "{err}");
        }
    }

    #[test]
    fn given_flags_override_and_absent_flags_do_not() {
        let mut kc = KubeletConfiguration { max_pods: 50, port: 11250, ..KubeletConfiguration::default() };
        parse(&["--max-pods=20", "--anonymous-auth=true", "--pod-manifest-path=/etc/pods"]).apply_to(&mut kc);
        assert_eq!(kc.max_pods, 20);
        assert_eq!(kc.port, 11250);
        assert!(kc.authentication.anonymous.enabled);
        assert_eq!(kc.static_pod_path, "/etc/pods");
    }
}
