//! Image pulls against the test bed's real registries (`cargo xtask testbed up` starts
//! Debian's docker-registry on 127.0.0.1: plain HTTP, and TLS with basic auth): pull
//! policies, credentials (pull secrets and the node's docker config), back-off. Static
//! pods of a standalone agent, but for the pull secrets: a node joined to the test bed's
//! real control plane (`cargo xtask testbed up --cluster`).

use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use swiftlet_tests::cluster::{Cluster, ClusterNode};
use swiftlet_tests::pods::{SERVE, pod_yaml_of};
use swiftlet_tests::registry::TestRegistry;
use swiftlet_tests::{Agent, AgentOptions, Cri, TestbedGuard, cri_endpoint, testbed_lock};

fn manifest(name: &str, image: &str, policy: &str) -> String {
    pod_yaml_of(name, None, image, policy, SERVE, "")
}

fn main_state(p: &Value) -> &Value {
    p["status"]["containerStatuses"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "main"))
        .map_or(&Value::Null, |c| &c["state"])
}

fn waiting_reason(p: &Value) -> &str {
    main_state(p)["waiting"]["reason"].as_str().unwrap_or_default()
}

fn running(p: &Value) -> bool {
    !main_state(p)["running"].is_null()
}

/// (reason, message) of the events of pod `name` (its full static pod name).
async fn events_of(agent: &Agent, name: &str) -> Result<Vec<(String, String)>> {
    let (_, body) = agent.get("/events").await?;
    let events: Value = serde_json::from_str(&body)?;
    Ok(events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["involvedObject"]["name"] == format!("{name}-{}", agent.node_name))
        .map(|e| {
            (e["reason"].as_str().unwrap_or_default().to_owned(), e["message"].as_str().unwrap_or_default().to_owned())
        })
        .collect())
}

/// Images the tests pull must not be on the node before they start.
async fn forget_images(cri: &Cri, images: &[&str]) -> Result<()> {
    for image in images {
        cri.remove_image(image).await?;
    }
    Ok(())
}

/// The start of a test against the test bed's registries: the test bed's lock, the
/// registries, a CRI client, and the image `pick` names, which the runtime has forgotten.
async fn registry_test(
    pick: impl FnOnce(&TestRegistry) -> String,
) -> Result<(TestbedGuard, TestRegistry, Cri, String)> {
    let g = testbed_lock().await;
    let reg = TestRegistry::load()?;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let image = pick(&reg);
    forget_images(&cri, &[&image]).await?;
    Ok((g, reg, cri, image))
}

#[tokio::test]
async fn pull_policies_against_a_real_registry() -> Result<()> {
    let (_g, reg, cri, image) = registry_test(|r| r.plain_image("busybox:latest")).await?;
    let missing = reg.plain_image("busybox:no-such-tag");
    let agent = Agent::start(AgentOptions::default()).await?;

    // Never, and the image is not there.
    agent.write_manifest("never.yaml", &manifest("never", &image, "Never"))?;
    agent.wait_pod("never", Duration::from_secs(30), |p| waiting_reason(p) == "ErrImageNeverPull").await?;
    assert!(!cri.has_image(&image).await?, "Never pulled nothing");
    let events = events_of(&agent, "never").await?;
    assert!(
        events.iter().any(|(r, m)| r == "ErrImageNeverPull"
            && m == &format!("Container image \"{image}\" is not present with pull policy of Never")),
        "{events:?}"
    );

    // Always pulls.
    agent.write_manifest("always.yaml", &manifest("always", &image, "Always"))?;
    agent.wait_pod("always", Duration::from_mins(1), running).await?;
    assert!(cri.has_image(&image).await?);
    let events = events_of(&agent, "always").await?;
    assert!(events.iter().any(|(r, m)| r == "Pulling" && m == &format!("Pulling image \"{image}\"")), "{events:?}");
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Pulled" && m.starts_with(&format!("Successfully pulled image \"{image}\" in "))),
        "{events:?}"
    );

    // IfNotPresent: the image is there now, no pull.
    agent.write_manifest("present.yaml", &manifest("present", &image, "IfNotPresent"))?;
    agent.wait_pod("present", Duration::from_mins(1), running).await?;
    let events = events_of(&agent, "present").await?;
    assert!(
        events.iter().any(|(r, m)| r == "Pulled"
            && m == &format!("Container image \"{image}\" already present on machine and can be accessed by the pod")),
        "{events:?}"
    );
    assert!(!events.iter().any(|(r, _)| r == "Pulling"), "no pull: {events:?}");

    // A tag the registry does not have: ErrImagePull, then the back-off.
    agent.write_manifest("missing.yaml", &manifest("missing", &missing, "Always"))?;
    agent.wait_pod("missing", Duration::from_secs(30), |p| waiting_reason(p) == "ErrImagePull").await?;
    agent.wait_pod("missing", Duration::from_secs(30), |p| waiting_reason(p) == "ImagePullBackOff").await?;
    let events = events_of(&agent, "missing").await?;
    assert!(
        events.iter().any(|(r, m)| r == "Failed" && m.starts_with(&format!("Failed to pull image \"{missing}\""))),
        "{events:?}"
    );
    assert!(
        events.iter().any(|(r, m)| r == "BackOff" && m == &format!("Back-off pulling image \"{missing}\"")),
        "{events:?}"
    );
    agent.shutdown(&cri).await?;
    forget_images(&cri, &[&image]).await
}

