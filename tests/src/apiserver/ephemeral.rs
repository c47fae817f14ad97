//! The `pods/<name>/ephemeralcontainers` subresource (upstream
//! `podEphemeralContainersStrategy` in `pkg/registry/core/pod/strategy.go`,
//! `ValidatePodEphemeralContainersUpdate` and `validateEphemeralContainers` in
//! `pkg/apis/core/validation`), what `kubectl debug` patches (a strategic merge patch
//! that adds one entry to `spec.ephemeralContainers`, merged by name).
//!
//! `PrepareForUpdate` keeps the stored pod and takes from the request only
//! `spec.ephemeralContainers` (`dropNonEphemeralContainerUpdates`: the request's labels,
//! annotations, status and other spec fields are dropped silently); a changed spec bumps
//! `metadata.generation`. Validation then refuses what upstream refuses: static (mirror)
//! pods; an ephemeral container without a name (or whose name is not a DNS label) or an
//! image; a name another container of the pod (of any kind) has; a `targetContainerName`
//! that is not one of the pod's containers or init containers; the fields an ephemeral
//! container cannot have (`ports`, `resources`, `resizePolicy`, `restartPolicy`, probes,
//! `lifecycle`), and `subPath` / `subPathExpr` mounts; and the removal or any change of
//! an ephemeral container already there. Conflicts on a stale `resourceVersion` come
//! from the shared update path, and so do the new resourceVersion and the watch event.
//!
//! Not checked (upstream does): the rest of the pod spec's validation (volume mounts that
//! name no volume, environment variables, security contexts, ...). The message of a
//! changed container ends in a list of the changed fields, not in go-cmp's diff.

use serde_json::{Value, json};

use super::meta;
use super::status::FieldError;

/// The annotation of mirror pods (`kubernetes.io/config.mirror`).
const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// What ephemeral containers cannot have (upstream `allowedEphemeralContainerFields`
/// maps them to false), in the order of the container type's fields.
const FORBIDDEN_FIELDS: [&str; 8] = [
    "ports",
    "resources",
    "resizePolicy",
    "restartPolicy",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
];
/// The detail of upstream's errors for those fields.
const CANNOT_BE_SET: &str = "cannot be set for an Ephemeral Container";

fn list<'a>(pod: &'a Value, field: &str) -> &'a [Value] {
    pod.pointer(&format!("/spec/{field}")).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn name_of(c: &Value) -> &str {
    c.get("name").and_then(Value::as_str).unwrap_or("")
}

/// `dropNonEphemeralContainerUpdates`: `old` with the request's ephemeral containers (and
/// its resourceVersion, which decides conflicts).
fn drop_non_ephemeral_container_updates(new: &Value, old: &Value) -> Value {
    let mut out = old.clone();
    match meta::meta(new).get("resourceVersion").cloned() {
        Some(rv) => meta::meta_mut(&mut out).insert("resourceVersion".into(), rv),
        None => meta::meta_mut(&mut out).remove("resourceVersion"),
    };
    let wanted = new.pointer("/spec/ephemeralContainers").filter(|v| !v.is_null()).cloned();
    let spec = meta::ensure_object(meta::ensure_object(&mut out).entry("spec").or_insert_with(|| json!({})));
    match wanted {
        Some(v) => spec.insert("ephemeralContainers".into(), v),
        None => spec.remove("ephemeralContainers"),
    };
    out
}

/// Whether a field is set, as Go's comparison with the zero value sees it after decoding:
/// present and not null (an empty list or map decodes to a non-nil value); `resources`
/// is a struct, set when any of its fields is.
fn is_set(c: &Value, field: &str) -> bool {
    match c.get(field) {
        None | Some(Value::Null) => false,
        Some(Value::Object(m)) if field == "resources" => m.values().any(|v| !v.is_null()),
        Some(_) => true,
    }
}

