//! Defaulting and validation of static pods, as the API server would do them for the
//! fields the agent uses (`pkg/apis/core/v1/defaults.go`, `pkg/apis/core/validation`),
//! plus the kubelet's own static-pod rules (`pkg/kubelet/config/common.go`): the UID
//! is a hash of the manifest and its source, the name gets `-<nodename>`, the node
//! name is set, and a `NoExecute` toleration for everything is added.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{Container, Pod, SeccompProfile, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use md5::{Digest, Md5};

use crate::types::pod::{CONFIG_HASH_ANNOTATION, CONFIG_SOURCE_ANNOTATION, FILE_SOURCE};

/// One validation problem, with the field path as the API server prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn err(field: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError { field: field.into(), message: message.into() }
}

/// The static pod UID: md5 over the manifest's canonical JSON, the node and the file.
#[must_use]
pub fn static_pod_uid(pod: &Pod, node_name: &str, source: &str) -> String {
    let mut h = Md5::new();
    h.update(serde_json::to_vec(pod).unwrap_or_default());
    h.update(format!("host:{node_name}"));
    h.update(format!("file:{source}"));
    hex::encode(h.finalize())
}

/// A lowercase RFC 1123 label (names of containers, namespaces, hostnames).
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

fn image_has_tag_or_digest(image: &str) -> bool {
    if image.contains('@') {
        return true;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    last.contains(':')
}

fn image_is_latest(image: &str) -> bool {
    !image.contains('@') && (!image_has_tag_or_digest(image) || image.ends_with(":latest"))
}

fn default_container(c: &mut Container) {
    if c.termination_message_path.is_none() {
        c.termination_message_path = Some("/dev/termination-log".into());
    }
    if c.termination_message_policy.is_none() {
        c.termination_message_policy = Some("File".into());
    }
    if c.image_pull_policy.is_none() {
        let image = c.image.as_deref().unwrap_or_default();
        c.image_pull_policy = Some(if image_is_latest(image) { "Always" } else { "IfNotPresent" }.into());
    }
    for p in c.ports.iter_mut().flatten() {
        if p.protocol.is_none() {
            p.protocol = Some("TCP".into());
        }
    }
    // Requests default to limits (API server defaulting).
    if let Some(r) = c.resources.as_mut()
        && let Some(limits) = r.limits.clone()
    {
        let req = r.requests.get_or_insert_with(BTreeMap::new);
        for (k, v) in limits {
            req.entry(k).or_insert(v);
        }
    }
}

/// Applies API-server defaults to a pod spec and metadata.
pub fn apply_api_defaults(pod: &mut Pod) {
    if pod.metadata.namespace.as_deref().unwrap_or_default().is_empty() {
        pod.metadata.namespace = Some("default".into());
    }
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.scheduler_name.get_or_insert_with(|| "default-scheduler".into());
    spec.security_context.get_or_insert_with(Default::default);
    spec.enable_service_links.get_or_insert(true);
    spec.priority.get_or_insert(0);
    for c in &mut spec.containers {
        default_container(c);
    }
    for c in spec.init_containers.iter_mut().flatten() {
        default_container(c);
    }
}

fn validate_quantity(field: &str, q: &Quantity, errors: &mut Vec<FieldError>) {
    if crate::types::quantity::parse(&q.0).is_err() {
        errors.push(err(field, format!("Invalid value: {:?}: must be a valid quantity", q.0)));
    }
}

/// Upstream `validateSeccompProfileField` of a `Localhost` profile
/// (`validateLocalDescendingPath`): the runtime is handed `<seccomp root>/<name>`, so the
/// name must be a relative path without `..` segments.
fn validate_seccomp_profile(field: &str, profile: Option<&SeccompProfile>, errors: &mut Vec<FieldError>) {
    let Some(name) = profile.filter(|p| p.type_ == "Localhost").and_then(|p| p.localhost_profile.as_deref()) else {
        return;
    };
    let field = format!("{field}.seccompProfile.localhostProfile");
    if name.starts_with('/') {
        errors.push(err(&field, format!("Invalid value: {name:?}: must be a relative path")));
    }
    if name.split('/').any(|part| part == "..") {
        errors.push(err(field, format!("Invalid value: {name:?}: must not contain '..'")));
    }
}

fn validate_container(path: &str, c: &Container, names: &mut HashSet<String>, errors: &mut Vec<FieldError>) {
    if c.name.is_empty() {
        errors.push(err(format!("{path}.name"), "Required value"));
    } else if !is_dns1123_label(&c.name) {
        errors.push(err(
            format!("{path}.name"),
            format!("Invalid value: {:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'", c.name),
        ));
    } else if !names.insert(c.name.clone()) {
        errors.push(err(format!("{path}.name"), format!("Duplicate value: {:?}", c.name)));
    }
    match c.image.as_deref() {
        None | Some("") => errors.push(err(format!("{path}.image"), "Required value")),
        Some(i) if i.trim() != i => {
            errors.push(err(format!("{path}.image"), "Invalid value: must not have leading or trailing whitespace"));
        }
        _ => {}
    }
    validate_seccomp_profile(
        &format!("{path}.securityContext"),
        c.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref()),
        errors,
    );
    if let Some(p) = c.image_pull_policy.as_deref()
        && !["Always", "IfNotPresent", "Never"].contains(&p)
    {
        errors.push(err(
            format!("{path}.imagePullPolicy"),
            format!("Unsupported value: {p:?}: supported values: \"Always\", \"IfNotPresent\", \"Never\""),
        ));
    }
    for (i, p) in c.ports.iter().flatten().enumerate() {
        if !(1..=65535).contains(&p.container_port) {
            errors.push(err(
                format!("{path}.ports[{i}].containerPort"),
                format!("Invalid value: {}: must be between 1 and 65535, inclusive", p.container_port),
            ));
        }
        if let Some(h) = p.host_port
            && !(0..=65535).contains(&h)
        {
            errors.push(err(
                format!("{path}.ports[{i}].hostPort"),
                format!("Invalid value: {h}: must be between 1 and 65535, inclusive"),
            ));
        }
    }
    if let Some(r) = &c.resources {
        for (kind, list) in [("limits", &r.limits), ("requests", &r.requests)] {
            for (k, v) in list.iter().flatten() {
                validate_quantity(&format!("{path}.resources.{kind}[{k}]"), v, errors);
            }
        }
        if let (Some(req), Some(lim)) = (&r.requests, &r.limits) {
            for (k, rv) in req {
                if let Some(lv) = lim.get(k) {
                    let (a, b) = if k == "cpu" {
                        (
                            crate::types::quantity::parse_milli_cpu(&rv.0).ok(),
                            crate::types::quantity::parse_milli_cpu(&lv.0).ok(),
                        )
                    } else {
                        (
                            crate::types::quantity::parse_bytes(&rv.0).ok(),
                            crate::types::quantity::parse_bytes(&lv.0).ok(),
                        )
                    };
                    if let (Some(a), Some(b)) = (a, b)
                        && a > b
                    {
                        errors.push(err(
                            format!("{path}.resources.requests[{k}]"),
                            format!("Invalid value: {:?}: must be less than or equal to {k} limit of {}", rv.0, lv.0),
                        ));
                    }
                }
            }
        }
    }
}

