//! Tests of loading: files, defaults, flags and error reporting together.

use std::io::Write;

use clap::Parser;

use super::*;

const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn write_file(text: &str, suffix: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new().suffix(suffix).tempfile().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file
}

fn flags(args: &[&str]) -> Flags {
    Flags::try_parse_from(std::iter::once("swiftlet").chain(args.iter().copied())).unwrap()
}

fn load_file(text: &str, extra_args: &[&str]) -> Result<Config> {
    let file = write_file(text, ".yaml");
    let config_arg = format!("--config={}", file.path().display());
    let mut args = vec![config_arg.as_str()];
    args.extend_from_slice(extra_args);
    load_with_hostname(flags(&args), || Ok("Node-A".to_owned()))
}

fn problems(result: Result<Config>) -> Vec<String> {
    match result {
        Err(Error::Invalid { problems, .. }) => problems,
        other => panic!("expected Error::Invalid, got {other:?}"),
    }
}

#[test]
fn defaults_equal_upstream_v1beta1() {
    let kc = KubeletConfiguration::default();
    let json = serde_json::to_value(&kc).unwrap();
    let expected: serde_json::Value = serde_json::from_str(
        r#"{
        "enableServer": true,
        "syncFrequency": "1m0s",
        "fileCheckFrequency": "20s",
        "httpCheckFrequency": "20s",
        "address": "0.0.0.0",
        "port": 10250,
        "readOnlyPort": 0,
        "rotateCertificates": false,
        "serverTLSBootstrap": false,
        "authentication": {
            "x509": {},
            "webhook": {"enabled": true, "cacheTTL": "2m0s"},
            "anonymous": {"enabled": false}
        },
        "authorization": {
            "mode": "Webhook",
            "webhook": {"cacheAuthorizedTTL": "5m0s", "cacheUnauthorizedTTL": "30s"}
        },
        "registryPullQPS": 5,
        "registryBurst": 10,
        "eventRecordQPS": 50,
        "eventBurst": 100,
        "enableDebuggingHandlers": true,
        "healthzPort": 10248,
        "healthzBindAddress": "127.0.0.1",
        "oomScoreAdj": -999,
        "streamingConnectionIdleTimeout": "4h0m0s",
        "nodeStatusUpdateFrequency": "10s",
        "nodeStatusReportFrequency": "5m0s",
        "nodeLeaseDurationSeconds": 40,
        "imageMinimumGCAge": "2m0s",
        "imageMaximumGCAge": "0s",
        "imageGCHighThresholdPercent": 85,
        "imageGCLowThresholdPercent": 80,
        "volumeStatsAggPeriod": "1m0s",
        "cgroupRoot": "/",
        "cgroupsPerQOS": true,
        "cgroupDriver": "cgroupfs",
        "cpuManagerPolicy": "none",
        "cpuManagerReconcilePeriod": "10s",
        "memoryManagerPolicy": "None",
        "topologyManagerPolicy": "none",
        "topologyManagerScope": "container",
        "runtimeRequestTimeout": "2m0s",
        "hairpinMode": "promiscuous-bridge",
        "maxPods": 110,
        "podPidsLimit": -1,
        "resolvConf": "/etc/resolv.conf",
        "cpuCFSQuota": true,
        "cpuCFSQuotaPeriod": "100ms",
        "nodeStatusMaxImages": 50,
        "maxOpenFiles": 1000000,
        "contentType": "application/vnd.kubernetes.protobuf",
        "kubeAPIQPS": 50,
        "kubeAPIBurst": 100,
        "serializeImagePulls": true,
        "evictionHard": {
            "imagefs.available": "15%",
            "imagefs.inodesFree": "5%",
            "memory.available": "100Mi",
            "nodefs.available": "10%",
            "nodefs.inodesFree": "5%"
        },
        "evictionPressureTransitionPeriod": "5m0s",
        "mergeDefaultEvictionSettings": false,
        "podsPerCore": 0,
        "enableControllerAttachDetach": true,
        "makeIPTablesUtilChains": true,
        "iptablesMasqueradeBit": 14,
        "iptablesDropBit": 15,
        "failSwapOn": true,
        "containerLogMaxSize": "10Mi",
        "containerLogMaxFiles": 5,
        "containerLogMaxWorkers": 1,
        "containerLogMonitorInterval": "10s",
        "configMapAndSecretChangeDetectionStrategy": "Watch",
        "enforceNodeAllocatable": ["pods"],
        "registerNode": true,
        "shutdownGracePeriod": "0s",
        "shutdownGracePeriodCriticalPods": "0s",
        "enableProfilingHandler": true,
        "enableDebugFlagsHandler": true,
        "enableSystemLogHandler": true,
        "localStorageCapacityIsolation": true,
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "logging": {"format": "text", "flushFrequency": "5s", "verbosity": 0},
        "podLogsDir": "/var/log/pods",
        "volumePluginDir": "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/",
        "memoryThrottlingFactor": 0.9,
        "failCgroupV1": false,
        "seccompDefault": false
    }"#,
    )
    .unwrap();
    for (key, want) in expected.as_object().unwrap() {
        let got = &json[key];
        match (want, got) {
            // Nested objects: the listed keys must match (others may exist).
            (serde_json::Value::Object(want), serde_json::Value::Object(got)) => {
                for (k, v) in want {
                    if let serde_json::Value::Object(inner) = v {
                        for (ik, iv) in inner {
                            assert_eq!(&got[k][ik], iv, "{key}.{k}.{ik}");
                        }
                    } else {
                        assert_eq!(&got[k], v, "{key}.{k}");
                    }
                }
            }
            _ => assert_eq!(got, want, "{key}"),
        }
    }
    // Fields without a default are left out, as upstream's omitempty does.
    for absent in ["staticPodPath", "tlsCertFile", "maxParallelImagePulls", "tracing", "clusterDNS"] {
        assert!(json.get(absent).is_none(), "{absent} should be omitted");
    }
}

