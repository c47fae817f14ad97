//! What the real server does to an object between decoding and storing it: the v1
//! defaulting functions (`pkg/apis/core/v1/defaults.go`), the admission plugins a
//! kubelet sees the effect of (`ServiceAccount`, Priority, `DefaultTolerationSeconds`), the
//! registry strategies' `PrepareForCreate` (pod status Pending + `qosClass`, generation 1,
//! the `SchedulingGated` condition; namespace finalizer and name label) and the little
//! validation the double does.

use serde_json::{Map, Value, json};

use super::meta::{self, ensure_object};
use super::status::FieldError;

/// The annotation that marks a mirror pod (`kubernetes.io/config.mirror`).
const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Sets `m[key] = value` if the key is absent or null.
fn default(m: &mut Map<String, Value>, key: &str, value: Value) {
    if m.get(key).is_none_or(Value::is_null) {
        m.insert(key.to_string(), value);
    }
}

fn obj_at<'a>(m: &'a mut Map<String, Value>, key: &str) -> Option<&'a mut Map<String, Value>> {
    m.get_mut(key).and_then(Value::as_object_mut)
}

fn list_at<'a>(m: &'a mut Map<String, Value>, key: &str) -> Option<&'a mut Vec<Value>> {
    m.get_mut(key).and_then(Value::as_array_mut)
}

/// `SetDefaults_Pod` + `SetDefaults_PodSpec` and the per-field defaulters below them.
pub(crate) fn default_pod(pod: &mut Value) {
    let spec = ensure_object(ensure_object(pod).entry("spec").or_insert_with(|| json!({})));
    default(spec, "dnsPolicy", json!("ClusterFirst"));
    default(spec, "restartPolicy", json!("Always"));
    default(spec, "securityContext", json!({}));
    default(spec, "terminationGracePeriodSeconds", json!(30));
    default(spec, "schedulerName", json!("default-scheduler"));
    default(spec, "enableServiceLinks", json!(true));
    let host_network = spec.get("hostNetwork").and_then(Value::as_bool).unwrap_or(false);
    for field in ["containers", "initContainers"] {
        if let Some(cs) = list_at(spec, field) {
            for c in cs.iter_mut() {
                default_container(ensure_object(c), host_network, true);
            }
        }
    }
    if let Some(cs) = list_at(spec, "ephemeralContainers") {
        for c in cs.iter_mut() {
            default_container(ensure_object(c), false, false);
        }
    }
    if let Some(vols) = list_at(spec, "volumes") {
        for v in vols.iter_mut() {
            default_volume(ensure_object(v));
        }
    }
}

/// `SetDefaults_Container` and the probe, port, handler and env defaulters;
/// `requests` default to `limits` (done in `SetDefaults_Pod` for pod containers only).
fn default_container(c: &mut Map<String, Value>, host_network: bool, requests_from_limits: bool) {
    let image = c.get("image").and_then(Value::as_str).unwrap_or("").to_string();
    default(c, "imagePullPolicy", json!(if image_tag(&image) == "latest" { "Always" } else { "IfNotPresent" }));
    default(c, "terminationMessagePath", json!("/dev/termination-log"));
    default(c, "terminationMessagePolicy", json!("File"));
    default(c, "resources", json!({}));
    if requests_from_limits
        && let Some(res) = obj_at(c, "resources")
        && let Some(limits) = res.get("limits").and_then(Value::as_object).cloned()
    {
        let req = ensure_object(res.entry("requests").or_insert_with(|| json!({})));
        for (k, v) in limits {
            req.entry(k).or_insert(v);
        }
    }
    if let Some(ports) = list_at(c, "ports") {
        for p in ports.iter_mut() {
            let p = ensure_object(p);
            default(p, "protocol", json!("TCP"));
            if host_network && let Some(cp) = p.get("containerPort").cloned() {
                default(p, "hostPort", cp);
            }
        }
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(p) = obj_at(c, probe) {
            default(p, "timeoutSeconds", json!(1));
            default(p, "periodSeconds", json!(10));
            default(p, "successThreshold", json!(1));
            default(p, "failureThreshold", json!(3));
            default_handler(p);
            if let Some(g) = obj_at(p, "grpc") {
                default(g, "service", json!(""));
            }
        }
    }
    if let Some(lc) = obj_at(c, "lifecycle") {
        for h in ["postStart", "preStop"] {
            if let Some(h) = obj_at(lc, h) {
                default_handler(h);
            }
        }
    }
    if let Some(env) = list_at(c, "env") {
        for e in env.iter_mut() {
            if let Some(fr) = e.pointer_mut("/valueFrom/fieldRef").and_then(Value::as_object_mut) {
                default(fr, "apiVersion", json!("v1"));
            }
        }
    }
}

