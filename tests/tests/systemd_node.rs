//! swiftlet on a node with systemd as its PID 1 and `cgroupDriver: systemd`: the node
//! container of `cargo xtask testbed up --node-container` (Debian, systemd, containerd
//! 1.6 with `SystemdCgroup = true`). swiftlet is installed in it as the README's unit
//! (`examples/systemd/swiftlet.service`, used as is) and runs there standalone, static
//! pods only; the test looks from the host: systemd's view of the slices (`systemctl`
//! in the node), the cgroup files, CRI on the node's containerd socket, and the agent's
//! HTTPS API on the node's address.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;
use swiftlet_tests::node::{Node, Runtime};
use swiftlet_tests::pods::{BUSYBOX, pod_yaml_of, restarts, running, uid};
use swiftlet_tests::{swiftlet_bin, testbed_lock};

const UNIT: &str = include_str!("../../examples/systemd/swiftlet.service");
/// Stops the agent's unit and removes what the test installed, also when it fails half-way.
struct Installed<'a>(&'a Node);

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        let _ = self.0.run(&["systemctl", "stop", "swiftlet"]);
        for path in ["/etc/systemd/system/swiftlet.service", "/etc/default/swiftlet", "/usr/local/bin/swiftlet"] {
            let _ = std::fs::remove_file(self.0.file(path));
        }
        let _ = std::fs::remove_dir_all(self.0.file("/etc/swiftlet"));
        let _ = std::fs::remove_dir_all(self.0.file("/etc/kubernetes/manifests"));
        let _ = self.0.run(&["systemctl", "daemon-reload"]);
    }
}

fn config(driver: &str, runtime: Runtime) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: {driver}
containerRuntimeEndpoint: unix://{socket}
staticPodPath: /etc/kubernetes/manifests
syncFrequency: 1m
fileCheckFrequency: 2s
address: 0.0.0.0
healthzBindAddress: 0.0.0.0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
evictionHard:
  memory.available: 100Mi
",
        socket = runtime.socket()
    )
}

/// A static pod whose container `main` sleeps until SIGTERM, with `resources` (lines under
/// the container) as given.
fn static_pod(name: &str, resources: &str) -> String {
    pod_yaml_of(name, None, BUSYBOX, "IfNotPresent", "trap 'exit 0' TERM; while true; do sleep 1; done", resources)
}

async fn eventually<T>(what: &str, timeout: Duration, mut probe: impl AsyncFnMut() -> Result<Option<T>>) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match probe().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => String::new(),
            Err(e) => format!(": {e:#}"),
        };
        if Instant::now() > deadline {
            bail!("{what} not within {timeout:?}{last}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    fn new(node: &Node) -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http =
            reqwest::Client::builder().danger_accept_invalid_certs(true).timeout(Duration::from_secs(10)).build()?;
        Ok(Self { http, base: format!("https://{}:10250", node.address) })
    }

    async fn text(&self, path: &str) -> Result<String> {
        let r = self.http.get(format!("{}{path}", self.base)).send().await?;
        ensure!(r.status().is_success(), "GET {path}: {}", r.status());
        Ok(r.text().await?)
    }

    async fn pod(&self, name: &str) -> Result<Option<Value>> {
        let pods: Value = serde_json::from_str(&self.text("/pods").await?)?;
        Ok(pods["items"].as_array().into_iter().flatten().find(|p| p["metadata"]["name"] == name).cloned())
    }

    async fn metric(&self, series: &str) -> Result<f64> {
        let body = self.text("/metrics").await?;
        Ok(body
            .lines()
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0))
    }
}

/// The slice of a pod's uid under `qos` (`""` for Guaranteed), as upstream names it.
fn pod_slice(qos: &str, uid: &str) -> String {
    let qos = if qos.is_empty() { String::new() } else { format!("-{qos}") };
    format!("kubepods{qos}-pod{}.slice", uid.replace('-', "_"))
}

/// On Debian's containerd 1.6, which does not say its driver over CRI: a `cgroupDriver`
/// that differs from its `SystemdCgroup` is refused.
#[tokio::test]
async fn pods_are_systemd_slices_on_a_systemd_node_with_containerd_1_6() -> Result<()> {
    pods_are_systemd_slices(Runtime::Containerd16).await
}

/// On containerd 2.x, which answers `RuntimeConfig`: its driver wins over `cgroupDriver`,
/// as upstream.
#[tokio::test]
async fn pods_are_systemd_slices_on_a_systemd_node_with_containerd_2() -> Result<()> {
    pods_are_systemd_slices(Runtime::Containerd2).await
}