#[test]
fn a_file_with_only_type_meta_is_the_defaults() {
    let config = load_file(HEADER, &["--authorization-mode=AlwaysAllow"]).unwrap();
    let mut expected = KubeletConfiguration::default();
    expected.authorization.mode = "AlwaysAllow".to_owned();
    assert_eq!(config.kubelet, expected);
    assert_eq!(config.node_name, "node-a");
    assert_eq!(config.root_dir, PathBuf::from("/var/lib/kubelet"));
    assert_eq!(config.cert_dir, PathBuf::from("/var/lib/kubelet/pki"));
    assert!(config.config_file.is_some());
}

#[test]
fn yaml_file_is_read() {
    let yaml = format!(
        "{HEADER}\
staticPodPath: /etc/kubernetes/manifests
syncFrequency: 30s
address: 127.0.0.1
port: 11250
healthzPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
  x509:
    clientCAFile: /etc/ca.crt
authorization:
  mode: AlwaysAllow
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
evictionHard:
  memory.available: 200Mi
featureGates:
  SomeGate: true
registerWithTaints:
  - key: dedicated
    value: infra
    effect: NoSchedule
logging:
  format: json
  flushFrequency: 1000000000
  verbosity: 3
tracing:
  endpoint: localhost:4317
  samplingRatePerMillion: 100
"
    );
    let config = load_file(&yaml, &[]).unwrap();
    let kc = &config.kubelet;
    assert_eq!(kc.static_pod_path, "/etc/kubernetes/manifests");
    assert_eq!(kc.sync_frequency, GoDuration::from_secs(30));
    assert_eq!(kc.port, 11250);
    assert_eq!(kc.healthz_port, 0, "an explicit 0 disables healthz, as upstream");
    assert!(kc.authentication.anonymous.enabled);
    assert!(!kc.authentication.webhook.enabled);
    assert_eq!(kc.authentication.x509.client_ca_file, "/etc/ca.crt");
    assert_eq!(kc.cluster_dns, ["10.96.0.10"]);
    assert_eq!(kc.eviction_hard.len(), 1, "a given evictionHard replaces the defaults");
    assert!(kc.feature_gates["SomeGate"]);
    assert_eq!(kc.register_with_taints[0].effect, "NoSchedule");
    assert_eq!(kc.logging.flush_frequency, GoDuration::from_secs(1));
    assert_eq!(config.verbosity, 3);
    assert_eq!(kc.tracing.as_ref().unwrap().sampling_rate_per_million, Some(100));
    // Untouched fields keep their defaults.
    assert_eq!(kc.max_pods, 110);
    assert_eq!(kc.file_check_frequency, GoDuration::from_secs(20));
}

