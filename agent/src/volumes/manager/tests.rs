//! Volume manager tests: real files in temporary directories, the fake object source and
//! the fake mounter (plus one real tmpfs test when running as root).

use std::os::unix::fs::MetadataExt as _;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::*;
use crate::volumes::mounter::MountCall;
use crate::volumes::tests_support::ManualClock;
use crate::volumes::{FakeMounter, FakeObjectSource, NoApiServer};

const NODE: NodeAllocatable = NodeAllocatable { cpu_milli: 2000, memory: 1 << 30, ephemeral_storage: 10 << 30 };

struct Env {
    dir: tempfile::TempDir,
    src: FakeObjectSource,
    mounter: FakeMounter,
    clock: Arc<ManualClock>,
    vm: VolumeManager,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::default());
    let src = FakeObjectSource::new().with_clock(clock.clone());
    let mounter = FakeMounter::default();
    let vm = VolumeManager::new(dir.path(), Arc::new(src.clone()))
        .with_mounter(Arc::new(mounter.clone()))
        .with_clock(clock.clone())
        .with_node_allocatable(NODE);
    Env { dir, src, mounter, clock, vm }
}

/// A pod `p` (uid `u1`) in `default` with container `c` mounting `mounts`.
#[expect(clippy::needless_pass_by_value, reason = "call sites read better with json! literals")]
fn pod(volumes: serde_json::Value, mounts: serde_json::Value) -> Pod {
    pod_with(&volumes, &mounts, &json!({}))
}

fn pod_with(volumes: &serde_json::Value, mounts: &serde_json::Value, security: &serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "u1", "labels": {"app": "web"}},
        "spec": {
            "securityContext": security,
            "volumes": volumes,
            "containers": [{"name": "c", "image": "img", "volumeMounts": mounts,
                            "resources": {"limits": {"memory": "256Mi"}}}]
        }
    }))
    .unwrap()
}

fn no_images() -> ImageVolumes {
    ImageVolumes::new()
}

fn mount(name: &str, path: &str) -> serde_json::Value {
    json!({"name": name, "mountPath": path})
}

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    let data: BTreeMap<String, String> = data.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"}, "data": data})).unwrap()
}

fn secret_obj(name: &str, data: &[(&str, &str)]) -> Secret {
    let mut s = Secret::default();
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some("default".into());
    s.data = Some(data.iter().map(|(k, v)| ((*k).into(), k8s_openapi::ByteString(v.as_bytes().to_vec()))).collect());
    s
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().mode() & 0o7777
}

fn failure_messages(e: &Error) -> Vec<String> {
    e.set_up_failures().iter().map(ToString::to_string).collect()
}