fn default_handler(h: &mut Map<String, Value>) {
    if let Some(g) = obj_at(h, "httpGet") {
        default(g, "path", json!("/"));
        default(g, "scheme", json!("HTTP"));
    }
}

/// The tag `parsers.ParseImageName` finds: "latest" when there is neither tag nor digest.
fn image_tag(image: &str) -> &str {
    if image.contains('@') {
        let before = image.split('@').next().unwrap_or("");
        let last = before.rsplit('/').next().unwrap_or("");
        return last.split_once(':').map_or("", |(_, t)| t);
    }
    let last = image.rsplit('/').next().unwrap_or("");
    last.split_once(':').map_or("latest", |(_, t)| t)
}

/// `SetDefaults_Volume` and the volume-source defaulters (mode 0644, token expiry 1 h).
fn default_volume(v: &mut Map<String, Value>) {
    const SOURCES: &[&str] = &[
        "hostPath",
        "emptyDir",
        "gcePersistentDisk",
        "awsElasticBlockStore",
        "gitRepo",
        "secret",
        "nfs",
        "iscsi",
        "glusterfs",
        "persistentVolumeClaim",
        "rbd",
        "flexVolume",
        "cinder",
        "cephfs",
        "flocker",
        "downwardAPI",
        "fc",
        "azureFile",
        "configMap",
        "vsphereVolume",
        "quobyte",
        "azureDisk",
        "photonPersistentDisk",
        "projected",
        "portworxVolume",
        "scaleIO",
        "storageos",
        "csi",
        "ephemeral",
        "image",
    ];
    if !SOURCES.iter().any(|s| v.get(*s).is_some_and(|x| !x.is_null())) {
        v.insert("emptyDir".into(), json!({}));
    }
    for src in ["secret", "configMap", "downwardAPI", "projected"] {
        if let Some(s) = obj_at(v, src) {
            default(s, "defaultMode", json!(420));
        }
    }
    if let Some(h) = obj_at(v, "hostPath") {
        default(h, "type", json!(""));
    }
    if let Some(items) = v.get_mut("downwardAPI").and_then(|d| d.get_mut("items")).and_then(Value::as_array_mut) {
        for i in items {
            if let Some(fr) = i.get_mut("fieldRef").and_then(Value::as_object_mut) {
                default(fr, "apiVersion", json!("v1"));
            }
        }
    }
    if let Some(sources) = v.get_mut("projected").and_then(|p| p.get_mut("sources")).and_then(Value::as_array_mut) {
        for s in sources {
            if let Some(t) = s.get_mut("serviceAccountToken").and_then(Value::as_object_mut) {
                default(t, "expirationSeconds", json!(3600));
            }
            if let Some(items) = s.pointer_mut("/downwardAPI/items").and_then(Value::as_array_mut) {
                for i in items {
                    if let Some(fr) = i.get_mut("fieldRef").and_then(Value::as_object_mut) {
                        default(fr, "apiVersion", json!("v1"));
                    }
                }
            }
        }
    }
}

/// The outcome of the mutating admission plugins: `Err` is a rejection message.
pub(crate) struct PodAdmission<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// Whether the `ServiceAccount`'s token volume is injected (`kube-api-access-*`).
    pub mount_token: bool,
    /// Looks up whether a service account exists in the pod's namespace.
    pub service_account_exists: &'a dyn Fn(&str) -> bool,
}

