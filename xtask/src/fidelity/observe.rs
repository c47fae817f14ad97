//! What the API shows of one scenario, as comparable facts, and the diff of two agents'.
//!
//! A fact is a key (`phase`, `condition Ready`, `container c0 state`, `event BackOff`, ...)
//! and a value with everything that differs from run to run by nature replaced by a
//! placeholder: the node and namespace names, uids, container and image ids, addresses,
//! durations and quantities ([`Normalizer`]). Timing shows only as buckets: restart counts
//! and event counts as `0`, `1` or `2+`, a graceful deletion's length against its grace
//! period. What is left must be the same for swiftlet and the upstream kubelet, or be one
//! of the differences [`super::documented`] lists with its reason.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
};

use regex::Regex;
use serde_json::Value;

/// A scenario's facts: key → normalized value.
pub type Facts = BTreeMap<String, String>;

/// Replaces what differs between runs by nature (names, ids, addresses, durations,
/// quantities) with placeholders.
#[derive(Debug)]
pub struct Normalizer {
    literal: Vec<(String, &'static str)>,
    patterns: Vec<(Regex, &'static str)>,
}

impl Normalizer {
    /// For a run whose node is `node` and namespace `namespace`.
    pub fn new(node: &str, namespace: &str) -> Self {
        // Longest first: the namespace contains the node's label.
        let mut literal = vec![(namespace.to_owned(), "<ns>"), (node.to_owned(), "<node>")];
        literal.sort_by_key(|(s, _)| std::cmp::Reverse(s.len()));
        let p = |re: &str, to: &'static str| (Regex::new(re).expect("a valid pattern"), to);
        let patterns = vec![
            p(r"sha256:[0-9a-f]{64}", "sha256:<digest>"),
            p(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", "<uid>"),
            p(r"\b[0-9a-f]{64}\b", "<id>"),
            p(r"\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}(:\d+)?\b", "<ip>"),
            // Durations: Go's (1m30s, 2.5s, 300ms) and a back-off's.
            p(r"\b(\d+(\.\d+)?(h|m|s|ms|µs|us|ns))+\b", "<dur>"),
            // Quantities with a suffix, and bare byte counts of 4 digits or more.
            p(r"\b\d+(\.\d+)?(Ki|Mi|Gi|Ti|k|M|G|T|m)\b", "<qty>"),
            p(r"\b\d{4,}\b", "<n>"),
        ];
        Self { literal, patterns }
    }

    pub fn apply(&self, text: &str) -> String {
        // The event correlator's prefix depends on how many similar events came before.
        let mut s = text.strip_prefix("(combined from similar events): ").unwrap_or(text).to_owned();
        for (from, to) in &self.literal {
            if !from.is_empty() {
                s = s.replace(from.as_str(), to);
            }
        }
        for (re, to) in &self.patterns {
            s = re.replace_all(&s, *to).into_owned();
        }
        s.split_whitespace().collect::<Vec<_>>().join(" ")
    }
}

/// `0`, `1` or `2+`: counts that depend on when the snapshot was taken.
pub fn bucket(n: u64) -> &'static str {
    match n {
        0 => "0",
        1 => "1",
        _ => "2+",
    }
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// A container state (`state` or `lastState`) as one line.
fn state(s: &Value, norm: &Normalizer) -> String {
    if let Some(w) = s.get("waiting") {
        let msg = norm.apply(text(&w["message"]));
        return format!(
            "waiting {}{}",
            text(&w["reason"]),
            if msg.is_empty() { String::new() } else { format!(": {msg}") }
        );
    }
    if s.get("running").is_some() {
        return "running".into();
    }
    if let Some(t) = s.get("terminated") {
        let msg = norm.apply(text(&t["message"]));
        let signal = t["signal"].as_i64().map(|s| format!(" signal {s}")).unwrap_or_default();
        return format!(
            "terminated {} exit {}{signal}{}",
            text(&t["reason"]),
            t["exitCode"],
            if msg.is_empty() { String::new() } else { format!(": {msg}") }
        );
    }
    "none".into()
}

/// The facts of a pod as the API shows it.
pub fn pod_facts(pod: &Value, norm: &Normalizer, facts: &mut Facts) {
    let status = &pod["status"];
    let mut put = |k: String, v: String| {
        facts.insert(k, v);
    };
    put("phase".into(), text(&status["phase"]).into());
    for (key, field) in [("reason", "reason"), ("message", "message"), ("qosClass", "qosClass")] {
        let v = norm.apply(text(&status[field]));
        if !v.is_empty() {
            put(key.into(), v);
        }
    }
    for (key, field) in [("hostIP", "hostIP"), ("podIP", "podIP"), ("startTime", "startTime")] {
        put(format!("{key} set"), (!status[field].is_null()).to_string());
    }
    for c in status["conditions"].as_array().into_iter().flatten() {
        let mut v = text(&c["status"]).to_owned();
        for field in ["reason", "message"] {
            let s = norm.apply(text(&c[field]));
            if !s.is_empty() {
                let _ = write!(v, " {field}={s}");
            }
        }
        put(format!("condition {}", text(&c["type"])), v);
    }
    for (kind, list) in [
        ("init", "initContainerStatuses"),
        ("container", "containerStatuses"),
        ("ephemeral", "ephemeralContainerStatuses"),
    ] {
        for c in status[list].as_array().into_iter().flatten() {
            let name = format!("{kind} {}", text(&c["name"]));
            put(format!("{name} state"), state(&c["state"], norm));
            let last = state(&c["lastState"], norm);
            if last != "none" {
                put(format!("{name} lastState"), last);
            }
            put(format!("{name} ready"), c["ready"].to_string());
            if !c["started"].is_null() {
                put(format!("{name} started"), c["started"].to_string());
            }
            put(format!("{name} restarts"), bucket(c["restartCount"].as_u64().unwrap_or(0)).into());
            put(format!("{name} image"), norm.apply(text(&c["image"])));
            put(format!("{name} imageID set"), (!text(&c["imageID"]).is_empty()).to_string());
            put(format!("{name} containerID set"), (!text(&c["containerID"]).is_empty()).to_string());
            // Devices' health (`ResourceHealthStatus`): each resource with its devices'
            // health; the ids (CDI names with claim UIDs) differ between runs.
            let allocated: Vec<String> = c["allocatedResourcesStatus"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    let health: Vec<&str> =
                        r["resources"].as_array().into_iter().flatten().map(|d| text(&d["health"])).collect();
                    format!("{} [{}]", text(&r["name"]), health.join(","))
                })
                .collect();
            if !allocated.is_empty() {
                put(format!("{name} allocatedResourcesStatus"), allocated.join(" "));
            }
        }
    }
}

/// The facts of the events about pod `name`: per reason, the type, the reporting
/// component, every distinct message and the summed count as a [`bucket`]. The
/// scheduler's `FailedScheduling` (a pod the scheduler places waits for its claims) is
/// left out: how often it tries before the claims are bound is the scheduler's timing.
pub fn event_facts(events: &[Value], name: &str, norm: &Normalizer, facts: &mut Facts) {
    let mut by_reason: BTreeMap<String, (BTreeSet<String>, u64)> = BTreeMap::new();
    for e in events.iter().filter(|e| {
        e["involvedObject"]["kind"] == "Pod" && e["involvedObject"]["name"] == name && e["reason"] != "FailedScheduling"
    }) {
        let component = if text(&e["source"]["component"]).is_empty() {
            text(&e["reportingComponent"])
        } else {
            text(&e["source"]["component"])
        };
        let entry = by_reason.entry(format!("event {}", text(&e["reason"]))).or_default();
        let line = format!("{} [{component}] {}", text(&e["type"]), norm.apply(text(&e["message"])));
        entry.0.insert(line);
        entry.1 += e["count"].as_u64().unwrap_or(1).max(1);
    }
    for (key, (lines, count)) in by_reason {
        let lines: Vec<String> = lines.into_iter().collect();
        facts.insert(key.clone(), lines.join(" | "));
        facts.insert(format!("{key} count"), bucket(count).into());
    }
}

/// The facts of a Node as the API shows it: conditions, addresses, what it reports of
/// itself, and which capacity, label and annotation keys it has.
pub fn node_facts(node: &Value, norm: &Normalizer) -> Facts {
    let mut facts = Facts::new();
    let status = &node["status"];
    for c in status["conditions"].as_array().into_iter().flatten() {
        let v =
            format!("{} reason={} message={}", text(&c["status"]), text(&c["reason"]), norm.apply(text(&c["message"])));
        facts.insert(format!("condition {}", text(&c["type"])), v);
    }
    let mut types: Vec<&str> = status["addresses"].as_array().into_iter().flatten().map(|a| text(&a["type"])).collect();
    types.sort_unstable();
    facts.insert("address types".into(), types.join(","));
    for field in ["capacity", "allocatable"] {
        let keys: Vec<&String> = status[field].as_object().into_iter().flat_map(|m| m.keys()).collect();
        facts.insert(format!("{field} keys"), keys.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(","));
    }
    for field in ["labels", "annotations"] {
        let keys: Vec<&String> = node["metadata"][field].as_object().into_iter().flat_map(|m| m.keys()).collect();
        facts.insert(format!("{field} keys"), keys.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(","));
    }
    for field in [
        "architecture",
        "operatingSystem",
        "osImage",
        "kernelVersion",
        "containerRuntimeVersion",
        "kubeletVersion",
        "kubeProxyVersion",
    ] {
        facts.insert(format!("nodeInfo {field}"), norm.apply(text(&status["nodeInfo"][field])));
    }
    facts.insert(
        "daemonEndpoints port set".into(),
        (status["daemonEndpoints"]["kubeletEndpoint"]["Port"].as_u64().unwrap_or(0) > 0).to_string(),
    );
    facts.insert("spec.taints".into(), {
        let mut t: Vec<String> = node["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| format!("{}:{}", text(&t["key"]), text(&t["effect"])))
            .collect();
        t.sort();
        t.join(",")
    });
    facts
}

/// The facts of the claims of one scenario (`claims`, as the API lists them; those of
/// the pod's generic ephemeral volumes among them): per claim its phase, capacity, access
/// modes and volume mode, whether it is bound to a volume, and who owns it.
pub fn claim_facts(claims: &[&Value], norm: &Normalizer, facts: &mut Facts) {
    for c in claims {
        let name = norm.apply(text(&c["metadata"]["name"]));
        let modes = |v: &Value| v.as_array().into_iter().flatten().map(text).collect::<Vec<_>>().join(",");
        let owners: Vec<String> = c["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| format!("{} {}", text(&o["kind"]), norm.apply(text(&o["name"]))))
            .collect();
        let status = &c["status"];
        let mut put = |k: &str, v: String| {
            facts.insert(format!("claim {name} {k}"), v);
        };
        put("phase", text(&status["phase"]).into());
        put("capacity", text(&status["capacity"]["storage"]).into());
        put("accessModes", modes(&status["accessModes"]));
        put("volumeMode", text(&c["spec"]["volumeMode"]).into());
        put("volumeName set", (!text(&c["spec"]["volumeName"]).is_empty()).to_string());
        put("owners", owners.join(","));
        let conditions: Vec<String> = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| format!("{}={}", text(&c["type"]), text(&c["status"])))
            .collect();
        if !conditions.is_empty() {
            put("conditions", conditions.join(","));
        }
    }
}

/// The facts a kubelet writes of the CSI drivers and volumes of its node: the node's
/// `csi.volume.kubernetes.io/nodeid` annotation, its `volumesInUse` and
/// `volumesAttached`, and its `CSINode` (`csinode`: its drivers with their node ids,
/// topology keys and volume limits, its annotations and its owner). A volume handle is the driver's name
/// for a volume, which differs from run to run: `volumes` (the cluster's
/// `PersistentVolumes`) name its claim instead.
pub fn csi_node_facts(node: &Value, csinode: Option<&Value>, volumes: &[Value], norm: &Normalizer) -> Facts {
    let mut facts = Facts::new();
    let annotation = &node["metadata"]["annotations"]["csi.volume.kubernetes.io/nodeid"];
    facts.insert("csi nodeid annotation".into(), norm.apply(annotation.as_str().unwrap_or("(none)")));
    let handle_names: BTreeMap<&str, String> = volumes
        .iter()
        .filter_map(|pv| {
            let handle = pv["spec"]["csi"]["volumeHandle"].as_str()?;
            Some((handle, format!("<volume of claim {}>", norm.apply(text(&pv["spec"]["claimRef"]["name"])))))
        })
        .collect();
    let unique_name = |n: &str| -> String {
        // `kubernetes.io/csi/<driver>^<volume handle>`
        match n.split_once('^') {
            Some((plugin, handle)) => {
                format!("{plugin}^{}", handle_names.get(handle).cloned().unwrap_or_else(|| "<handle>".into()))
            }
            None => norm.apply(n),
        }
    };
    let mut in_use: Vec<String> =
        node["status"]["volumesInUse"].as_array().into_iter().flatten().map(|v| unique_name(text(v))).collect();
    in_use.sort();
    facts.insert("csi volumesInUse".into(), in_use.join(", "));
    let mut attached: Vec<String> = node["status"]["volumesAttached"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| unique_name(text(&v["name"])))
        .collect();
    attached.sort();
    facts.insert("csi volumesAttached".into(), attached.join(", "));
    let Some(csinode) = csinode else {
        facts.insert("csinode".into(), "(none)".into());
        return facts;
    };
    let owners: Vec<String> = csinode["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| format!("{} {} controller={}", text(&o["kind"]), norm.apply(text(&o["name"])), o["controller"]))
        .collect();
    facts.insert("csinode owners".into(), owners.join(","));
    for (k, v) in csinode["metadata"]["annotations"].as_object().into_iter().flatten() {
        facts.insert(format!("csinode annotation {k}"), norm.apply(text(v)));
    }
    let mut names = Vec::new();
    for d in csinode["spec"]["drivers"].as_array().into_iter().flatten() {
        let name = text(&d["name"]);
        names.push(name);
        let keys = d["topologyKeys"].as_array().into_iter().flatten().map(text).collect::<Vec<_>>().join(",");
        let count = d["allocatable"]["count"].as_u64().map_or_else(|| "(none)".to_owned(), |c| c.to_string());
        facts.insert(
            format!("csinode driver {name}"),
            format!("nodeID={} topologyKeys=[{keys}] allocatable.count={count}", norm.apply(text(&d["nodeID"]))),
        );
    }
    facts.insert("csinode drivers".into(), names.join(","));
    facts
}

/// One fact that differs between the two agents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    pub scenario: String,
    pub key: String,
    /// `None`: the agent's view has no such fact.
    pub swiftlet: Option<String>,
    pub kubelet: Option<String>,
}

/// The facts that differ between `swiftlet` and `kubelet` for `scenario`.
pub fn diff(scenario: &str, swiftlet: &Facts, kubelet: &Facts) -> Vec<Difference> {
    let mut keys: Vec<&String> = swiftlet.keys().chain(kubelet.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| swiftlet.get(*k) != kubelet.get(*k))
        .map(|k| Difference {
            scenario: scenario.to_owned(),
            key: k.clone(),
            swiftlet: swiftlet.get(k).cloned(),
            kubelet: kubelet.get(k).cloned(),
        })
        .collect()
}

/// The name a `ResourceClaim` of a scenario goes by in its facts: its own when the
/// scenario created it; `<pod claim> of pod` for one made from a template (its name has
/// a random suffix), `extended of pod` for the one the scheduler made for the pod's
/// extended resources.
pub fn resource_claim_key(claim: &Value, norm: &Normalizer) -> String {
    let annotations = &claim["metadata"]["annotations"];
    if annotations["resource.kubernetes.io/extended-resource-claim"] == "true" {
        return "extended of pod".into();
    }
    if let Some(pod_claim) = annotations["resource.kubernetes.io/pod-claim-name"].as_str() {
        return format!("{pod_claim} of pod");
    }
    norm.apply(text(&claim["metadata"]["name"]))
}

/// The facts of the `ResourceClaims` of one scenario (`claims`, as the API lists them):
/// per claim who owns it, its allocation (driver, pool and request of each device; which
/// device the scheduler picks is its choice), whom it is reserved for, the devices' status
/// the driver wrote, and whether the node's driver holds it prepared (`prepared`, by
/// claim uid).
pub fn resource_claim_facts(claims: &[&Value], prepared: &dyn Fn(&str) -> bool, norm: &Normalizer, facts: &mut Facts) {
    for c in claims {
        let key = resource_claim_key(c, norm);
        let mut put = |k: &str, v: String| {
            facts.insert(format!("resourceclaim {key} {k}"), v);
        };
        let owners: Vec<String> = c["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| format!("{} {} controller={}", text(&o["kind"]), norm.apply(text(&o["name"])), o["controller"]))
            .collect();
        put("owners", owners.join(","));
        let status = &c["status"];
        let allocation = &status["allocation"];
        let results: Vec<String> = allocation["devices"]["results"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                format!(
                    "driver={} pool={} request={} device set={}",
                    text(&r["driver"]),
                    norm.apply(text(&r["pool"])),
                    text(&r["request"]),
                    !text(&r["device"]).is_empty()
                )
            })
            .collect();
        put("allocation", if allocation.is_null() { "(none)".into() } else { results.join(", ") });
        put("allocation nodeSelector set", (!allocation["nodeSelector"].is_null()).to_string());
        let reserved: Vec<String> = status["reservedFor"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| format!("{} {}", text(&r["resource"]), norm.apply(text(&r["name"]))))
            .collect();
        put("reservedFor", reserved.join(","));
        let devices: Vec<String> = status["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| {
                let conditions: Vec<String> = d["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| format!("{}={}", text(&c["type"]), text(&c["status"])))
                    .collect();
                format!(
                    "driver={} pool={} [{}]",
                    text(&d["driver"]),
                    norm.apply(text(&d["pool"])),
                    conditions.join(",")
                )
            })
            .collect();
        put("devices status", devices.join(", "));
        put("prepared on node", prepared(text(&c["metadata"]["uid"])).to_string());
    }
}

/// The facts of the `ResourceSlices` published for node `node` (`slices`: all of the
/// cluster's): per driver its pools and devices (slice names are generated).
pub fn resource_slice_facts(slices: &[Value], node: &str, norm: &Normalizer) -> Facts {
    let mut by_driver: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in slices.iter().filter(|s| s["spec"]["nodeName"] == node) {
        let spec = &s["spec"];
        let mut devices: Vec<&str> =
            spec["devices"].as_array().into_iter().flatten().map(|d| text(&d["name"])).collect();
        devices.sort_unstable();
        by_driver.entry(text(&spec["driver"]).to_owned()).or_default().insert(format!(
            "pool={} generation={} devices={}",
            norm.apply(text(&spec["pool"]["name"])),
            spec["pool"]["generation"],
            devices.join(",")
        ));
    }
    let mut facts = Facts::new();
    facts.insert("dra slice drivers".into(), by_driver.keys().cloned().collect::<Vec<_>>().join(","));
    for (driver, pools) in by_driver {
        facts.insert(format!("dra slices {driver}"), pools.into_iter().collect::<Vec<_>>().join(" | "));
    }
    facts
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn norm() -> Normalizer {
        Normalizer::new("swiftlet-bench-fidelity-swiftlet", "swiftlet-bench-42-fidelity-swiftlet")
    }

    #[test]
    fn names_ids_addresses_durations_and_quantities_become_placeholders() {
        let n = norm();
        assert_eq!(
            n.apply("pod x in swiftlet-bench-42-fidelity-swiftlet on swiftlet-bench-fidelity-swiftlet"),
            "pod x in <ns> on <node>"
        );
        assert_eq!(
            n.apply(&format!("container {} image sha256:{}", "a".repeat(64), "b".repeat(64))),
            "container <id> image sha256:<digest>"
        );
        assert_eq!(n.apply("uid 0b8e4a6c-1a2b-4c3d-9e8f-0123456789ab"), "uid <uid>");
        assert_eq!(n.apply("dial tcp 127.0.0.1:1: connect: refused"), "dial tcp <ip>: connect: refused");
        assert_eq!(
            n.apply("back-off 10s restarting; took 1m30s and 2.5s and 300ms"),
            "back-off <dur> restarting; took <dur> and <dur> and <dur>"
        );
        assert_eq!(
            n.apply("Threshold quantity: 100Mi, available: 123456Ki, used 70m"),
            "Threshold quantity: <qty>, available: <qty>, used <dur>"
        );
        assert_eq!(n.apply("exit code 137,   usage 12345"), "exit code 137, usage <n>");
        assert_eq!(n.apply("(combined from similar events): Liveness probe errored"), "Liveness probe errored");
    }

    #[test]
    fn pod_facts_keep_reasons_and_bucket_counts() {
        let pod = json!({"status": {
            "phase": "Running", "qosClass": "BestEffort", "podIP": "10.88.0.4", "hostIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": "containers with unready status: [c0]"}],
            "containerStatuses": [{
                "name": "c0", "ready": false, "started": true, "restartCount": 3, "image": "localhost/busybox:latest",
                "imageID": "sha256:x", "containerID": "containerd://abc",
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container=c0"}},
                "lastState": {"terminated": {"reason": "Error", "exitCode": 3}},
                "allocatedResourcesStatus": [
                    {"name": "claim:gpu/one", "resources": [{"resourceID": "d/p/0", "health": "Unknown"}, {"resourceID": "d/p/1", "health": "Healthy"}]},
                    {"name": "example.com/dev", "resources": [{"resourceID": "dev-1", "health": "Healthy"}]},
                ],
            }],
        }});
        let mut f = Facts::new();
        pod_facts(&pod, &norm(), &mut f);
        assert_eq!(
            f["container c0 allocatedResourcesStatus"],
            "claim:gpu/one [Unknown,Healthy] example.com/dev [Healthy]"
        );
        assert_eq!(f["phase"], "Running");
        assert_eq!(
            f["condition Ready"],
            "False reason=ContainersNotReady message=containers with unready status: [c0]"
        );
        assert_eq!(f["container c0 state"], "waiting CrashLoopBackOff: back-off <dur> restarting failed container=c0");
        assert_eq!(f["container c0 lastState"], "terminated Error exit 3");
        assert_eq!(f["container c0 restarts"], "2+");
        assert_eq!((f["podIP set"].as_str(), f["startTime set"].as_str()), ("true", "false"));
    }

    #[test]
    fn events_are_grouped_by_reason_with_their_messages_and_count() {
        let ev = |reason: &str, msg: &str, count: u64| {
            json!({"involvedObject": {"kind": "Pod", "name": "p"}, "reason": reason, "type": "Warning",
                   "message": msg, "count": count, "source": {"component": "kubelet"}})
        };
        let events = vec![
            ev("Failed", "Error: ErrImagePull", 1),
            ev("Failed", "Failed to pull image \"x\"", 2),
            ev("BackOff", "Back-off pulling image \"x\"", 1),
            json!({"involvedObject": {"kind": "Pod", "name": "other"}, "reason": "Killing"}),
        ];
        let mut f = Facts::new();
        event_facts(&events, "p", &norm(), &mut f);
        assert_eq!(
            f["event Failed"],
            "Warning [kubelet] Error: ErrImagePull | Warning [kubelet] Failed to pull image \"x\""
        );
        assert_eq!(f["event Failed count"], "2+");
        assert_eq!(f["event BackOff count"], "1");
        assert!(!f.contains_key("event Killing"));
    }

    #[test]
    fn the_diff_names_each_fact_that_differs_or_is_missing() {
        let a: Facts = [("phase".into(), "Running".into()), ("x".into(), "1".into())].into();
        let b: Facts = [("phase".into(), "Failed".into()), ("y".into(), "2".into())].into();
        let d = diff("s", &a, &b);
        assert_eq!(d.len(), 3);
        assert_eq!(
            d[0],
            Difference {
                scenario: "s".into(),
                key: "phase".into(),
                swiftlet: Some("Running".into()),
                kubelet: Some("Failed".into())
            }
        );
        assert_eq!((d[1].key.as_str(), d[1].kubelet.as_deref()), ("x", None));
        assert_eq!((d[2].key.as_str(), d[2].swiftlet.as_deref()), ("y", None));
        assert!(diff("s", &a, &a).is_empty());
    }

    #[test]
    fn claim_facts_name_the_claim_and_its_owner() {
        let claim = json!({
            "metadata": {"name": "p-scratch", "ownerReferences": [{"kind": "Pod", "name": "p"}]},
            "spec": {"volumeMode": "Filesystem", "volumeName": "pvc-0b8e4a6c-1a2b-4c3d-9e8f-0123456789ab"},
            "status": {"phase": "Bound", "capacity": {"storage": "5Mi"}, "accessModes": ["ReadWriteOnce"]},
        });
        let mut f = Facts::new();
        claim_facts(&[&claim], &norm(), &mut f);
        assert_eq!(f["claim p-scratch phase"], "Bound");
        assert_eq!(f["claim p-scratch capacity"], "5Mi");
        assert_eq!(f["claim p-scratch accessModes"], "ReadWriteOnce");
        assert_eq!(f["claim p-scratch volumeName set"], "true");
        assert_eq!(f["claim p-scratch owners"], "Pod p");
        assert!(!f.contains_key("claim p-scratch conditions"));
    }

    #[test]
    fn resource_claim_facts_name_template_and_extended_claims_by_role() {
        let uid = "0b8e4a6c-1a2b-4c3d-9e8f-0123456789ab";
        let own = json!({
            "metadata": {"name": "dev", "uid": uid},
            "status": {
                "allocation": {"devices": {"results": [{"driver": "d", "pool": "swiftlet-bench-fidelity-swiftlet",
                    "request": "one", "device": "device-01"}]}, "nodeSelector": {}},
                "reservedFor": [{"resource": "pods", "name": "p", "uid": uid}],
            },
        });
        let templated = json!({
            "metadata": {"name": "p-dev-x7k2q", "uid": "u2",
                "annotations": {"resource.kubernetes.io/pod-claim-name": "dev"},
                "ownerReferences": [{"kind": "Pod", "name": "p", "controller": true}]},
            "status": {},
        });
        let extended = json!({"metadata": {"name": "p-extended-resources-abcde",
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"}}});
        let mut f = Facts::new();
        resource_claim_facts(&[&own, &templated, &extended], &|u| u == uid, &norm(), &mut f);
        assert_eq!(f["resourceclaim dev allocation"], "driver=d pool=<node> request=one device set=true");
        assert_eq!(f["resourceclaim dev allocation nodeSelector set"], "true");
        assert_eq!(f["resourceclaim dev reservedFor"], "pods p");
        assert_eq!(f["resourceclaim dev prepared on node"], "true");
        assert_eq!(f["resourceclaim dev of pod allocation"], "(none)");
        assert_eq!(f["resourceclaim dev of pod owners"], "Pod p controller=true");
        assert_eq!(f["resourceclaim dev of pod prepared on node"], "false");
        assert!(f.contains_key("resourceclaim extended of pod reservedFor"));
    }

    #[test]
    fn resource_slice_facts_list_the_nodes_pools_by_driver() {
        let n = "swiftlet-bench-fidelity-swiftlet";
        let slice = |node: &str, driver: &str, devices: &[&str]| {
            let devices: Vec<Value> = devices.iter().map(|d| json!({"name": d})).collect();
            json!({"spec": {"nodeName": node, "driver": driver, "pool": {"name": node, "generation": 1}, "devices": devices}})
        };
        let slices = [slice(n, "d", &["device-01", "device-00"]), slice("other", "d", &["x"]), slice(n, "a", &["a-0"])];
        let f = resource_slice_facts(&slices, n, &norm());
        assert_eq!(f["dra slice drivers"], "a,d");
        assert_eq!(f["dra slices d"], "pool=<node> generation=1 devices=device-00,device-01");
        assert_eq!(resource_slice_facts(&[], n, &norm())["dra slice drivers"], "");
    }

    #[test]
    fn csi_node_facts_name_volumes_by_their_claims() {
        let n = "swiftlet-bench-fidelity-swiftlet";
        let node = json!({
            "metadata": {"annotations": {"csi.volume.kubernetes.io/nodeid": format!("{{\"d\":\"{n}\"}}")}},
            "status": {"volumesInUse": ["kubernetes.io/csi/d^hp-2", "kubernetes.io/csi/d^hp-1", "kubernetes.io/csi/d^hp-9"]},
        });
        let volumes = [
            json!({"spec": {"csi": {"driver": "d", "volumeHandle": "hp-1"}, "claimRef": {"name": "data"}}}),
            json!({"spec": {"csi": {"driver": "d", "volumeHandle": "hp-2"}, "claimRef": {"name": "p-scratch"}}}),
        ];
        let csinode = json!({
            "metadata": {"ownerReferences": [{"kind": "Node", "name": n}], "annotations": {"a": "x"}},
            "spec": {"drivers": [{"name": "d", "nodeID": n, "topologyKeys": null}]},
        });
        let f = csi_node_facts(&node, Some(&csinode), &volumes, &norm());
        assert_eq!(f["csi nodeid annotation"], "{\"d\":\"<node>\"}");
        assert_eq!(
            f["csi volumesInUse"],
            "kubernetes.io/csi/d^<handle>, kubernetes.io/csi/d^<volume of claim data>, \
             kubernetes.io/csi/d^<volume of claim p-scratch>"
        );
        assert_eq!(f["csi volumesAttached"], "");
        assert_eq!(f["csinode drivers"], "d");
        assert_eq!(f["csinode driver d"], "nodeID=<node> topologyKeys=[] allocatable.count=(none)");
        assert_eq!(f["csinode owners"], "Node <node> controller=null");
        assert_eq!(f["csinode annotation a"], "x");
        assert_eq!(csi_node_facts(&json!({}), None, &[], &norm())["csinode"], "(none)");
    }

    #[test]
    fn node_facts_list_conditions_and_keys() {
        let node = json!({
            "metadata": {"labels": {"kubernetes.io/os": "linux", "kubernetes.io/hostname": "h"}},
            "spec": {"taints": [{"key": "swiftlet.dev/bench", "effect": "NoSchedule"}]},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
                "addresses": [{"type": "Hostname"}, {"type": "InternalIP"}],
                "capacity": {"cpu": "2", "memory": "1Gi"},
                "nodeInfo": {"kubeletVersion": "v1.37.2"},
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            }
        });
        let f = node_facts(&node, &norm());
        assert_eq!(f["condition Ready"], "True reason=KubeletReady message=kubelet is posting ready status");
        assert_eq!(f["address types"], "Hostname,InternalIP");
        assert_eq!(f["capacity keys"], "cpu,memory");
        assert_eq!(f["labels keys"], "kubernetes.io/hostname,kubernetes.io/os");
        assert_eq!(f["daemonEndpoints port set"], "true");
        assert_eq!(f["spec.taints"], "swiftlet.dev/bench:NoSchedule");
    }
}
