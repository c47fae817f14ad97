//! The scenarios `cargo xtask fidelity` runs on each agent: one API pod each (named after
//! the scenario), what is done to it once it runs ([`Action`]), and when what the API
//! shows is taken as the outcome ([`Done`], or the scenario's timeout).
//!
//! `fast` scenarios end within about 40 s on either agent and run in CI; the others (a
//! `ConfigMap` update, which a kubelet sees at its next periodic sync, up to a minute and a
//! half later; a node-pressure eviction, which needs a node configured to be under
//! pressure) run with `cargo xtask fidelity` alone.
//!
//! The `csi-*` scenarios use the test bed's host-path CSI driver, which the runner deploys
//! beside the node of each agent in turn (see [`super::csi`]): a claim of its storage
//! class, a generic ephemeral and an inline volume of it, an inline volume whose pod sees
//! the service-account token the agent requested for the driver (bound to that pod), and a
//! claim that does not exist.
//!
//! The `dra-*` scenarios use upstream's DRA test driver, which the runner starts beside
//! the node of each agent in turn (see [`super::dra`]), and are placed by the scheduler,
//! which allocates their claims: a `ResourceClaim` and a `ResourceClaimTemplate` of its
//! devices, a claim released when its pod is deleted, a claim of a driver the node does
//! not run (upstream's `FailedPrepareDynamicResources`), and an extended resource served
//! by DRA (a device class with `extendedResourceName`), for which the scheduler makes the
//! pod's claim. The upstream kubelet can fetch a claim just before the API server's node
//! authorizer has seen the pod bound to its node (`forbidden ... no relationship found
//! between node ... and this object`): its prepare fails, and without an error of the
//! sync it tries again only at its next resync, a minute later. A run where that happened
//! differs in timing only; the second run the runner makes of such scenarios absorbs it.

use std::time::Duration;

use serde_json::{Value, json};

use super::dra;
use crate::{bench::apiserver::BENCH_TAINT, images::BUSYBOX_IMAGE};

/// What is done to the scenario's pod once its container `c0` runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    None,
    /// SIGKILL to the container's main process, from the host (its pid from CRI).
    KillFromHost,
    /// A graceful delete (the pod's own grace period); the deletion's length is a fact.
    Delete,
    /// The `ConfigMap` `name` gets `key: value`.
    UpdateConfigMap {
        name: &'static str,
        key: &'static str,
        value: &'static str,
    },
}

impl Action {
    /// How long container `c0` must have been seen running before the action is taken.
    /// A `ConfigMap` update waits until both agents are past the syncs that follow a
    /// container's start (upstream relists every second, syncs the pod on the start it
    /// sees and on the first result of each probe, and each sync refreshes the volume):
    /// taken at once, it may land just before such a sync on one agent and just after it
    /// on the other, and the scenario would compare that chance instead of the periodic
    /// refresh both agents do.
    #[must_use]
    pub fn after_running(&self) -> Duration {
        match self {
            Self::UpdateConfigMap { .. } => Duration::from_secs(5),
            Self::None | Self::KillFromHost | Self::Delete => Duration::ZERO,
        }
    }
}

