use super::*;

const GIB: u64 = 1 << 30;

/// Two NUMA nodes of 4 GiB.
fn topo() -> MachineTopology {
    MachineTopology::synthetic(2, 1, 2, 1, 4 * GIB)
}

fn cfg(reserved: &[(usize, u64)], allocatable_reservation: u64) -> MemoryManagerConfig {
    MemoryManagerConfig {
        policy: "Static".into(),
        reserved_memory: reserved.iter().map(|(n, b)| (*n, Requests::from([("memory".to_owned(), *b)]))).collect(),
        node_allocatable_reservation: if allocatable_reservation > 0 {
            Requests::from([("memory".to_owned(), allocatable_reservation)])
        } else {
            Requests::new()
        },
    }
}

fn ok_cfg() -> MemoryManagerConfig {
    cfg(&[(0, GIB), (1, GIB)], 2 * GIB)
}

fn pod(uid: &str, memory: &str, guaranteed: bool) -> Pod {
    let res = if guaranteed {
        serde_json::json!({"requests": {"cpu": "1", "memory": memory}, "limits": {"cpu": "1", "memory": memory}})
    } else {
        serde_json::json!({"requests": {"memory": memory}})
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "uid": uid},
        "spec": {"containers": [{"name": "app", "image": "x", "resources": res}]}
    }))
    .unwrap()
}

fn app(p: &Pod) -> &Container {
    &p.spec.as_ref().unwrap().containers[0]
}

fn h(nodes: &[usize], preferred: bool) -> TopologyHint {
    TopologyHint { affinity: Some(NumaMask::from_nodes(nodes.iter().copied())), preferred }
}

#[test]
fn reserved_memory_must_match_node_allocatable() {
    let dir = tempfile::tempdir().unwrap();
    let e = MemoryManager::new(&cfg(&[], 100 << 20), &topo(), dir.path()).unwrap_err().to_string();
    assert_eq!(
        e,
        "[memorymanager] the total amount \"0\" of type \"memory\" is not equal to the value \"100Mi\" determined by Node Allocatable feature"
    );
    let e = MemoryManager::new(&cfg(&[(5, GIB)], GIB), &topo(), dir.path()).unwrap_err().to_string();
    assert!(e.contains("NUMA node 5 does not exist"), "{e}");
    let e = MemoryManager::new(&cfg(&[(0, 5 * GIB)], 5 * GIB), &topo(), dir.path()).unwrap_err().to_string();
    assert!(e.contains("reserves 5368709120 bytes of memory on NUMA node 0, which only has 4294967296"), "{e}");
    let e = MemoryManager::new(&cfg(&[], 0), &topo(), dir.path()).unwrap_err().to_string();
    assert_eq!(e, "[memorymanager] you should specify the system reserved memory");
    let m = MemoryManager::new(&ok_cfg(), &topo(), dir.path()).unwrap();
    let table = &m.state().machine[&0].memory_map["memory"];
    assert_eq!((table.total, table.system_reserved, table.allocatable, table.free), (4 * GIB, GIB, 3 * GIB, 3 * GIB));
}

#[test]
fn guaranteed_containers_get_numa_memory_and_cpuset_mems() {
    let dir = tempfile::tempdir().unwrap();
    let m = MemoryManager::new(&ok_cfg(), &topo(), dir.path()).unwrap();
    let small = pod("s", "2Gi", true);
    assert_eq!(
        m.get_topology_hints(&small, app(&small))["memory"],
        vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]
    );
    m.allocate(&small, app(&small), &h(&[1], true)).unwrap();
    assert_eq!(m.memory_numa_nodes("s", "app"), vec![1]);
    let mut config = api::ContainerConfig::default();
    m.pre_create_container(&small, app(&small), &mut config).unwrap();
    assert_eq!(config.linux.unwrap().resources.unwrap().cpuset_mems, "1");
    // Node 1 has 1 GiB left: a second 2 GiB container fits only node 0; node 1 being used
    // alone, it cannot be grouped.
    let next = pod("n", "2Gi", true);
    assert_eq!(m.get_topology_hints(&next, app(&next))["memory"], vec![h(&[0], true)]);
    // Bigger than any node: needs both, which node 1's single use forbids.
    let big = pod("b", "5Gi", true);
    assert!(m.get_topology_hints(&big, app(&big))["memory"].is_empty());
    // Without affinity from the topology manager, the default (best) hint is used.
    m.allocate(&next, app(&next), &TopologyHint::default()).unwrap();
    assert_eq!(m.memory_numa_nodes("n", "app"), vec![0]);
    // Burstable pods are not managed.
    let b = pod("x", "1Gi", false);
    assert!(m.get_topology_hints(&b, app(&b)).is_empty());
    m.allocate(&b, app(&b), &TopologyHint::default()).unwrap();
    assert!(m.memory_numa_nodes("x", "app").is_empty());
}