#[test]
fn json_file_is_read() {
    let json = r#"{
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "maxPods": 42,
        "cgroupDriver": "systemd",
        "authorization": {"mode": "AlwaysAllow"},
        "authentication": {"webhook": {"enabled": false}},
        "reservedMemory": [{"numaNode": 0, "limits": {"memory": 1073741824}}]
    }"#;
    let file = write_file(json, ".json");
    let config =
        load_with_hostname(flags(&[&format!("--config={}", file.path().display())]), || Ok("host".to_owned())).unwrap();
    assert_eq!(config.kubelet.max_pods, 42);
    assert_eq!(config.kubelet.cgroup_driver, "systemd");
    assert_eq!(config.kubelet.reserved_memory[0].limits["memory"], "1073741824");
}

#[test]
fn zero_values_take_defaults_like_upstream() {
    let yaml = format!(
        "{HEADER}port: 0\nsyncFrequency: 0s\naddress: \"\"\nmaxPods: 0\nregistryPullQPS: 0\n\
         podPidsLimit: -5\nnodeStatusUpdateFrequency: 20s\nmaxParallelImagePulls: 3\n\
         mergeDefaultEvictionSettings: true\nevictionHard:\n  memory.available: 1Gi\n"
    );
    let kc = load_file(&yaml, &[]).unwrap().kubelet;
    assert_eq!(kc.port, 10250);
    assert_eq!(kc.sync_frequency, GoDuration::from_mins(1));
    assert_eq!(kc.address, "0.0.0.0");
    assert_eq!(kc.max_pods, 110);
    assert_eq!(kc.registry_pull_qps, 0, "a pointer field upstream: 0 means no limit");
    assert_eq!(kc.pod_pids_limit, -1);
    assert_eq!(
        kc.node_status_report_frequency,
        GoDuration::from_secs(20),
        "report frequency follows an explicit update frequency"
    );
    assert!(!kc.serialize_image_pulls, "maxParallelImagePulls >= 2 turns serial pulls off");
    assert_eq!(kc.eviction_hard["memory.available"], "1Gi");
    assert_eq!(kc.eviction_hard["nodefs.available"], "10%", "merged default");
    assert_eq!(kc.eviction_hard.len(), 5);
}

#[test]
fn flags_win_over_the_file() {
    let yaml = format!(
        "{HEADER}maxPods: 50\nport: 11250\nstaticPodPath: /from/file\nfailSwapOn: true\n\
         authentication:\n  anonymous:\n    enabled: false\n"
    );
    let config = load_file(
        &yaml,
        &[
            "--max-pods=20",
            "--pod-manifest-path=/from/flag",
            "--fail-swap-on=false",
            "--anonymous-auth",
            "--sync-frequency=5s",
            "--hostname-override=Worker-7",
            "--node-labels=zone=a,tier=web",
            "--v=5",
        ],
    )
    .unwrap();
    let kc = &config.kubelet;
    assert_eq!(kc.max_pods, 20);
    assert_eq!(kc.port, 11250, "a flag not given leaves the file's value");
    assert_eq!(kc.static_pod_path, "/from/flag");
    assert!(!kc.fail_swap_on);
    assert!(kc.authentication.anonymous.enabled);
    assert_eq!(kc.sync_frequency, GoDuration::from_secs(5));
    assert_eq!(config.node_name, "worker-7");
    assert_eq!(config.node_labels["tier"], "web");
    assert_eq!(config.verbosity, 5);
}

#[test]
fn without_a_file_flags_apply_to_the_defaults() {
    let config =
        load_with_hostname(flags(&["--port=12250", "--kubeconfig=/etc/kubelet.conf", "--node-ip=10.0.0.5"]), || {
            Ok("MyHost\n".to_owned())
        })
        .unwrap();
    assert_eq!(config.kubelet.port, 12250);
    assert_eq!(config.node_name, "myhost");
    assert_eq!(config.kubeconfig, Some(PathBuf::from("/etc/kubelet.conf")));
    assert_eq!(config.config_file, None);
}

