//! The `configMap` volume's payload (upstream `pkg/volume/configmap` `MakePayload`): every
//! key of `data` and `binaryData` as a file, or only the listed `items` at their paths.
//! A listed key that does not exist fails the volume unless it is `optional`.

use k8s_openapi::api::core::v1::{ConfigMap, KeyToPath};

use super::atomic_writer::{Payload, key_payload};

/// Upstream `ConfigMapVolumeSourceDefaultMode`.
pub const DEFAULT_MODE: u32 = 0o644;

/// A listed key is in neither `data` nor `binaryData`.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("configmap references non-existent config key: {key}")]
pub struct MissingKey {
    /// The key.
    pub key: String,
}

/// The files of a `ConfigMap` volume (or projection).
pub fn make_payload(
    items: &[KeyToPath],
    config_map: &ConfigMap,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, MissingKey> {
    let data = config_map.data.as_ref();
    let binary = config_map.binary_data.as_ref();
    // `binaryData` after `data`: a key in both is the binary one, as upstream.
    let all = data.into_iter().flatten().map(|(k, v)| (k, v.as_bytes().to_vec()));
    let all = all.chain(binary.into_iter().flatten().map(|(k, v)| (k, v.0.clone())));
    let lookup = |key: &str| {
        data.and_then(|d| d.get(key))
            .map(|v| v.as_bytes().to_vec())
            .or_else(|| binary.and_then(|d| d.get(key)).map(|v| v.0.clone()))
    };
    key_payload(items, all, lookup, default_mode, optional).map_err(|key| MissingKey { key })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volumes::atomic_writer::FileProjection;

    fn cm() -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns"},
            "data": {"a": "1", "b": "2"},
            "binaryData": {"bin": "AAEC"}
        }))
        .unwrap()
    }

    fn item(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath { key: key.into(), path: path.into(), mode, user: None }
    }

    #[test]
    fn all_keys_by_default() {
        let p = make_payload(&[], &cm(), DEFAULT_MODE, false).unwrap();
        assert_eq!(p.keys().collect::<Vec<_>>(), ["a", "b", "bin"]);
        assert_eq!(p["bin"].data, vec![0, 1, 2]);
        assert_eq!(p["a"].mode, 0o644);
    }

    #[test]
    fn items_select_and_rename_with_modes() {
        let p = make_payload(&[item("a", "dir/x", Some(0o400)), item("bin", "y", None)], &cm(), 0o440, false).unwrap();
        assert_eq!(p.keys().collect::<Vec<_>>(), ["dir/x", "y"]);
        assert_eq!(p["dir/x"], FileProjection::new("1", 0o400));
        assert_eq!(p["y"].mode, 0o440);
    }

    #[test]
    fn missing_key_required_or_optional() {
        let err = make_payload(&[item("zz", "z", None)], &cm(), DEFAULT_MODE, false).unwrap_err();
        assert_eq!(err.to_string(), "configmap references non-existent config key: zz");
        let p = make_payload(&[item("zz", "z", None), item("a", "a", None)], &cm(), DEFAULT_MODE, true).unwrap();
        assert_eq!(p.len(), 1);
    }
}
