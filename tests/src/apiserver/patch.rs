//! The patch types of `PATCH`: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and
//! strategic merge patch with the patch strategies and merge keys of the built-in types
//! (the `patchStrategy`/`patchMergeKey` tags of `k8s.io/api/core/v1/types.go`) and the
//! directives `CreateTwoWayMergePatch` emits (`$patch`, `$setElementOrder/<field>`,
//! `$deleteFromPrimitiveList/<field>`, `$retainKeys`), as apimachinery `strategicpatch`
//! applies them. A list without a merge strategy is replaced whole, as upstream
//! (so `status.containerStatuses` is replaced, while `status.conditions` merges by `type`).

use serde_json::{Map, Value};

use super::status::StatusError;

/// The patch types the server accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchType {
    pub(crate) fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or("").trim();
        Some(match base {
            "application/merge-patch+json" => Self::Merge,
            "application/json-patch+json" => Self::Json,
            "application/strategic-merge-patch+json" => Self::Strategic,
            "application/apply-patch+yaml" => Self::Apply,
            _ => return None,
        })
    }
}

/// RFC 7386.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// RFC 6902 (a failed `test` or a missing path is a 422, as upstream).
pub(crate) fn json_patch(target: &mut Value, patch: &Value) -> Result<(), StatusError> {
    let p: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| StatusError::bad_request(format!("error decoding patch: {e}")))?;
    json_patch::patch(target, &p).map_err(|e| {
        StatusError::new(422, "Invalid", format!("the server rejected our request due to an error in our request: {e}"))
    })
}

/// How a list field merges in a strategic merge patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListStrategy {
    Replace,
    /// Lists of objects merged by a key field.
    MergeKey(&'static str),
    /// Lists of scalars merged as a set.
    MergePrimitive,
}

/// The `patchStrategy:"merge"` fields of the kinds the double serves, by path of field
/// names from the object root (list indices left out).
fn list_strategy(kind: &str, path: &[String]) -> ListStrategy {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    match p.as_slice() {
        ["metadata", "finalizers"] => return ListStrategy::MergePrimitive,
        ["metadata", "ownerReferences"] => return ListStrategy::MergeKey("uid"),
        _ => {}
    }
    match (kind, p.as_slice()) {
        (
            "Pod",
            [
                "spec",
                "containers"
                | "initContainers"
                | "ephemeralContainers"
                | "volumes"
                | "imagePullSecrets"
                | "resourceClaims"
                | "schedulingGates",
            ]
            | ["spec", "containers" | "initContainers" | "ephemeralContainers", "env"]
            | ["status", "resourceClaimStatuses"],
        ) => ListStrategy::MergeKey("name"),
        ("Pod", ["spec", "containers" | "initContainers" | "ephemeralContainers", "ports"]) => {
            ListStrategy::MergeKey("containerPort")
        }
        ("Pod", ["spec", "containers" | "initContainers" | "ephemeralContainers", "volumeMounts"]) => {
            ListStrategy::MergeKey("mountPath")
        }
        ("Pod", ["spec", "containers" | "initContainers" | "ephemeralContainers", "volumeDevices"]) => {
            ListStrategy::MergeKey("devicePath")
        }
        ("Pod", ["spec", "hostAliases"] | ["status", "podIPs" | "hostIPs"]) => ListStrategy::MergeKey("ip"),
        ("Pod", ["spec", "topologySpreadConstraints"]) => ListStrategy::MergeKey("topologyKey"),
        ("Pod" | "Node" | "Namespace", ["status", "conditions"]) | ("Node", ["status", "addresses"]) => {
            ListStrategy::MergeKey("type")
        }
        ("Node", ["spec", "podCIDRs"]) => ListStrategy::MergePrimitive,
        _ => ListStrategy::Replace,
    }
}

/// Applies a strategic merge patch to `target` (an object of `kind`).
pub(crate) fn strategic_merge(target: &mut Value, patch: &Value, kind: &str) -> Result<(), StatusError> {
    let Some(p) = patch.as_object() else {
        return Err(StatusError::bad_request("strategic merge patch must be a JSON object"));
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    merge_map(target.as_object_mut().expect("object"), p, &mut Vec::new(), kind)
}

fn directive(v: &Value) -> Option<&str> {
    v.get("$patch").and_then(Value::as_str)
}

/// A patch value with its directives removed (what lands in the object when there is
/// nothing to merge with).
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(a) => {
            Value::Array(a.iter().filter(|e| !matches!(directive(e), Some("delete" | "replace"))).map(strip).collect())
        }
        other => other.clone(),
    }
}

fn merge_map(
    target: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    fields: &mut Vec<String>,
    kind: &str,
) -> Result<(), StatusError> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *target = strip(&Value::Object(patch.clone())).as_object().cloned().unwrap_or_default();
            return Ok(());
        }
        Some("delete") => {
            target.clear();
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => return Err(StatusError::bad_request(format!("unknown patch type: {other}"))),
    }
    let mut orders: Vec<(&str, &Vec<Value>)> = Vec::new();
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$setElementOrder/") {
            if let Some(list) = v.as_array() {
                orders.push((field, list));
            }
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(cur)), Some(del)) = (target.get_mut(field), v.as_array()) {
                cur.retain(|x| !del.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            target.remove(k);
            continue;
        }
        fields.push(k.clone());
        match (target.get_mut(k), v) {
            (Some(Value::Object(cur)), Value::Object(pm)) => {
                if directive(v) == Some("delete") {
                    target.remove(k);
                } else {
                    merge_map(cur, pm, fields, kind)?;
                }
            }
            (Some(Value::Array(cur)), Value::Array(pl)) => merge_list(cur, pl, fields, kind)?,
            (_, Value::Object(_)) if directive(v) == Some("delete") => {
                target.remove(k);
            }
            _ => {
                target.insert(k.clone(), strip(v));
            }
        }
        fields.pop();
    }
    for (field, order) in orders {
        fields.push(field.to_string());
        let strategy = list_strategy(kind, fields);
        fields.pop();
        if let Some(Value::Array(cur)) = target.get_mut(field) {
            reorder(cur, order, strategy);
        }
    }
    if let Some(Value::Array(keep)) = patch.get("$retainKeys") {
        target.retain(|k, _| keep.iter().any(|x| x.as_str() == Some(k)));
    }
    Ok(())
}

