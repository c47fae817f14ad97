use std::collections::BTreeMap;

use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::Pod;

use super::*;

/// 2 sockets = 2 NUMA nodes × 4 cores × 2 threads: node 0 = 0-3,8-11; node 1 = 4-7,12-15.
fn topo() -> MachineTopology {
    MachineTopology::synthetic(2, 1, 4, 2, 1 << 30)
}

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap()
}

fn cfg(reserved_cpus: &str) -> CpuManagerConfig {
    CpuManagerConfig {
        policy: "static".into(),
        options: BTreeMap::new(),
        reserved_system_cpus: reserved_cpus.into(),
        reserved_milli_cpu: 0,
        topology_policy: "none".into(),
        feature_gates: BTreeMap::new(),
        reconcile_period: Duration::from_secs(10),
    }
}

fn with_options(mut c: CpuManagerConfig, opts: &[(&str, &str)]) -> CpuManagerConfig {
    c.options = opts.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
    c
}

/// A pod `uid` with app containers `(name, cpu)` and init containers `(name, cpu)`; cpu
/// "" means no resources (`BestEffort`); requests = limits (Guaranteed) unless `burstable`.
fn pod(uid: &str, apps: &[(&str, &str)], inits: &[(&str, &str)], burstable: bool) -> Pod {
    let c = |(name, cpu): &(&str, &str)| {
        if cpu.is_empty() {
            serde_json::json!({"name": name, "image": "x"})
        } else if burstable {
            serde_json::json!({"name": name, "image": "x", "resources": {"requests": {"cpu": cpu}}})
        } else {
            let r = serde_json::json!({"cpu": cpu, "memory": "1Gi"});
            serde_json::json!({"name": name, "image": "x", "resources": {"requests": r, "limits": r}})
        }
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "uid": uid},
        "spec": {"containers": apps.iter().map(c).collect::<Vec<_>>(), "initContainers": inits.iter().map(c).collect::<Vec<_>>()}
    }))
    .unwrap()
}

fn container<'a>(p: &'a Pod, name: &str) -> &'a Container {
    let s = p.spec.as_ref().unwrap();
    s.containers.iter().chain(s.init_containers.iter().flatten()).find(|c| c.name == name).unwrap()
}

fn manager(c: &CpuManagerConfig, dir: &Path) -> CpuManager {
    CpuManager::new(c, topo(), dir, None).unwrap()
}

fn any() -> TopologyHint {
    TopologyHint::default()
}

fn node(n: usize) -> TopologyHint {
    TopologyHint { affinity: Some(NumaMask::from_nodes([n])), preferred: true }
}

#[test]
fn static_policy_startup_errors_are_upstreams() {
    let dir = tempfile::tempdir().unwrap();
    let e = CpuManager::new(&cfg(""), topo(), dir.path(), None).unwrap_err().to_string();
    assert_eq!(
        e,
        "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
    );
    let e = CpuManager::new(&cfg("0,99"), topo(), dir.path(), None).unwrap_err().to_string();
    assert_eq!(e, "[cpumanager] unable to reserve the required amount of CPUs (size of 0,99 did not equal 2)");
    let e = CpuManager::new(&cfg("x"), topo(), dir.path(), None).unwrap_err().to_string();
    assert!(e.starts_with("[cpumanager] unable to parse reservedSystemCPUs: invalid cpuset \"x\""), "{e}");
    let mut big = cfg("");
    big.reserved_milli_cpu = 17_000;
    let e = CpuManager::new(&big, topo(), dir.path(), None).unwrap_err().to_string();
    assert!(e.contains("unable to reserve the required amount of CPUs"), "{e}");
}

#[test]
fn reserved_cpus_by_count_take_whole_cores_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg("");
    c.reserved_milli_cpu = 1500; // ceil → 2 CPUs: one whole core
    assert_eq!(manager(&c, dir.path()).reserved(), &set("0,8"));
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(manager(&cfg("3"), dir.path()).reserved(), &set("3"));
}

