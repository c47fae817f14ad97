//! One stored object, two API versions: events are stored once (as core/v1 events, like
//! the real server's single `events` storage) and served at `events.k8s.io/v1` through
//! the upstream conversion (`pkg/apis/events/v1/conversion.go`): `regarding` is
//! `involvedObject`, `note` is `message`, `reportingController` is `reportingComponent`,
//! `deprecated*` are the old fields.

use serde_json::{Map, Value, json};

use super::resources::ResourceInfo;

/// (events.k8s.io field, core field).
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

fn rename(obj: &Value, to_core: bool) -> Value {
    let Some(m) = obj.as_object() else { return obj.clone() };
    let mut out = Map::new();
    for (k, v) in m {
        let renamed = EVENT_FIELDS
            .iter()
            .find(|(ev, core)| if to_core { ev == k } else { core == k })
            .map(|(ev, core)| if to_core { *core } else { *ev });
        out.insert(renamed.unwrap_or(k).to_string(), v.clone());
    }
    Value::Object(out)
}

/// The stored form of an object received at `info`: without `kind` and `apiVersion`
/// (the storage knows them), in the stored version's field names.
pub(crate) fn to_storage(info: &ResourceInfo, obj: Value) -> Value {
    let mut obj = if info.group == "events.k8s.io" { rename(&obj, true) } else { obj };
    if let Some(m) = obj.as_object_mut() {
        m.remove("kind");
        m.remove("apiVersion");
    }
    obj
}

/// The form of a stored object served at `info` (with `apiVersion` and `kind`).
pub(crate) fn to_view(info: &ResourceInfo, obj: &Value) -> Value {
    let mut v = if info.group == "events.k8s.io" { rename(obj, false) } else { obj.clone() };
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), json!(info.api_version()));
        m.insert("kind".into(), json!(info.kind));
    }
    v
}