#[tokio::test]
async fn empty_dirs_on_disk_and_in_memory() {
    let e = env();
    let p = pod(
        json!([{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
               {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
               {"name": "mem-default", "emptyDir": {"medium": "Memory"}}]),
        json!([mount("scratch", "/s"), mount("mem", "/m"), mount("mem-default", "/d")]),
    );
    let vols = e.vm.mount_pod_volumes(&p).await.unwrap();
    let scratch = vols.get("scratch").unwrap();
    assert_eq!(scratch.path, e.dir.path().join("pods/u1/volumes/kubernetes.io~empty-dir/scratch"));
    assert_eq!((scratch.memory, scratch.size_limit, scratch.read_only), (false, Some(1 << 30), false));
    assert_eq!(mode(&scratch.path), 0o777);
    let mem = vols.get("mem").unwrap();
    assert!(mem.memory);
    // sizeLimit 64Mi < pod limit 256Mi < node 1Gi; without a sizeLimit the pod limit wins.
    let mem_default = vols.get("mem-default").unwrap().path.clone();
    assert_eq!(
        e.mounter.calls(),
        vec![
            MountCall::MountTmpfs(mem.path.clone(), Some(64 << 20)),
            MountCall::MountTmpfs(mem_default, Some(256 << 20))
        ]
    );
    // Idempotent: nothing is mounted twice.
    e.vm.mount_pod_volumes(&p).await.unwrap();
    assert_eq!(e.mounter.calls().len(), 2);

    std::fs::write(scratch.path.join("data"), "x").unwrap();
    e.vm.cleanup_pod("u1").unwrap();
    assert!(e.mounter.mounts().is_empty());
    assert!(!e.dir.path().join("pods/u1/volumes").exists());
    assert!(e.vm.mounted_volumes("u1").is_none());
}

#[tokio::test]
async fn unused_and_unsupported_volumes() {
    let e = env();
    let p = pod(
        json!([{"name": "unused", "emptyDir": {}},
               {"name": "claim", "nfs": {"server": "s", "path": "/x"}},
               {"name": "hp", "hostPath": {"path": "/nonexistent/swiftlet", "type": "Directory"}}]),
        json!([mount("claim", "/c"), mount("hp", "/h")]),
    );
    let err = e.vm.mount_pod_volumes(&p).await.unwrap_err();
    // The hostPath failed its set-up (its own event); the nfs volume could not even be
    // processed (upstream's "failed to process volumes" event).
    assert_eq!(
        failure_messages(&err),
        vec![
            "MountVolume.SetUp failed for volume \"hp\" : hostPath type check failed: /nonexistent/swiftlet is not a directory"
        ]
    );
    assert_eq!(
        err.processing_event().as_deref(),
        Some(
            "Unable to attach or mount volumes: unmounted volumes=[claim hp], unattached volumes=[], failed to process volumes=[claim]: nfs volumes are not supported by swiftlet (supported: emptyDir, hostPath, configMap, secret, downwardAPI, projected, image, csi, persistentVolumeClaim, ephemeral)"
        )
    );
    assert!(err.to_string().starts_with("unmounted volumes=[claim hp], unattached volumes=[]: "));
    assert!(!e.dir.path().join("pods/u1/volumes/kubernetes.io~empty-dir/unused").exists());
    // The hostPath is desired but not set up; the unsupported volume is neither.
    let counts = e.vm.volume_counts();
    assert_eq!(counts.get(&("kubernetes.io/host-path".to_owned(), "desired_state_of_world")), Some(&1));
    assert_eq!(counts.get(&("kubernetes.io/host-path".to_owned(), "actual_state_of_world")), None);
    assert_eq!(counts.len(), 1, "{counts:?}");
}

#[tokio::test]
async fn host_path_creates_and_checks() {
    let e = env();
    let target = e.dir.path().join("host/data");
    let p = pod(
        json!([{"name": "hp", "hostPath": {"path": target, "type": "DirectoryOrCreate"}}]),
        json!([mount("hp", "/data")]),
    );
    let vols = e.vm.mount_pod_volumes(&p).await.unwrap();
    assert_eq!(vols.get("hp").unwrap().path, target);
    assert!(target.is_dir());
    let mounts =
        e.vm.container_mounts(&p.spec.as_ref().unwrap().containers[0], &vols, &no_images(), &[]).unwrap().mounts;
    assert_eq!(mounts[0].host_path, target.to_string_lossy());
    assert!(!mounts[0].readonly);
    // Cleanup never touches the host path.
    e.vm.cleanup_pod("u1").unwrap();
    assert!(target.is_dir());
}

#[tokio::test]
async fn config_map_volume_lifecycle() {
    let e = env();
    let p = pod(
        json!([{"name": "cfg", "configMap": {"name": "app", "defaultMode": 0o440,
                                            "items": [{"key": "a", "path": "conf/a.txt"}, {"key": "b", "path": "b", "mode": 0o400}]}}]),
        json!([mount("cfg", "/etc/app")]),
    );
    // Missing: the pod waits, nothing is created.
    let err = e.vm.mount_pod_volumes(&p).await.unwrap_err();
    assert_eq!(
        failure_messages(&err),
        vec!["MountVolume.SetUp failed for volume \"cfg\" : configmap \"app\" not found"]
    );
    let dir = e.dir.path().join("pods/u1/volumes/kubernetes.io~configmap/cfg");
    assert!(!dir.exists());

    // A listed key that is missing names the key.
    e.src.set_config_map(config_map("app", &[("a", "1")]));
    let err = e.vm.mount_pod_volumes(&p).await.unwrap_err();
    assert_eq!(
        failure_messages(&err),
        vec!["MountVolume.SetUp failed for volume \"cfg\" : configmap references non-existent config key: b"]
    );
    assert!(!dir.exists(), "a failed first setup is torn down");

    e.src.set_config_map(config_map("app", &[("a", "1"), ("b", "2")]));
    let vols = e.vm.mount_pod_volumes(&p).await.unwrap();
    let v = vols.get("cfg").unwrap();
    assert!(v.read_only && !v.memory);
    assert_eq!(read(&dir.join("conf/a.txt")), "1");
    assert_eq!(mode(&dir.join("conf/a.txt")), 0o440);
    assert_eq!(mode(&dir.join("b")), 0o400);
    let version = std::fs::read_link(dir.join("..data")).unwrap();

    // Unchanged: no new version.
    e.vm.mount_pod_volumes(&p).await.unwrap();
    assert_eq!(std::fs::read_link(dir.join("..data")).unwrap(), version);

    // Updated: the next sync writes it.
    e.src.set_config_map(config_map("app", &[("a", "10"), ("b", "2")]));
    e.vm.mount_pod_volumes(&p).await.unwrap();
    assert_eq!(read(&dir.join("conf/a.txt")), "10");
    assert_ne!(std::fs::read_link(dir.join("..data")).unwrap(), version);

    // Deleted while in use: reported, the content stays, the pod is not blocked.
    e.src.remove_config_map("default", "app");
    let vols = e.vm.mount_pod_volumes(&p).await.unwrap();
    assert_eq!(
        vols.remount_failures().iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec!["MountVolume.SetUp failed for volume \"cfg\" : configmap \"app\" not found"]
    );
    assert_eq!(read(&dir.join("conf/a.txt")), "10");
    assert!(vols.get("cfg").is_some());
}

#[tokio::test]
async fn optional_config_map_and_key_removal() {
    let e = env();
    let p = pod(
        json!([{"name": "cfg", "configMap": {"name": "opt", "optional": true}}]),
        json!([mount("cfg", "/etc/app")]),
    );
    let dir = e.dir.path().join("pods/u1/volumes/kubernetes.io~configmap/cfg");
    e.vm.mount_pod_volumes(&p).await.unwrap();
    assert!(dir.join("..data").exists());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "only ..data and its version");

    e.src.set_config_map(config_map("opt", &[("x", "1"), ("y", "2")]));
    e.vm.mount_pod_volumes(&p).await.unwrap();
    assert_eq!(read(&dir.join("y")), "2");
    e.src.set_config_map(config_map("opt", &[("x", "1")]));
    e.vm.mount_pod_volumes(&p).await.unwrap();
    assert!(std::fs::symlink_metadata(dir.join("y")).is_err());
    assert_eq!(read(&dir.join("x")), "1");
}

#[tokio::test]
async fn standalone_mode_refuses_api_volumes_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let vm = VolumeManager::new(dir.path(), Arc::new(NoApiServer))
        .with_mounter(Arc::new(FakeMounter::default()))
        .with_node_allocatable(NODE);
    let p = pod(
        json!([{"name": "cfg", "configMap": {"name": "x", "optional": true}}, {"name": "e", "emptyDir": {}}]),
        json!([mount("cfg", "/c"), mount("e", "/e")]),
    );
    let err = vm.mount_pod_volumes(&p).await.unwrap_err();
    assert_eq!(
        failure_messages(&err),
        vec!["MountVolume.SetUp failed for volume \"cfg\" : ConfigMap default/x: no API server (standalone mode)"]
    );
    // The emptyDir was set up regardless.
    assert!(dir.path().join("pods/u1/volumes/kubernetes.io~empty-dir/e").is_dir());
}