#[test]
fn every_problem_is_reported_at_once() {
    let yaml = format!(
        "{HEADER}syncFrequency: -1s\nmaxPods: -1\nimageGCHighThresholdPercent: 70\n\
         imageGCLowThresholdPercent: 190\ncgroupDriver: x\nauthorization:\n  mode: Magic\n"
    );
    let err = load_file(&yaml, &["--port=70000", "--node-ip=not-an-ip"]).unwrap_err();
    let text = err.to_string();
    let expected = [
        "syncFrequency: must be greater than 0",
        "maxPods: -1 must not be a negative number",
        "imageGCLowThresholdPercent: 190 must be between 0 and 100, inclusive",
        "imageGCLowThresholdPercent: 190 must be less than imageGCHighThresholdPercent 70",
        "cgroupDriver: unsupported value \"x\"",
        "authorization.mode: unsupported value \"Magic\"",
        "port: 70000 must be between 1 and 65535, inclusive",
        "--node-ip: \"not-an-ip\" is not a valid IP address",
    ];
    for want in expected {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    assert!(text.starts_with("invalid configuration ("), "{text}");
    assert_eq!(text.lines().count(), expected.len() + 1, "one line each:\n{text}");
}

#[test]
fn unknown_fields_are_all_reported_with_paths() {
    let yaml = format!(
        "{HEADER}foo: 1\nauthentication:\n  x509:\n    caFile: /x\n  anonymous:\n    enabled: true\n\
         registerWithTaints:\n  - key: k\n    effect: NoSchedule\n    bogus: 1\n\
         logging:\n  options:\n    text:\n      color: true\nmaxPods: -3\n"
    );
    let problems = problems(load_file(&yaml, &[]));
    for want in [
        "unknown field \"foo\"",
        "unknown field \"authentication.x509.caFile\"",
        "unknown field \"registerWithTaints[0].bogus\"",
        "unknown field \"logging.options.text.color\"",
        // Validation still runs when only unknown fields are wrong.
        "maxPods: -3 must not be a negative number",
    ] {
        assert!(problems.iter().any(|p| p == want || p.starts_with(want)), "{want:?} in {problems:#?}");
    }
}

#[test]
fn values_of_the_wrong_type_are_all_reported() {
    let yaml = format!(
        "{HEADER}port: \"abc\"\nsyncFrequency: 10\nauthentication:\n  anonymous:\n    enabled: maybe\n\
         evictionHard: [1]\nstreamingConnectionIdleTimeout: 3days\n"
    );
    let problems = problems(load_file(&yaml, &[]));
    for want in [
        "port: invalid type: string \"abc\", expected i32",
        "syncFrequency: invalid type: integer `10`, expected a string",
        "authentication.anonymous.enabled: invalid type: string \"maybe\", expected a boolean",
        "evictionHard: invalid type: sequence, expected a map",
        "streamingConnectionIdleTimeout: time: unknown unit in duration \"3days\"",
    ] {
        assert!(problems.iter().any(|p| p == want), "{want:?} in {problems:#?}");
    }
    assert_eq!(problems.len(), 5, "{problems:#?}");
}

#[test]
fn kind_and_api_version_are_checked() {
    let problems_of = |text: &str| problems(load_file(text, &[]));
    let wrong = problems_of("apiVersion: kubelet.config.k8s.io/v1\nkind: KubeProxyConfiguration\n");
    assert_eq!(
        wrong,
        [
            "apiVersion: unsupported value \"kubelet.config.k8s.io/v1\", must be \
             \"kubelet.config.k8s.io/v1beta1\"",
            "kind: unsupported value \"KubeProxyConfiguration\", must be \"KubeletConfiguration\"",
        ]
    );
    let missing = problems_of("maxPods: 10\n");
    assert_eq!(
        missing,
        [
            "apiVersion: required value, must be \"kubelet.config.k8s.io/v1beta1\"",
            "kind: required value, must be \"KubeletConfiguration\"",
        ]
    );
}

#[test]
fn unreadable_and_malformed_files() {
    let missing =
        load_with_hostname(flags(&["--config=/nonexistent/kubelet.yaml"]), || Ok("h".to_owned())).unwrap_err();
    assert!(matches!(missing, Error::Read { .. }), "{missing}");
    assert!(missing.to_string().contains("/nonexistent/kubelet.yaml"), "{missing}");
    for text in ["", "  \n", "- a\n- b\n", "key: [unclosed\n", "{\"a\": }"] {
        let err = load_file(text, &[]).unwrap_err();
        assert!(matches!(err, Error::Parse { .. }), "{text:?}: {err}");
    }
}

#[test]
fn configz_shape_round_trips() {
    let config =
        load_file(&format!("{HEADER}maxPods: 7\nsyncFrequency: 1h2m3.5s\nclusterDNS: [10.0.0.10]\n"), &[]).unwrap();
    let configz = config.kubelet.to_configz_json();
    let inner = &configz["kubeletconfig"];
    assert_eq!(inner["maxPods"], 7);
    assert_eq!(inner["syncFrequency"], "1h2m3.5s");
    assert!(inner.get("kind").is_none(), "configz has no type meta, like upstream");
    // What /configz shows, with the type meta put back, loads as the same configuration.
    let mut document = inner.clone();
    document["apiVersion"] = API_VERSION.into();
    document["kind"] = KIND.into();
    let again = load_file(&document.to_string(), &[]).unwrap();
    assert_eq!(again.kubelet, config.kubelet);
}

#[test]
fn hostname_errors_name_the_flag() {
    let err = load_with_hostname(Flags::default(), || Err(io::Error::other("no uts"))).unwrap_err();
    assert!(err.to_string().contains("--hostname-override"), "{err}");
}

#[test]
fn container_gc_flags_default_as_upstream_and_can_be_set() {
    let minimal = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    let c = load_file(minimal, &[]).unwrap();
    assert_eq!(
        c.container_gc,
        ContainerGcOptions {
            minimum_container_ttl_duration: std::time::Duration::ZERO,
            maximum_dead_containers_per_container: 1,
            maximum_dead_containers: -1,
        }
    );
    let c = load_file(
        minimal,
        &[
            "--minimum-container-ttl-duration=1m",
            "--maximum-dead-containers-per-container=3",
            "--maximum-dead-containers=100",
        ],
    )
    .unwrap();
    assert_eq!(
        c.container_gc,
        ContainerGcOptions {
            minimum_container_ttl_duration: std::time::Duration::from_mins(1),
            maximum_dead_containers_per_container: 3,
            maximum_dead_containers: 100,
        }
    );
    let p = problems(load_file(minimal, &["--minimum-container-ttl-duration=-1s"]));
    assert!(p.iter().any(|p| p.contains("--minimum-container-ttl-duration")), "{p:?}");
}

#[test]
fn image_gc_period_is_left_to_image_gc_unless_given() {
    let minimal = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    assert_eq!(load_file(minimal, &[]).unwrap().swiftlet.image_gc_period, None);
    assert_eq!(
        load_file(minimal, &["--image-gc-period=1m"]).unwrap().swiftlet.image_gc_period,
        Some(std::time::Duration::from_mins(1))
    );
    let c = load_file(minimal, &["--image-gc-period=30s"]).unwrap();
    assert_eq!(c.swiftlet.image_gc_period, Some(std::time::Duration::from_secs(30)));
    for bad in ["--image-gc-period=0s", "--image-gc-period=-1m"] {
        let p = problems(load_file(minimal, &[bad]));
        assert!(p.iter().any(|p| p.contains("--image-gc-period: must be greater than 0")), "{bad}: {p:?}");
    }
}

#[test]
fn image_pull_and_gc_settings_are_validated_like_upstream() {
    let load = |yaml: &str| load_file(&format!("{HEADER}{yaml}"), &[]);
    let one_problem = |yaml: &str| {
        let p = problems(load(yaml));
        assert_eq!(p.len(), 1, "{yaml}: {p:#?}");
        p[0].clone()
    };
    assert_eq!(one_problem("maxParallelImagePulls: 0\n"), "maxParallelImagePulls: 0 must be a positive number");
    assert_eq!(
        one_problem("serializeImagePulls: true\nmaxParallelImagePulls: 2\n"),
        "maxParallelImagePulls: cannot be larger than 1 unless serializeImagePulls is false"
    );
    assert!(load("serializeImagePulls: true\nmaxParallelImagePulls: 1\n").is_ok());
    let parallel = load("serializeImagePulls: false\nmaxParallelImagePulls: 5\n").unwrap().kubelet;
    assert_eq!((parallel.serialize_image_pulls, parallel.max_parallel_image_pulls), (false, Some(5)));

    assert_eq!(
        one_problem("imageGCHighThresholdPercent: 101\n"),
        "imageGCHighThresholdPercent: 101 must be between 0 and 100, inclusive"
    );
    assert_eq!(
        one_problem("imageGCHighThresholdPercent: 80\nimageGCLowThresholdPercent: 80\n"),
        "imageGCLowThresholdPercent: 80 must be less than imageGCHighThresholdPercent 80"
    );
    assert_eq!(one_problem("imageMaximumGCAge: -1s\n"), "imageMaximumGCAge: -1s must not be negative");
    assert_eq!(
        one_problem("imageMaximumGCAge: 1m\n"),
        "imageMaximumGCAge: 1m0s must be greater than imageMinimumGCAge 2m0s"
    );
    let aged = load("imageMaximumGCAge: 168h\n").unwrap().kubelet;
    assert_eq!(aged.image_maximum_gc_age, GoDuration::from_hours(168));
}

#[test]
fn swiftlet_options_default_to_the_fast_paths() {
    let defaults = load_with_hostname(flags(&[]), || Ok("host".to_owned())).unwrap().swiftlet;
    assert!(defaults.evented_pleg);
    assert!(defaults.eviction_kernel_signals);
    let polling =
        load_with_hostname(flags(&["--eviction-kernel-signals=false"]), || Ok("host".to_owned())).unwrap().swiftlet;
    assert!(!polling.eviction_kernel_signals);
    assert!(polling.evented_pleg, "the PLEG is another setting");
}

#[test]
fn runtime_start_concurrency_is_left_to_the_runtime_unless_given() {
    let load = |args: &[&str]| load_with_hostname(flags(args), || Ok("host".to_owned())).unwrap().swiftlet;
    assert_eq!(load(&[]).runtime_start_concurrency, None);
    assert_eq!(load(&["--runtime-start-concurrency=0"]).runtime_start_concurrency, Some(0));
    assert_eq!(load(&["--runtime-start-concurrency=16"]).runtime_start_concurrency, Some(16));
}

#[test]
fn evented_pleg_ring_buffer_bytes_defaults_to_256_kib_and_must_be_power_of_two_pages() {
    let load = |args: &[&str]| load_with_hostname(flags(args), || Ok("host".to_owned()));
    assert_eq!(load(&[]).unwrap().swiftlet.evented_pleg_ring_buffer_bytes, 262_144);
    assert_eq!(load(&["--evented-pleg-ring-buffer-bytes=4096"]).unwrap().swiftlet.evented_pleg_ring_buffer_bytes, 4096);
    assert_eq!(
        load(&["--evented-pleg-ring-buffer-bytes", "1048576"]).unwrap().swiftlet.evented_pleg_ring_buffer_bytes,
        1 << 20
    );
    for bad in ["0", "1000", "2048", "12288"] {
        let problems = problems(load(&[&format!("--evented-pleg-ring-buffer-bytes={bad}")]));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with(&format!("--evented-pleg-ring-buffer-bytes: {bad} must be a power of two")),
            "{problems:?}"
        );
    }
}

#[test]
fn graceful_shutdown_settings_are_validated_as_upstream() {
    let yaml = format!(
        "{HEADER}shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n\
         shutdownGracePeriodByPodPriority:\n- priority: 0\n  shutdownGracePeriodSeconds: 5\n\
         featureGates:\n  GracefulNodeShutdown: false\n  GracefulNodeShutdownBasedOnPodPriority: false\n"
    );
    let problems = problems(load_file(&yaml, &[]));
    for want in [
        "shutdownGracePeriodCriticalPods: 20s must be <= shutdownGracePeriod 10s",
        "shutdownGracePeriod: requires feature gate GracefulNodeShutdown",
        "shutdownGracePeriodByPodPriority: requires feature gate GracefulNodeShutdownBasedOnPodPriority",
        "shutdownGracePeriodByPodPriority: cannot be specified together with shutdownGracePeriod or \
         shutdownGracePeriodCriticalPods",
    ] {
        assert!(problems.iter().any(|p| p == want), "missing {want:?} in {problems:#?}");
    }
}