#[test]
fn policy_options_are_validated_as_upstream() {
    let t = topo();
    let gates = BTreeMap::new();
    let parse = |o: &[(&str, &str)], gates: &BTreeMap<String, bool>, tm: &str| {
        let o: BTreeMap<String, String> = o.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        StaticPolicyOptions::parse(&o, gates, tm, &t)
    };
    assert_eq!(
        parse(&[("bogus", "true")], &gates, "none").unwrap_err(),
        "unknown CPU Manager Policy option: \"bogus\""
    );
    assert!(
        parse(&[("full-pcpus-only", "yes")], &gates, "none")
            .unwrap_err()
            .starts_with("bad value for option \"full-pcpus-only\"")
    );
    assert_eq!(
        parse(&[("align-by-socket", "true")], &gates, "none").unwrap_err(),
        "CPU Manager Policy Alpha-level Options not enabled, but option \"align-by-socket\" provided"
    );
    let alpha = BTreeMap::from([("CPUManagerPolicyAlphaOptions".to_owned(), true)]);
    assert!(parse(&[("align-by-socket", "true")], &alpha, "none").unwrap().align_by_socket);
    assert!(parse(&[("align-by-socket", "true")], &alpha, "single-numa-node").unwrap_err().contains("incompatible"));
    let no_beta = BTreeMap::from([("CPUManagerPolicyBetaOptions".to_owned(), false)]);
    assert!(
        parse(&[("full-pcpus-only", "true")], &no_beta, "none").unwrap_err().contains("Beta-level Options not enabled")
    );
    let o = parse(&[("full-pcpus-only", "true"), ("distribute-cpus-across-numa", "true")], &gates, "none").unwrap();
    assert!(o.full_pcpus_only && o.distribute_cpus_across_numa && !o.strict_cpu_reservation);
    assert!(
        parse(&[("prefer-align-cpus-by-uncorecache", "true")], &gates, "none").unwrap_err().contains("not supported")
    );
    let dir = tempfile::tempdir().unwrap();
    let e = CpuManager::new(&with_options(cfg("0"), &[("bogus", "1")]), topo(), dir.path(), None).unwrap_err();
    assert_eq!(e.to_string(), "[cpumanager] unknown CPU Manager Policy option: \"bogus\"");
}

#[test]
fn guaranteed_integer_requests_get_exclusive_cpus_within_the_affinity() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&cfg("0,8"), dir.path());
    assert_eq!(m.state().default_cpuset, set("0-15"));
    let g = pod("g", &[("app", "4")], &[], false);
    m.allocate(&g, container(&g, "app"), &node(1)).unwrap();
    assert_eq!(m.cpu_affinity("g", "app"), set("4-5,12-13"), "two whole cores of node 1");
    assert_eq!(m.state().default_cpuset, set("0-3,6-11,14-15"));
    // Allocating again (a re-admission) keeps what it has.
    m.allocate(&g, container(&g, "app"), &node(0)).unwrap();
    assert_eq!(m.cpu_affinity("g", "app"), set("4-5,12-13"));
    // Fractional, Burstable and BestEffort containers share the pool.
    let frac = pod("f", &[("app", "1500m")], &[], false);
    let b = pod("b", &[("app", "2")], &[], true);
    let be = pod("e", &[("app", "")], &[], false);
    for p in [&frac, &b, &be] {
        m.allocate(p, container(p, "app"), &any()).unwrap();
        assert_eq!(m.cpu_affinity(pod_uid(p), "app"), set("0-3,6-11,14-15"));
    }
    assert_eq!(m.state().assignments.len(), 1);
    // The shared pool keeps the reserved CPUs; strict-cpu-reservation takes them out.
    let dir = tempfile::tempdir().unwrap();
    let strict = manager(&with_options(cfg("0,8"), &[("strict-cpu-reservation", "true")]), dir.path());
    assert_eq!(strict.cpu_affinity("b", "app"), set("1-7,9-15"));
}