/// Validates the fields the agent relies on; returns every problem at once.
#[must_use]
pub fn validate(pod: &Pod) -> Vec<FieldError> {
    let mut errors = Vec::new();
    match pod.metadata.name.as_deref() {
        None | Some("") => errors.push(err("metadata.name", "Required value: name or generateName is required")),
        Some(n) if !is_dns1123_subdomain(n) => errors.push(err(
            "metadata.name",
            format!("Invalid value: {n:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"),
        )),
        _ => {}
    }
    if let Some(ns) = pod.metadata.namespace.as_deref()
        && !ns.is_empty()
        && !is_dns1123_label(ns)
    {
        errors.push(err("metadata.namespace", format!("Invalid value: {ns:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'")));
    }
    let Some(spec) = &pod.spec else {
        errors.push(err("spec", "Required value"));
        return errors;
    };
    if spec.containers.is_empty() {
        errors.push(err("spec.containers", "Required value"));
    }
    validate_seccomp_profile(
        "spec.securityContext",
        spec.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref()),
        &mut errors,
    );
    let mut names = HashSet::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        validate_container(&format!("spec.initContainers[{i}]"), c, &mut names, &mut errors);
    }
    for (i, c) in spec.containers.iter().enumerate() {
        validate_container(&format!("spec.containers[{i}]"), c, &mut names, &mut errors);
    }
    if let Some(p) = spec.restart_policy.as_deref()
        && !["Always", "OnFailure", "Never"].contains(&p)
    {
        errors.push(err(
            "spec.restartPolicy",
            format!("Unsupported value: {p:?}: supported values: \"Always\", \"OnFailure\", \"Never\""),
        ));
    }
    if let Some(g) = spec.termination_grace_period_seconds
        && g < 0
    {
        errors.push(err(
            "spec.terminationGracePeriodSeconds",
            format!("Invalid value: {g}: must be greater than or equal to 0"),
        ));
    }
    if let Some(d) = spec.dns_policy.as_deref()
        && !["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"].contains(&d)
    {
        errors.push(err("spec.dnsPolicy", format!("Unsupported value: {d:?}")));
    }
    // Upstream's file source validates as a create (`ValidatePodCreate`): ephemeral
    // containers only come through the API server's subresource.
    if spec.ephemeral_containers.as_ref().is_some_and(|e| !e.is_empty()) {
        errors.push(err("spec.ephemeralContainers", "Forbidden: cannot be set on create"));
    }
    errors
}