#[test]
fn a_hint_too_small_is_extended_and_stale_pods_are_released() {
    let dir = tempfile::tempdir().unwrap();
    let m = MemoryManager::new(&ok_cfg(), &topo(), dir.path()).unwrap();
    let big = pod("b", "5Gi", true);
    assert_eq!(m.get_topology_hints(&big, app(&big))["memory"], vec![h(&[0, 1], true)]);
    // best-effort may hand over node 0 alone: it is widened to both nodes.
    m.allocate(&big, app(&big), &h(&[0], false)).unwrap();
    assert_eq!(m.memory_numa_nodes("b", "app"), vec![0, 1]);
    let s = m.state();
    assert_eq!(s.machine[&0].cells, vec![0, 1]);
    assert_eq!(s.machine[&0].memory_map["memory"].free + s.machine[&1].memory_map["memory"].free, GIB);
    m.remove_stale(&[]);
    let s = m.state();
    assert!(s.assignments.is_empty());
    assert_eq!(s.machine[&0].cells, vec![0]);
    assert_eq!(s.machine[&1].memory_map["memory"].free, 3 * GIB);
}

#[test]
fn the_checkpoint_round_trips_and_refuses_another_policy() {
    let dir = tempfile::tempdir().unwrap();
    let m = MemoryManager::new(&ok_cfg(), &topo(), dir.path()).unwrap();
    let p = pod("p", "1Gi", true);
    m.allocate(&p, app(&p), &h(&[0], true)).unwrap();
    let before = m.state();
    drop(m);
    let text = std::fs::read_to_string(dir.path().join(CHECKPOINT_NAME)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["policyName"], "Static");
    assert_eq!(v["machineState"]["0"]["memoryMap"]["memory"]["reserved"], GIB);
    assert_eq!(v["entries"]["p"]["app"][0]["numaAffinity"], serde_json::json!([0]));
    assert!(v["checksum"].as_u64().is_some_and(|c| c > 0));
    let again = MemoryManager::new(&ok_cfg(), &topo(), dir.path()).unwrap();
    assert_eq!(again.state(), before);
    drop(again);
    // Another reservation is another machine state.
    let e = MemoryManager::new(&cfg(&[(0, 2 * GIB)], 2 * GIB), &topo(), dir.path()).unwrap_err().to_string();
    assert!(e.contains("the expected machine state is different from the real one"), "{e}");
    let e =
        MemoryManager::new(&MemoryManagerConfig { policy: "None".into(), ..Default::default() }, &topo(), dir.path())
            .unwrap_err()
            .to_string();
    assert!(e.contains("configured policy \"None\" differs from state checkpoint policy \"Static\""), "{e}");
    // A tampered file fails its checksum.
    std::fs::write(
        dir.path().join(CHECKPOINT_NAME),
        text.replace("\"numberOfAssignments\":1", "\"numberOfAssignments\":2"),
    )
    .unwrap();
    let e = MemoryManager::new(&ok_cfg(), &topo(), dir.path()).unwrap_err().to_string();
    assert!(e.contains("checkpoint is corrupted"), "{e}");
}

#[test]
fn checksum_matches_upstreams_test_vector() {
    // From upstream's state_checkpoint_test.go.
    let file: CheckpointFile = serde_json::from_str(
        r#"{"policyName":"static","machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}},"entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory","size":512}]}},"checksum":4215593881}"#,
    )
    .unwrap();
    assert_eq!(u64::from(file.checksum()), 4_215_593_881);
}

