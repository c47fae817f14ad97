use std::collections::BTreeMap;
use std::time::Duration;

use clap::Parser as _;

use super::*;

/// `load`s flags (and a config file of `yaml`, when given) as the binary does.
fn load(yaml: Option<&str>, flags: &[&str]) -> Config {
    let file = yaml.map(|yaml| {
        let mut file = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
        std::io::Write::write_all(
            &mut file,
            format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{yaml}").as_bytes(),
        )
        .unwrap();
        file
    });
    let mut argv = vec!["swiftlet".to_owned(), "--hostname-override=Node-1".to_owned()];
    argv.extend(file.as_ref().map(|f| format!("--config={}", f.path().display())));
    argv.extend(flags.iter().map(|f| (*f).to_owned()));
    crate::config::load(crate::config::Flags::try_parse_from(argv).unwrap()).unwrap()
}

#[test]
fn tracing_follows_the_kubelet_configuration() {
    let tracing_of = |yaml: &str| tracing(&load(Some(yaml), &[])).unwrap();
    assert_eq!(tracing_of(""), None, "no tracing unless configured");
    let defaults = tracing_of("tracing: {}\n").unwrap();
    assert_eq!(defaults.endpoint, CollectorEndpoint::parse("localhost:4317").unwrap());
    assert_eq!(defaults.sampling_rate_per_million, 0);
    assert_eq!(defaults.node_name, "node-1");
    let set = tracing_of("tracing:\n  endpoint: unix:///run/otel.sock\n  samplingRatePerMillion: 250\n").unwrap();
    assert_eq!(set.endpoint, CollectorEndpoint::Unix("/run/otel.sock".into()));
    assert_eq!(set.sampling_rate_per_million, 250);
}

#[test]
fn log_rotation_from_the_configuration() {
    let kc = KubeletConfiguration::default();
    assert_eq!(
        log_rotation(&kc).unwrap(),
        RotationPolicy {
            max_size: 10 * 1024 * 1024,
            max_files: 5,
            max_workers: 1,
            monitor_interval: Duration::from_secs(10)
        }
    );
    let bad = KubeletConfiguration { container_log_max_size: "ten".into(), ..kc };
    assert!(log_rotation(&bad).unwrap_err().contains("containerLogMaxSize"));
}

#[test]
fn reserved_system_cpus_replace_the_reserved_cpu() {
    let mut kc = KubeletConfiguration {
        reserved_system_cpus: "0,2-3".into(),
        kube_reserved: BTreeMap::from([("cpu".into(), "500m".into()), ("memory".into(), "1Gi".into())]),
        ..KubeletConfiguration::default()
    };
    apply_reserved_system_cpus(&mut kc);
    assert_eq!(kc.kube_reserved, BTreeMap::from([("memory".into(), "1Gi".into())]));
    assert_eq!(kc.system_reserved, BTreeMap::from([("cpu".into(), "3".into())]));
    let mut plain = KubeletConfiguration::default();
    apply_reserved_system_cpus(&mut plain);
    assert!(plain.system_reserved.is_empty());
}

#[test]
fn defaults_are_the_subsystems_own() {
    let c = load(None, &[]);
    assert_eq!(container_gc(&c), ContainerGcPolicy::default());
    assert_eq!(image_gc_period(&c), crate::images::gc::IMAGE_GC_PERIOD);
    assert_eq!(image_gc_period(&c), Duration::from_mins(5));
    assert_eq!(runtime_start_concurrency(&c), crate::runtime::start_gate::default_limit());
    assert_eq!(image_gc(&c.kubelet), ImageGcPolicy::default());
    assert_eq!(image_puller(&c.kubelet), PullerConfig::default());
}

#[test]
fn flags_override_the_defaults() {
    let c = load(
        None,
        &[
            "--minimum-container-ttl-duration=1m",
            "--maximum-dead-containers-per-container=3",
            "--maximum-dead-containers=100",
            "--image-gc-period=30s",
            "--runtime-start-concurrency=0",
        ],
    );
    assert_eq!(
        container_gc(&c),
        ContainerGcPolicy { min_age: Duration::from_mins(1), max_per_pod_container: 3, max_containers: 100 }
    );
    assert_eq!(image_gc_period(&c), Duration::from_secs(30));
    assert_eq!(runtime_start_concurrency(&c), 0);
}

#[test]
fn eviction_hard_merges_the_defaults_only_when_asked() {
    let given = BTreeMap::from([("memory.available".to_owned(), "1Gi".to_owned())]);
    let kc = KubeletConfiguration { eviction_hard: given.clone(), ..KubeletConfiguration::default() };
    assert_eq!(eviction(&kc).hard, given);
    let merged = eviction(&KubeletConfiguration { merge_default_eviction_settings: true, ..kc }).hard;
    assert_eq!(merged["memory.available"], "1Gi", "a given value wins");
    for (signal, _) in DEFAULT_EVICTION_HARD {
        assert!(merged.contains_key(signal), "{signal}");
    }
    let defaults = eviction(&KubeletConfiguration::default());
    assert!(defaults.enforce_pods_allocatable);
    assert_eq!(defaults.pressure_transition_period, Duration::from_mins(5));
}

