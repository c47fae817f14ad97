use std::sync::Arc;

use super::*;

fn ready_runtime(userns: bool) -> Arc<RuntimeState> {
    let state = RuntimeState::default();
    let condition = |t: &str| api::RuntimeCondition { r#type: t.into(), status: true, ..Default::default() };
    state.apply(Ok(&api::StatusResponse {
        status: Some(api::RuntimeStatus { conditions: vec![condition("RuntimeReady"), condition("NetworkReady")] }),
        runtime_handlers: vec![api::RuntimeHandler {
            name: String::new(),
            features: Some(api::RuntimeHandlerFeatures { recursive_read_only_mounts: true, user_namespaces: userns }),
        }],
        ..Default::default()
    }));
    Arc::new(state)
}

fn pod(uid: &str, host_users: Option<bool>) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default", "uid": uid},
        "spec": {"hostUsers": host_users, "containers": [{"name": "c", "image": "i"}]},
    }))
    .unwrap()
}

fn manager(dir: &Path, runtime: Arc<RuntimeState>) -> UsernsManager {
    UsernsManager::new(dir, UNIT, kubelet_default(), 110, runtime).unwrap()
}

fn kubelet_default() -> (u32, u32) {
    (UNIT, u32::MAX - UNIT + 1)
}

#[test]
fn getsubids_output_is_parsed_as_upstream() {
    assert_eq!(parse_getsubids("0: kubelet 65536 2147483648\n"), Ok((65536, 2_147_483_648)));
    assert!(parse_getsubids("0: kubelet 65536\n").unwrap_err().starts_with("invalid line"));
    assert!(parse_getsubids("a\nb\n").unwrap_err().contains("it must contain only one line"));
    assert!(parse_getsubids("0: kubelet x 1\n").is_err());
    assert!(user_exists("root:x:0:0::/root:/bin/sh\nkubelet:x:998:998::/:/sbin/nologin\n", "kubelet"));
    assert!(!user_exists("kubeletx:x:998:998::/:/sbin/nologin\n", "kubelet"));
}

#[test]
fn mappings_out_of_line_are_refused_with_upstreams_messages() {
    let dir = tempfile::tempdir().unwrap();
    let rt = ready_runtime(true);
    let new = |ids: u32, mapping: (u32, u32), max: u32| {
        UsernsManager::new(dir.path(), ids, mapping, max, rt.clone()).map(drop).unwrap_err()
    };
    assert_eq!(new(1000, (65536, 65536 * 200), 110), "kubelet user namespace length 1000 is not a multiple of 65536");
    assert_eq!(new(UNIT, (100, UNIT * 200), 110), "kubelet user assigned ID 100 is not a multiple of 65536");
    assert_eq!(new(UNIT, (0, UNIT * 200), 110), "kubelet user assigned ID 0 must be greater or equal to 65536");
    assert_eq!(new(UNIT, (UNIT, 1000), 110), "kubelet user assigned IDs length 1000 is not a multiple of 65536");
    assert_eq!(new(UNIT, (UNIT, UNIT * 10), 110), "kubelet user assigned IDs are not enough to support 110 pods");
}