#[tokio::test]
async fn secret_volume_is_on_tmpfs() {
    let e = env();
    let p = pod(
        json!([{"name": "creds", "secret": {"secretName": "db", "defaultMode": 0o400}}]),
        json!([mount("creds", "/creds")]),
    );
    let err = e.vm.mount_pod_volumes(&p).await.unwrap_err();
    assert_eq!(failure_messages(&err), vec!["MountVolume.SetUp failed for volume \"creds\" : secret \"db\" not found"]);
    assert!(e.mounter.calls().is_empty(), "nothing is mounted before the secret is read");

    e.src.set_secret(secret_obj("db", &[("password", "hunter2")]));
    let vols = e.vm.mount_pod_volumes(&p).await.unwrap();
    let v = vols.get("creds").unwrap();
    assert!(v.memory && v.read_only);
    assert_eq!(e.mounter.calls(), vec![MountCall::MountTmpfs(v.path.clone(), Some(256 << 20))]);
    assert_eq!(read(&v.path.join("password")), "hunter2");
    assert_eq!(mode(&v.path.join("password")), 0o400);
    e.vm.cleanup_pod("u1").unwrap();
    assert!(e.mounter.mounts().is_empty());
}

#[tokio::test]
async fn downward_api_volume() {
    let e = env();
    let p = pod(
        json!([{"name": "info", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}},
            {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu", "divisor": "1m"}}
        ]}}]),
        json!([mount("info", "/info")]),
    );
    let vols = e.vm.mount_pod_volumes(&p).await.unwrap();
    let dir = &vols.get("info").unwrap().path;
    assert_eq!(read(&dir.join("labels")), "app=\"web\"");
    assert_eq!(read(&dir.join("mem")), "256");
    // No cpu limit: node allocatable.
    assert_eq!(read(&dir.join("cpu")), "2000");
    assert!(vols.get("info").unwrap().memory);
}