/// `validateEphemeralContainers` (the part the double checks) for `pod`'s list.
fn validate_ephemeral_containers(pod: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let others: Vec<&str> = list(pod, "containers").iter().chain(list(pod, "initContainers")).map(name_of).collect();
    let mut all: std::collections::HashSet<&str> = others.iter().copied().collect();
    for (i, ec) in list(pod, "ephemeralContainers").iter().enumerate() {
        let path = format!("spec.ephemeralContainers[{i}]");
        let name = name_of(ec);
        if name.is_empty() {
            errs.push(FieldError::required(format!("{path}.name"), ""));
        } else if !meta::is_dns1123_label(name) {
            errs.push(FieldError::invalid(
                format!("{path}.name"),
                json!(name),
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'",
            ));
        }
        if ec.get("image").and_then(Value::as_str).unwrap_or("").is_empty() {
            errs.push(FieldError::required(format!("{path}.image"), ""));
        }
        if !all.insert(name) {
            errs.push(FieldError::duplicate(format!("{path}.name"), json!(name)));
        }
        let target = ec.get("targetContainerName").and_then(Value::as_str).unwrap_or("");
        if !target.is_empty() && !others.contains(&target) {
            errs.push(FieldError::not_found(format!("{path}.targetContainerName"), json!(target)));
        }
        for field in FORBIDDEN_FIELDS {
            if is_set(ec, field) {
                errs.push(FieldError::forbidden(format!("{path}.{field}"), CANNOT_BE_SET));
            }
        }
        for (j, m) in ec.get("volumeMounts").and_then(Value::as_array).into_iter().flatten().enumerate() {
            for field in ["subPath", "subPathExpr"] {
                if m.get(field).and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
                    errs.push(FieldError::forbidden(format!("{path}.volumeMounts[{j}].{field}"), CANNOT_BE_SET));
                }
            }
        }
    }
    errs
}