impl PodAdmission<'_> {
    /// `ServiceAccount`, Priority and `DefaultTolerationSeconds`, in the upstream plugin order.
    pub(crate) fn admit(&self, pod: &mut Value) -> Result<(), String> {
        let mirror = meta::meta(pod).get("annotations").and_then(|a| a.get(MIRROR_POD_ANNOTATION)).is_some();
        let spec = ensure_object(ensure_object(pod).entry("spec").or_insert_with(|| json!({})));
        // ServiceAccount: mirror pods are left alone (the kubelet would see a changed spec).
        if !mirror {
            default(spec, "serviceAccountName", json!("default"));
            let sa = spec["serviceAccountName"].as_str().unwrap_or("default").to_string();
            if !(self.service_account_exists)(&sa) {
                return Err(format!(
                    "error looking up service account {}/{sa}: serviceaccount \"{sa}\" not found",
                    self.namespace
                ));
            }
            if self.mount_token && spec.get("automountServiceAccountToken").and_then(Value::as_bool) != Some(false) {
                mount_token_volume(spec);
            }
        }
        if let Some(sa) = spec.get("serviceAccountName").cloned() {
            // The deprecated field mirrors the new one on the wire (v1 conversion).
            spec.insert("serviceAccount".into(), sa);
        }
        // Priority.
        let (priority, policy) = match spec.get("priorityClassName").and_then(Value::as_str).unwrap_or("") {
            "" => (0, "PreemptLowerPriority"),
            "system-node-critical" => (2_000_001_000, "PreemptLowerPriority"),
            "system-cluster-critical" => (2_000_000_000, "PreemptLowerPriority"),
            other => return Err(format!("no PriorityClass with name {other} was found")),
        };
        if let Some(p) = spec.get("priority").and_then(Value::as_i64)
            && p != priority
        {
            return Err("the integer value of priority must not be provided in pod spec; priority admission \
                        controller computed the value from the given PriorityClass name"
                .to_string());
        }
        spec.insert("priority".into(), json!(priority));
        default(spec, "preemptionPolicy", json!(policy));
        // DefaultTolerationSeconds.
        let tolerations = ensure_list(spec, "tolerations");
        for taint in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"] {
            let tolerated = tolerations.iter().any(|t| {
                let key = t.get("key").and_then(Value::as_str).unwrap_or("");
                let effect = t.get("effect").and_then(Value::as_str).unwrap_or("");
                (key == taint || key.is_empty()) && (effect == "NoExecute" || effect.is_empty())
            });
            if !tolerated {
                tolerations.push(json!({
                    "key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300
                }));
            }
        }
        Ok(())
    }
}

fn ensure_list<'a>(m: &'a mut Map<String, Value>, key: &str) -> &'a mut Vec<Value> {
    let v = m.entry(key).or_insert_with(|| json!([]));
    if !v.is_array() {
        *v = json!([]);
    }
    v.as_array_mut().expect("array")
}

/// The projected volume the `ServiceAccount` plugin adds (`kube-api-access-<5 chars>`),
/// mounted read-only at the well-known path in every container.
fn mount_token_volume(spec: &mut Map<String, Value>) {
    const PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
    let already = ["containers", "initContainers"].iter().any(|f| {
        spec.get(*f).and_then(Value::as_array).is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("volumeMounts")
                    .and_then(Value::as_array)
                    .is_some_and(|ms| ms.iter().any(|m| m.get("mountPath").and_then(Value::as_str) == Some(PATH)))
            })
        })
    });
    if already {
        return;
    }
    let name = meta::generate_name("kube-api-access-");
    ensure_list(spec, "volumes").push(json!({
        "name": name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        },
    }));
    for f in ["containers", "initContainers"] {
        if let Some(cs) = list_at(spec, f) {
            for c in cs {
                ensure_list(ensure_object(c), "volumeMounts")
                    .push(json!({"name": name, "readOnly": true, "mountPath": PATH}));
            }
        }
    }
}