#[test]
fn allocation_failures_are_rejections_as_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&with_options(cfg("0,8"), &[("full-pcpus-only", "true")]), dir.path());
    let odd = pod("odd", &[("app", "3")], &[], false);
    let r = m.allocate(&odd, container(&odd, "app"), &any()).unwrap_err();
    assert_eq!(r.reason, "SMTAlignmentError");
    assert_eq!(r.message, "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2");
    let huge = pod("huge", &[("app", "16")], &[], false);
    let r = m.allocate(&huge, container(&huge, "app"), &any()).unwrap_err();
    assert_eq!(
        r.message,
        "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = 14, requested CPUs = 16, CPUs per core = 2"
    );
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&cfg("0,8"), dir.path());
    let r = m.allocate(&huge, container(&huge, "app"), &any()).unwrap_err();
    assert_eq!(r.reason, "UnexpectedAdmissionError");
    assert_eq!(
        r.message,
        "Allocate failed due to not enough cpus available to satisfy request: requested=16, available=14, which is unexpected"
    );
    assert!(m.state().assignments.is_empty(), "a failed allocation takes nothing");
}

#[test]
fn app_containers_reuse_init_container_cpus_and_stale_pods_give_them_back() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&cfg("0,8"), dir.path());
    let p = pod("p", &[("app", "2")], &[("init", "2")], false);
    m.allocate(&p, container(&p, "init"), &any()).unwrap();
    m.allocate(&p, container(&p, "app"), &any()).unwrap();
    assert_eq!(m.cpu_affinity("p", "init"), m.cpu_affinity("p", "app"), "the app reuses the init's CPUs");
    assert_eq!(m.state().default_cpuset.len(), 14);
    m.remove_stale(&[]);
    assert!(m.state().assignments.is_empty());
    assert_eq!(m.state().default_cpuset, set("0-15"));
    // A sidecar (restartable init container) runs next to the app: nothing is reused.
    let mut s = pod("s", &[("app", "2")], &[("side", "2")], false);
    s.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].restart_policy = Some("Always".into());
    m.allocate(&s, container(&s, "side"), &any()).unwrap();
    m.allocate(&s, container(&s, "app"), &any()).unwrap();
    assert!(m.cpu_affinity("s", "side").intersection(&m.cpu_affinity("s", "app")).is_empty());
    assert_eq!(pod_guaranteed_cpus(&s), 4);
    let mut mixed = pod("m", &[("app", "2")], &[("side", "2"), ("init", "3")], false);
    mixed.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].restart_policy = Some("Always".into());
    assert_eq!(pod_guaranteed_cpus(&mixed), 5, "the init runs next to the sidecar started before it");
}

#[test]
fn hints_prefer_the_narrowest_numa_nodes_that_could_hold_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&cfg("0,8"), dir.path());
    let hint = |mask: &[usize], preferred: bool| TopologyHint {
        affinity: Some(NumaMask::from_nodes(mask.iter().copied())),
        preferred,
    };
    let p = pod("p", &[("app", "4")], &[], false);
    assert_eq!(
        m.get_topology_hints(&p, container(&p, "app"))["cpu"],
        vec![hint(&[0], true), hint(&[1], true), hint(&[0, 1], false)]
    );
    let big = pod("big", &[("app", "10")], &[], false);
    assert_eq!(m.get_topology_hints(&big, container(&big, "app"))["cpu"], vec![hint(&[0, 1], true)]);
    // More than is free anywhere: an empty list (cannot be aligned).
    let huge = pod("huge", &[("app", "15")], &[], false);
    assert!(m.get_topology_hints(&huge, container(&huge, "app"))["cpu"].is_empty());
    // No exclusive CPUs: no preference.
    let b = pod("b", &[("app", "2")], &[], true);
    assert!(m.get_topology_hints(&b, container(&b, "app")).is_empty());
    // Pod scope: the larger of the largest init container and the sum of the apps.
    let two = pod("two", &[("a", "4"), ("b", "4")], &[("i", "6")], false);
    assert_eq!(pod_guaranteed_cpus(&two), 8);
    assert_eq!(m.get_pod_topology_hints(&two)["cpu"], vec![hint(&[1], true), hint(&[0, 1], false)]);
    // Already allocated: the hints regenerate from what it has.
    m.allocate(&p, container(&p, "app"), &node(1)).unwrap();
    assert_eq!(m.get_topology_hints(&p, container(&p, "app"))["cpu"], vec![hint(&[1], true), hint(&[0, 1], false)]);
}

