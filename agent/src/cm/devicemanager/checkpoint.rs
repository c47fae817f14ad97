//! The device manager's checkpoint, `<root-dir>/device-plugins/kubelet_internal_checkpoint`
//! (upstream `devicemanager/checkpoint`): which devices each container got (with the
//! plugin's `Allocate` answer, protobuf-encoded) and which devices each resource had, so
//! that running pods keep their devices across an agent restart.
//!
//! The JSON layout is upstream's (`{"Data": {"PodDeviceEntries": [...],
//! "RegisteredDevices": {...}}, "Checksum": N}`, `DeviceIDs` keyed by NUMA node, `-1`
//! for devices without topology, `AllocResp` base64). Deviation: upstream's checksum is
//! FNV-32a over a Go-specific dump of the structs; ours is FNV-32a over the compact JSON
//! of `Data`. A checkpoint written by the other implementation therefore fails the
//! checksum and is ignored, as upstream ignores any corrupt checkpoint.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One container's devices of one resource.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodDevicesEntry {
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    #[serde(rename = "ContainerName")]
    pub container_name: String,
    #[serde(rename = "ResourceName")]
    pub resource_name: String,
    /// Device ids per NUMA node (`-1`: no topology).
    #[serde(rename = "DeviceIDs")]
    pub device_ids: BTreeMap<i64, Vec<String>>,
    /// The plugin's `ContainerAllocateResponse`, protobuf-encoded.
    #[serde(rename = "AllocResp", serialize_with = "ser_b64", deserialize_with = "de_b64")]
    pub alloc_resp: Vec<u8>,
}

/// The checkpointed state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointData {
    /// `null` when empty, as Go writes a nil slice.
    #[serde(rename = "PodDeviceEntries")]
    pub pod_device_entries: Option<Vec<PodDevicesEntry>>,
    #[serde(rename = "RegisteredDevices")]
    pub registered_devices: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct File {
    #[serde(rename = "Data")]
    data: CheckpointData,
    #[serde(rename = "Checksum")]
    checksum: u64,
}

/// Why a checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the device manager checkpoint {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the device manager checkpoint {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("device manager checkpoint {path} is not valid: {reason}")]
    Corrupt { path: String, reason: String },
}

fn ser_b64<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
}

fn de_b64<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let s = Option::<String>::deserialize(d)?.unwrap_or_default();
    base64::engine::general_purpose::STANDARD.decode(s).map_err(serde::de::Error::custom)
}

/// FNV-32a (upstream's checkpoint hash) over our JSON of the data.
fn checksum(data: &CheckpointData) -> u64 {
    u64::from(crate::cm::checkpoint::fnv32a(&serde_json::to_vec(data).unwrap_or_default()))
}

/// Encodes `data` with its checksum.
#[must_use]
pub fn encode(data: &CheckpointData) -> Vec<u8> {
    serde_json::to_vec(&File { data: data.clone(), checksum: checksum(data) }).unwrap_or_default()
}

/// Decodes a checkpoint, checking its checksum.
///
/// # Errors
/// [`Error::Corrupt`] for bad JSON or a checksum mismatch.
pub fn decode(bytes: &[u8], path: &Path) -> Result<CheckpointData, Error> {
    let corrupt = |reason: String| Error::Corrupt { path: path.display().to_string(), reason };
    let f: File = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    if checksum(&f.data) != f.checksum {
        return Err(corrupt(format!("checksum {} does not match the data", f.checksum)));
    }
    Ok(f.data)
}

/// Writes `data` to `path` atomically (temporary file, then rename).
///
/// # Errors
/// [`Error::Write`].
pub fn write(path: &Path, data: &CheckpointData) -> Result<(), Error> {
    crate::cm::checkpoint::write_atomic(path, &encode(data))
        .map_err(|source| Error::Write { path: path.display().to_string(), source })
}

/// Reads the checkpoint at `path`; `None` when there is none.
///
/// # Errors
/// [`Error::Read`] or [`Error::Corrupt`].
pub fn read(path: &Path) -> Result<Option<CheckpointData>, Error> {
    match std::fs::read(path) {
        Ok(b) => decode(&b, path).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Read { path: path.display().to_string(), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CheckpointData {
        CheckpointData {
            pod_device_entries: Some(vec![PodDevicesEntry {
                pod_uid: "u1".into(),
                container_name: "c".into(),
                resource_name: "example.com/dev".into(),
                device_ids: BTreeMap::from([(-1, vec!["d0".into()]), (0, vec!["d1".into()])]),
                alloc_resp: vec![1, 2, 3],
            }]),
            registered_devices: BTreeMap::from([("example.com/dev".into(), vec!["d0".into(), "d1".into()])]),
        }
    }

    #[test]
    fn round_trips_in_upstreams_layout() {
        let bytes = encode(&sample());
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let e = &v["Data"]["PodDeviceEntries"][0];
        assert_eq!(e["PodUID"], "u1");
        assert_eq!(e["DeviceIDs"]["-1"][0], "d0");
        assert_eq!(e["AllocResp"], "AQID");
        assert_eq!(v["Data"]["RegisteredDevices"]["example.com/dev"][1], "d1");
        assert!(v["Checksum"].is_u64());
        assert_eq!(decode(&bytes, Path::new("x")).unwrap(), sample());
        let empty = encode(&CheckpointData::default());
        assert!(String::from_utf8(empty).unwrap().contains("\"PodDeviceEntries\":null"));
    }

    #[test]
    fn a_tampered_checkpoint_is_refused() {
        let text = String::from_utf8(encode(&sample())).unwrap().replace("\"c\"", "\"x\"");
        let e = decode(text.as_bytes(), Path::new("/cp")).unwrap_err().to_string();
        assert!(e.contains("/cp") && e.contains("checksum"), "{e}");
        assert!(decode(b"{", Path::new("/cp")).is_err());
    }

    #[test]
    fn file_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kubelet_internal_checkpoint");
        assert_eq!(read(&p).unwrap(), None);
        write(&p, &sample()).unwrap();
        assert_eq!(read(&p).unwrap(), Some(sample()));
    }
}