#[test]
fn huge_pages_are_placed_like_memory() {
    let mut machine = topo();
    machine.numa_hugepages.insert(0, Requests::from([("hugepages-2Mi".to_owned(), 0)]));
    machine.numa_hugepages.insert(1, Requests::from([("hugepages-2Mi".to_owned(), GIB)]));
    let dir = tempfile::tempdir().unwrap();
    // Reserving huge pages that node allocatable does not reserve is refused.
    let mut bad = ok_cfg();
    bad.reserved_memory.get_mut(&1).unwrap().insert("hugepages-2Mi".into(), 2 << 20);
    let err = MemoryManager::new(&bad, &machine, dir.path()).unwrap_err().to_string();
    assert_eq!(
        err,
        "[memorymanager] the total amount \"2Mi\" of type \"hugepages-2Mi\" is not equal to the value \"0\" determined by Node Allocatable feature"
    );
    let m = MemoryManager::new(&ok_cfg(), &machine, dir.path()).unwrap();
    assert_eq!(m.state().machine[&1].memory_map["hugepages-2Mi"].allocatable, GIB);
    let mut hp = pod("h", "1Gi", true);
    let res = hp.spec.as_mut().unwrap().containers[0].resources.as_mut().unwrap();
    for list in [res.requests.as_mut().unwrap(), res.limits.as_mut().unwrap()] {
        list.insert("hugepages-2Mi".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("512Mi".into()));
    }
    let hints = m.get_topology_hints(&hp, app(&hp));
    assert_eq!(hints["hugepages-2Mi"], vec![h(&[1], true), h(&[0, 1], false)]);
    assert_eq!(hints["memory"], hints["hugepages-2Mi"], "one list for every type");
    m.allocate(&hp, app(&hp), &TopologyHint::default()).unwrap();
    assert_eq!(m.memory_numa_nodes("h", "app"), vec![1]);
    let state = m.state();
    let blocks = &state.assignments["h"]["app"];
    assert_eq!(
        blocks.iter().map(|b| (b.kind.as_str(), b.size)).collect::<Vec<_>>(),
        [("hugepages-2Mi", 512 << 20), ("memory", GIB)]
    );
    assert_eq!(state.machine[&1].memory_map["hugepages-2Mi"].free, 512 << 20);
    assert_eq!(state.machine[&1].number_of_assignments, 2, "one per type, as upstream");
    drop(m);
    // The state with huge pages survives a restart, and is released with the pod.
    let again = MemoryManager::new(&ok_cfg(), &machine, dir.path()).unwrap();
    assert_eq!(again.state(), state);
    again.remove_stale(&[]);
    assert_eq!(again.state().machine[&1].memory_map["hugepages-2Mi"].free, GIB);
    assert_eq!(again.state().machine[&1].number_of_assignments, 0);
}

#[test]
fn app_containers_reuse_init_container_memory() {
    let dir = tempfile::tempdir().unwrap();
    let m = MemoryManager::new(&ok_cfg(), &topo(), dir.path()).unwrap();
    let r = |mem: &str| {
        let q = serde_json::json!({"cpu": "1", "memory": mem});
        serde_json::json!({"requests": q, "limits": q})
    };
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "p"},
        "spec": {
            "initContainers": [{"name": "init", "image": "x", "resources": r("2Gi")}],
            "containers": [{"name": "app", "image": "x", "resources": r("1Gi")}]
        }
    }))
    .unwrap();
    let spec = p.spec.as_ref().unwrap();
    let (init, app) = (&spec.init_containers.as_ref().unwrap()[0], &spec.containers[0]);
    m.allocate(&p, init, &TopologyHint::default()).unwrap();
    m.allocate(&p, app, &TopologyHint::default()).unwrap();
    let state = m.state();
    let node0 = &state.machine[&0].memory_map["memory"];
    assert_eq!(node0.reserved, 2 * GIB, "the app reuses the init container's memory");
    assert_eq!(state.assignments["p"]["app"][0].size, GIB);
    assert_eq!(state.assignments["p"]["init"][0].size, GIB, "the init block shrinks by what was reused");
    m.remove_stale(&[]);
    assert_eq!(m.state().machine[&0].memory_map["memory"].free, 3 * GIB);
}