/// The node's docker config (`<root-dir>/config.json`) lets a static pod pull from the
/// registry that wants a password; without it the pull fails with a clear error.
#[tokio::test]
async fn node_credentials_open_the_private_registry() -> Result<()> {
    let (_g, reg, cri, image) = registry_test(|r| r.tls_image("busybox:latest")).await?;
    let agent = Agent::start(AgentOptions::default()).await?;
    agent.write_manifest("anon.yaml", &manifest("anon", &image, "IfNotPresent"))?;
    agent.wait_pod("anon", Duration::from_secs(30), |p| waiting_reason(p) == "ErrImagePull").await?;
    let events = events_of(&agent, "anon").await?;
    let failed = events.iter().find(|(r, _)| r == "Failed").map(|(_, m)| m.clone()).unwrap_or_default();
    assert!(failed.starts_with(&format!("Failed to pull image \"{image}\"")), "{events:?}");
    // containerd 1.6 says "401 Unauthorized", 2.x "authorization failed: no basic auth
    // credentials": the runtime's words, passed on as they are.
    let lower = failed.to_lowercase();
    assert!(failed.contains("401") || lower.contains("unauthorized") || lower.contains("authorization"), "{failed}");
    agent.shutdown(&cri).await?;

    // The node's credentials are read once per 5 minutes, as upstream caches them: a new
    // agent, with the file in place from the start.
    let mut agent = Agent::start(AgentOptions::default()).await?;
    agent.stop()?;
    let root = agent.dir.path().join("root");
    std::fs::create_dir_all(&root)?;
    std::fs::write(root.join("config.json"), reg.docker_config_json(&reg.username, &reg.password))?;
    agent.spawn().await?;
    agent.write_manifest("private.yaml", &manifest("private", &image, "IfNotPresent"))?;
    agent.wait_pod("private", Duration::from_mins(1), running).await?;
    assert!(cri.has_image(&image).await?);
    agent.shutdown(&cri).await?;
    forget_images(&cri, &[&image]).await
}