#[tokio::test]
async fn projected_volume_with_token_refresh() {
    let e = env();
    e.src.set_config_map(config_map("ca", &[("ca.crt", "CERT")]));
    e.src.set_secret(secret_obj("s", &[("k", "v")]));
    let p = pod(
        json!([{"name": "kube-api-access", "projected": {"defaultMode": 0o444, "sources": [
            {"serviceAccountToken": {"path": "token", "audience": "api", "expirationSeconds": 3600}},
            {"configMap": {"name": "ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"secret": {"name": "s"}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
        ]}}]),
        json!([mount("kube-api-access", "/var/run/secrets/kubernetes.io/serviceaccount")]),
    );
    let vols = e.vm.mount_pod_volumes(&p).await.unwrap();
    let dir = vols.get("kube-api-access").unwrap().path.clone();
    assert!(dir.ends_with("pods/u1/volumes/kubernetes.io~projected/kube-api-access"));
    assert_eq!(read(&dir.join("token")), "token-1");
    assert_eq!(read(&dir.join("ca.crt")), "CERT");
    assert_eq!(read(&dir.join("k")), "v");
    assert_eq!(read(&dir.join("namespace")), "default");
    assert_eq!(mode(&dir.join("token")), 0o444);
    let req = e.src.token_requests()[0].clone();
    assert_eq!(
        (req.namespace.as_str(), req.service_account.as_str(), req.audiences, req.expiration_seconds),
        ("default", "default", vec!["api".to_string()], 3600)
    );
    assert_eq!(req.pod, BoundPod { name: "p".into(), uid: "u1".into() });

    // Before 80 % of the lifetime: the same token, nothing rewritten.
    e.clock.advance(Duration::from_secs(2879));
    e.vm.mount_pod_volumes(&p).await.unwrap();
    assert_eq!(read(&dir.join("token")), "token-1");
    // After: a new token reaches the file.
    e.clock.advance(Duration::from_secs(2));
    e.vm.mount_pod_volumes(&p).await.unwrap();
    assert_eq!(read(&dir.join("token")), "token-2");
    assert_eq!(e.src.token_requests().len(), 2);
}

#[tokio::test]
async fn projected_errors_are_aggregated() {
    let e = env();
    let p = pod(
        json!([{"name": "pj", "projected": {"sources": [
            {"configMap": {"name": "nope"}},
            {"secret": {"name": "nope", "optional": true}},
            {"clusterTrustBundle": {"path": "b", "signerName": "x"}}
        ]}}]),
        json!([mount("pj", "/pj")]),
    );
    let err = e.vm.mount_pod_volumes(&p).await.unwrap_err();
    assert_eq!(
        failure_messages(&err),
        vec![
            "MountVolume.SetUp failed for volume \"pj\" : [configmap \"nope\" not found, projected volume source clusterTrustBundle is not supported by swiftlet]"
        ]
    );
}

#[tokio::test]
async fn fs_group_and_fs_user() {
    let e = env();
    e.src.set_config_map(config_map("c", &[("k", "v")]));
    let p = pod_with(
        &json!([{"name": "cfg", "configMap": {"name": "c", "defaultMode": 0o400}},
                {"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
                {"name": "scratch", "emptyDir": {}}]),
        &json!([mount("cfg", "/c"), mount("tok", "/t"), mount("scratch", "/s")]),
        &json!({"fsGroup": 2000, "runAsUser": 1000}),
    );
    let vols = e.vm.mount_pod_volumes(&p).await.unwrap();
    let cfg = &vols.get("cfg").unwrap().path;
    // Read-only volumes get g+r, directories setgid.
    assert_eq!(mode(&cfg.join("k")), 0o440);
    assert_eq!(mode(cfg) & 0o2000, 0o2000);
    // The token is 0600 for its fsUser, plus g+r from fsGroup.
    let tok = &vols.get("tok").unwrap().path;
    assert_eq!(mode(&tok.join("t")), 0o640);
    assert_eq!(mode(&vols.get("scratch").unwrap().path), 0o2777);
    if crate::volumes::mounter::running_as_root() {
        assert_eq!(std::fs::metadata(cfg.join("k")).unwrap().gid(), 2000);
        assert_eq!(std::fs::metadata(tok.join("t")).unwrap().uid(), 1000);
    }
    // A second sync does not rewrite (modes changed by fsGroup do not count as changes).
    let version = std::fs::read_link(cfg.join("..data")).unwrap();
    e.vm.mount_pod_volumes(&p).await.unwrap();
    assert_eq!(std::fs::read_link(cfg.join("..data")).unwrap(), version);
}

#[tokio::test]
async fn nested_mount_points_are_created_in_read_only_volumes() {
    let e = env();
    e.src.set_config_map(config_map("c", &[("k", "v")]));
    let p = pod(
        json!([{"name": "cfg", "configMap": {"name": "c"}}, {"name": "inner", "emptyDir": {}}]),
        json!([mount("cfg", "/etc/app"), mount("inner", "/etc/app/cache/"), mount("inner", "/etc/app/cache/x")]),
    );
    let vols = e.vm.mount_pod_volumes(&p).await.unwrap();
    let cfg = &vols.get("cfg").unwrap().path;
    assert!(cfg.join("cache").is_dir());
    assert!(!cfg.join("cache/x").exists(), "doubly nested points are the inner volume's business");
}

#[tokio::test]
async fn container_mounts_map_read_only_propagation_and_sub_paths() {
    let e = env();
    e.src.set_config_map(config_map("c", &[("k", "v")]));
    let p = pod(
        json!([{"name": "cfg", "configMap": {"name": "c"}}, {"name": "data", "emptyDir": {}}]),
        json!([
            mount("cfg", "/etc/app"),
            {"name": "data", "mountPath": "/a", "readOnly": true, "mountPropagation": "HostToContainer"},
            {"name": "data", "mountPath": "/b", "subPath": "logs/b", "mountPropagation": "Bidirectional"},
            {"name": "data", "mountPath": "/e", "subPathExpr": "pods/$(POD_NAME)"}
        ]),
    );
    let vols = e.vm.mount_pod_volumes(&p).await.unwrap();
    let c = &p.spec.as_ref().unwrap().containers[0];
    let envs = vec![("POD_NAME".to_string(), "p".to_string())];
    let m = e.vm.container_mounts(c, &vols, &no_images(), &envs).unwrap().mounts;
    let data = vols.get("data").unwrap().path.canonicalize().unwrap();
    assert_eq!(m.len(), 4);
    assert!(m[0].readonly, "configMap volumes are always read-only");
    assert_eq!(m[0].propagation, api::MountPropagation::PropagationPrivate as i32);
    assert!(m[1].readonly);
    assert_eq!(m[1].propagation, api::MountPropagation::PropagationHostToContainer as i32);
    assert!(!m[2].readonly);
    assert_eq!(m[2].propagation, api::MountPropagation::PropagationBidirectional as i32);
    assert_eq!(m[2].host_path, data.join("logs/b").to_string_lossy());
    assert!(data.join("logs/b").is_dir());
    assert_eq!(m[3].host_path, data.join("pods/p").to_string_lossy());
    assert_eq!(m[3].container_path, "/e");

    // subPathExpr without the variable.
    let err = e.vm.container_mounts(c, &vols, &no_images(), &[]).unwrap_err();
    assert_eq!(err.to_string(), "missing value for POD_NAME");
}

#[tokio::test]
async fn container_mount_errors() {
    let e = env();
    let escape = e.dir.path().join("escape");
    std::fs::create_dir(&escape).unwrap();
    let p = pod(
        json!([{"name": "data", "emptyDir": {}}]),
        json!([{"name": "data", "mountPath": "/x", "subPath": "link/etc"}]),
    );
    let vols = e.vm.mount_pod_volumes(&p).await.unwrap();
    std::os::unix::fs::symlink(&escape, vols.get("data").unwrap().path.join("link")).unwrap();
    let c = p.spec.as_ref().unwrap().containers[0].clone();
    let err = e.vm.container_mounts(&c, &vols, &no_images(), &[]).unwrap_err();
    assert_eq!(err.to_string(), "failed to prepare subPath for volumeMount \"data\" of container \"c\"");
    assert!(!escape.join("etc").exists());

    let mut bad = c.clone();
    bad.volume_mounts = Some(vec![
        serde_json::from_value(json!({"name": "data", "mountPath": "/x", "mountPropagation": "Sideways"})).unwrap(),
    ]);
    assert_eq!(
        e.vm.container_mounts(&bad, &vols, &no_images(), &[]).unwrap_err().to_string(),
        "invalid MountPropagation mode: \"Sideways\""
    );
    bad.volume_mounts = Some(vec![serde_json::from_value(json!({"name": "other", "mountPath": "/x"})).unwrap()]);
    assert_eq!(
        e.vm.container_mounts(&bad, &vols, &no_images(), &[]).unwrap_err().to_string(),
        "cannot find volume \"other\" to mount into container \"c\""
    );
}

#[tokio::test]
async fn an_image_volume_is_the_pulled_image_mounted_read_only_by_the_runtime_with_its_sub_path() {
    let e = env();
    let p = pod(
        json!([{"name": "tools", "image": {"reference": "example.test/tools:1", "pullPolicy": "IfNotPresent"}},
               {"name": "data", "emptyDir": {}}]),
        json!([
            {"name": "data", "mountPath": "/data"},
            {"name": "tools", "mountPath": "/opt/tools"},
            {"name": "tools", "mountPath": "/etc/tool", "subPathExpr": "etc/$(POD_NAME)", "readOnly": false}
        ]),
    );
    let vols = e.vm.mount_pod_volumes(&p).await.unwrap();
    let tools = vols.get("tools").unwrap();
    assert_eq!((tools.plugin.name(), tools.read_only), ("kubernetes.io/image", true));
    assert!(e.mounter.calls().is_empty(), "nothing is mounted on the node for an image volume");
    assert!(!e.vm.pod_volumes_dir("u1").join("kubernetes.io~image").exists());

    let c = &p.spec.as_ref().unwrap().containers[0];
    let envs = vec![("POD_NAME".to_string(), "p".to_string())];
    let spec = api::ImageSpec {
        image: "sha256:1234".into(),
        user_specified_image: "example.test/tools:1".into(),
        ..Default::default()
    };
    let images = ImageVolumes::from([("tools".to_owned(), spec.clone())]);
    let out = e.vm.container_mounts(c, &vols, &images, &envs).unwrap();
    assert_eq!(out.mounts.len(), 3);
    assert!(out.mounts[0].image.is_none());
    for m in &out.mounts[1..] {
        assert_eq!(m.image.as_ref(), Some(&spec));
        assert_eq!(m.host_path, "", "an image mount has no host path");
        assert!(m.readonly, "image volumes are read-only whatever the mount says");
    }
    assert_eq!(out.image_sub_paths, [(2, "etc/p".to_owned())]);

    // The image must have been pulled; sub paths are checked as any other.
    let err = e.vm.container_mounts(c, &vols, &no_images(), &envs).unwrap_err();
    assert_eq!(err.to_string(), "the image of image volume \"tools\" was not pulled");
    let mut bad = c.clone();
    bad.volume_mounts =
        Some(vec![serde_json::from_value(json!({"name": "tools", "mountPath": "/x", "subPath": "../etc"})).unwrap()]);
    assert_eq!(
        e.vm.container_mounts(&bad, &vols, &images, &[]).unwrap_err().to_string(),
        "unable to provision SubPath `../etc`: must not contain '..'"
    );
    // Nothing to clean up but the pod's directory.
    e.vm.cleanup_pod("u1").unwrap();
}

#[tokio::test]
async fn cleanup_refuses_to_remove_what_stays_mounted() {
    let e = env();
    let p = pod(json!([{"name": "m", "emptyDir": {"medium": "Memory"}}]), json!([mount("m", "/m")]));
    e.vm.mount_pod_volumes(&p).await.unwrap();
    e.mounter.fail_unmount(Some("device or resource busy"));
    let err = e.vm.cleanup_pod("u1").unwrap_err();
    assert!(err.to_string().contains("device or resource busy"), "{err}");
    assert!(e.dir.path().join("pods/u1/volumes/kubernetes.io~empty-dir/m").is_dir());
    e.mounter.fail_unmount(None);
    e.vm.cleanup_pod("u1").unwrap();
    assert!(!e.dir.path().join("pods/u1/volumes").exists());
}

#[tokio::test]
async fn cleanup_does_not_follow_symlinks_out_of_the_pod() {
    let e = env();
    let outside = e.dir.path().join("precious");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("f"), "keep").unwrap();
    let p = pod(json!([{"name": "d", "emptyDir": {}}]), json!([mount("d", "/d")]));
    let vols = e.vm.mount_pod_volumes(&p).await.unwrap();
    std::os::unix::fs::symlink(&outside, vols.get("d").unwrap().path.join("link")).unwrap();
    e.vm.cleanup_pod("u1").unwrap();
    assert_eq!(read(&outside.join("f")), "keep");
}

#[tokio::test]
async fn orphaned_pod_directories_are_removed() {
    let e = env();
    for uid in ["u1", "u2"] {
        let mut p = pod(json!([{"name": "m", "emptyDir": {"medium": "Memory"}}]), json!([mount("m", "/m")]));
        p.metadata.uid = Some(uid.into());
        e.vm.mount_pod_volumes(&p).await.unwrap();
    }
    let sweep = e.vm.cleanup_orphans(|u| (u != "u1").then_some(())).unwrap();
    assert_eq!(sweep, crate::volumes::manager::OrphanSweep { removed: vec!["u2".to_string()], failed: vec![] });
    assert!(!e.dir.path().join("pods/u2").exists());
    assert!(e.dir.path().join("pods/u1/volumes").exists());
    assert_eq!(e.mounter.mounts().len(), 1);
    // A pod whose volume stays mounted is a failure of this sweep, retried by the next.
    e.mounter.fail_unmount(Some("device or resource busy"));
    let sweep = e.vm.cleanup_orphans(|_| Some(())).unwrap();
    assert_eq!(sweep.failed, vec!["u1".to_string()]);
    assert!(sweep.removed.is_empty());
    e.mounter.fail_unmount(None);
    assert_eq!(e.vm.cleanup_orphans(|_| Some(())).unwrap().removed, vec!["u1".to_string()]);
}

/// A real tmpfs for `medium: Memory` (root only; CI runs as root), cleaned up by
/// `cleanup_pod` — and by a guard if an assertion fails first.
#[tokio::test]
async fn real_memory_empty_dir() {
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = SystemMounter.unmount(&self.0);
        }
    }
    if !crate::volumes::mounter::running_as_root() {
        eprintln!("skipping: needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let vm = VolumeManager::new(dir.path(), Arc::new(NoApiServer)).with_node_allocatable(NODE);
    let p =
        pod(json!([{"name": "m", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}]), json!([mount("m", "/m")]));
    let vols = vm.mount_pod_volumes(&p).await.unwrap();
    let path = vols.get("m").unwrap().path.clone();
    let _guard = Unmount(path.clone());
    assert!(SystemMounter.is_tmpfs(&path).unwrap());
    let line = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.contains(path.to_str().unwrap()))
        .map(str::to_owned)
        .unwrap();
    assert!(line.contains("size=8192k"), "{line}");
    std::fs::write(path.join("f"), "in memory").unwrap();
    // A second sync keeps the same tmpfs (and its content).
    vm.mount_pod_volumes(&p).await.unwrap();
    assert_eq!(read(&path.join("f")), "in memory");
    vm.cleanup_pod("u1").unwrap();
    assert!(!SystemMounter.is_tmpfs(&path).unwrap());
    assert!(!path.exists());
}

#[test]
fn sub_path_expr_expansion() {
    let envs = vec![("A".to_string(), "1".to_string()), ("E".to_string(), String::new())];
    assert_eq!(expand_sub_path_expr("x/$(A)/$$(B)", &envs).unwrap(), "x/1/$(B)");
    assert_eq!(expand_sub_path_expr("$(E)/$(C)/$(B)", &envs).unwrap_err().to_string(), "missing value for B, C, E");
}
