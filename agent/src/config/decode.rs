//! Decoding a kubelet config file (YAML or JSON) into a defaulted [`KubeletConfiguration`],
//! reporting every problem of the file at once: wrong `kind`/`apiVersion`, unknown fields
//! (with their paths) and values of the wrong type.
//!
//! The file is first read into a `serde_json::Value`, so each top-level field can be
//! decoded on its own: serde stops at the first error, and a typo in one field should not
//! hide a bad value in another.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::kubelet_configuration::KubeletConfiguration;
use crate::types::duration::GoDuration;

/// The only `apiVersion` accepted.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The only `kind` accepted.
pub const KIND: &str = "KubeletConfiguration";

/// What decoding a file produced.
#[derive(Debug)]
pub(crate) struct Decoded {
    /// The configuration, unless a value of the wrong type made it impossible to build.
    pub config: Option<KubeletConfiguration>,
    /// Every problem found, one line each (`path: message`).
    pub problems: Vec<String>,
}

/// Why the text is not a YAML/JSON document at all.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct SyntaxError(String);

/// Decodes the text of a config file. JSON is recognised by its leading `{`; anything else
/// is read as YAML.
pub(crate) fn decode(text: &str) -> Result<Decoded, SyntaxError> {
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Err(SyntaxError("the file is empty".to_owned()));
    }
    let value: Value = if trimmed.starts_with('{') {
        serde_json::from_str(text).map_err(|e| SyntaxError(format!("invalid JSON: {e}")))?
    } else {
        serde_saphyr::from_str(text).map_err(|e| SyntaxError(format!("invalid YAML: {e}")))?
    };
    let Value::Object(mut object) = strip_nulls(value) else {
        return Err(SyntaxError("expected a KubeletConfiguration object at the top level".to_owned()));
    };
    let mut problems = Vec::new();
    check_type_meta(&mut object, "apiVersion", API_VERSION, &mut problems);
    check_type_meta(&mut object, "kind", KIND, &mut problems);

    let mut type_errors = false;
    for (key, value) in &object {
        let single = Value::Object(Map::from_iter([(key.clone(), value.clone())]));
        if let Err(problem) = decode_checked(single, &mut problems) {
            problems.push(problem);
            type_errors = true;
        }
    }
    let config = if type_errors {
        None
    } else {
        let update_given = object.contains_key("nodeStatusUpdateFrequency");
        let report_given = object.contains_key("nodeStatusReportFrequency");
        let serialize_given = object.contains_key("serializeImagePulls");
        let mut config =
            KubeletConfiguration::deserialize(Value::Object(object)).expect("every field decoded on its own above");
        // Defaults that depend on other fields (defaults.go).
        if !report_given || config.node_status_report_frequency.is_zero() {
            config.node_status_report_frequency = if update_given && !config.node_status_update_frequency.is_zero() {
                config.node_status_update_frequency
            } else {
                GoDuration::from_mins(5)
            };
        }
        if !serialize_given {
            config.serialize_image_pulls = config.max_parallel_image_pulls.is_none_or(|n| n < 2);
        }
        config.default_zero_values();
        Some(config)
    };
    Ok(Decoded { config, problems })
}

/// Decodes `value` while recording unknown fields into `problems`; a type error comes back
/// as `Err` with its path.
fn decode_checked(value: Value, problems: &mut Vec<String>) -> Result<(), String> {
    let mut track = serde_path_to_error::Track::new();
    let tracked = serde_path_to_error::Deserializer::new(value, &mut track);
    let result: Result<KubeletConfiguration, _> = serde_ignored::deserialize(tracked, |path| {
        problems.push(format!("unknown field {:?}", field_path(&path)));
    });
    result.map(drop).map_err(|error| format!("{}: {error}", track.path()))
}

/// `a.b[0].c`, the way field paths read in Kubernetes errors.
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => {
            let parent = field_path(parent);
            if parent.is_empty() { key.clone() } else { format!("{parent}.{key}") }
        }
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

fn check_type_meta(object: &mut Map<String, Value>, field: &str, expected: &str, problems: &mut Vec<String>) {
    match object.remove(field) {
        None => problems.push(format!("{field}: required value, must be {expected:?}")),
        Some(Value::String(found)) if found == expected => {}
        Some(Value::String(found)) => {
            problems.push(format!("{field}: unsupported value {found:?}, must be {expected:?}"));
        }
        Some(other) => problems.push(format!("{field}: must be the string {expected:?}, not {other}")),
    }
}

/// Go leaves a field at its zero value for an explicit `null`, which is what an absent
/// field means here too.
fn strip_nulls(value: Value) -> Value {
    match value {
        Value::Object(object) => {
            Value::Object(object.into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k, strip_nulls(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(strip_nulls).collect()),
        other => other,
    }
}