/// `podStrategy.PrepareForCreate`: generation 1, status reset to Pending with the `QoS`
/// class, and the `SchedulingGated` condition for gated pods.
pub(crate) fn prepare_pod_for_create(pod: &mut Value) {
    meta::meta_mut(pod).insert("generation".into(), json!(1));
    let qos = qos_class(pod);
    let gated = pod.pointer("/spec/schedulingGates").and_then(Value::as_array).is_some_and(|g| !g.is_empty());
    let mut status = json!({ "phase": "Pending", "qosClass": qos });
    if gated {
        status["conditions"] = json!([{
            "type": "PodScheduled", "status": "False", "lastProbeTime": null, "lastTransitionTime": null,
            "reason": "SchedulingGated", "message": "Scheduling is blocked due to non-empty scheduling gates",
        }]);
    }
    ensure_object(pod).insert("status".into(), status);
}

/// `qos.GetPodQOS` (with pod-level resources when set).
pub(crate) fn qos_class(pod: &Value) -> &'static str {
    const QOS: [&str; 2] = ["cpu", "memory"];
    let mut requests: std::collections::BTreeMap<String, i128> = std::collections::BTreeMap::new();
    let mut limits: std::collections::BTreeMap<String, i128> = std::collections::BTreeMap::new();
    let mut guaranteed = true;
    let mut add = |res: &Value, guaranteed: &mut bool| {
        if let Some(r) = res.get("requests").and_then(Value::as_object) {
            for (k, v) in r {
                if let Some(q) = v.as_str().and_then(parse_quantity)
                    && QOS.contains(&k.as_str())
                    && q > 0
                {
                    *requests.entry(k.clone()).or_default() += q;
                }
            }
        }
        let mut found = Vec::new();
        if let Some(l) = res.get("limits").and_then(Value::as_object) {
            for (k, v) in l {
                if let Some(q) = v.as_str().and_then(parse_quantity)
                    && QOS.contains(&k.as_str())
                    && q > 0
                {
                    found.push(k.clone());
                    *limits.entry(k.clone()).or_default() += q;
                }
            }
        }
        if !QOS.iter().all(|r| found.iter().any(|f| f == r)) {
            *guaranteed = false;
        }
    };
    let pod_level = pod.pointer("/spec/resources").filter(|r| {
        ["requests", "limits"]
            .iter()
            .any(|k| r.get(*k).and_then(Value::as_object).is_some_and(|m| QOS.iter().any(|q| m.contains_key(*q))))
    });
    if let Some(res) = pod_level {
        add(res, &mut guaranteed);
    } else {
        for field in ["containers", "initContainers"] {
            for c in pod.pointer(&format!("/spec/{field}")).and_then(Value::as_array).into_iter().flatten() {
                add(c.get("resources").unwrap_or(&Value::Null), &mut guaranteed);
            }
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    if guaranteed {
        for (k, r) in &requests {
            if limits.get(k) != Some(r) {
                guaranteed = false;
            }
        }
    }
    if guaranteed && requests.len() == limits.len() { "Guaranteed" } else { "Burstable" }
}

/// A `resource.Quantity` in units of 10^-9 (exact for every quantity a pod uses).
pub(crate) fn parse_quantity(s: &str) -> Option<i128> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let (neg, num) = match num.strip_prefix('-') {
        Some(n) => (true, n),
        None => (false, num.strip_prefix('+').unwrap_or(num)),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let frac = &frac[..frac.len().min(9)];
    let mut nanos: i128 = if int.is_empty() { 0 } else { int.parse::<i128>().ok()? } * 1_000_000_000;
    if !frac.is_empty() {
        nanos += frac.parse::<i128>().ok()? * 10i128.pow(9 - u32::try_from(frac.len()).ok()?);
    }
    let scaled = match suffix {
        "" => nanos,
        "n" => nanos / 1_000_000_000,
        "u" => nanos / 1_000_000,
        "m" => nanos / 1_000,
        "k" => nanos * 1_000,
        "M" => nanos * 1_000_000,
        "G" => nanos * 1_000_000_000,
        "T" => nanos * 1_000_000_000_000,
        "P" => nanos * 1_000_000_000_000_000,
        "E" => nanos * 1_000_000_000_000_000_000,
        "Ki" => nanos << 10,
        "Mi" => nanos << 20,
        "Gi" => nanos << 30,
        "Ti" => nanos << 40,
        "Pi" => nanos << 50,
        "Ei" => nanos << 60,
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().ok()?;
            if exp >= 0 { nanos * 10i128.pow(exp.unsigned_abs()) } else { nanos / 10i128.pow(exp.unsigned_abs()) }
        }
        _ => return None,
    };
    Some(if neg { -scaled } else { scaled })
}