/// When the outcome is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    Phase(&'static str),
    /// The pod's status says `reason` (e.g. `Evicted`).
    Reason(&'static str),
    /// Container `c0` is waiting for `reason`.
    Waiting(&'static str),
    /// Container `c0` was restarted at least this often and runs again.
    RestartedAndRunning(u64),
    /// Container `c0` was restarted at least this often.
    Restarted(u64),
    /// Container `c0` has `started: true`.
    Started,
    /// The pod's `Ready` condition has this status.
    Ready(bool),
    /// An event of this reason about the pod.
    Event(&'static str),
    /// Events of this reason about the pod, counted (their `count`s summed), at least
    /// this many.
    EventCount(&'static str, u64),
    /// The pod is gone from the API (after [`Action::Delete`]).
    Gone,
    /// The `ResourceClaim` of this name is reserved for no pod and deallocated (or gone).
    ClaimReleased(&'static str),
    All(Vec<Done>),
}

/// Container `c0`'s status in `pod`.
pub fn c0(pod: &Value) -> Option<&Value> {
    pod["status"]["containerStatuses"].as_array()?.iter().find(|c| c["name"] == "c0")
}

/// Whether container `c0` of `pod` runs and has an id (an action can be taken on it).
pub fn c0_running(pod: &Value) -> bool {
    c0(pod).is_some_and(|c| {
        c["state"].get("running").is_some() && c["containerID"].as_str().is_some_and(|s| !s.is_empty())
    })
}

impl Done {
    /// Whether this holds for `pod` (`None`: not in the API), the events about it and
    /// the `ResourceClaims` of its namespace.
    pub fn holds(&self, pod: Option<&Value>, events: &[&Value], claims: &[Value]) -> bool {
        let restarts = || pod.and_then(c0).and_then(|c| c["restartCount"].as_u64()).unwrap_or(0);
        match self {
            Self::Phase(p) => pod.is_some_and(|p2| p2["status"]["phase"] == *p),
            Self::Reason(r) => pod.is_some_and(|p| p["status"]["reason"] == *r),
            Self::Waiting(r) => pod.and_then(c0).is_some_and(|c| c["state"]["waiting"]["reason"] == *r),
            Self::RestartedAndRunning(n) => restarts() >= *n && pod.is_some_and(c0_running),
            Self::Restarted(n) => restarts() >= *n,
            Self::Started => pod.and_then(c0).is_some_and(|c| c["started"] == true),
            Self::Ready(want) => pod.is_some_and(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == if *want { "True" } else { "False" })
            }),
            Self::Event(reason) => events.iter().any(|e| e["reason"] == *reason),
            Self::EventCount(reason, n) => {
                events
                    .iter()
                    .filter(|e| e["reason"] == *reason)
                    .map(|e| e["count"].as_u64().unwrap_or(1).max(1))
                    .sum::<u64>()
                    >= *n
            }
            Self::Gone => pod.is_none(),
            Self::ClaimReleased(name) => dra::released(claims.iter().find(|c| c["metadata"]["name"] == *name)),
            Self::All(all) => all.iter().all(|d| d.holds(pod, events, claims)),
        }
    }
}

/// How a scenario's pod gets to the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The runner binds it (`nodeName`), as the scheduler binds a pod.
    Bound,
    /// The scheduler places it (a node selector on the node's hostname label): it waits
    /// until the claims of the pod's generic ephemeral volumes exist and are bound, as in
    /// any cluster, where a pod bound at once would reach the agent before its claims.
    Scheduled,
}

/// One scenario.
#[derive(Debug, Clone)]
#[expect(clippy::struct_excessive_bools, reason = "independent needs of a scenario, not states of one")]
pub struct Scenario {
    /// Also the pod's name.
    pub name: &'static str,
    /// Ends within about 40 s: run in CI (`--fast`).
    pub fast: bool,
    /// Runs on a node configured to be under memory pressure once the pod fills its memory.
    pub pressure: bool,
    /// `ConfigMaps` created before the pod.
    pub config_maps: Vec<Value>,
    /// `PersistentVolumeClaims` created before the pod; the pod is created once they are
    /// bound, as the scheduler would have waited for them.
    pub claims: Vec<Value>,
    /// Needs the test bed's host-path CSI driver deployed for the node.
    pub csi: bool,
    /// Needs the DRA test driver beside the node and the DRA device classes.
    pub dra: bool,
    /// `ResourceClaims` and `ResourceClaimTemplates` created before the pod.
    pub resource_claims: Vec<Value>,
    /// How the pod gets to the node.
    pub placement: Placement,
    /// The pod, without `nodeName` (set by the runner).
    pub pod: Value,
    pub action: Action,
    pub done: Done,
    pub timeout: Duration,
}

/// A pod named `name` with `spec` merged over the defaults every scenario shares: the
/// bench nodes' toleration, no service-account token, a 1 s grace period, restart Always.
pub fn pod(name: &str, spec: &Value) -> Value {
    let mut base = json!({
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": false,
        "tolerations": [{ "key": BENCH_TAINT, "operator": "Exists" }],
    });
    for (k, v) in spec.as_object().into_iter().flatten() {
        base[k] = v.clone();
    }
    json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": name }, "spec": base })
}

/// Container `c0` of busybox running `script` with `extra` fields merged in.
pub fn c0_with(script: &str, extra: &Value) -> Value {
    let mut c = json!({
        "name": "c0",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script],
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        c[k] = v.clone();
    }
    c
}

fn exec_probe(command: &[&str], extra: &Value) -> Value {
    let mut p = json!({ "exec": { "command": command }, "periodSeconds": 1, "failureThreshold": 1 });
    for (k, v) in extra.as_object().into_iter().flatten() {
        p[k] = v.clone();
    }
    p
}

const SLEEP: &str = "exec sleep 3600";

/// The test bed's host-path CSI driver and its storage class (`swiftlet_tests::csi_driver`
/// and `swiftlet_tests::csi_hostpath`, which `swiftlet-test-csi-driver deploy` deploys).
pub const CSI_DRIVER: &str = "hostpath.csi.swiftlet.test";
pub const CSI_STORAGE_CLASS: &str = "swiftlet-csi-hostpath";
/// The audience of the token the `CSIDriver` asks each agent for (`tokenRequests`). The
/// driver writes `<audience> <namespace>/<pod> <service account>` of each token it gets,
/// from the token's claims, into an inline volume's `serviceaccount-tokens`
/// (`swiftlet_tests::csi_driver::TOKENS_FILE`).
pub const CSI_TOKEN_AUDIENCE: &str = "swiftlet-fidelity";

/// A `ReadWriteOnce` filesystem claim `name` of the host-path storage class, `size` big.
pub fn csi_claim(name: &str, size: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": { "name": name },
        "spec": {
            "storageClassName": CSI_STORAGE_CLASS,
            "accessModes": ["ReadWriteOnce"],
            "resources": { "requests": { "storage": size } },
        },
    })
}