async fn pods_are_systemd_slices(runtime: Runtime) -> Result<()> {
    let _g = testbed_lock().await;
    let node = Node::load()?;
    let cri = node.cri(runtime)?;
    cri.remove_all().await?;
    let installed = Installed(&node);
    std::fs::copy(swiftlet_bin()?, node.file("/usr/local/bin/swiftlet")).context("installing swiftlet")?;
    node.write("/etc/systemd/system/swiftlet.service", UNIT)?;
    node.write("/etc/default/swiftlet", "SWIFTLET_ARGS=\"--hostname-override=systemd-node --v=2\"\n")?;
    std::fs::create_dir_all(node.file("/etc/kubernetes/manifests"))?;

    let configured = match runtime {
        Runtime::Containerd16 => {
            // A driver that differs from the runtime's is refused at start, naming both.
            node.write("/etc/swiftlet/config.yaml", &config("cgroupfs", runtime))?;
            let out = node.run(&["/usr/local/bin/swiftlet", "--config=/etc/swiftlet/config.yaml"])?;
            let said = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
            ensure!(!out.status.success(), "swiftlet started with the wrong driver: {said}");
            ensure!(
                said.contains(
                    "cgroupDriver is \"cgroupfs\" but the container runtime runs containers with the \"systemd\" \
                     driver"
                ),
                "the mismatch is not named: {said}"
            );
            ensure!(cri.all_sandboxes().await?.is_empty(), "a refused agent must not start pods");
            "systemd"
        }
        // The runtime's answer decides: the configured cgroupfs is overridden.
        Runtime::Containerd2 => "cgroupfs",
    };
    node.write("/etc/swiftlet/config.yaml", &config(configured, runtime))?;
    node.write(
        "/etc/kubernetes/manifests/guaranteed.yaml",
        &static_pod(
            "guaranteed",
            "    resources:\n      limits: {cpu: 250m, memory: 64Mi}\n      requests: {cpu: 250m, memory: 64Mi}\n",
        ),
    )?;
    node.write("/etc/kubernetes/manifests/besteffort.yaml", &static_pod("besteffort", ""))?;
    node.ok(&["systemctl", "daemon-reload"])?;
    node.ok(&["systemctl", "start", "swiftlet"])?;
    let api = Api::new(&node)?;
    let result = async {
        // The QoS slices are systemd's units with the kubelet's settings.
        let active = eventually("kubepods-besteffort.slice with CPUShares=2", Duration::from_secs(30), async || {
            Ok((node.unit_property("kubepods-besteffort.slice", "CPUShares")? == "2").then_some(()))
        })
        .await;
        active.with_context(|| format!("swiftlet's journal:\n{}", node.journal("swiftlet")))?;
        assert_eq!(node.unit_property("kubepods.slice", "ActiveState")?, "active");
        assert_eq!(node.unit_property("kubepods-burstable.slice", "Slice")?, "kubepods.slice");
        if runtime == Runtime::Containerd2 {
            let journal = node.journal("swiftlet");
            ensure!(
                journal.contains("Using cgroup driver setting received from the CRI runtime cgroup_driver=systemd"),
                "the runtime's driver is not the one used:\n{journal}"
            );
        }

        let g = eventually("the guaranteed pod running", Duration::from_mins(1), async || {
            Ok(api.pod("guaranteed-systemd-node").await?.filter(|p| running(p, "main")))
        })
        .await
        .with_context(|| format!("swiftlet's journal:\n{}", node.journal("swiftlet")))?;
        let b = eventually("the best-effort pod running", Duration::from_secs(30), async || {
            Ok(api.pod("besteffort-systemd-node").await?.filter(|p| running(p, "main")))
        })
        .await?;
        // Upstream's gauge for a runtime without RuntimeConfig: containerd 1.6 only.
        let losing = api.metric("kubelet_cri_losing_support{version=\"1.38.0\"}").await?;
        let want = if runtime == Runtime::Containerd16 { 1.0 } else { 0.0 };
        assert!((losing - want).abs() < 0.5, "kubelet_cri_losing_support {losing} on {runtime:?}");
        let (g_uid, b_uid) = (uid(&g), uid(&b));
        let g_slice = pod_slice("", &g_uid);
        let b_slice = pod_slice("besteffort", &b_uid);
        // systemd holds the pod's limits.
        assert_eq!(node.unit_property(&g_slice, "ActiveState")?, "active");
        assert_eq!(node.unit_property(&g_slice, "Slice")?, "kubepods.slice");
        assert_eq!(node.unit_property(&g_slice, "MemoryLimit")?, (64u64 << 20).to_string());
        assert_eq!(node.unit_property(&g_slice, "CPUQuotaPerSecUSec")?, "250ms");
        assert_eq!(node.unit_property(&b_slice, "Slice")?, "kubepods-besteffort.slice");
        // And so do the cgroup files; the container is a scope of containerd's in the slice.
        let g_path = format!("/kubepods.slice/{g_slice}");
        let limit = node.ok(&["cat", &format!("/sys/fs/cgroup/memory{g_path}/memory.limit_in_bytes")])?;
        assert_eq!(limit, (64u64 << 20).to_string());
        let quota = node.ok(&["cat", &format!("/sys/fs/cgroup/cpu{g_path}/cpu.cfs_quota_us")])?;
        assert_eq!(quota, "25000");
        let cid = cri.containers(&g_uid).await?.first().context("no container")?.id.clone();
        let pid = cri.container_pid(&cid).await?;
        let cgroups = node.ok(&["cat", &format!("/proc/{pid}/cgroup")])?;
        let scope = format!("{g_path}/cri-containerd-{cid}.scope");
        ensure!(cgroups.lines().any(|l| l.ends_with(&format!(":memory:{scope}"))), "not in {scope}:\n{cgroups}");

        // The stats follow the slices: the container's usage and the pods' cgroup.
        let summary: Value = serde_json::from_str(&api.text("/stats/summary").await?)?;
        let pod_stats = summary["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["podRef"]["name"] == "guaranteed-systemd-node")
            .context("no stats for the guaranteed pod")?;
        let ws = &pod_stats["containers"][0]["memory"]["workingSetBytes"];
        ensure!(ws.as_u64().is_some_and(|b| b > 0), "no container memory from the slice: {pod_stats}");
        ensure!(pod_stats["memory"]["workingSetBytes"].as_u64().is_some_and(|b| b > 0), "no pod memory");
        let pods_sc =
            summary["node"]["systemContainers"].as_array().into_iter().flatten().find(|c| c["name"] == "pods");
        ensure!(pods_sc.is_some_and(|c| c["memory"]["workingSetBytes"].as_u64().is_some()), "no pods container");

        // The kernel sensors see the slices from inside the node's cgroup namespace.
        let health = api.text("/healthz?verbose").await?;
        ensure!(health.contains("[+]pleg ok (evented"), "evented PLEG must be active in the node: {health}");
        let before = restarts(&g, "main");
        node.ok(&["kill", "-9", &pid.to_string()])?;
        let restarted = eventually("the killed container restarted", Duration::from_secs(20), async || {
            Ok(api
                .pod("guaranteed-systemd-node")
                .await?
                .filter(|p| restarts(p, "main") == before + 1 && running(p, "main")))
        })
        .await;
        restarted.with_context(|| format!("swiftlet's journal:\n{}", node.journal("swiftlet")))?;
        assert!(api.metric("kubelet_evented_pleg_kernel_events_total{kind=\"exit\"}").await? >= 1.0);
        assert!(api.metric("kubelet_evented_pleg_relist_repairs_total").await? < 0.5, "the kernel missed the exit");
        // containerd 2 tells the stop on its event stream too (GetContainerEvents), after
        // the kernel; containerd 1.6 has no such stream.
        let series = "kubelet_evented_pleg_runtime_events_total{kind=\"stopped\",first=\"kernel\"}";
        if runtime == Runtime::Containerd2 {
            eventually(
                "the runtime's stop event, counted as told by the kernel first",
                Duration::from_secs(10),
                async || Ok((api.metric(series).await? >= 1.0).then_some(())),
            )
            .await?;
        } else {
            assert!(api.metric(series).await? < 0.5, "no event stream on containerd 1.6");
        }

        // Removed pods take their slices with them, and the container GC their sandboxes
        // (as upstream: up to a minute).
        std::fs::remove_file(node.file("/etc/kubernetes/manifests/guaranteed.yaml"))?;
        std::fs::remove_file(node.file("/etc/kubernetes/manifests/besteffort.yaml"))?;
        let gone = eventually("the pods' slices gone", Duration::from_mins(2), async || {
            // systemd loads any slice name on demand: a stopped one is inactive.
            let g = node.unit_property(&g_slice, "ActiveState")? == "inactive";
            let b = node.unit_property(&b_slice, "ActiveState")? == "inactive";
            Ok((g && b).then_some(()))
        })
        .await;
        gone.with_context(|| format!("swiftlet's journal:\n{}", node.journal("swiftlet")))?;
        for h in ["cpuset", "memory", "unified"] {
            let dir = node.run(&["test", "-d", &format!("/sys/fs/cgroup/{h}{g_path}")])?;
            ensure!(!dir.status.success(), "the pod's {h} cgroup is left");
        }
        // The sandboxes go at the container GC's next pass (every minute, as upstream's),
        // which may come after the slices went.
        eventually("the pods' sandboxes removed", Duration::from_mins(2), async || {
            let left = cri.all_sandboxes().await?;
            Ok(left.is_empty().then_some(()))
        })
        .await?;
        anyhow::Ok(())
    }
    .await;
    drop(installed);
    if result.is_err() {
        // A test that failed half-way leaves no pod for the next one.
        cri.remove_all().await?;
    }
    result
}