#[test]
fn memcg_thresholds_take_the_hard_memory_thresholds() {
    let kc = KubeletConfiguration {
        cgroup_root: "/".into(),
        eviction_hard: BTreeMap::from([("memory.available".to_owned(), "5%".to_owned())]),
        ..KubeletConfiguration::default()
    };
    assert_eq!(
        memcg_thresholds(&kc),
        MemcgThresholdSettings {
            pods_cgroup: Some("/kubepods".into()),
            memory_available: Some("5%".into()),
            allocatable_memory_available: None
        }
    );
}

/// The pods cgroup whose memcg threshold tells `allocatableMemory.available` is the one
/// the cgroup manager makes: `/kubepods.slice` under the systemd driver (found in the
/// node container: the watcher looked for `/kubepods` there and the kernel OOM killer
/// acted before the eviction manager).
#[test]
fn memcg_thresholds_watch_the_pods_cgroup_of_the_driver() {
    let kc = KubeletConfiguration {
        cgroup_root: "/".into(),
        cgroup_driver: "systemd".into(),
        eviction_hard: BTreeMap::from([("allocatableMemory.available".to_owned(), "150Mi".to_owned())]),
        ..KubeletConfiguration::default()
    };
    assert_eq!(memcg_thresholds(&kc).pods_cgroup.as_deref(), Some("/kubepods.slice"));
    let kc = KubeletConfiguration { cgroup_root: "/node".into(), cgroup_driver: "cgroupfs".into(), ..kc };
    assert_eq!(memcg_thresholds(&kc).pods_cgroup.as_deref(), Some("/node/kubepods"));
}

#[test]
fn node_shutdown_gates_default_on() {
    let s = node_shutdown(&KubeletConfiguration::default());
    assert!(s.graceful_node_shutdown && s.based_on_pod_priority);
    let mut kc = KubeletConfiguration::default();
    kc.feature_gates.insert("GracefulNodeShutdownBasedOnPodPriority".into(), false);
    assert!(!node_shutdown(&kc).based_on_pod_priority);
}

#[test]
fn the_node_the_cgroups_and_the_stats_follow_the_configuration() {
    let cfg = load(
        Some(
            "cgroupRoot: /custom\nmaxPods: 250\nnodeStatusUpdateFrequency: 4s\nclusterDNS: [10.96.0.10]\n\
             clusterDomain: example.local\ncrashLoopBackOff:\n  maxContainerRestartPeriod: 30s\n\
             featureGates:\n  KubeletCrashLoopBackOffMax: true\n",
        ),
        &["--node-labels=zone=a"],
    );
    let node = node(&cfg, Some("10.0.0.7".parse().unwrap()));
    assert_eq!((node.node_name.as_str(), node.hostname.as_str()), ("node-1", "node-1"));
    assert_eq!(node.max_pods, 250);
    assert_eq!(node.update_frequency, Duration::from_secs(4));
    assert_eq!(node.labels.get("zone").map(String::as_str), Some("a"));
    assert!(node.kubelet_version.starts_with("v1.37.0-swiftlet."), "{}", node.kubelet_version);

    let cgroups = cgroups(&cfg.kubelet, crate::cm::allocatable::Enforcement::default());
    assert_eq!(cgroups.cgroup_root, "/custom");
    assert!(cgroups.cgroups_per_qos);
    assert_eq!(stats(&cfg).pods_cgroup.as_deref(), Some("/custom/kubepods"));

    let dns = dns(&cfg.kubelet);
    assert_eq!(dns.cluster_dns, ["10.96.0.10"]);
    assert_eq!(dns.cluster_domain, "example.local");
    assert_eq!(crash_loop_max(&cfg.kubelet), Duration::from_secs(30));
    let rm = runtime_manager(&cfg, Some("10.0.0.7".into()));
    assert_eq!((rm.node_name.as_str(), rm.host_ip.as_deref()), ("node-1", Some("10.0.0.7")));
}

#[test]
fn an_empty_cgroup_root_is_the_root_and_the_defaults_are_upstreams() {
    let kc = KubeletConfiguration::default();
    assert_eq!(cgroups(&kc, crate::cm::allocatable::Enforcement::default()).cgroup_root, "/");
    assert_eq!(crash_loop_max(&kc), crate::container::backoff::MAX);
    assert!(!node_resize(&kc).static_cpu_policy);
    let mut cfg = load(None, &[]);
    assert_eq!(stats(&cfg).pods_cgroup.as_deref(), Some("/kubepods"));
    // Under the systemd driver the pods' cgroup is a slice, under a root slice too.
    cfg.kubelet.cgroup_driver = "systemd".into();
    assert_eq!(stats(&cfg).pods_cgroup.as_deref(), Some("/kubepods.slice"));
    cfg.kubelet.cgroup_root = "/node".into();
    assert_eq!(stats(&cfg).pods_cgroup.as_deref(), Some("/node.slice/node-kubepods.slice"));
}