/// On the real control plane: a pod's imagePullSecrets (a real
/// `kubernetes.io/dockerconfigjson` Secret in the test's namespace, which the node may read
/// because a pod bound to it names it) open the private registry; without the secret the
/// pull fails, and a secret that does not exist is reported.
#[tokio::test]
async fn image_pull_secrets_open_the_private_registry() -> Result<()> {
    let (_g, reg, cri, image) = registry_test(|r| r.tls_image("busybox:latest")).await?;
    let cluster = Cluster::connect().await?;
    let mut node = cluster.join("pull-secrets", AgentOptions::default()).await?;
    let ns = node.namespace("pull-secrets").await?;
    let secret: Secret = serde_json::from_value(reg.pull_secret(&ns, "regcred"))?;
    Api::<Secret>::namespaced(cluster.client(), &ns).create(&PostParams::default(), &secret).await?;
    let pod = |name: &str, secrets: Value| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": 2,
                "imagePullSecrets": secrets,
                "containers": [{"name": "main", "image": image, "imagePullPolicy": "Always",
                                "command": ["sh", "-c", SERVE]}]
            }
        })
    };
    node.create_pod(&ns, pod("nosecret", json!([{"name": "absent"}]))).await?;
    node.create_pod(&ns, pod("withsecret", json!([{"name": "regcred"}]))).await?;
    let wait = |name: &'static str, want: &'static [&'static str]| {
        let (node, ns) = (&node, &ns);
        async move {
            node.eventually_pod(ns, name, Duration::from_mins(1), &format!("{name} {want:?}"), |p| {
                want.contains(&api_main_state(p).as_str())
            })
            .await
        }
    };
    wait("withsecret", &["Running"]).await?;
    wait("nosecret", &["ErrImagePull", "ImagePullBackOff"]).await?;
    // The agent posts its events on its own time: wait (bounded) until both are there.
    let events = eventually_events(&node, &ns, |events| {
        events
            .iter()
            .any(|(n, r, m)| n == "nosecret" && r == "FailedToRetrieveImagePullSecret" && m.contains("(absent)"))
            && events.iter().any(|(n, r, _)| n == "nosecret" && r == "Failed")
    })
    .await?;
    assert!(
        events
            .iter()
            .any(|(n, r, m)| n == "nosecret" && r == "FailedToRetrieveImagePullSecret" && m.contains("(absent)")),
        "{events:?}"
    );
    assert!(events.iter().any(|(n, r, _)| n == "nosecret" && r == "Failed"), "{events:?}");
    node.leave(&cri).await?;
    forget_images(&cri, &[&image]).await
}

/// "Running", or the waiting reason, of the API pod's `main` container.
fn api_main_state(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == "main"))
        .and_then(|c| c.state.as_ref())
        .map(|s| {
            if s.running.is_some() {
                "Running".to_owned()
            } else {
                s.waiting.as_ref().and_then(|w| w.reason.clone()).unwrap_or_default()
            }
        })
        .unwrap_or_default()
}