/// The CSI scenarios (see the module documentation).
fn csi_scenarios() -> Vec<Scenario> {
    let csi = |name, claims, placement, pod, done| Scenario {
        name,
        fast: true,
        pressure: false,
        config_maps: Vec::new(),
        claims,
        csi: true,
        dra: false,
        resource_claims: Vec::new(),
        placement,
        pod,
        action: Action::None,
        done,
        timeout: Duration::from_secs(40),
    };
    let writes = |dirs: &[&str]| {
        let files: Vec<String> = dirs.iter().map(|d| format!("{d}/f")).collect();
        let script = format!("echo hi | tee {} && exec sleep 3600", files.join(" "));
        let mut probe = vec!["cat"];
        probe.extend(files.iter().map(String::as_str));
        (script, exec_probe(&probe, &json!({})))
    };
    let (claim_script, claim_probe) = writes(&["/data"]);
    let (eph_script, eph_probe) = writes(&["/scratch", "/inline"]);
    // The token is the pod's own: its namespace (the run's), its name, its account.
    let token_line = format!("{CSI_TOKEN_AUDIENCE} [^/ ]*/csi-token default");
    vec![
        csi(
            "csi-claim",
            vec![csi_claim("csi-claim-data", "5Mi")],
            Placement::Bound,
            pod(
                "csi-claim",
                &json!({
                    "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": "csi-claim-data" } }],
                    "containers": [c0_with(&claim_script, &json!({
                        "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
                        "readinessProbe": claim_probe,
                    }))],
                }),
            ),
            Done::All(vec![Done::Phase("Running"), Done::Ready(true)]),
        ),
        csi(
            "csi-ephemeral",
            Vec::new(),
            Placement::Scheduled,
            pod(
                "csi-ephemeral",
                &json!({
                    "volumes": [
                        { "name": "scratch", "ephemeral": { "volumeClaimTemplate": { "spec": {
                            "storageClassName": CSI_STORAGE_CLASS,
                            "accessModes": ["ReadWriteOnce"],
                            "resources": { "requests": { "storage": "5Mi" } },
                        } } } },
                        { "name": "inline", "csi": { "driver": CSI_DRIVER, "volumeAttributes": { "purpose": "fidelity" } } },
                    ],
                    "containers": [c0_with(&eph_script, &json!({
                        "volumeMounts": [
                            { "name": "scratch", "mountPath": "/scratch" },
                            { "name": "inline", "mountPath": "/inline" },
                        ],
                        "readinessProbe": eph_probe,
                    }))],
                }),
            ),
            Done::All(vec![Done::Phase("Running"), Done::Ready(true)]),
        ),
        csi(
            "csi-token",
            Vec::new(),
            Placement::Scheduled,
            pod(
                "csi-token",
                &json!({
                    "volumes": [{ "name": "inline", "csi": { "driver": CSI_DRIVER } }],
                    "containers": [c0_with(SLEEP, &json!({
                        "volumeMounts": [{ "name": "inline", "mountPath": "/inline" }],
                        "readinessProbe": exec_probe(&["grep", "-qx", &token_line, "/inline/serviceaccount-tokens"], &json!({})),
                    }))],
                }),
            ),
            Done::All(vec![Done::Phase("Running"), Done::Ready(true)]),
        ),
        csi(
            "csi-missing-claim",
            Vec::new(),
            Placement::Bound,
            pod(
                "csi-missing-claim",
                &json!({
                    "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": "csi-absent" } }],
                    "containers": [c0_with(SLEEP, &json!({ "volumeMounts": [{ "name": "data", "mountPath": "/data" }] }))],
                }),
            ),
            Done::All(vec![Done::Waiting("ContainerCreating"), Done::Event("FailedMount")]),
        ),
    ]
}