#[test]
fn the_checkpoint_survives_a_restart_and_is_checked_against_the_machine() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&cfg("0,8"), dir.path());
    let p = pod("p", &[("app", "2")], &[], false);
    m.allocate(&p, container(&p, "app"), &node(1)).unwrap();
    let before = m.state();
    drop(m);
    let again = manager(&cfg("0,8"), dir.path());
    assert_eq!(again.state(), before);
    // Reserving a CPU that is now exclusively assigned contradicts the state.
    let taken = before.get("p", "app").unwrap().iter().next().unwrap();
    let e = CpuManager::new(&cfg(&format!("0,{taken}")), topo(), dir.path(), None).unwrap_err().to_string();
    assert!(e.contains("are present in defaultCpuSet"), "{e}");
    // Another policy refuses the file.
    let mut none = cfg("");
    none.policy = "none".into();
    let e = CpuManager::new(&none, topo(), dir.path(), None).unwrap_err().to_string();
    assert!(e.contains("configured policy \"none\" differs from state checkpoint policy \"static\""), "{e}");
    // A machine with fewer CPUs than the state knows.
    let small = MachineTopology::synthetic(1, 1, 4, 2, 1 << 30);
    let e = CpuManager::new(&cfg("0"), small, dir.path(), None).unwrap_err().to_string();
    assert!(e.contains("doesn't match with CPUs in state"), "{e}");
}

#[test]
fn reconcile_moves_shared_containers_off_exclusive_cpus_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&cfg("0,8"), dir.path());
    let shared = pod("s", &[("app", "")], &[], false);
    let g = pod("g", &[("app", "2")], &[], false);
    let running =
        vec![("cs".to_owned(), "s".to_owned(), "app".to_owned()), ("cg".to_owned(), "g".to_owned(), "app".to_owned())];
    // The shared container was created on the whole pool.
    m.pre_start_container(&shared, container(&shared, "app"), "cs").unwrap();
    m.allocate(&g, container(&g, "app"), &any()).unwrap();
    m.pre_start_container(&g, container(&g, "app"), "cg").unwrap();
    let active = vec![shared.clone(), g.clone()];
    let plan = m.reconcile_plan(Some(&active), &running);
    let exclusive = m.cpu_affinity("g", "app");
    assert_eq!(plan, vec![("cs".to_owned(), set("0-15").difference(&exclusive))]);
    for (id, cpus) in plan {
        m.record_update(&id, cpus);
    }
    assert!(m.reconcile_plan(Some(&active), &running).is_empty(), "nothing changes twice");
    // The Guaranteed pod is gone: its CPUs return and the shared container grows back.
    let plan = m.reconcile_plan(Some(std::slice::from_ref(&shared)), &running[..1]);
    assert_eq!(plan, vec![("cs".to_owned(), set("0-15"))]);
    assert!(m.state().assignments.is_empty());
    // Containers of pods that are not active are left alone.
    assert!(m.reconcile_plan(Some(&[]), &running[..1]).is_empty());
    // Until the pod sources are ready nothing is stale and nothing is updated.
    let g2 = pod("g2", &[("app", "2")], &[], false);
    m.allocate(&g2, container(&g2, "app"), &any()).unwrap();
    assert!(m.reconcile_plan(None, &running).is_empty());
    assert_eq!(m.state().assignments.len(), 1);
}

/// A container config whose resources enforce a CFS quota of `quota` µs per 100 ms.
fn with_quota(quota: i64) -> api::ContainerConfig {
    let resources = api::LinuxContainerResources { cpu_period: 100_000, cpu_quota: quota, ..Default::default() };
    api::ContainerConfig {
        linux: Some(api::LinuxContainerConfig { resources: Some(resources), ..Default::default() }),
        ..Default::default()
    }
}