fn merge_list(cur: &mut Vec<Value>, patch: &[Value], fields: &mut Vec<String>, kind: &str) -> Result<(), StatusError> {
    match list_strategy(kind, fields) {
        ListStrategy::Replace => {
            *cur = patch.iter().filter(|e| directive(e).is_none()).map(strip).collect();
        }
        ListStrategy::MergePrimitive => {
            for v in patch {
                if !cur.contains(v) {
                    cur.push(v.clone());
                }
            }
        }
        ListStrategy::MergeKey(key) => {
            if patch.iter().any(|e| directive(e) == Some("replace")) {
                *cur = patch.iter().filter(|e| directive(e).is_none()).map(strip).collect();
                return Ok(());
            }
            for e in patch {
                let Some(pm) = e.as_object() else {
                    return Err(StatusError::bad_request(format!(
                        "strategic merge patch: element of {} is not an object",
                        fields.join(".")
                    )));
                };
                let Some(kv) = pm.get(key) else {
                    return Err(StatusError::bad_request(format!(
                        "map: {e} does not contain declared merge key: {key}"
                    )));
                };
                let pos = cur.iter().position(|c| c.get(key) == Some(kv));
                match (directive(e), pos) {
                    (Some("delete"), Some(_)) => cur.retain(|c| c.get(key) != Some(kv)),
                    (Some("delete"), None) => {}
                    (_, Some(i)) => {
                        let target = &mut cur[i];
                        if !target.is_object() {
                            *target = Value::Object(Map::new());
                        }
                        merge_map(target.as_object_mut().expect("object"), pm, fields, kind)?;
                    }
                    (_, None) => cur.push(strip(e)),
                }
            }
        }
    }
    Ok(())
}

/// `$setElementOrder`: the patch's order for the elements it names; elements the patch
/// does not name keep their server positions relative to the others.
fn reorder(cur: &mut Vec<Value>, order: &[Value], strategy: ListStrategy) {
    let key_of = |v: &Value| -> Value {
        match strategy {
            ListStrategy::MergeKey(k) => v.get(k).cloned().unwrap_or(Value::Null),
            _ => v.clone(),
        }
    };
    let wanted: Vec<Value> = order.iter().map(&key_of).collect();
    let items = std::mem::take(cur);
    let mut ordered: Vec<Value> = Vec::new();
    for w in &wanted {
        if let Some(item) = items.iter().find(|i| key_of(i) == *w) {
            ordered.push(item.clone());
        }
    }
    let server_only: Vec<(usize, Value)> =
        items.iter().enumerate().filter(|(_, i)| !wanted.contains(&key_of(i))).map(|(n, i)| (n, i.clone())).collect();
    let mut out = Vec::with_capacity(items.len());
    let mut so = server_only.into_iter().peekable();
    for item in ordered {
        while let Some((idx, _)) = so.peek() {
            if *idx <= out.len() {
                out.push(so.next().expect("peeked").1);
            } else {
                break;
            }
        }
        out.push(item);
    }
    out.extend(so.map(|(_, v)| v));
    *cur = out;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conditions_merge_by_type_and_container_statuses_replace() {
        let mut pod = json!({"status": {
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "a", "ready": false}, {"name": "b", "ready": false}],
        }});
        let patch = json!({"status": {
            "$setElementOrder/conditions": [{"type": "PodScheduled"}, {"type": "Ready"}],
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "a", "ready": true}],
        }});
        strategic_merge(&mut pod, &patch, "Pod").unwrap();
        assert_eq!(
            pod["status"]["conditions"],
            json!([{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}])
        );
        assert_eq!(pod["status"]["containerStatuses"], json!([{"name": "a", "ready": true}]));
    }

    #[test]
    fn delete_directive_and_primitive_lists() {
        let mut node = json!({"metadata": {"finalizers": ["a"]}, "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "n"}],
        }});
        let patch = json!({"metadata": {"finalizers": ["b"]}, "status": {
            "addresses": [{"type": "Hostname", "$patch": "delete"}],
        }});
        strategic_merge(&mut node, &patch, "Node").unwrap();
        assert_eq!(node["status"]["addresses"], json!([{"type": "InternalIP", "address": "10.0.0.1"}]));
        assert_eq!(node["metadata"]["finalizers"], json!(["a", "b"]));
        let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}});
        strategic_merge(&mut node, &patch, "Node").unwrap();
        assert_eq!(node["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn merge_patch_nulls_delete() {
        let mut v = json!({"a": 1, "b": {"c": 2, "d": 3}});
        merge_patch(&mut v, &json!({"a": null, "b": {"c": 5}}));
        assert_eq!(v, json!({"b": {"c": 5, "d": 3}}));
    }
}