/// `ValidatePodCreate`, the part a kubelet's tests run into: containers with names and
/// images, unique container names, no ephemeral containers (only the `ephemeralcontainers`
/// subresource adds them).
pub(crate) fn validate_pod(pod: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let containers = pod.pointer("/spec/containers").and_then(Value::as_array);
    if containers.is_none_or(Vec::is_empty) {
        errs.push(FieldError::required("spec.containers", ""));
    }
    let mut names = std::collections::HashSet::new();
    for field in ["initContainers", "containers"] {
        for (i, c) in pod.pointer(&format!("/spec/{field}")).and_then(Value::as_array).into_iter().flatten().enumerate()
        {
            let name = c.get("name").and_then(Value::as_str).unwrap_or("");
            if name.is_empty() {
                errs.push(FieldError::required(format!("spec.{field}[{i}].name"), ""));
            } else if !meta::is_dns1123_label(name) {
                errs.push(FieldError::invalid(
                    format!("spec.{field}[{i}].name"),
                    json!(name),
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'",
                ));
            } else if !names.insert(name.to_string()) {
                errs.push(FieldError::duplicate(format!("spec.{field}[{i}].name"), json!(name)));
            }
            if c.get("image").and_then(Value::as_str).unwrap_or("").is_empty() {
                errs.push(FieldError::required(format!("spec.{field}[{i}].image"), ""));
            }
        }
    }
    if pod.pointer("/spec/ephemeralContainers").and_then(Value::as_array).is_some_and(|l| !l.is_empty()) {
        errs.push(FieldError::forbidden("spec.ephemeralContainers", "cannot be set on create"));
    }
    errs
}

/// `ValidatePodUpdate`: only container images, `activeDeadlineSeconds`, added
/// tolerations, `terminationGracePeriodSeconds` and removed scheduling gates may change
/// (ephemeral containers only through their subresource).
pub(crate) fn validate_pod_spec_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut a = new.get("spec").cloned().unwrap_or(Value::Null);
    let b = old.get("spec").cloned().unwrap_or(Value::Null);
    for field in ["containers", "initContainers"] {
        let old_list = b.get(field).and_then(Value::as_array).cloned().unwrap_or_default();
        if let Some(list) = a.get_mut(field).and_then(Value::as_array_mut) {
            for (i, c) in list.iter_mut().enumerate() {
                if let (Some(oc), Some(m)) = (old_list.get(i), c.as_object_mut()) {
                    m.insert("image".into(), oc.get("image").cloned().unwrap_or(Value::Null));
                }
            }
        }
    }
    let am = ensure_object(&mut a);
    for f in ["activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds", "schedulingGates"] {
        match b.get(f) {
            Some(v) => am.insert(f.into(), v.clone()),
            None => am.remove(f),
        };
    }
    if a == b {
        Vec::new()
    } else {
        vec![FieldError::forbidden(
            "spec",
            "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,\
             `spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),\
             `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
        )]
    }
}

/// `SetDefaults_NodeStatus`: allocatable defaults to capacity.
pub(crate) fn default_node(node: &mut Value) {
    if let Some(status) = node.get_mut("status").and_then(Value::as_object_mut)
        && status.get("allocatable").is_none_or(Value::is_null)
        && let Some(cap) = status.get("capacity").cloned()
    {
        status.insert("allocatable".into(), cap);
    }
}

