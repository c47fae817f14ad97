//! The `secret` volume's payload (upstream `pkg/volume/secret` `MakePayload`): every key of
//! `data`, or only the listed `items` at their paths. A listed key that does not exist
//! fails the volume unless it is `optional`. Secret volumes live on tmpfs so that their
//! content never reaches the node's disk (see the volume manager).

use k8s_openapi::api::core::v1::{KeyToPath, Secret};

use super::atomic_writer::{Payload, key_payload};

/// Upstream `SecretVolumeSourceDefaultMode`.
pub const DEFAULT_MODE: u32 = 0o644;

/// A listed key is not in `data`.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("references non-existent secret key: {key}")]
pub struct MissingKey {
    /// The key.
    pub key: String,
}

/// The files of a Secret volume (or projection). `stringData` is write-only in the API and
/// never read back; only `data` counts.
pub fn make_payload(
    items: &[KeyToPath],
    secret: &Secret,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, MissingKey> {
    let data = secret.data.as_ref();
    let all = data.into_iter().flatten().map(|(k, v)| (k, v.0.clone()));
    let lookup = |key: &str| data.and_then(|d| d.get(key)).map(|v| v.0.clone());
    key_payload(items, all, lookup, default_mode, optional).map_err(|key| MissingKey { key })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volumes::atomic_writer::FileProjection;

    fn secret() -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s", "namespace": "ns"},
            "data": {"user": "YWRtaW4=", "pass": "czNjcjN0"}
        }))
        .unwrap()
    }

    #[test]
    fn all_keys_decoded() {
        let p = make_payload(&[], &secret(), DEFAULT_MODE, false).unwrap();
        assert_eq!(p["user"].data, b"admin");
        assert_eq!(p["pass"], FileProjection::new("s3cr3t", 0o644));
    }

    #[test]
    fn items_and_missing_keys() {
        let item = |k: &str, p: &str| KeyToPath { key: k.into(), path: p.into(), mode: Some(0o400), user: None };
        let p = make_payload(&[item("user", "u")], &secret(), DEFAULT_MODE, false).unwrap();
        assert_eq!(p["u"], FileProjection::new("admin", 0o400));
        let err = make_payload(&[item("nope", "n")], &secret(), DEFAULT_MODE, false).unwrap_err();
        assert_eq!(err.to_string(), "references non-existent secret key: nope");
        assert!(make_payload(&[item("nope", "n")], &secret(), DEFAULT_MODE, true).unwrap().is_empty());
    }
}