/// (involved object, reason, message) of the Events in `ns`, once `done` holds of them
/// (within 30 s); the agent's event correlator folds repeats into one object's `count`.
async fn eventually_events(
    node: &ClusterNode,
    ns: &str,
    done: impl Fn(&[(String, String, String)]) -> bool,
) -> Result<Vec<(String, String, String)>> {
    let api = Api::<Event>::namespaced(node.cluster.client(), ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events: Vec<_> = api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|e| {
                (
                    e.involved_object.name.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                )
            })
            .collect();
        if done(&events) || Instant::now() > deadline {
            return Ok(events);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A TCP proxy in front of the plain registry that holds every request for `delay`
/// and records when each started and for which repository: pulls become slow enough to
/// see whether they overlap.
struct SlowRegistry {
    port: u16,
    requests: std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, String)>>>,
    /// Its `hosts.toml` directories: the test bed's, and the node container's when the
    /// agent runs there.
    hosts_dirs: Vec<std::path::PathBuf>,
    task: tokio::task::JoinHandle<()>,
}

impl SlowRegistry {
    async fn start(upstream: &str, delay: Duration) -> Result<Self> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = requests.clone();
        let upstream = upstream.to_owned();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let (upstream, log) = (upstream.clone(), log.clone());
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await else { return };
                    let (mut cr, mut cw) = client.split();
                    let (mut sr, mut sw) = server.split();
                    let to_server = async {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match cr.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let head = String::from_utf8_lossy(&buf[..n.min(200)]).into_owned();
                            if let Some(path) = head.lines().next().and_then(|l| l.split(' ').nth(1)) {
                                log.lock().unwrap().push((std::time::Instant::now(), path.to_owned()));
                                tokio::time::sleep(delay).await;
                            }
                            if sw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = sw.shutdown().await;
                    };
                    let to_client = tokio::io::copy(&mut sr, &mut cw);
                    let _ = tokio::join!(to_server, to_client);
                });
            }
        });
        // containerd speaks plain HTTP to it (the hosts dir of `cargo xtask registry up`;
        // in the node container, the node's, and the port forwarded there).
        let mut hosts_dirs =
            vec![std::path::PathBuf::from(format!("/var/lib/swiftlet-testbed/certs.d/127.0.0.1:{port}"))];
        if let Some((node, _)) = swiftlet_tests::node::node_target()? {
            node.forward_loopback(std::net::SocketAddr::from(([127, 0, 0, 1], port)))?;
            let certs = node.file(swiftlet_tests::registry::NODE_CERTS_DIR);
            hosts_dirs.push(certs.join(format!("127.0.0.1:{port}")));
        }
        for dir in &hosts_dirs {
            std::fs::create_dir_all(dir)?;
            std::fs::write(
                dir.join("hosts.toml"),
                format!(
                    "server = \"http://127.0.0.1:{port}\"\n\n[host.\"http://127.0.0.1:{port}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
                ),
            )?;
        }
        Ok(Self { port, requests, hosts_dirs, task })
    }

    /// (first, last) request time of the pulls of `repository`.
    fn span_of(&self, repository: &str) -> Option<(std::time::Instant, std::time::Instant)> {
        let prefix = format!("/v2/{repository}/");
        let times: Vec<_> =
            self.requests.lock().unwrap().iter().filter(|(_, p)| p.starts_with(&prefix)).map(|(t, _)| *t).collect();
        Some((*times.iter().min()?, *times.iter().max()?))
    }
}