/// `namespaceStrategy.PrepareForCreate` + `SetDefaults_NamespaceStatus`: the `kubernetes`
/// finalizer, phase Active and the `kubernetes.io/metadata.name` label.
pub(crate) fn prepare_namespace_for_create(ns: &mut Value) {
    let name = meta::name(ns).to_string();
    let labels = ensure_object(meta::meta_mut(ns).entry("labels").or_insert_with(|| json!({})));
    labels.insert("kubernetes.io/metadata.name".into(), json!(name));
    let o = ensure_object(ns);
    o.insert("spec".into(), json!({ "finalizers": ["kubernetes"] }));
    o.insert("status".into(), json!({ "phase": "Active" }));
}

/// The service CIDR the double allocates cluster IPs from (kubeadm's default); its first
/// address belongs to the `kubernetes` service in `default`.
pub(crate) const SERVICE_CIDR: (std::net::Ipv4Addr, u8) = (std::net::Ipv4Addr::new(10, 96, 0, 0), 12);

fn in_service_cidr(ip: std::net::Ipv4Addr) -> bool {
    let (base, bits) = SERVICE_CIDR;
    let mask = u32::MAX << (32 - bits);
    u32::from(ip) & mask == u32::from(base) & mask
}

/// `SetDefaults_Service` and the REST strategy's `PrepareForCreate`: type `ClusterIP`,
/// session affinity `None`, each port's protocol `TCP` and `targetPort` = `port`,
/// single-stack IPv4, internal traffic policy `Cluster`. `allocated` are the cluster IPs
/// in use: a service without `clusterIP` gets the lowest free one (the real allocator
/// picks at random; tests only need uniqueness).
pub(crate) fn default_service(svc: &mut Value, allocated: &std::collections::HashSet<String>) {
    let spec = ensure_object(ensure_object(svc).entry("spec").or_insert_with(|| json!({})));
    default(spec, "type", json!("ClusterIP"));
    default(spec, "sessionAffinity", json!("None"));
    for p in list_at(spec, "ports").into_iter().flatten() {
        let p = ensure_object(p);
        default(p, "protocol", json!("TCP"));
        if let Some(port) = p.get("port").cloned() {
            default(p, "targetPort", port);
        }
    }
    if spec.get("type").and_then(Value::as_str) == Some("ExternalName") {
        return;
    }
    default(spec, "internalTrafficPolicy", json!("Cluster"));
    let ip = spec.get("clusterIP").and_then(Value::as_str).unwrap_or("").to_string();
    let ip = if ip.is_empty() {
        let (base, bits) = SERVICE_CIDR;
        let size = 1u32 << (32 - bits);
        let free = (1..size - 1)
            .map(|i| std::net::Ipv4Addr::from(u32::from(base) + i).to_string())
            .find(|c| !allocated.contains(c));
        let Some(free) = free else { return };
        spec.insert("clusterIP".into(), json!(free));
        free
    } else {
        ip
    };
    default(spec, "clusterIPs", json!([ip]));
    if ip != "None" {
        default(spec, "ipFamilies", json!(["IPv4"]));
        default(spec, "ipFamilyPolicy", json!("SingleStack"));
    }
}