/// The top-level fields in which two ephemeral containers differ, for the error message.
fn changed_fields(old: &Value, new: &Value) -> Vec<String> {
    let (empty_old, empty_new) = (serde_json::Map::new(), serde_json::Map::new());
    let o = old.as_object().unwrap_or(&empty_old);
    let n = new.as_object().unwrap_or(&empty_new);
    let mut keys: Vec<&String> = o.keys().chain(n.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter().filter(|k| o.get(*k) != n.get(*k)).cloned().collect()
}

/// `podEphemeralContainersStrategy.PrepareForUpdate` and `ValidateUpdate`: turns the
/// request `new` into the pod to store (or the field errors that refuse it).
///
/// # Errors
/// The field errors of `ValidatePodEphemeralContainersUpdate`.
pub(crate) fn prepare_and_validate(
    new: &mut Value,
    old: &Value,
    canonical: impl Fn(&Value) -> Value,
) -> Result<(), Vec<FieldError>> {
    *new = drop_non_ephemeral_container_updates(new, old);
    let mut errs = validate_ephemeral_containers(new);
    // Upstream answers a static pod with this error alone.
    if meta::meta(old).get("annotations").and_then(|a| a.get(MIRROR_POD_ANNOTATION)).is_some() {
        return Err(vec![FieldError::forbidden("", "static pods do not support ephemeral containers")]);
    }
    // Existing ephemeral containers may not change; a patch may reorder them.
    let news = list(new, "ephemeralContainers");
    for o in list(old, "ephemeralContainers") {
        let name = name_of(o);
        match news.iter().find(|n| name_of(n) == name) {
            None => errs.push(FieldError::forbidden(
                "spec.ephemeralContainers",
                format!("existing ephemeral containers {name:?} may not be removed\n"),
            )),
            Some(n) if canonical(n) != canonical(o) => errs.push(FieldError::forbidden(
                "spec.ephemeralContainers",
                format!(
                    "existing ephemeral containers {name:?} may not be changed\nchanged: {}",
                    changed_fields(&canonical(o), &canonical(n)).join(", ")
                ),
            )),
            Some(_) => {}
        }
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    if canonical(&new["spec"]) != canonical(&old["spec"]) {
        let g = meta::meta(old).get("generation").and_then(Value::as_i64).unwrap_or(0);
        meta::meta_mut(new).insert("generation".into(), json!(g + 1));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Value {
        json!({
            "metadata": {"name": "p", "namespace": "default", "generation": 1, "resourceVersion": "5",
                         "labels": {"app": "web"}},
            "spec": {
                "initContainers": [{"name": "init", "image": "busybox"}],
                "containers": [{"name": "app", "image": "busybox"}],
            },
            "status": {"phase": "Running"},
        })
    }

    fn debugger(name: &str) -> Value {
        json!({"name": name, "image": "busybox", "targetContainerName": "app", "stdin": true, "tty": true,
               "resources": {}, "terminationMessagePolicy": "File"})
    }

    fn run(new: &mut Value, old: &Value) -> Result<(), Vec<String>> {
        prepare_and_validate(new, old, Clone::clone).map_err(|e| e.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn only_the_ephemeral_containers_of_the_request_are_taken() {
        let old = pod();
        let mut new = pod();
        new["spec"]["ephemeralContainers"] = json!([debugger("debug")]);
        new["spec"]["containers"][0]["image"] = json!("nginx");
        new["metadata"]["labels"] = json!({"app": "other"});
        new["status"] = json!({"phase": "Failed"});
        run(&mut new, &old).unwrap();
        assert_eq!(new["spec"]["ephemeralContainers"][0]["name"], "debug");
        assert_eq!(new["spec"]["containers"][0]["image"], "busybox");
        assert_eq!((&new["metadata"]["labels"]["app"], &new["status"]["phase"]), (&json!("web"), &json!("Running")));
        assert_eq!(new["metadata"]["generation"], 2);
        // The same again: nothing changes, no new generation.
        let stored = new.clone();
        let mut again = stored.clone();
        run(&mut again, &stored).unwrap();
        assert_eq!(again["metadata"]["generation"], 2);
    }

    #[test]
    fn names_targets_and_fields_are_validated() {
        let old = pod();
        let mut bad = debugger("app");
        bad["targetContainerName"] = json!("nope");
        bad["ports"] = json!([{"containerPort": 80}]);
        bad["resources"] = json!({"limits": {"cpu": "1"}});
        bad["readinessProbe"] = json!({"exec": {"command": ["true"]}});
        bad["lifecycle"] = json!({"preStop": {"exec": {"command": ["true"]}}});
        bad["volumeMounts"] = json!([{"name": "v", "mountPath": "/v", "subPath": "x"}]);
        let mut new = pod();
        new["spec"]["ephemeralContainers"] = json!([bad, debugger("init"), {"name": "Bad_Name"}]);
        assert_eq!(
            run(&mut new, &old).unwrap_err(),
            [
                "spec.ephemeralContainers[0].name: Duplicate value: \"app\"",
                "spec.ephemeralContainers[0].targetContainerName: Not found: \"nope\"",
                "spec.ephemeralContainers[0].ports: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[0].resources: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[0].readinessProbe: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[0].lifecycle: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[0].volumeMounts[0].subPath: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[1].name: Duplicate value: \"init\"",
                "spec.ephemeralContainers[2].name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'",
                "spec.ephemeralContainers[2].image: Required value",
            ]
        );
        // Targeting an init container is allowed; two debuggers of one name are not.
        let mut new = pod();
        let mut on_init = debugger("d1");
        on_init["targetContainerName"] = json!("init");
        new["spec"]["ephemeralContainers"] = json!([on_init, debugger("d2"), debugger("d2")]);
        assert_eq!(run(&mut new, &old).unwrap_err(), ["spec.ephemeralContainers[2].name: Duplicate value: \"d2\""]);
    }

    #[test]
    fn existing_ephemeral_containers_cannot_change_or_go() {
        let mut old = pod();
        old["spec"]["ephemeralContainers"] = json!([debugger("d1"), debugger("d2")]);
        // Reordered and one added: fine.
        let mut new = pod();
        new["spec"]["ephemeralContainers"] = json!([debugger("d2"), debugger("d1"), debugger("d3")]);
        run(&mut new, &old).unwrap();
        // Changed, and removed.
        let mut changed = debugger("d1");
        changed["image"] = json!("nginx");
        let mut new = pod();
        new["spec"]["ephemeralContainers"] = json!([changed]);
        assert_eq!(
            run(&mut new, &old).unwrap_err(),
            [
                "spec.ephemeralContainers: Forbidden: existing ephemeral containers \"d1\" may not be changed\nchanged: image",
                "spec.ephemeralContainers: Forbidden: existing ephemeral containers \"d2\" may not be removed\n",
            ]
        );
        // A request without the list removes them all: refused.
        let mut new = pod();
        assert_eq!(run(&mut new, &old).unwrap_err().len(), 2);
    }

    #[test]
    fn static_pods_do_not_support_ephemeral_containers() {
        let mut old = pod();
        old["metadata"]["annotations"] = json!({MIRROR_POD_ANNOTATION: "abc"});
        let mut new = old.clone();
        new["spec"]["ephemeralContainers"] = json!([debugger("debug")]);
        assert_eq!(run(&mut new, &old).unwrap_err(), [": Forbidden: static pods do not support ephemeral containers"]);
    }
}
