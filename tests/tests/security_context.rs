//! End-to-end tests of pod and container security contexts: a real `swiftlet` runs
//! static pods in the test bed's containerd, and the kernel's view of the container's
//! process (`/proc/<pid>/status`) says what was really applied.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde_json::Value;
use swiftlet_tests::{Agent, AgentOptions, Cri, cri_endpoint, testbed_lock};

const BUSYBOX: &str = "localhost/busybox:latest";
/// A container that runs until SIGTERM and then exits at once.
const SERVE: &str = "trap 'exit 0' TERM; while true; do sleep 1; done";

fn pod_yaml(name: &str, pod_sc: &str, containers: &[(&str, &str)]) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 2\n  securityContext: {pod_sc}\n  containers:\n"
    );
    for (cname, sc) in containers {
        let _ = write!(
            out,
            "  - name: {cname}\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"{SERVE}\"]\n    securityContext: {sc}\n"
        );
    }
    out
}

fn container<'a>(p: &'a Value, name: &str) -> &'a Value {
    p["status"]["containerStatuses"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

fn running(p: &Value, names: &[&str]) -> bool {
    p["status"]["phase"] == "Running" && names.iter().all(|n| !container(p, n)["state"]["running"].is_null())
}

/// The `/proc/<pid>/status` line `field` of the container's main process, as the host sees it.
async fn proc_status(cri: &Cri, p: &Value, name: &str, field: &str) -> Result<String> {
    let id = container(p, name)["containerID"].as_str().context("no containerID")?;
    let pid = cri.container_pid(id.trim_start_matches("containerd://")).await?;
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")).map(|v| v.trim().to_string()))
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

async fn setup() -> Result<(Agent, Cri)> {
    let cri = Cri::connect(&cri_endpoint()?)?;
    let agent = Agent::start(AgentOptions::default()).await?;
    Ok((agent, cri))
}

#[tokio::test]
async fn seccomp_runtime_default_filters_and_unconfined_does_not() -> Result<()> {
    let _g = testbed_lock().await;
    let (agent, cri) = setup().await?;
    agent.write_manifest(
        "seccomp.yaml",
        &pod_yaml(
            "seccomp",
            "{}",
            &[
                ("confined", "{seccompProfile: {type: RuntimeDefault}}"),
                ("unconfined", "{seccompProfile: {type: Unconfined}}"),
            ],
        ),
    )?;
    let p = agent.wait_pod("seccomp", Duration::from_mins(1), |p| running(p, &["confined", "unconfined"])).await?;
    // 2 = SECCOMP_MODE_FILTER, 0 = disabled.
    assert_eq!(proc_status(&cri, &p, "confined", "Seccomp").await?, "2");
    assert_eq!(proc_status(&cri, &p, "unconfined", "Seccomp").await?, "0");
    agent.remove_manifest("seccomp.yaml")?;
    agent.shutdown(&cri).await
}

#[tokio::test]
async fn run_as_non_root_refuses_a_root_image_and_runs_a_non_root_user() -> Result<()> {
    let _g = testbed_lock().await;
    let (agent, cri) = setup().await?;
    // busybox has no USER: it would run as root.
    agent.write_manifest("rootimg.yaml", &pod_yaml("rootimg", "{runAsNonRoot: true}", &[("main", "{}")]))?;
    agent.write_manifest(
        "nonroot.yaml",
        &pod_yaml("nonroot", "{runAsNonRoot: true}", &[("main", "{runAsUser: 1000}")]),
    )?;
    let p = agent
        .wait_pod("rootimg", Duration::from_mins(1), |p| {
            container(p, "main")["state"]["waiting"]["reason"] == "CreateContainerConfigError"
        })
        .await?;
    let msg = container(&p, "main")["state"]["waiting"]["message"].as_str().unwrap_or_default().to_string();
    let uid = p["metadata"]["uid"].as_str().unwrap_or_default();
    let name = p["metadata"]["name"].as_str().unwrap_or_default();
    assert_eq!(
        msg,
        format!(
            "container has runAsNonRoot and image will run as root (pod: \"{name}_default({uid})\", container: main)"
        )
    );
    assert!(cri.containers(uid).await?.is_empty(), "no container was created for the refused one");

    let p = agent.wait_pod("nonroot", Duration::from_mins(1), |p| running(p, &["main"])).await?;
    let uids = proc_status(&cri, &p, "main", "Uid").await?;
    assert!(uids.split_whitespace().all(|u| u == "1000"), "Uid: {uids}");
    agent.remove_manifest("rootimg.yaml")?;
    agent.remove_manifest("nonroot.yaml")?;
    agent.shutdown(&cri).await
}

#[tokio::test]
async fn fs_group_and_supplemental_groups_reach_the_process() -> Result<()> {
    let _g = testbed_lock().await;
    let (agent, cri) = setup().await?;
    agent.write_manifest(
        "groups.yaml",
        &pod_yaml("groups", "{runAsUser: 1000, fsGroup: 2000, supplementalGroups: [3000]}", &[("main", "{}")]),
    )?;
    let p = agent.wait_pod("groups", Duration::from_mins(1), |p| running(p, &["main"])).await?;
    let groups = proc_status(&cri, &p, "main", "Groups").await?;
    let groups: Vec<&str> = groups.split_whitespace().collect();
    assert!(groups.contains(&"2000"), "fsGroup missing from Groups: {groups:?}");
    assert!(groups.contains(&"3000"), "supplemental group missing from Groups: {groups:?}");
    agent.remove_manifest("groups.yaml")?;
    agent.shutdown(&cri).await
}

#[tokio::test]
async fn apparmor_pod_is_refused_on_a_host_without_apparmor() -> Result<()> {
    let _g = testbed_lock().await;
    let (agent, cri) = setup().await?;
    let host_has_apparmor = std::fs::read("/sys/module/apparmor/parameters/enabled").is_ok_and(|b| b.starts_with(b"Y"));
    agent.write_manifest("aa.yaml", &pod_yaml("aa", "{appArmorProfile: {type: RuntimeDefault}}", &[("main", "{}")]))?;
    if host_has_apparmor {
        agent.wait_pod("aa", Duration::from_mins(1), |p| running(p, &["main"])).await?;
    } else {
        let p = agent.wait_pod("aa", Duration::from_mins(1), |p| p["status"]["phase"] == "Failed").await?;
        // The kubelet's rejectPod prefixes the handler's message.
        assert_eq!(p["status"]["reason"], "AppArmor");
        assert_eq!(
            p["status"]["message"],
            "Pod was rejected: Cannot enforce AppArmor: AppArmor is not enabled on the host"
        );
        let uid = p["metadata"]["uid"].as_str().unwrap_or_default();
        assert!(cri.sandboxes(uid).await?.is_empty(), "a refused pod gets no sandbox");
    }
    agent.remove_manifest("aa.yaml")?;
    agent.shutdown(&cri).await
}

#[tokio::test]
async fn seccomp_default_and_localhost_profiles_under_the_root_dir() -> Result<()> {
    let _g = testbed_lock().await;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let agent =
        Agent::start(AgentOptions { extra_config: "seccompDefault: true\n".into(), ..AgentOptions::default() }).await?;
    // An allow-all filter: the process is still in filter mode.
    let dir = agent.root_dir.join("seccomp/profiles");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("allow.json"), r#"{"defaultAction": "SCMP_ACT_ALLOW"}"#)?;
    agent.write_manifest(
        "defaults.yaml",
        &pod_yaml(
            "defaults",
            "{}",
            &[
                ("unset", "{}"),
                ("local", "{seccompProfile: {type: Localhost, localhostProfile: profiles/allow.json}}"),
                ("unconfined", "{seccompProfile: {type: Unconfined}}"),
            ],
        ),
    )?;
    let p =
        agent.wait_pod("defaults", Duration::from_mins(1), |p| running(p, &["unset", "local", "unconfined"])).await?;
    assert_eq!(proc_status(&cri, &p, "unset", "Seccomp").await?, "2", "seccompDefault makes unset RuntimeDefault");
    assert_eq!(proc_status(&cri, &p, "local", "Seccomp").await?, "2");
    assert_eq!(proc_status(&cri, &p, "unconfined", "Seccomp").await?, "0");
    agent.remove_manifest("defaults.yaml")?;
    agent.shutdown(&cri).await
}

/// Pushes `busybox:<tag>` to the plain test registry: busybox's layers with `User` set in
/// the image config; returns the image reference to pull.
async fn push_busybox_with_user(tag: &str, user: &str) -> Result<String> {
    use sha2::Digest as _;
    let reg = swiftlet_tests::TestRegistry::load()?;
    let base = format!("http://{}/v2/busybox", reg.plain);
    let http = reqwest::Client::new();
    let accept = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";
    let resp =
        http.get(format!("{base}/manifests/latest")).header("Accept", accept).send().await?.error_for_status()?;
    let media_type = resp.headers().get("content-type").context("no manifest content type")?.to_str()?.to_string();
    let mut manifest: Value = resp.json().await?;
    let config_digest = manifest["config"]["digest"].as_str().context("manifest has no config")?.to_string();
    let mut config: Value =
        http.get(format!("{base}/blobs/{config_digest}")).send().await?.error_for_status()?.json().await?;
    config["config"]["User"] = Value::String(user.into());
    let body = serde_json::to_vec(&config)?;
    let digest = format!("sha256:{:x}", sha2::Sha256::digest(&body));
    let upload = http.post(format!("{base}/blobs/uploads/")).send().await?.error_for_status()?;
    let location = upload.headers().get("location").context("no upload location")?.to_str()?.to_string();
    let location = if location.starts_with("http") { location } else { format!("http://{}{location}", reg.plain) };
    let sep = if location.contains('?') { '&' } else { '?' };
    http.put(format!("{location}{sep}digest={digest}"))
        .header("Content-Type", "application/octet-stream")
        .body(body.clone())
        .send()
        .await?
        .error_for_status()?;
    manifest["config"]["digest"] = Value::String(digest);
    manifest["config"]["size"] = Value::from(body.len());
    http.put(format!("{base}/manifests/{tag}"))
        .header("Content-Type", media_type)
        .body(serde_json::to_vec(&manifest)?)
        .send()
        .await?
        .error_for_status()?;
    Ok(reg.plain_image(&format!("busybox:{tag}")))
}

#[tokio::test]
async fn run_as_non_root_uses_the_image_user_from_image_status() -> Result<()> {
    let _g = testbed_lock().await;
    let (agent, cri) = setup().await?;
    // runAsNonRoot without runAsUser passes only if ImageStatus gave the kubelet the
    // image's uid (an image whose user is unknown runs as root).
    let image = push_busybox_with_user("secctx-uid1000", "1000").await?;
    agent.write_manifest(
        "imageuser.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: imageuser\nspec:\n  terminationGracePeriodSeconds: 2\n  securityContext: {{runAsNonRoot: true}}\n  containers:\n  - name: main\n    image: {image}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"{SERVE}\"]\n"
        ),
    )?;
    let p = agent.wait_pod("imageuser", Duration::from_mins(1), |p| running(p, &["main"])).await?;
    let uids = proc_status(&cri, &p, "main", "Uid").await?;
    assert!(uids.split_whitespace().all(|u| u == "1000"), "Uid: {uids}");
    agent.remove_manifest("imageuser.yaml")?;
    agent.shutdown(&cri).await?;
    cri.remove_image(&image).await
}

/// `hostUsers: false` (user namespaces, GA since 1.36). On a runtime whose handler
/// supports them (containerd 2.x: run with `SWIFTLET_E2E_NODE=containerd2`, as CI's node
/// suite does) the pod's processes run in a user namespace of their own, container ids
/// 0..65536 on host ids 65536..131072 (the first range after id 0's), the range kept in
/// the pod's directory across an agent restart; its emptyDir is an idmapped mount, so a
/// file root makes there is owned by root on the host too. On a runtime without them
/// (containerd 1.6) the sandbox is refused with upstream's event, and nothing runs.
#[tokio::test]
async fn host_users_false_runs_the_pod_in_a_user_namespace_of_its_own() -> Result<()> {
    let _g = testbed_lock().await;
    let (mut agent, cri) = setup().await?;
    let supported = cri.supports_user_namespaces().await?;
    let script = format!("touch /data/by-root; {SERVE}");
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: userns\nspec:\n  hostUsers: false\n  terminationGracePeriodSeconds: 2\n  \
         volumes:\n  - name: data\n    emptyDir: {{}}\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    \
         imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"{script}\"]\n    volumeMounts:\n    - {{name: data, mountPath: /data}}\n"
    );
    agent.write_manifest("userns.yaml", &manifest)?;
    if !supported {
        let refused = "Failed to create pod sandbox: can't set `spec.hostUsers: false`, runtime does not support user \
                       namespaces";
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (_, body) = agent.get("/events").await?;
            let events: Value = serde_json::from_str(&body)?;
            let found = events["items"].as_array().into_iter().flatten().any(|e| {
                e["reason"] == "FailedCreatePodSandBox" && e["message"].as_str().is_some_and(|m| m == refused)
            });
            if found {
                break;
            }
            anyhow::ensure!(std::time::Instant::now() < deadline, "no refusal event: {body}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        anyhow::ensure!(cri.all_sandboxes().await?.is_empty(), "a sandbox was made");
        return agent.shutdown(&cri).await;
    }
    let p = agent.wait_pod("userns", Duration::from_mins(1), |p| running(p, &["main"])).await?;
    let uid = p["metadata"]["uid"].as_str().context("no uid")?.to_owned();
    let id = container(&p, "main")["containerID"].as_str().context("no containerID")?;
    let id = id.trim_start_matches("containerd://").to_owned();
    let (code, map) = cri.exec(&id, &["cat", "/proc/self/uid_map"]).await?;
    anyhow::ensure!(code == 0, "cat uid_map: {map}");
    let fields: Vec<&str> = map.split_whitespace().collect();
    assert_eq!(fields, ["0", "65536", "65536"], "the container's uid map");
    let (_, gid_map) = cri.exec(&id, &["cat", "/proc/self/gid_map"]).await?;
    assert_eq!(gid_map.split_whitespace().collect::<Vec<_>>(), ["0", "65536", "65536"]);
    // Root inside owns what it makes in the volume, seen from inside and on the host.
    let (_, owner) = cri.exec(&id, &["stat", "-c", "%u", "/data/by-root"]).await?;
    assert_eq!(owner.trim(), "0");
    let on_host = agent.root_dir.join(format!("pods/{uid}/volumes/kubernetes.io~empty-dir/data/by-root"));
    let meta = std::fs::metadata(&on_host).with_context(|| format!("{}", on_host.display()))?;
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 0, "an idmapped mount keeps the host's ids");
    // The range is the pod's, in upstream's file, and survives an agent crash.
    let file = agent.root_dir.join(format!("pods/{uid}/userns"));
    let mappings: Value = serde_json::from_slice(&std::fs::read(&file)?)?;
    assert_eq!(mappings["uidMappings"][0], serde_json::json!({"hostId": 65536, "containerId": 0, "length": 65536}));
    agent.kill9()?;
    agent.spawn().await?;
    let again = agent.wait_pod("userns", Duration::from_mins(1), |p| running(p, &["main"])).await?;
    assert_eq!(container(&again, "main")["containerID"], container(&p, "main")["containerID"], "nothing restarted");
    // Removed: the range is given back with the pod.
    agent.remove_manifest("userns.yaml")?;
    let deadline = std::time::Instant::now() + Duration::from_mins(1);
    while file.exists() {
        anyhow::ensure!(std::time::Instant::now() < deadline, "the pod's mappings file is still there");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    agent.shutdown(&cri).await
}

/// `supplementalGroupsPolicy`: `Merge` (the default) adds the groups the image's
/// `/etc/group` gives the user (root is in `wheel`, 10, in the test bed's busybox),
/// `Strict` leaves them out, and the status' `user` names the process's groups as the
/// runtime reports them. Both on a runtime with the feature (containerd 2.x: run with
/// `SWIFTLET_E2E_NODE=containerd2`, as CI's node suite does); on one without it
/// (containerd 1.6) `Strict` is refused at admission (`tests/tests/runtime_state.rs`),
/// `Merge` merges and no `user` is reported.
#[tokio::test]
async fn supplemental_groups_policy_strict_leaves_out_the_images_groups() -> Result<()> {
    let _g = testbed_lock().await;
    let (agent, cri) = setup().await?;
    let supported = cri.status().await?.features.is_some_and(|f| f.supplemental_groups_policy);
    agent.write_manifest("merge.yaml", &pod_yaml("merge", "{supplementalGroups: [3000]}", &[("main", "{}")]))?;
    let groups = async |name: &str| -> Result<(Vec<String>, Value)> {
        let p = agent.wait_pod(name, Duration::from_mins(1), |p| running(p, &["main"])).await?;
        let groups = proc_status(&cri, &p, "main", "Groups").await?;
        Ok((groups.split_whitespace().map(str::to_owned).collect(), container(&p, "main")["user"].clone()))
    };
    let (merged, merged_user) = groups("merge").await?;
    assert!(merged.contains(&"10".into()) && merged.contains(&"3000".into()), "Merge: {merged:?}");
    if !supported {
        assert!(merged_user.is_null(), "containerd 1.6 reports no user: {merged_user}");
        return agent.shutdown(&cri).await;
    }
    assert_eq!(merged_user["linux"]["uid"], 0);
    agent.write_manifest(
        "strict.yaml",
        &pod_yaml("strict", "{supplementalGroups: [3000], supplementalGroupsPolicy: Strict}", &[("main", "{}")]),
    )?;
    let (strict, strict_user) = groups("strict").await?;
    assert!(!strict.contains(&"10".into()) && strict.contains(&"3000".into()), "Strict: {strict:?}");
    let reported: Vec<String> = strict_user["linux"]["supplementalGroups"]
        .as_array()
        .context("no supplementalGroups in the status' user")?
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(!reported.contains(&"10".into()) && reported.contains(&"3000".into()), "status user: {strict_user}");
    agent.shutdown(&cri).await
}