/// `ValidateService`, the part tests run into: a DNS-1035 name, ports (required unless
/// headless or `ExternalName`; 1–65535; named and unique when more than one; TCP, UDP or
/// SCTP), and a cluster IP that is `None` or a free address of the service CIDR.
pub(crate) fn validate_service(svc: &Value, allocated: &std::collections::HashSet<String>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = meta::name(svc);
    let dns1035 =
        name.len() <= 63 && name.starts_with(|c: char| c.is_ascii_lowercase()) && meta::is_dns1123_label(name);
    if !dns1035 {
        errs.push(FieldError::invalid(
            "metadata.name",
            json!(name),
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an \
             alphabetic character, and end with an alphanumeric character",
        ));
    }
    let spec = svc.get("spec").cloned().unwrap_or(Value::Null);
    let kind = spec.get("type").and_then(Value::as_str).unwrap_or("ClusterIP");
    let cluster_ip = spec.get("clusterIP").and_then(Value::as_str).unwrap_or("");
    let ports = spec.get("ports").and_then(Value::as_array).cloned().unwrap_or_default();
    if ports.is_empty() && kind != "ExternalName" && cluster_ip != "None" {
        errs.push(FieldError::required("spec.ports", ""));
    }
    let mut names = std::collections::HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let pname = p.get("name").and_then(Value::as_str).unwrap_or("");
        if ports.len() > 1 && pname.is_empty() {
            errs.push(FieldError::required(format!("spec.ports[{i}].name"), ""));
        } else if !pname.is_empty() && !names.insert(pname.to_string()) {
            errs.push(FieldError::duplicate(format!("spec.ports[{i}].name"), json!(pname)));
        }
        let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
        if !(1..=65535).contains(&port) {
            errs.push(FieldError::invalid(
                format!("spec.ports[{i}].port"),
                json!(port),
                "must be between 1 and 65535, inclusive",
            ));
        }
        let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
        if !["TCP", "UDP", "SCTP"].contains(&proto) {
            errs.push(FieldError::invalid(
                format!("spec.ports[{i}].protocol"),
                json!(proto),
                "supported values: \"SCTP\", \"TCP\", \"UDP\"",
            ));
        }
    }
    if kind != "ExternalName" && cluster_ip != "None" {
        match cluster_ip.parse::<std::net::Ipv4Addr>() {
            Ok(ip) if !in_service_cidr(ip) => errs.push(FieldError::invalid(
                "spec.clusterIPs",
                json!([cluster_ip]),
                format!(
                    "failed to allocate IP {cluster_ip}: provided IP is not in the valid range. \
                     The range of valid IPs is {}/{}",
                    SERVICE_CIDR.0, SERVICE_CIDR.1
                ),
            )),
            Ok(_) if allocated.contains(cluster_ip) => errs.push(FieldError::invalid(
                "spec.clusterIPs",
                json!([cluster_ip]),
                format!("failed to allocate IP {cluster_ip}: provided IP is already allocated"),
            )),
            Ok(_) => {}
            Err(_) => errs.push(FieldError::invalid(
                "spec.clusterIP",
                json!(cluster_ip),
                "must be empty, 'None', or a valid IP address",
            )),
        }
    }
    errs
}

/// `SetDefaults_Secret`: type Opaque.
pub(crate) fn default_secret(secret: &mut Value) {
    default(ensure_object(secret), "type", json!("Opaque"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_pull_policy_follows_the_tag() {
        assert_eq!(image_tag("busybox"), "latest");
        assert_eq!(image_tag("busybox:latest"), "latest");
        assert_eq!(image_tag("localhost:5000/busybox"), "latest");
        assert_eq!(image_tag("localhost:5000/busybox:1.36"), "1.36");
        assert_eq!(image_tag("busybox@sha256:abc"), "");
    }

    #[test]
    fn quantities_and_qos() {
        assert_eq!(parse_quantity("1"), parse_quantity("1000m"));
        assert_eq!(parse_quantity("1Ki"), Some(1024 * 1_000_000_000));
        assert_eq!(parse_quantity("1.5"), parse_quantity("1500m"));
        assert_eq!(parse_quantity("1e3"), parse_quantity("1k"));
        let mut pod = json!({"spec": {"containers": [{"name": "a", "image": "x",
            "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}});
        default_pod(&mut pod);
        assert_eq!(qos_class(&pod), "Guaranteed");
        let pod = json!({"spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "100m"}}}]}});
        assert_eq!(qos_class(&pod), "Burstable");
        let pod = json!({"spec": {"containers": [{"name": "a"}]}});
        assert_eq!(qos_class(&pod), "BestEffort");
    }
}
