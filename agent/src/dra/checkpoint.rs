//! The DRA manager's checkpoint, `<root-dir>/dra_manager_state` (upstream
//! `cm/dra/state`): the claims prepared on this node, the pods using each, and what each
//! driver answered to `NodePrepareResources` (devices, their requests and CDI ids), so
//! that a restarted agent still hands the CDI devices to containers it creates and
//! unprepares the claims once their last pod is gone.
//!
//! Layout, as upstream's: `{"Data": "<JSON text>", "Checksum": <CRC-32 (IEEE) of that
//! text>}`, the text being `{"kind": "DRACheckpoint", "apiVersion":
//! "checkpoint.dra.kubelet.k8s.io/v1", "ClaimInfoStateList": [{"ClaimUID", "ClaimName",
//! "Namespace", "PodUIDs": {"<uid>": {}}, "DriverState": {"<driver>": {"Devices":
//! [{"PoolName", "DeviceName", "ShareID", "RequestNames", "CDIDeviceIDs"}]}}}]}`.
//! Because the checksum covers the stored text, not a re-encoding, either implementation
//! reads the other's file.
//!
//! Two additions of ours, which upstream's reader ignores: `swiftletBootID` (the boot the
//! file was written in) and, per claim, `swiftletPrepared` (every driver answered
//! `NodePrepareResources`). Upstream forgets on restart that a claim was prepared and
//! calls the driver again for the next pod; we trust the flag within one boot, and only
//! within it: after a reboot the drivers' CDI spec files (under `/var/run/cdi`, a tmpfs)
//! are gone, so every claim is prepared again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The checkpoint's `kind`.
pub const KIND: &str = "DRACheckpoint";
/// The checkpoint's `apiVersion`.
pub const API_VERSION: &str = "checkpoint.dra.kubelet.k8s.io/v1";

/// One device a driver prepared for a claim.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    #[serde(rename = "PoolName", default)]
    pub pool_name: String,
    #[serde(rename = "DeviceName", default)]
    pub device_name: String,
    /// Set for a device shared by several allocations (consumable capacity).
    #[serde(rename = "ShareID", default)]
    pub share_id: Option<String>,
    /// The claim's requests this device serves; empty means all of them.
    #[serde(rename = "RequestNames", default, deserialize_with = "null_default")]
    pub request_names: Vec<String>,
    /// Fully qualified CDI device names, handed to the runtime.
    #[serde(rename = "CDIDeviceIDs", default, deserialize_with = "null_default")]
    pub cdi_device_ids: Vec<String>,
}

/// One driver's part of a claim.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverState {
    #[serde(rename = "Devices", default, deserialize_with = "null_default")]
    pub devices: Vec<Device>,
    /// Node operations the allocation lets the kubelet skip (alpha
    /// `DRAOptionalNodeOperations`; always empty here, kept for upstream's files).
    #[serde(rename = "skipNodeOperations", default, skip_serializing_if = "Vec::is_empty")]
    pub skip_node_operations: Vec<String>,
}

/// A claim known to this node (upstream `ClaimInfoState`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimInfo {
    #[serde(rename = "ClaimUID", default)]
    pub claim_uid: String,
    #[serde(rename = "ClaimName", default)]
    pub claim_name: String,
    #[serde(rename = "Namespace", default)]
    pub namespace: String,
    /// The pods using the claim (a Go set: a map to empty objects on disk).
    #[serde(rename = "PodUIDs", default, serialize_with = "ser_set", deserialize_with = "de_set")]
    pub pod_uids: BTreeSet<String>,
    /// Every driver with devices in the allocation, whether or not it prepared any.
    #[serde(rename = "DriverState", default, deserialize_with = "null_default")]
    pub driver_state: BTreeMap<String, DriverState>,
    /// Every driver answered `NodePrepareResources` (ours; see the module doc).
    #[serde(rename = "swiftletPrepared", default, skip_serializing_if = "std::ops::Not::not")]
    pub prepared: bool,
}

impl ClaimInfo {
    /// The devices serving `request` (`""`: every device; a device naming no request
    /// serves all) with their driver: drivers by name, each one's devices in the order it
    /// answered.
    pub fn devices_for<'a>(&'a self, request: &'a str) -> impl Iterator<Item = (&'a str, &'a Device)> + 'a {
        self.driver_state
            .iter()
            .flat_map(|(driver, state)| state.devices.iter().map(move |d| (driver.as_str(), d)))
            .filter(move |(_, d)| {
                request.is_empty() || d.request_names.is_empty() || d.request_names.iter().any(|r| r == request)
            })
    }

    /// The CDI ids of the devices serving `request` ([`Self::devices_for`]; upstream
    /// `cdiDevicesAsList`).
    pub fn cdi_device_ids<'a>(&'a self, request: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.devices_for(request).flat_map(|(_, d)| d.cdi_device_ids.iter().map(String::as_str))
    }
}

/// The checkpointed state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointData {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(rename = "apiVersion", default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(rename = "ClaimInfoStateList", default, deserialize_with = "null_default")]
    pub claims: Vec<ClaimInfo>,
    /// The boot (`/proc/sys/kernel/random/boot_id`) the file was written in (ours).
    #[serde(rename = "swiftletBootID", default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