#[test]
fn pre_create_sets_the_cpuset_and_none_sets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(&cfg("0,8"), dir.path());
    let g = pod("g", &[("app", "2")], &[], false);
    m.allocate(&g, container(&g, "app"), &any()).unwrap();
    // A CFS quota is in force (period set): the pinned container runs without one
    // (DisableCPUQuotaWithExclusiveCPUs), and so does its pod cgroup.
    let mut config = with_quota(200_000);
    m.pre_create_container(&g, container(&g, "app"), &mut config).unwrap();
    let got = config.linux.unwrap().resources.unwrap();
    assert_eq!(got.cpuset_cpus, m.cpu_affinity("g", "app").to_string());
    assert_eq!(got.cpu_quota, -1);
    assert!(m.pod_runs_without_quota("g"));
    assert!(!m.pod_runs_without_quota("other"));
    // A shared-pool container keeps its quota.
    let b = pod("b", &[("app", "500m")], &[], false);
    let mut config = with_quota(50_000);
    m.pre_create_container(&b, container(&b, "app"), &mut config).unwrap();
    assert_eq!(config.linux.unwrap().resources.unwrap().cpu_quota, 50_000);
    // The gate turned off keeps every quota.
    let dir = tempfile::tempdir().unwrap();
    let mut gated = cfg("0,8");
    gated.feature_gates.insert("DisableCPUQuotaWithExclusiveCPUs".into(), false);
    let off = manager(&gated, dir.path());
    off.allocate(&g, container(&g, "app"), &any()).unwrap();
    assert!(!off.pod_runs_without_quota("g"));
    let dir = tempfile::tempdir().unwrap();
    let mut none = cfg("");
    none.policy = "none".into();
    let n = manager(&none, dir.path());
    n.allocate(&g, container(&g, "app"), &any()).unwrap();
    assert!(n.get_topology_hints(&g, container(&g, "app")).is_empty());
    let mut config = api::ContainerConfig::default();
    n.pre_create_container(&g, container(&g, "app"), &mut config).unwrap();
    assert!(config.linux.is_none());
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("cpu_manager_state")).unwrap()).unwrap();
    assert_eq!(state["policyName"], "none");
}

#[test]
fn pinning_metrics_count_requests_and_errors() {
    let mut reg = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(ResourceManagerMetrics::new(&mut reg));
    let dir = tempfile::tempdir().unwrap();
    let m = CpuManager::new(&cfg("0,8"), topo(), dir.path(), Some(metrics.clone())).unwrap();
    let g = pod("g", &[("app", "2")], &[], false);
    let huge = pod("h", &[("app", "15")], &[], false);
    m.allocate(&g, container(&g, "app"), &any()).unwrap();
    m.allocate(&huge, container(&huge, "app"), &any()).unwrap_err();
    assert_eq!(metrics.cpu_manager_pinning_requests.get(), 2);
    assert_eq!(metrics.cpu_manager_pinning_errors.get(), 1);
}

#[test]
fn align_by_socket_prefers_hints_within_the_fewest_sockets() {
    // 2 sockets × 2 NUMA nodes × 2 cores × 1 thread: node n = CPUs 2n, 2n+1.
    let t = MachineTopology::synthetic(2, 2, 2, 1, 1 << 30);
    let dir = tempfile::tempdir().unwrap();
    let mut c = with_options(cfg("0"), &[("align-by-socket", "true")]);
    c.feature_gates.insert("CPUManagerPolicyAlphaOptions".into(), true);
    let m = CpuManager::new(&c, t, dir.path(), None).unwrap();
    let p = pod("p", &[("app", "2")], &[], false);
    let got = m.get_topology_hints(&p, container(&p, "app"))["cpu"].clone();
    let preferred: Vec<Vec<usize>> = got.iter().filter(|h| h.preferred).map(|h| h.affinity.unwrap().nodes()).collect();
    // Node 0 has one free CPU (0 is reserved): {1}, {2}, {3} fit alone; {0,1} spans one
    // socket and is preferred too; {1,2} spans two and is not.
    assert!(
        preferred.contains(&vec![1]) && preferred.contains(&vec![0, 1]) && preferred.contains(&vec![2, 3]),
        "{got:?}"
    );
    assert!(!preferred.contains(&vec![1, 2]), "{got:?}");
}
