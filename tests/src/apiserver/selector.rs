//! Label and field selectors: the query-string grammar of apimachinery `pkg/labels` and
//! `pkg/fields`, and the selectable fields each resource exposes (the registries'
//! `ToSelectableFields` / `GetAttrs`). An unsupported field is a 400, as upstream.

use serde_json::Value;

use super::meta;
use super::resources::ResourceInfo;
use super::status::StatusError;

#[derive(Clone, Debug, PartialEq, Eq)]
enum LabelOp {
    Exists,
    DoesNotExist,
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Gt(i64),
    Lt(i64),
}

/// A parsed label selector: every requirement must hold.
#[derive(Clone, Debug, Default)]
pub(crate) struct LabelSelector {
    reqs: Vec<(String, LabelOp)>,
}

impl LabelSelector {
    pub(crate) fn parse(s: &str) -> Result<Self, StatusError> {
        let mut reqs = Vec::new();
        for term in split_top_level(s) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            reqs.push(parse_requirement(term).ok_or_else(|| {
                StatusError::bad_request(format!("unable to parse requirement: invalid label selector: {term:?}"))
            })?);
        }
        Ok(Self { reqs })
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels = meta::labels(obj);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|(k, op)| {
            let v = get(k);
            match op {
                LabelOp::Exists => v.is_some(),
                LabelOp::DoesNotExist => v.is_none(),
                LabelOp::Equals(want) => v == Some(want.as_str()),
                LabelOp::NotEquals(want) => v != Some(want.as_str()),
                LabelOp::In(set) => v.is_some_and(|v| set.iter().any(|s| s == v)),
                LabelOp::NotIn(set) => v.is_none_or(|v| !set.iter().any(|s| s == v)),
                LabelOp::Gt(n) => v.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v > *n),
                LabelOp::Lt(n) => v.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v < *n),
            }
        })
    }
}

/// Splits on commas outside parentheses (`a in (x,y),b`).
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0u32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        && k.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63 && v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_set(rest: &str) -> Option<Vec<String>> {
    let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
    let vals: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    vals.iter().all(|v| valid_value(v)).then_some(vals)
}

fn parse_requirement(term: &str) -> Option<(String, LabelOp)> {
    if let Some(k) = term.strip_prefix('!') {
        let k = k.trim();
        return valid_key(k).then(|| (k.to_string(), LabelOp::DoesNotExist));
    }
    for (sep, ctor) in [("!=", 0), ("==", 1), ("=", 1), (">", 2), ("<", 3)] {
        if let Some((k, v)) = term.split_once(sep) {
            let (k, v) = (k.trim(), v.trim());
            if !valid_key(k) {
                return None;
            }
            return match ctor {
                0 => valid_value(v).then(|| (k.to_string(), LabelOp::NotEquals(v.to_string()))),
                1 => valid_value(v).then(|| (k.to_string(), LabelOp::Equals(v.to_string()))),
                2 => v.parse().ok().map(|n| (k.to_string(), LabelOp::Gt(n))),
                _ => v.parse().ok().map(|n| (k.to_string(), LabelOp::Lt(n))),
            };
        }
    }
    let mut words = term.splitn(2, char::is_whitespace);
    let key = words.next()?.trim();
    let rest = words.next().unwrap_or("").trim();
    if !valid_key(key) {
        return None;
    }
    if rest.is_empty() {
        return Some((key.to_string(), LabelOp::Exists));
    }
    if let Some(set) = rest.strip_prefix("notin") {
        return parse_set(set).map(|s| (key.to_string(), LabelOp::NotIn(s)));
    }
    if let Some(set) = rest.strip_prefix("in") {
        return parse_set(set).map(|s| (key.to_string(), LabelOp::In(s)));
    }
    None
}