/// A `ResourceClaim` (`kind`: or a `ResourceClaimTemplate`) `name` of one device of
/// device class `class`, its request named `one`.
pub fn resource_claim(kind: &str, name: &str, class: &str) -> Value {
    let spec = json!({ "devices": { "requests": [{ "name": "one", "exactly": { "deviceClassName": class } }] } });
    let spec = if kind == "ResourceClaimTemplate" { json!({ "spec": spec }) } else { spec };
    json!({ "apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": { "name": name }, "spec": spec })
}

/// The DRA scenarios (see the module documentation).
fn dra_scenarios() -> Vec<Scenario> {
    let scenario = |name, resource_claims, pod, action, done| Scenario {
        name,
        fast: true,
        pressure: false,
        config_maps: Vec::new(),
        claims: Vec::new(),
        csi: false,
        dra: true,
        resource_claims,
        placement: Placement::Scheduled,
        pod,
        action,
        done,
        timeout: Duration::from_secs(40),
    };
    // A pod whose container uses pod claim `dev`, which `source` names.
    let with_claim = |name: &str, source: Value, script: &str| {
        let mut claim = json!({ "name": "dev" });
        for (k, v) in source.as_object().into_iter().flatten() {
            claim[k] = v.clone();
        }
        pod(
            name,
            &json!({
                "resourceClaims": [claim],
                "containers": [c0_with(script, &json!({ "resources": { "claims": [{ "name": "dev" }] } }))],
            }),
        )
    };
    let running = || Done::All(vec![Done::Phase("Running"), Done::Ready(true)]);
    vec![
        scenario(
            "dra-claim",
            vec![resource_claim("ResourceClaim", "dra-claim-dev", dra::CLASS)],
            with_claim("dra-claim", json!({ "resourceClaimName": "dra-claim-dev" }), SLEEP),
            Action::None,
            running(),
        ),
        scenario(
            "dra-template",
            vec![resource_claim("ResourceClaimTemplate", "dra-template-dev", dra::CLASS)],
            with_claim("dra-template", json!({ "resourceClaimTemplateName": "dra-template-dev" }), SLEEP),
            Action::None,
            running(),
        ),
        scenario(
            "dra-claim-released",
            vec![resource_claim("ResourceClaim", "dra-released-dev", dra::CLASS)],
            with_claim("dra-claim-released", json!({ "resourceClaimName": "dra-released-dev" }), SLEEP),
            Action::Delete,
            Done::All(vec![Done::Gone, Done::ClaimReleased("dra-released-dev")]),
        ),
        scenario(
            "dra-driver-missing",
            vec![resource_claim("ResourceClaim", "dra-missing-dev", dra::ABSENT_CLASS)],
            with_claim("dra-driver-missing", json!({ "resourceClaimName": "dra-missing-dev" }), SLEEP),
            Action::None,
            Done::All(vec![Done::Waiting("ContainerCreating"), Done::Event("FailedPrepareDynamicResources")]),
        ),
        scenario(
            "dra-extended-resource",
            Vec::new(),
            pod(
                "dra-extended-resource",
                &json!({ "containers": [c0_with(SLEEP, &json!({
                    "resources": { "limits": { dra::EXTENDED_RESOURCE: "1" } },
                }))] }),
            ),
            Action::None,
            running(),
        ),
    ]
}

