//! Small helpers over JSON objects: `metadata` access, time stamps in the API's formats,
//! UIDs and generated names.

use rand::Rng as _;
use serde_json::{Map, Value};

/// `metadata` of an object (an empty map if absent or not an object).
pub(crate) fn meta(obj: &Value) -> &Map<String, Value> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    obj.get("metadata").and_then(Value::as_object).unwrap_or_else(|| EMPTY.get_or_init(Map::new))
}

/// `metadata`, created if absent.
pub(crate) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    let o = ensure_object(obj);
    let m = o.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    ensure_object(m)
}

/// Turns `v` into an object if it is not one, and returns its map.
pub(crate) fn ensure_object(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    v.as_object_mut().expect("just made an object")
}

/// A string field of `metadata` ("" if absent).
pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    meta(obj).get(field).and_then(Value::as_str).unwrap_or("")
}

pub(crate) fn name(obj: &Value) -> &str {
    meta_str(obj, "name")
}

pub(crate) fn namespace(obj: &Value) -> &str {
    meta_str(obj, "namespace")
}

pub(crate) fn resource_version(obj: &Value) -> &str {
    meta_str(obj, "resourceVersion")
}

pub(crate) fn uid(obj: &Value) -> &str {
    meta_str(obj, "uid")
}

pub(crate) fn labels(obj: &Value) -> Option<&Map<String, Value>> {
    meta(obj).get("labels").and_then(Value::as_object)
}

pub(crate) fn finalizers(obj: &Value) -> usize {
    meta(obj).get("finalizers").and_then(Value::as_array).map_or(0, Vec::len)
}

pub(crate) fn deletion_grace(obj: &Value) -> Option<i64> {
    meta(obj).get("deletionGracePeriodSeconds").and_then(Value::as_i64)
}

pub(crate) fn has_deletion_timestamp(obj: &Value) -> bool {
    meta(obj).get("deletionTimestamp").is_some_and(|v| !v.is_null())
}

/// A string at a path of fields ("" if absent).
pub(crate) fn str_at<'a>(obj: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = obj;
    for p in path {
        match cur.get(p) {
            Some(v) => cur = v,
            None => return "",
        }
    }
    cur.as_str().unwrap_or("")
}

/// Now, as `metav1.Time` serializes it (RFC 3339, whole seconds, UTC).
pub(crate) fn now() -> String {
    time_string(jiff::Timestamp::now().as_second())
}

/// Unix seconds as `metav1.Time`.
pub(crate) fn time_string(unix_seconds: i64) -> String {
    jiff::Timestamp::from_second(unix_seconds).map(|t| t.to_string()).unwrap_or_default()
}

/// Parses `metav1.Time` to Unix seconds.
pub(crate) fn parse_time(s: &str) -> Option<i64> {
    s.parse::<jiff::Timestamp>().ok().map(jiff::Timestamp::as_second)
}

/// A random (version 4) UID, as the API server gives every object.
pub(crate) fn new_uid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex_string(&b);
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

pub(crate) fn hex_string(b: &[u8]) -> String {
    use std::fmt::Write as _;
    b.iter().fold(String::with_capacity(b.len() * 2), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

/// `names.SimpleNameGenerator`: the prefix and five random characters from the
/// alphabet without vowels and look-alikes.
pub(crate) fn generate_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    // The real generator truncates the prefix so the name stays within 63 characters.
    let prefix = if prefix.len() > 58 { &prefix[..58] } else { prefix };
    let suffix: String = (0..5).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect();
    format!("{prefix}{suffix}")
}

/// `IsDNS1123Subdomain`.
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_label_chars)
}

/// `IsDNS1123Label`.
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && is_label_chars(s)
}

fn is_label_chars(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}