impl CheckpointData {
    /// `claims` written in boot `boot_id`.
    #[must_use]
    pub fn new(claims: Vec<ClaimInfo>, boot_id: &str) -> Self {
        Self {
            kind: KIND.into(),
            api_version: API_VERSION.into(),
            claims,
            boot_id: (!boot_id.is_empty()).then(|| boot_id.to_owned()),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct File {
    #[serde(rename = "Data")]
    data: String,
    #[serde(rename = "Checksum")]
    checksum: u32,
}

/// Why the checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the DRA checkpoint {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the DRA checkpoint {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("DRA checkpoint {path} is not valid ({reason}); drain the node and remove the file to start without it")]
    Corrupt { path: String, reason: String },
}

#[derive(Serialize)]
struct Empty {}

fn ser_set<S: Serializer>(set: &BTreeSet<String>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(set.iter().map(|k| (k, Empty {})))
}

fn de_set<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeSet<String>, D::Error> {
    let m = Option::<BTreeMap<String, serde_json::Value>>::deserialize(d)?;
    Ok(m.unwrap_or_default().into_keys().collect())
}

/// Go writes a nil slice or map as `null`.
fn null_default<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// CRC-32 with the IEEE polynomial (Go's `crc32.ChecksumIEEE`), bit by bit: the file is
/// small and written once per prepare or unprepare.
#[must_use]
pub fn crc32_ieee(data: &[u8]) -> u32 {
    let mut crc = u32::MAX;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let low_bit = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & low_bit);
        }
    }
    !crc
}

/// Encodes `data` with its checksum.
#[must_use]
pub fn encode(data: &CheckpointData) -> Vec<u8> {
    let text = serde_json::to_string(data).unwrap_or_default();
    let checksum = crc32_ieee(text.as_bytes());
    serde_json::to_vec(&File { data: text, checksum }).unwrap_or_default()
}

/// Decodes a checkpoint, checking its checksum.
///
/// # Errors
/// [`Error::Corrupt`] for bad JSON or a checksum mismatch.
pub fn decode(bytes: &[u8], path: &Path) -> Result<CheckpointData, Error> {
    let corrupt = |reason: String| Error::Corrupt { path: path.display().to_string(), reason };
    let f: File = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    let actual = crc32_ieee(f.data.as_bytes());
    if actual != f.checksum {
        return Err(corrupt(format!("checksum is {actual}, the file says {}", f.checksum)));
    }
    serde_json::from_str(&f.data).map_err(|e| corrupt(e.to_string()))
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
        CheckpointData::new(
            vec![ClaimInfo {
                claim_uid: "claim-uid".into(),
                claim_name: "gpu".into(),
                namespace: "default".into(),
                pod_uids: BTreeSet::from(["pod-1".to_string()]),
                driver_state: BTreeMap::from([(
                    "gpu.example.com".to_string(),
                    DriverState {
                        devices: vec![Device {
                            pool_name: "node-1".into(),
                            device_name: "gpu-0".into(),
                            share_id: None,
                            request_names: vec!["req".into()],
                            cdi_device_ids: vec!["example.com/gpu=gpu-0".into()],
                        }],
                        skip_node_operations: Vec::new(),
                    },
                )]),
                prepared: true,
            }],
            "boot-1",
        )
    }

    #[test]
    fn crc32_is_the_ieee_one() {
        // The check value of CRC-32/ISO-HDLC.
        assert_eq!(crc32_ieee(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32_ieee(b""), 0);
    }

    #[test]
    fn round_trips_in_upstreams_layout() {
        let bytes = encode(&sample());
        let file: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let text = file["Data"].as_str().unwrap();
        assert_eq!(file["Checksum"].as_u64().unwrap(), u64::from(crc32_ieee(text.as_bytes())));
        let data: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(data["kind"], KIND);
        assert_eq!(data["apiVersion"], API_VERSION);
        let claim = &data["ClaimInfoStateList"][0];
        assert_eq!(claim["PodUIDs"], serde_json::json!({"pod-1": {}}));
        let device = &claim["DriverState"]["gpu.example.com"]["Devices"][0];
        assert_eq!(device["CDIDeviceIDs"][0], "example.com/gpu=gpu-0");
        assert_eq!(device["ShareID"], serde_json::Value::Null);
        assert_eq!(decode(&bytes, Path::new("x")).unwrap(), sample());
    }

    #[test]
    fn reads_a_file_as_upstream_writes_it() {
        // Go's encoding: nil slices as null, no extensions of ours.
        let text = r#"{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1","ClaimInfoStateList":[{"ClaimUID":"u","ClaimName":"c","Namespace":"ns","PodUIDs":{"p1":{},"p2":{}},"DriverState":{"d":{"Devices":[{"PoolName":"pool","DeviceName":"dev","ShareID":null,"RequestNames":null,"CDIDeviceIDs":["v/c=dev"]}]},"e":{"Devices":null}}}]}"#;
        let file = serde_json::json!({"Data": text, "Checksum": crc32_ieee(text.as_bytes())});
        let data = decode(file.to_string().as_bytes(), Path::new("x")).unwrap();
        assert_eq!(data.boot_id, None);
        let claim = &data.claims[0];
        assert!(!claim.prepared);
        assert_eq!(claim.pod_uids.len(), 2);
        assert!(claim.driver_state["e"].devices.is_empty());
        assert_eq!(claim.cdi_device_ids("any").collect::<Vec<_>>(), ["v/c=dev"]);
    }

    #[test]
    fn a_tampered_checkpoint_is_refused() {
        let text = String::from_utf8(encode(&sample())).unwrap().replace("gpu-0", "gpu-1");
        let e = decode(text.as_bytes(), Path::new("/cp")).unwrap_err().to_string();
        assert!(e.contains("/cp") && e.contains("checksum"), "{e}");
        assert!(decode(b"{", Path::new("/cp")).is_err());
    }

    #[test]
    fn file_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dra_manager_state");
        assert_eq!(read(&p).unwrap(), None);
        write(&p, &sample()).unwrap();
        assert_eq!(read(&p).unwrap(), Some(sample()));
    }
}