/// Every scenario. `pull_registry` is the test bed's plain registry (`host:port`), where
/// the image of the failing pull is absent.
pub fn all(pull_registry: &str) -> Vec<Scenario> {
    let fast = |name, pod: Value, action, done, secs| Scenario {
        name,
        fast: true,
        pressure: false,
        config_maps: Vec::new(),
        claims: Vec::new(),
        csi: false,
        dra: false,
        resource_claims: Vec::new(),
        placement: Placement::Bound,
        pod,
        action,
        done,
        timeout: Duration::from_secs(secs),
    };
    let kill = |name: &'static str, policy: &str, done| {
        fast(
            name,
            pod(name, &json!({ "restartPolicy": policy, "containers": [c0_with(SLEEP, &json!({}))] })),
            Action::KillFromHost,
            done,
            40,
        )
    };
    let image = |name: &'static str, image: &str, policy: &str, done| {
        let c = json!({ "name": "c0", "image": image, "imagePullPolicy": policy, "command": ["sleep", "3600"] });
        fast(name, pod(name, &json!({ "containers": [c] })), Action::None, done, 40)
    };
    let mut v = vec![
        fast(
            "liveness-failing",
            pod(
                "liveness-failing",
                &json!({ "containers": [c0_with(SLEEP, &json!({ "livenessProbe": exec_probe(&["sh", "-c", "echo sick; exit 1"], &json!({})) }))] }),
            ),
            Action::None,
            // Killed and restarted twice, now in its first back-off (10 s): a state that
            // lasts, whichever agent is slower to show it.
            Done::All(vec![
                Done::Restarted(2),
                Done::Waiting("CrashLoopBackOff"),
                Done::Event("Killing"),
                Done::Event("Unhealthy"),
            ]),
            40,
        ),
        fast(
            "liveness-erroring",
            pod(
                "liveness-erroring",
                &json!({ "containers": [c0_with(SLEEP, &json!({ "livenessProbe": exec_probe(&["/no-such-probe"], &json!({})) }))] }),
            ),
            Action::None,
            // Upstream does not restart a container whose probe errors (the result is
            // unknown): the outcome is the warning.
            Done::Event("Unhealthy"),
            30,
        ),
        fast(
            "completes",
            pod("completes", &json!({ "restartPolicy": "Never", "containers": [c0_with("exit 0", &json!({}))] })),
            Action::None,
            Done::Phase("Succeeded"),
            30,
        ),
        fast(
            "readiness-failing",
            pod(
                "readiness-failing",
                &json!({ "containers": [c0_with(SLEEP, &json!({ "readinessProbe": exec_probe(&["sh", "-c", "exit 1"], &json!({})) }))] }),
            ),
            Action::None,
            Done::All(vec![Done::Phase("Running"), Done::Ready(false), Done::Event("Unhealthy")]),
            40,
        ),
        fast(
            "startup-probe",
            pod(
                "startup-probe",
                &json!({ "containers": [c0_with("sleep 3; touch /tmp/started; exec sleep 3600", &json!({
                    "startupProbe": exec_probe(&["cat", "/tmp/started"], &json!({ "failureThreshold": 30 })),
                    "readinessProbe": exec_probe(&["true"], &json!({})),
                }))] }),
            ),
            Action::None,
            Done::All(vec![Done::Started, Done::Ready(true)]),
            40,
        ),
        fast(
            "crash-loop",
            pod("crash-loop", &json!({ "containers": [c0_with("exit 3", &json!({}))] })),
            Action::None,
            // Restarted twice, so in the second back-off (20 s): a state that lasts,
            // whichever agent is slower to show it.
            Done::All(vec![Done::Restarted(2), Done::Event("BackOff")]),
            40,
        ),
        fast(
            "oom-kill",
            pod(
                "oom-kill",
                &json!({ "restartPolicy": "Never", "containers": [c0_with("head -c 300m /dev/zero | tail", &json!({
                    "resources": { "limits": { "memory": "32Mi" } },
                }))] }),
            ),
            Action::None,
            Done::Phase("Failed"),
            40,
        ),
        fast(
            "init-failure",
            pod(
                "init-failure",
                &json!({
                    "restartPolicy": "Never",
                    "initContainers": [{ "name": "i0", "image": BUSYBOX_IMAGE, "imagePullPolicy": "IfNotPresent", "command": ["sh", "-c", "exit 2"] }],
                    "containers": [c0_with(SLEEP, &json!({}))],
                }),
            ),
            Action::None,
            Done::Phase("Failed"),
            40,
        ),
        kill("kill-always", "Always", Done::RestartedAndRunning(1)),
        kill("kill-onfailure", "OnFailure", Done::RestartedAndRunning(1)),
        kill("kill-never", "Never", Done::Phase("Failed")),
        fast(
            "delete-ignoring-sigterm",
            pod(
                "delete-ignoring-sigterm",
                &json!({ "terminationGracePeriodSeconds": 3, "containers": [c0_with("trap '' TERM; while true; do sleep 1; done", &json!({}))] }),
            ),
            Action::Delete,
            Done::Gone,
            40,
        ),
        fast(
            "prestop-hook-failing",
            pod(
                "prestop-hook-failing",
                &json!({ "terminationGracePeriodSeconds": 3, "containers": [c0_with(SLEEP, &json!({
                    "lifecycle": { "preStop": { "exec": { "command": ["sh", "-c", "echo bye; exit 1"] } } },
                }))] }),
            ),
            Action::Delete,
            Done::Gone,
            40,
        ),
        // Pulled twice: upstream shows `ImagePullBackOff` only from its second pull on.
        image(
            "image-pull-error",
            &format!("{pull_registry}/swiftlet/absent:1"),
            "IfNotPresent",
            Done::All(vec![Done::Waiting("ImagePullBackOff"), Done::EventCount("Pulling", 2)]),
        ),
        image(
            "image-never-pull",
            "localhost/absent:never",
            "Never",
            Done::All(vec![Done::Waiting("ErrImageNeverPull"), Done::Event("ErrImageNeverPull")]),
        ),
        image(
            "image-invalid-name",
            "localhost/Busybox:latest",
            "IfNotPresent",
            Done::All(vec![Done::Waiting("InvalidImageName"), Done::Event("InspectFailed")]),
        ),
        fast(
            "admission-out-of-cpu",
            pod(
                "admission-out-of-cpu",
                &json!({ "containers": [c0_with(SLEEP, &json!({ "resources": { "requests": { "cpu": "64" } } }))] }),
            ),
            Action::None,
            Done::Phase("Failed"),
            30,
        ),
        fast(
            "admission-node-affinity",
            pod(
                "admission-node-affinity",
                &json!({ "nodeSelector": { "swiftlet.dev/absent": "true" }, "containers": [c0_with(SLEEP, &json!({}))] }),
            ),
            Action::None,
            Done::Phase("Failed"),
            30,
        ),
    ];
    v.extend(csi_scenarios());
    v.extend(dra_scenarios());
    v.push(Scenario {
        name: "configmap-update",
        fast: false,
        pressure: false,
        claims: Vec::new(),
        csi: false,
        dra: false,
        resource_claims: Vec::new(),
        placement: Placement::Bound,
        config_maps: vec![json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "fidelity-cm" },
            "data": { "key": "v1" },
        })],
        pod: pod(
            "configmap-update",
            &json!({
                "volumes": [{ "name": "cfg", "configMap": { "name": "fidelity-cm" } }],
                "containers": [c0_with(SLEEP, &json!({
                    "volumeMounts": [{ "name": "cfg", "mountPath": "/cfg" }],
                    "readinessProbe": exec_probe(&["grep", "-q", "v2", "/cfg/key"], &json!({})),
                }))],
            }),
        ),
        action: Action::UpdateConfigMap { name: "fidelity-cm", key: "key", value: "v2" },
        done: Done::Ready(true),
        timeout: Duration::from_secs(150),
    });
    v.push(Scenario {
        name: "node-pressure-eviction",
        fast: false,
        pressure: true,
        config_maps: Vec::new(),
        claims: Vec::new(),
        csi: false,
        dra: false,
        resource_claims: Vec::new(),
        placement: Placement::Bound,
        pod: pod(
            "node-pressure-eviction",
            &json!({
                "volumes": [{ "name": "mem", "emptyDir": { "medium": "Memory" } }],
                "containers": [c0_with(
                    &format!("dd if=/dev/zero of=/mem/fill bs=1M count={HOG_MIB} 2>/dev/null; exec sleep 3600"),
                    &json!({ "volumeMounts": [{ "name": "mem", "mountPath": "/mem" }] }),
                )],
            }),
        ),
        action: Action::None,
        done: Done::All(vec![Done::Reason("Evicted"), Done::Phase("Failed")]),
        timeout: Duration::from_secs(90),
    });
    v
}