/// A parsed field selector: `key=value`, `key==value`, `key!=value`, comma-separated.
#[derive(Clone, Debug, Default)]
pub(crate) struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses and checks every key against the fields `info` can select on; field labels
    /// of events.k8s.io are converted to the stored (core) names, as upstream does.
    pub(crate) fn parse(s: &str, info: &ResourceInfo) -> Result<Self, StatusError> {
        let mut reqs = Vec::new();
        for term in split_unescaped(s, ',') {
            if term.is_empty() {
                continue;
            }
            let (key, eq, value) = if let Some((k, v)) = split_op(&term, "!=") {
                (k, false, v)
            } else if let Some((k, v)) = split_op(&term, "==") {
                (k, true, v)
            } else if let Some((k, v)) = split_op(&term, "=") {
                (k, true, v)
            } else {
                return Err(StatusError::bad_request(format!("invalid selector: '{s}'; can't understand '{term}'")));
            };
            let key = convert_field_label(info, key.trim())
                .ok_or_else(|| StatusError::bad_request(format!("field label not supported: {}", key.trim())))?;
            reqs.push((key, eq, unescape(&value)));
        }
        Ok(Self { reqs })
    }

    pub(crate) fn matches(&self, info: &ResourceInfo, obj: &Value) -> bool {
        self.reqs.iter().all(|(k, eq, v)| {
            let actual = field_value(info, obj, k);
            (actual == *v) == *eq
        })
    }
}

fn split_op(term: &str, op: &str) -> Option<(String, String)> {
    // The operator is the first unescaped occurrence.
    let bytes = term.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if term[i..].starts_with(op) {
            // "=" must not match the "=" of "!=" or "==".
            if op == "=" && (i > 0 && bytes[i - 1] == b'!') {
                i += 1;
                continue;
            }
            return Some((term[..i].to_string(), term[i + op.len()..].to_string()));
        }
        i += 1;
    }
    None
}

fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            cur.push(c);
            if let Some(n) = chars.next() {
                cur.push(n);
            }
        } else if c == sep {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The stored field name for a selector key, or None if `info` cannot select on it.
fn convert_field_label(info: &ResourceInfo, key: &str) -> Option<String> {
    if info.group == "events.k8s.io" {
        let core = match key {
            "regarding.kind" => "involvedObject.kind",
            "regarding.namespace" => "involvedObject.namespace",
            "regarding.name" => "involvedObject.name",
            "regarding.uid" => "involvedObject.uid",
            "regarding.apiVersion" => "involvedObject.apiVersion",
            "regarding.resourceVersion" => "involvedObject.resourceVersion",
            "regarding.fieldPath" => "involvedObject.fieldPath",
            "reportingController" => "reportingComponent",
            "deprecatedSource" => "source",
            "metadata.name" | "metadata.namespace" | "reason" | "type" => key,
            _ => return None,
        };
        return Some(core.to_string());
    }
    let supported: &[&str] = match info.storage {
        "pods" => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        "nodes" => &["spec.unschedulable"],
        "namespaces" => &["status.phase"],
        "secrets" => &["type"],
        "certificatesigningrequests.certificates.k8s.io" => &["spec.signerName"],
        "events" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        _ => &[],
    };
    let ok = key == "metadata.name" || (key == "metadata.namespace" && info.namespaced) || supported.contains(&key);
    ok.then(|| key.to_string())
}

/// The value of a selectable field of a stored object.
fn field_value(info: &ResourceInfo, obj: &Value, key: &str) -> String {
    let s = |path: &[&str]| meta::str_at(obj, path).to_string();
    match key {
        "metadata.name" => meta::name(obj).to_string(),
        "metadata.namespace" => meta::namespace(obj).to_string(),
        "spec.hostNetwork" | "spec.unschedulable" => {
            let field = key.trim_start_matches("spec.");
            obj.pointer(&format!("/spec/{field}")).and_then(Value::as_bool).unwrap_or(false).to_string()
        }
        "status.podIP" => obj
            .pointer("/status/podIPs/0/ip")
            .and_then(Value::as_str)
            .or_else(|| obj.pointer("/status/podIP").and_then(Value::as_str))
            .unwrap_or("")
            .to_string(),
        "type" if info.storage == "secrets" => s(&["type"]),
        "source" => s(&["source", "component"]),
        _ => {
            let path: Vec<&str> = key.split('.').collect();
            s(&path)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_grammar() {
        let obj = json!({"metadata": {"labels": {"app": "web", "tier": "fe", "n": "5"}}});
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&obj);
        assert!(m("app=web"));
        assert!(m("app==web,tier"));
        assert!(!m("app!=web"));
        assert!(m("app in (web, db)"));
        assert!(!m("app notin (web,db)"));
        assert!(m("missing notin (x)"));
        assert!(m("!missing"));
        assert!(!m("!app"));
        assert!(m("n>4,n<6"));
        assert!(m(""));
        assert!(LabelSelector::parse("a in b").is_err());
    }
}