impl Drop for SlowRegistry {
    fn drop(&mut self) {
        self.task.abort();
        for dir in &self.hosts_dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Two pods whose images are slow to pull, started together: their pulls overlap only
/// when `serializeImagePulls` is false.
async fn pulls_overlap(config: &str) -> Result<bool> {
    let reg = TestRegistry::load()?;
    let cri = Cri::connect(&cri_endpoint()?)?;
    let slow = SlowRegistry::start(&reg.plain, Duration::from_millis(400)).await?;
    let images = [format!("127.0.0.1:{}/busybox:latest", slow.port), format!("127.0.0.1:{}/pause:3.10", slow.port)];
    forget_images(&cri, &[&images[0], &images[1]]).await?;
    let agent = Agent::start(AgentOptions { extra_config: config.to_owned(), ..AgentOptions::default() }).await?;
    agent.write_manifest("a.yaml", &manifest("a", &images[0], "IfNotPresent"))?;
    // The pause image has no shell: its own entrypoint runs.
    let pause =
        manifest("b", &images[1], "IfNotPresent").replace(&format!("    command: [\"sh\", \"-c\", \"{SERVE}\"]\n"), "");
    agent.write_manifest("b.yaml", &pause)?;
    for name in ["a", "b"] {
        agent.wait_pod(name, Duration::from_mins(2), running).await?;
    }
    let (a, b) = (slow.span_of("busybox"), slow.span_of("pause"));
    agent.shutdown(&cri).await?;
    forget_images(&cri, &[&images[0], &images[1]]).await?;
    let ((a0, a1), (b0, b1)) = (a.expect("busybox pulled"), b.expect("pause pulled"));
    Ok(a0 <= b1 && b0 <= a1)
}

#[tokio::test]
async fn serialized_pulls_never_overlap_and_parallel_ones_do() -> Result<()> {
    let _g = testbed_lock().await;
    assert!(!pulls_overlap("serializeImagePulls: true\n").await?, "serialized pulls overlapped");
    assert!(
        pulls_overlap("serializeImagePulls: false\nmaxParallelImagePulls: 2\n").await?,
        "parallel pulls did not overlap"
    );
    Ok(())
}

/// Image GC on a real containerd whose image filesystem is a 256 MiB loop-mounted file
/// (a private containerd: GC must not take the shared test bed's local images, which
/// cannot be pulled back). With `imageGCHighThresholdPercent` 1 the filesystem is over the
/// threshold at once; the agent's first round removes the two unused images and keeps the
/// image of a running container and the sandbox image.
#[tokio::test]
async fn image_gc_removes_unused_images_and_keeps_the_in_use_and_sandbox_images() -> Result<()> {
    use swiftlet_tests::scratch::{ScratchContainerd, ScratchOptions};
    let _g = testbed_lock().await;
    let reg = TestRegistry::load()?;
    let pause = reg.plain_image("pause:3.10");
    let in_use = reg.plain_image("busybox:latest");
    let unused = [reg.plain_image("busybox:spare-1"), reg.plain_image("busybox:spare-2")];
    let mut containerd = ScratchContainerd::start(&ScratchOptions {
        root_size_mib: 256,
        sandbox_image: pause.clone(),
        registry_hosts_dir: reg.hosts_dir.clone(),
    })
    .await?;
    let cri = Cri::connect(&containerd.endpoint)?;
    let outcome = async {
        let mut agent = Agent::start(AgentOptions {
            cri_endpoint: Some(containerd.endpoint.clone()),
            // The containerd has no pod network.
            extra_flags: vec![format!("--pod-infra-container-image={pause}")],
            ..AgentOptions::default()
        })
        .await?;
        let result = async {
            // A running pod (its sandbox pulls the pause image), and two images nobody uses.
            let pod = manifest("gc-keeper", &in_use, "IfNotPresent").replace("spec:\n", "spec:\n  hostNetwork: true\n");
            agent.write_manifest("keeper.yaml", &pod)?;
            agent.wait_pod("gc-keeper", Duration::from_mins(1), running).await?;
            for image in &unused {
                cri.pull_image(image).await?;
            }
            for image in [&pause, &in_use, &unused[0], &unused[1]] {
                anyhow::ensure!(cri.has_image(image).await?, "{image} should be on the node before GC");
            }
            let (capacity, available) = containerd.root.space()?;
            anyhow::ensure!(available < capacity, "the image filesystem shows no usage");

            // Restarted with GC thresholds the filesystem is over and rounds every 2 s (the
            // images are new to the restarted agent: its first round, at once, finds them
            // younger than imageMinimumGCAge; 0 would mean the 2m default, as upstream).
            agent.stop()?;
            agent.add_flag("--image-gc-period=2s");
            agent.rewrite_config(|c| {
                format!("{c}imageGCHighThresholdPercent: 1\nimageGCLowThresholdPercent: 0\nimageMinimumGCAge: 1s\n")
            })?;
            agent.spawn().await?;
            let deadline = std::time::Instant::now() + Duration::from_mins(1);
            loop {
                let mut left = Vec::new();
                for image in &unused {
                    if cri.has_image(image).await? {
                        left.push(image.clone());
                    }
                }
                if left.is_empty() {
                    break;
                }
                anyhow::ensure!(
                    std::time::Instant::now() < deadline,
                    "image GC did not remove {left:?}:\n{}",
                    swiftlet_tests::tail(&agent.log(), 40)
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            anyhow::ensure!(cri.has_image(&in_use).await?, "the running container's image was removed");
            anyhow::ensure!(cri.has_image(&pause).await?, "the sandbox image was removed");
            let removed = agent.metric("kubelet_image_garbage_collected_total{reason=\"space\"}").await?;
            anyhow::ensure!((removed - 2.0).abs() < f64::EPSILON, "kubelet_image_garbage_collected_total: {removed}");
            // The pod never noticed.
            let p = agent.pod("gc-keeper").await?.unwrap_or_default();
            anyhow::ensure!(running(&p), "the pod stopped running: {p}");
            anyhow::Ok(())
        }
        .await;
        let down = agent.shutdown(&cri).await;
        result.and(down)
    }
    .await;
    let stopped = containerd.stop().await;
    outcome.map_err(|e| anyhow::anyhow!("{e:#}\nscratch containerd log:\n{}", containerd.log_tail(20))).and(stopped)
}