/// What the eviction scenario's pod writes to its memory-backed volume, in MiB; the
/// pressure node's `memory.available` threshold is set half of it below what is available
/// when the node starts.
pub const HOG_MIB: u64 = 2048;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_carry_the_defaults_and_their_own_spec() {
        let p =
            pod("x", &json!({ "restartPolicy": "Never", "containers": [c0_with("true", &json!({ "tty": true }))] }));
        assert_eq!(p["metadata"]["name"], "x");
        assert_eq!(p["spec"]["restartPolicy"], "Never");
        assert_eq!(p["spec"]["terminationGracePeriodSeconds"], 1);
        assert_eq!(p["spec"]["tolerations"][0]["key"], BENCH_TAINT);
        assert_eq!(p["spec"]["containers"][0]["command"], json!(["sh", "-c", "true"]));
        assert_eq!(p["spec"]["containers"][0]["tty"], true);
    }

    #[test]
    fn only_the_config_map_update_waits_for_the_start_up_syncs() {
        let update = Action::UpdateConfigMap { name: "cm", key: "k", value: "v" };
        assert!(update.after_running() >= Duration::from_secs(3), "upstream relists every second");
        for a in [Action::None, Action::KillFromHost, Action::Delete] {
            assert_eq!(a.after_running(), Duration::ZERO, "{a:?}");
        }
    }

    #[test]
    fn scenarios_have_unique_names_and_cover_the_list() {
        let all = all("127.0.0.1:5001");
        let mut names: Vec<&str> = all.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert!(all.iter().all(|s| s.pod["metadata"]["name"] == s.name));
        assert!(all.iter().filter(|s| s.fast).all(|s| s.timeout <= Duration::from_secs(40) && !s.pressure));
        assert_eq!(all.iter().filter(|s| !s.fast).count(), 2);
    }

    #[test]
    fn dra_scenarios_are_scheduled_and_use_the_runners_device_classes() {
        let all = all("127.0.0.1:5001");
        let dra: Vec<&Scenario> = all.iter().filter(|s| s.dra).collect();
        assert_eq!(dra.len(), 5);
        for s in &dra {
            assert!(s.fast && !s.csi && s.placement == Placement::Scheduled, "{}: the scheduler allocates", s.name);
            for c in &s.resource_claims {
                let spec = if c["kind"] == "ResourceClaimTemplate" { &c["spec"]["spec"] } else { &c["spec"] };
                let class = spec["devices"]["requests"][0]["exactly"]["deviceClassName"].as_str().unwrap();
                assert!(dra::cluster_objects("n").iter().any(|(_, o)| o["metadata"]["name"] == class), "{class}");
            }
            // Every pod claim names a claim or template the scenario creates.
            for pc in s.pod["spec"]["resourceClaims"].as_array().into_iter().flatten() {
                let name = pc["resourceClaimName"].as_str().or(pc["resourceClaimTemplateName"].as_str()).unwrap();
                assert!(s.resource_claims.iter().any(|c| c["metadata"]["name"] == name), "{}: {name}", s.name);
            }
        }
        // The test driver publishes 4 devices; the missing driver's claim takes none of them.
        let devices = dra.iter().filter(|s| s.name != "dra-driver-missing").count();
        assert!(devices <= 4, "{devices} devices wanted");
    }

    #[test]
    fn csi_scenarios_name_their_claims_and_the_driver() {
        let all = all("127.0.0.1:5001");
        let csi: Vec<&Scenario> = all.iter().filter(|s| s.csi).collect();
        assert_eq!(
            csi.iter().map(|s| s.name).collect::<Vec<_>>(),
            ["csi-claim", "csi-ephemeral", "csi-token", "csi-missing-claim"]
        );
        assert!(
            all.iter().filter(|s| !s.csi && !s.dra).all(|s| s.claims.is_empty() && s.placement == Placement::Bound)
        );
        for s in &csi {
            for v in s.pod["spec"]["volumes"].as_array().unwrap() {
                if let Some(claim) = v["persistentVolumeClaim"]["claimName"].as_str() {
                    // Created by the scenario, or (the missing one) by none.
                    let own = s.claims.iter().any(|c| c["metadata"]["name"] == claim);
                    assert_eq!(own, s.name != "csi-missing-claim", "{}: {claim}", s.name);
                }
                if let Some(t) = v.get("ephemeral") {
                    assert_eq!(t["volumeClaimTemplate"]["spec"]["storageClassName"], CSI_STORAGE_CLASS);
                    assert_eq!(s.placement, Placement::Scheduled, "{}: its claim comes after the pod", s.name);
                }
                if let Some(c) = v.get("csi") {
                    assert_eq!(c["driver"], CSI_DRIVER);
                }
            }
            // The token scenario's probe reads the driver's record of its pod's token.
            let probe = s.pod["spec"]["containers"][0]["readinessProbe"]["exec"]["command"].to_string();
            assert_eq!(s.name == "csi-token", probe.contains("swiftlet-fidelity [^/ ]*/csi-token default"), "{probe}");
            assert!(s.claims.iter().all(|c| c["spec"]["storageClassName"] == CSI_STORAGE_CLASS));
        }
    }

    #[test]
    fn done_conditions_read_the_pod_and_its_events() {
        let pod = json!({"status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "c0", "restartCount": 2, "containerID": "containerd://a",
                "state": {"running": {}}}]}});
        let ev = json!({"reason": "Killing"});
        let events = vec![&ev];
        assert!(Done::Phase("Running").holds(Some(&pod), &[], &[]));
        assert!(Done::RestartedAndRunning(2).holds(Some(&pod), &[], &[]));
        assert!(!Done::RestartedAndRunning(3).holds(Some(&pod), &[], &[]));
        assert!(Done::Ready(false).holds(Some(&pod), &[], &[]) && !Done::Ready(true).holds(Some(&pod), &[], &[]));
        assert!(Done::All(vec![Done::Event("Killing"), Done::Restarted(1)]).holds(Some(&pod), &events, &[]));
        assert!(!Done::Event("BackOff").holds(Some(&pod), &events, &[]));
        let twice = json!({"reason": "Pulling", "count": 2});
        assert!(Done::EventCount("Pulling", 2).holds(Some(&pod), &[&twice], &[]));
        assert!(!Done::EventCount("Pulling", 3).holds(Some(&pod), &[&twice], &[]));
        assert!(Done::Gone.holds(None, &[], &[]) && !Done::Gone.holds(Some(&pod), &[], &[]));
        assert!(c0_running(&pod));
        assert!(!Done::Waiting("CrashLoopBackOff").holds(Some(&pod), &[], &[]));
    }
}
