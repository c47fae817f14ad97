//! The `pods/resize` subresource (upstream `podResizeStrategy` in
//! `pkg/registry/core/pod/strategy.go` and `ValidatePodResize` in
//! `pkg/apis/core/validation`).
//!
//! `PrepareForUpdate` keeps the stored pod and takes from the request only what a resize
//! may change: the `resources` and `resizePolicy` of the containers and sidecar init
//! containers, matched by name (everything else in the request is dropped silently, as
//! upstream's `dropNonResizeUpdates` does); a changed spec bumps `metadata.generation`.
//! Validation then refuses what upstream refuses: static (mirror) pods, pods with
//! pod-level resources, Windows pods, a change of `QoS` class, removed requests or
//! limits, changes to resources other than cpu and memory, and requests above limits.
//! Conflicts on a stale `resourceVersion` come from the shared update path.
//!
//! Not checked (upstream does): the node's support for resize (every node here is one
//! of ours), the full pod spec validation (only the resize-relevant part).

use serde_json::{Map, Value, json};

use super::admission::{parse_quantity, qos_class};
use super::meta;
use super::status::FieldError;

/// The annotation of mirror pods (`kubernetes.io/config.mirror`).
const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// The resources a resize may change.
const RESIZABLE: [&str; 2] = ["cpu", "memory"];

/// Whether an init container is a sidecar (`restartPolicy: Always`).
fn is_sidecar(c: &Value) -> bool {
    c.get("restartPolicy").and_then(Value::as_str) == Some("Always")
}

/// `dropNonResizeUpdates`: `old` with the resizable fields of `new`'s containers.
fn drop_non_resize_updates(new: &Value, old: &Value) -> Value {
    let mut out = old.clone();
    // The request's resourceVersion decides conflicts.
    match meta::meta(new).get("resourceVersion").cloned() {
        Some(rv) => meta::meta_mut(&mut out).insert("resourceVersion".into(), rv),
        None => meta::meta_mut(&mut out).remove("resourceVersion"),
    };
    for field in ["containers", "initContainers"] {
        let wanted: Vec<Value> =
            new.pointer(&format!("/spec/{field}")).and_then(Value::as_array).cloned().unwrap_or_default();
        let Some(list) = out.pointer_mut(&format!("/spec/{field}")).and_then(Value::as_array_mut) else { continue };
        for c in list.iter_mut() {
            if field == "initContainers" && !is_sidecar(c) {
                continue;
            }
            let name = c.get("name").cloned();
            let Some(w) = wanted.iter().find(|w| w.get("name") == name.as_ref()) else { continue };
            let Some(m) = c.as_object_mut() else { continue };
            for key in ["resources", "resizePolicy"] {
                match w.get(key).filter(|v| !v.is_null()) {
                    Some(v) => m.insert(key.into(), v.clone()),
                    None => m.remove(key),
                };
            }
        }
    }
    out
}

fn resource_map<'a>(c: &'a Value, kind: &str) -> Option<&'a Map<String, Value>> {
    c.get("resources").and_then(|r| r.get(kind)).and_then(Value::as_object)
}