/// Turns a parsed manifest into the pod the kubelet runs: UID, name, node, defaults,
/// annotations. Returns every validation error at once.
pub fn static_pod(mut pod: Pod, node_name: &str, source_path: &str) -> Result<Pod, Vec<FieldError>> {
    let errors = validate(&pod);
    if !errors.is_empty() {
        return Err(errors);
    }
    if pod.metadata.uid.as_deref().unwrap_or_default().is_empty() {
        pod.metadata.uid = Some(static_pod_uid(&pod, node_name, source_path));
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let node = node_name.to_lowercase();
    pod.metadata.name = Some(format!("{}-{node}", pod.metadata.name.as_deref().unwrap_or_default()));
    apply_api_defaults(&mut pod);
    let spec = pod.spec.as_mut().expect("validated");
    spec.node_name = Some(node_name.to_string());
    let tol = Toleration { operator: Some("Exists".into()), effect: Some("NoExecute".into()), ..Default::default() };
    let tols = spec.tolerations.get_or_insert_with(Vec::new);
    if !tols.contains(&tol) {
        tols.push(tol);
    }
    let ann = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    ann.insert(CONFIG_HASH_ANNOTATION.into(), uid);
    ann.insert(CONFIG_SOURCE_ANNOTATION.into(), FILE_SOURCE.into());
    let status = pod.status.get_or_insert_with(Default::default);
    status.phase = Some("Pending".into());
    Ok(pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn defaults_and_identity() {
        let p = parse(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web"},
            "spec": {"containers": [{"name": "c", "image": "localhost/busybox:latest",
                "resources": {"limits": {"cpu": "1", "memory": "64Mi"}}}]}
        }));
        let a = static_pod(p.clone(), "Node-A", "/etc/kubernetes/manifests/web.yaml").unwrap();
        let b = static_pod(p.clone(), "Node-A", "/etc/kubernetes/manifests/web.yaml").unwrap();
        assert_eq!(a.metadata.uid, b.metadata.uid);
        assert_eq!(a.metadata.uid.as_ref().unwrap().len(), 32);
        let c = static_pod(p, "Node-A", "/other.yaml").unwrap();
        assert_ne!(a.metadata.uid, c.metadata.uid);
        assert_eq!(a.metadata.name.as_deref(), Some("web-node-a"));
        assert_eq!(a.metadata.namespace.as_deref(), Some("default"));
        let spec = a.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("Node-A"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        let c0 = &spec.containers[0];
        assert_eq!(c0.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(c0.resources.as_ref().unwrap().requests.as_ref().unwrap()["cpu"].0, "1");
        let ann = a.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION], "file");
        assert_eq!(ann[CONFIG_HASH_ANNOTATION], *a.metadata.uid.as_ref().unwrap());
    }

    #[test]
    fn a_static_pod_cannot_have_ephemeral_containers() {
        let p = parse(serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"containers": [{"name": "c", "image": "x"}],
                     "ephemeralContainers": [{"name": "debug", "image": "x"}]}
        }));
        let errors = static_pod(p, "n", "/m/web.yaml").unwrap_err();
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(text, ["spec.ephemeralContainers: Forbidden: cannot be set on create"]);
    }

    #[test]
    fn a_localhost_seccomp_profile_must_stay_below_the_seccomp_root() {
        // Caught by the fuzz target `manifest` (the input is in its corpus): an absolute
        // `localhostProfile` replaced the seccomp root (`Path::join`), and `..` left it;
        // upstream validates static pods as a create, which refuses both
        // (`validateLocalDescendingPath`).
        let localhost = |profile: &str| serde_json::json!({"type": "Localhost", "localhostProfile": profile});
        let p = parse(serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {
                "securityContext": {"seccompProfile": localhost("/etc/profile.json")},
                "initContainers": [{"name": "i", "image": "x", "securityContext": {"seccompProfile": localhost("a/../../b.json")}}],
                "containers": [
                    {"name": "c", "image": "x", "securityContext": {"seccompProfile": localhost("/../x")}},
                    {"name": "d", "image": "x", "securityContext": {"seccompProfile": localhost("profiles/..json")}}
                ]
            }
        }));
        let text: Vec<String> = validate(&p).iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "spec.securityContext.seccompProfile.localhostProfile: Invalid value: \"/etc/profile.json\": must be a relative path",
                "spec.initContainers[0].securityContext.seccompProfile.localhostProfile: Invalid value: \"a/../../b.json\": must not contain '..'",
                "spec.containers[0].securityContext.seccompProfile.localhostProfile: Invalid value: \"/../x\": must be a relative path",
                "spec.containers[0].securityContext.seccompProfile.localhostProfile: Invalid value: \"/../x\": must not contain '..'",
            ]
        );
    }

    #[test]
    fn pull_policy_defaults() {
        assert!(image_is_latest("busybox"));
        assert!(image_is_latest("localhost:5000/busybox"));
        assert!(image_is_latest("busybox:latest"));
        assert!(!image_is_latest("localhost:5000/busybox:1.36"));
        assert!(!image_is_latest("busybox@sha256:abc"));
    }

    #[test]
    fn every_error_is_reported_with_its_field() {
        let p = parse(serde_json::json!({
            "metadata": {"name": "Bad_Name"},
            "spec": {"restartPolicy": "Sometimes", "containers": [
                {"name": "c", "image": ""},
                {"name": "c", "image": "x", "ports": [{"containerPort": 0}],
                 "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1", "memory": "lots"}}}
            ]}
        }));
        let errs = static_pod(p, "n", "/f").unwrap_err();
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        for f in [
            "metadata.name",
            "spec.containers[0].image",
            "spec.containers[1].name",
            "spec.containers[1].ports[0].containerPort",
            "spec.containers[1].resources.limits[memory]",
            "spec.containers[1].resources.requests[cpu]",
            "spec.restartPolicy",
        ] {
            assert!(fields.contains(&f), "missing {f} in {errs:?}");
        }
    }
}