/// `hostUsers` unset or true: the node's namespace. false: a range of its own, kept in the
/// pod's directory, the same on every call and after a restart; released at termination.
#[test]
fn a_pod_without_host_users_gets_a_range_of_its_own_that_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let rt = ready_runtime(true);
    let first = manager(dir.path(), rt.clone());
    for host_users in [None, Some(true)] {
        let ns = first.namespace(&pod("u0", host_users), "").unwrap();
        assert_eq!((ns.mode, ns.uids.len()), (api::NamespaceMode::Node as i32, 0));
    }
    let ns_a = first.namespace(&pod("ua", Some(false)), "").unwrap();
    let ns_b = first.namespace(&pod("ub", Some(false)), "").unwrap();
    assert_eq!(ns_a.mode, api::NamespaceMode::Pod as i32);
    let range = |ns: &api::UserNamespace| (ns.uids[0].host_id, ns.uids[0].container_id, ns.uids[0].length);
    assert_eq!(range(&ns_a), (UNIT, 0, UNIT), "the first range after id 0's");
    assert_eq!(range(&ns_b), (2 * UNIT, 0, UNIT));
    assert_eq!(ns_a.uids, ns_a.gids);
    assert_eq!(first.namespace(&pod("ua", Some(false)), "").unwrap(), ns_a, "the same range again");
    // Upstream's file format.
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("ua").join(MAPPINGS_FILE)).unwrap()).unwrap();
    assert_eq!(file["uidMappings"][0], serde_json::json!({"hostId": 65536, "containerId": 0, "length": 65536}));

    // A restarted agent reads the ranges back: a new pod does not get one of them.
    let restarted = manager(dir.path(), rt.clone());
    assert_eq!(restarted.allocated(), 2);
    assert_eq!(restarted.namespace(&pod("ub", Some(false)), "").unwrap(), ns_b);
    let ns_c = restarted.namespace(&pod("uc", Some(false)), "").unwrap();
    assert_eq!(range(&ns_c), (3 * UNIT, 0, UNIT));
    // Released at termination: the range is free for the next pod, the file gone.
    restarted.release("ua");
    assert!(!dir.path().join("ua").join(MAPPINGS_FILE).exists());
    let ns_d = restarted.namespace(&pod("ud", Some(false)), "").unwrap();
    assert_eq!(range(&ns_d), (UNIT, 0, UNIT));
    // Orphans: pods the agent no longer knows give their ranges back.
    restarted.cleanup_orphans(|uid| uid == "ud");
    assert_eq!(restarted.allocated(), 1);
    // A range whose pod directory is gone is given back too.
    std::fs::remove_dir_all(dir.path().join("ud")).unwrap();
    restarted.cleanup_orphans(|_| true);
    assert_eq!(restarted.allocated(), 0);
}

#[test]
fn a_runtime_without_user_namespaces_refuses_the_pod() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), ready_runtime(false));
    assert_eq!(
        m.namespace(&pod("ua", Some(false)), "").unwrap_err(),
        "can't set `spec.hostUsers: false`, runtime does not support user namespaces"
    );
    assert!(m.namespace(&pod("ua", Some(false)), "kata").unwrap_err().starts_with(
        "can't set `spec.hostUsers: false`, RuntimeClass handler \"kata\" does not support user namespaces: \
             the handler \"kata\" is not known"
    ));
    // containerd 1.6 lists no handlers at all.
    let m = manager(dir.path(), Arc::new(RuntimeState::default()));
    assert!(m.namespace(&pod("ua", Some(false)), "").is_err());
    assert!(m.namespace(&pod("ua", None), "").is_ok());
    assert_eq!(m.allocated(), 0);
}

#[test]
fn a_damaged_mappings_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ua")).unwrap();
    std::fs::write(dir.path().join("ua").join(MAPPINGS_FILE), "{not json").unwrap();
    let err = UsernsManager::new(dir.path(), UNIT, kubelet_default(), 110, ready_runtime(true)).unwrap_err();
    assert!(err.contains("invalid user namespace mappings file") && err.contains("ua"), "{err}");
    let two = Mappings::of_range(UNIT, UNIT);
    let two = Mappings { uid_mappings: vec![two.uid_mappings[0]; 2], ..two };
    std::fs::write(dir.path().join("ua").join(MAPPINGS_FILE), serde_json::to_vec(&two).unwrap()).unwrap();
    let err = UsernsManager::new(dir.path(), UNIT, kubelet_default(), 110, ready_runtime(true)).unwrap_err();
    assert!(err.contains("no more than one mapping allowed"), "{err}");
}

#[test]
fn mounts_get_the_pods_mappings() {
    let ns = Mappings::of_range(UNIT, UNIT).to_cri();
    let mut mounts = vec![api::Mount { container_path: "/data".into(), ..Default::default() }];
    map_mounts(&mut mounts, Some(&api::UserNamespace { mode: api::NamespaceMode::Node as i32, ..Default::default() }));
    assert!(mounts[0].uid_mappings.is_empty());
    map_mounts(&mut mounts, Some(&ns));
    assert_eq!((mounts[0].uid_mappings.clone(), mounts[0].gid_mappings.clone()), (ns.uids.clone(), ns.gids));
}