/// Only cpu and memory entries of `list` differ between `new` and `old`.
fn same_except_cpu_memory(new: Option<&Map<String, Value>>, old: Option<&Map<String, Value>>) -> bool {
    let strip = |m: Option<&Map<String, Value>>| -> Map<String, Value> {
        m.map(|m| {
            m.iter().filter(|(k, _)| !RESIZABLE.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect()
        })
        .unwrap_or_default()
    };
    strip(new) == strip(old)
}

/// `validateContainerResize` + the cpu/memory-only rule + requests <= limits, for one
/// container at `path`.
fn validate_container(new: &Value, old: &Value, path: &str, sidecar: bool, errs: &mut Vec<FieldError>) {
    for (kind, what) in [("requests", "resource requests"), ("limits", "resource limits")] {
        let (n, o) = (resource_map(new, kind), resource_map(old, kind));
        if o.is_some_and(|o| o.keys().any(|k| !n.is_some_and(|n| n.contains_key(k)))) {
            errs.push(FieldError::forbidden(format!("{path}.resources.{kind}"), format!("{what} cannot be removed")));
        }
    }
    let mut rest_new = new.clone();
    let mut rest_old = old.clone();
    for v in [&mut rest_new, &mut rest_old] {
        if let Some(m) = v.as_object_mut() {
            m.remove("resources");
            m.remove("resizePolicy");
        }
    }
    let resources_ok = same_except_cpu_memory(resource_map(new, "requests"), resource_map(old, "requests"))
        && same_except_cpu_memory(resource_map(new, "limits"), resource_map(old, "limits"));
    if rest_new != rest_old || !resources_ok {
        let msg = if sidecar {
            "only cpu and memory resources for sidecar containers are mutable"
        } else {
            "only cpu and memory resources are mutable"
        };
        errs.push(FieldError::forbidden("spec", msg));
    }
    for r in RESIZABLE {
        let req = resource_map(new, "requests").and_then(|m| m.get(r)).and_then(Value::as_str);
        let lim = resource_map(new, "limits").and_then(|m| m.get(r)).and_then(Value::as_str);
        if let (Some(req), Some(lim)) = (req, lim)
            && let (Some(q), Some(l)) = (parse_quantity(req), parse_quantity(lim))
            && q > l
        {
            errs.push(FieldError::invalid(
                format!("{path}.resources.requests"),
                json!(req),
                format!("must be less than or equal to {r} limit of {lim}"),
            ));
        }
    }
}

/// `podResizeStrategy.PrepareForUpdate` and `ValidateUpdate`: turns the request `new` into
/// the pod to store (or the field errors that refuse it).
///
/// # Errors
/// The field errors of `ValidatePodResize`.
pub(crate) fn prepare_and_validate(new: &mut Value, old: &Value) -> Result<(), Vec<FieldError>> {
    *new = drop_non_resize_updates(new, old);
    if meta::meta(old).get("annotations").and_then(|a| a.get(MIRROR_POD_ANNOTATION)).is_some() {
        return Err(vec![FieldError::forbidden("", "static pods cannot be resized")]);
    }
    let pod_level = |p: &Value| p.pointer("/spec/resources").is_some_and(|r| !r.is_null());
    if pod_level(old) || pod_level(new) {
        return Err(vec![FieldError::forbidden("", "pods with pod-level resources cannot be resized")]);
    }
    if old.pointer("/spec/os/name").and_then(Value::as_str) == Some("windows") {
        return Err(vec![FieldError::forbidden("", "windows pods cannot be resized")]);
    }
    let mut errs = Vec::new();
    let old_qos = old
        .pointer("/status/qosClass")
        .and_then(Value::as_str)
        .filter(|q| !q.is_empty())
        .unwrap_or_else(|| qos_class(old));
    let new_qos = qos_class(new);
    if old_qos != new_qos {
        errs.push(FieldError::invalid("spec", json!(old_qos), "Pod QOS Class may not change as a result of resizing"));
    }
    for field in ["initContainers", "containers"] {
        let news = new.pointer(&format!("/spec/{field}")).and_then(Value::as_array).cloned().unwrap_or_default();
        let olds = old.pointer(&format!("/spec/{field}")).and_then(Value::as_array).cloned().unwrap_or_default();
        for (i, (n, o)) in news.iter().zip(olds.iter()).enumerate() {
            let sidecar = field == "initContainers";
            if sidecar && !is_sidecar(o) {
                continue;
            }
            validate_container(n, o, &format!("spec.{field}[{i}]"), sidecar, &mut errs);
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    if new.get("spec") != old.get("spec") {
        let g = meta::meta(old).get("generation").and_then(Value::as_i64).unwrap_or(0);
        meta::meta_mut(new).insert("generation".into(), json!(g + 1));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(cpu_req: &str, cpu_lim: &str, mem: &str) -> Value {
        json!({
            "metadata": {"name": "p", "namespace": "default", "generation": 1, "resourceVersion": "5"},
            "spec": {"containers": [{
                "name": "c", "image": "busybox",
                "resources": {"requests": {"cpu": cpu_req, "memory": mem}, "limits": {"cpu": cpu_lim, "memory": mem}},
            }]},
            "status": {"qosClass": if cpu_req == cpu_lim { "Guaranteed" } else { "Burstable" }},
        })
    }

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn cpu_and_memory_change_and_bump_the_generation() {
        let old = pod("100m", "200m", "64Mi");
        let mut new = pod("150m", "300m", "96Mi");
        new["spec"]["containers"][0]["resizePolicy"] =
            json!([{"resourceName": "memory", "restartPolicy": "RestartContainer"}]);
        prepare_and_validate(&mut new, &old).unwrap();
        assert_eq!(new["metadata"]["generation"], 2);
        assert_eq!(new["spec"]["containers"][0]["resources"]["limits"]["cpu"], "300m");
        assert_eq!(new["spec"]["containers"][0]["resizePolicy"][0]["restartPolicy"], "RestartContainer");
        // No change: no new generation.
        let mut same = old.clone();
        prepare_and_validate(&mut same, &old).unwrap();
        assert_eq!(same["metadata"]["generation"], 1);
    }

    #[test]
    fn other_fields_of_the_request_are_dropped() {
        let old = pod("100m", "200m", "64Mi");
        let mut new = pod("100m", "200m", "64Mi");
        new["spec"]["containers"][0]["image"] = json!("nginx");
        new["metadata"]["labels"] = json!({"a": "b"});
        new["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "extra", "image": "x"}));
        prepare_and_validate(&mut new, &old).unwrap();
        assert_eq!(new["spec"]["containers"][0]["image"], "busybox");
        assert!(new["metadata"].get("labels").is_none());
        assert_eq!(new["spec"]["containers"].as_array().unwrap().len(), 1);
        assert_eq!(new["metadata"]["generation"], 1);
    }

    #[test]
    fn qos_class_may_not_change() {
        let old = pod("100m", "100m", "64Mi");
        let mut new = pod("100m", "200m", "64Mi");
        let errs = prepare_and_validate(&mut new, &old).unwrap_err();
        assert_eq!(
            messages(&errs),
            ["spec: Invalid value: \"Guaranteed\": Pod QOS Class may not change as a result of resizing"]
        );
    }

    #[test]
    fn removals_other_resources_and_requests_above_limits_are_refused() {
        let old = pod("100m", "200m", "64Mi");
        let mut new = pod("100m", "200m", "64Mi");
        new["spec"]["containers"][0]["resources"]["limits"].as_object_mut().unwrap().remove("cpu");
        let errs = prepare_and_validate(&mut new, &old).unwrap_err();
        assert_eq!(
            messages(&errs),
            ["spec.containers[0].resources.limits: Forbidden: resource limits cannot be removed"]
        );

        let mut new = pod("100m", "200m", "64Mi");
        new["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] = json!("1Gi");
        let errs = prepare_and_validate(&mut new, &old).unwrap_err();
        assert_eq!(messages(&errs), ["spec: Forbidden: only cpu and memory resources are mutable"]);

        let mut new = pod("300m", "200m", "64Mi");
        let errs = prepare_and_validate(&mut new, &old).unwrap_err();
        assert_eq!(
            messages(&errs),
            [
                "spec.containers[0].resources.requests: Invalid value: \"300m\": must be less than or equal to cpu limit of 200m"
            ]
        );
    }

    #[test]
    fn static_and_pod_level_resources_pods_cannot_be_resized() {
        let mut old = pod("100m", "200m", "64Mi");
        old["metadata"]["annotations"] = json!({MIRROR_POD_ANNOTATION: "x"});
        let mut new = pod("150m", "200m", "64Mi");
        let errs = prepare_and_validate(&mut new, &old).unwrap_err();
        assert_eq!(messages(&errs), [": Forbidden: static pods cannot be resized"]);

        let mut old = pod("100m", "200m", "64Mi");
        old["spec"]["resources"] = json!({"limits": {"cpu": "1"}});
        let mut new = pod("150m", "200m", "64Mi");
        let errs = prepare_and_validate(&mut new, &old).unwrap_err();
        assert_eq!(messages(&errs), [": Forbidden: pods with pod-level resources cannot be resized"]);
    }
}
