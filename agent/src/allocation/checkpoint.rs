//! The allocation checkpoint `<root-dir>/allocated_pods_state`, in upstream's (unversioned,
//! "V1") format so that a kubelet can read what swiftlet wrote and the other way round:
//!
//! ```json
//! {"data":"{\"entries\":{\"<pod uid>\":{\"ContainerResources\":{\"<container>\":{\"limits\":{...},\"requests\":{...}}}}}}","checksum":1178570812}
//! ```
//!
//! `data` is the JSON of the entries (maps sorted by key, as Go encodes them) and
//! `checksum` the FNV-1a (32 bit) hash of what Go's `hashutil.DeepHashObject` prints for
//! that string: `(string)` followed by the raw data. A checkpoint whose checksum does not
//! match is corrupt (upstream refuses to start with it; so do we).
//!
//! `PodLevelResources` holds the pod-level resources, `null` for none, as upstream writes
//! it; an entry without the field was written before swiftlet checkpointed them (it
//! reads as unknown). Upstream's newest format ("v2", a protobuf `PodList` inside the
//! JSON) is not written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::ResourceRequirements;
use serde::{Deserialize, Serialize};

use crate::types::io::PathIoError;

/// The checkpoint's file name under the root dir (upstream `allocatedPodsStateFile`).
pub const FILE_NAME: &str = "allocated_pods_state";

/// The file of what the containers and pod cgroups were last given, in the same format
/// (upstream `actuatedPodsStateFile`, written by its runtime manager).
pub const ACTUATED_FILE_NAME: &str = "actuated_pods_state";

/// Errors reading or writing the checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read or written.
    #[error(transparent)]
    Io(#[from] PathIoError),
    /// The file is not a checkpoint.
    #[error("{path}: cannot decode the checkpoint: {source}")]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The data does not match its checksum (upstream `ErrCorruptCheckpoint`).
    #[error("{path}: checkpoint is corrupted")]
    Corrupt { path: PathBuf },
}

/// The resources allocated to one pod: container name -> requirements, and the pod-level
/// requirements.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PodAllocation {
    #[serde(rename = "ContainerResources", default)]
    pub container_resources: BTreeMap<String, ResourceRequirements>,
    /// `None`: unknown (an entry without the field); `Some(None)`: the pod has none.
    #[serde(
        rename = "PodLevelResources",
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub pod_level_resources: Option<Option<ResourceRequirements>>,
}

/// A field that is there, `null` or not (serde's `default` covers a missing one).
#[expect(clippy::option_option, reason = "missing, null and a value are three cases")]
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<ResourceRequirements>>, D::Error> {
    Option::<ResourceRequirements>::deserialize(d).map(Some)
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Entries {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    entries: BTreeMap<String, PodAllocation>,
}

#[derive(Debug, Serialize, Deserialize)]
struct File {
    data: String,
    checksum: u64,
}

/// The checksum upstream stores with `data`.
#[must_use]
pub fn checksum(data: &str) -> u64 {
    u64::from(crate::cm::checkpoint::Spew::string(data).checksum())
}

/// Encodes the allocations as the checkpoint file's bytes.
#[must_use]
pub fn encode(allocations: &BTreeMap<String, PodAllocation>) -> Vec<u8> {
    let data = serde_json::to_string(&Entries { entries: allocations.clone() }).unwrap_or_default();
    let file = File { checksum: checksum(&data), data };
    serde_json::to_vec(&file).unwrap_or_default()
}

/// Decodes a checkpoint file's bytes (`path` only names it in errors).
///
/// # Errors
/// [`Error::Decode`] or [`Error::Corrupt`].
pub fn decode(path: &Path, bytes: &[u8]) -> Result<BTreeMap<String, PodAllocation>, Error> {
    let file: File = serde_json::from_slice(bytes).map_err(|source| Error::Decode { path: path.into(), source })?;
    if checksum(&file.data) != file.checksum {
        return Err(Error::Corrupt { path: path.into() });
    }
    let entries: Entries =
        serde_json::from_str(&file.data).map_err(|source| Error::Decode { path: path.into(), source })?;
    Ok(entries.entries)
}

/// Reads the checkpoint at `path`; a missing file is an empty checkpoint.
///
/// # Errors
/// A read, decode or checksum failure.
pub fn load(path: &Path) -> Result<BTreeMap<String, PodAllocation>, Error> {
    match std::fs::read(path) {
        Ok(bytes) => decode(path, &bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(source) => Err(PathIoError { op: "read", path: path.into(), source }.into()),
    }
}

/// Writes the checkpoint atomically, as the resource managers' checkpoints
/// ([`crate::cm::checkpoint::write_atomic`]).
///
/// # Errors
/// A write failure.
pub fn store(path: &Path, allocations: &BTreeMap<String, PodAllocation>) -> Result<(), Error> {
    crate::cm::checkpoint::write_atomic(path, &encode(allocations)).map_err(PathIoError::at("write", path))?;
    Ok(())
}

/// [`store`] without waiting for the disk (`fsync`): for records that describe running
/// containers, which a crash of the machine ends anyway (the actuated records are
/// written at every container start; an agent crash keeps what the kernel has).
///
/// # Errors
/// A write failure.
pub fn store_unsynced(path: &Path, allocations: &BTreeMap<String, PodAllocation>) -> Result<(), Error> {
    crate::cm::checkpoint::replace_unsynced(path, &encode(allocations)).map_err(PathIoError::at("write", path))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    /// Upstream's own fixture (`state_checkpoint_test.go`): swiftlet reads it, and writes
    /// the same bytes for the same allocation.
    const UPSTREAM: &str = r#"{"data":"{\"entries\":{\"pod1\":{\"ContainerResources\":{\"container1\":{\"requests\":{\"cpu\":\"1Ki\",\"memory\":\"1Ki\"}}}}}}","checksum":1178570812}"#;

    fn upstream_allocation() -> BTreeMap<String, PodAllocation> {
        let requests =
            BTreeMap::from([("cpu".to_string(), Quantity("1Ki".into())), ("memory".into(), Quantity("1Ki".into()))]);
        let c = ResourceRequirements { requests: Some(requests), ..Default::default() };
        BTreeMap::from([(
            "pod1".to_string(),
            PodAllocation {
                container_resources: BTreeMap::from([("container1".to_string(), c)]),
                pod_level_resources: None,
            },
        )])
    }

    #[test]
    fn reads_and_writes_upstreams_format() {
        let got = decode(Path::new("x"), UPSTREAM.as_bytes()).unwrap();
        assert_eq!(got, upstream_allocation());
        assert_eq!(String::from_utf8(encode(&upstream_allocation())).unwrap(), UPSTREAM);
    }

    #[test]
    fn a_wrong_checksum_is_corruption() {
        let bad = UPSTREAM.replace("1178570812", "1178570813");
        let err = decode(Path::new("/r/allocated_pods_state"), bad.as_bytes()).unwrap_err();
        assert_eq!(err.to_string(), "/r/allocated_pods_state: checkpoint is corrupted");
    }

    #[test]
    fn store_then_load_round_trips_and_missing_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        assert!(load(&path).unwrap().is_empty());
        store(&path, &upstream_allocation()).unwrap();
        assert_eq!(load(&path).unwrap(), upstream_allocation());
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(files, [std::ffi::OsString::from(FILE_NAME)], "no temporary file is left");
    }

    #[test]
    fn pod_level_resources_are_kept_and_null_is_none_unlike_a_missing_field() {
        let mut with = upstream_allocation();
        let limits = BTreeMap::from([("memory".to_string(), Quantity("200Mi".into()))]);
        with.get_mut("pod1").unwrap().pod_level_resources =
            Some(Some(ResourceRequirements { limits: Some(limits), ..Default::default() }));
        let bytes = encode(&with);
        assert!(
            String::from_utf8_lossy(&bytes).contains(r#"\"PodLevelResources\":{\"limits\":{\"memory\":\"200Mi\"}}"#)
        );
        assert_eq!(decode(Path::new("x"), &bytes).unwrap(), with);
        let data =
            r#"{"entries":{"pod1":{"ContainerResources":{},"PodLevelResources":null,"EmptyDirVolumeLimits":null}}}"#;
        let file = format!(r#"{{"data":{},"checksum":{}}}"#, serde_json::to_string(data).unwrap(), checksum(data));
        let got = decode(Path::new("x"), file.as_bytes()).unwrap();
        assert_eq!(got["pod1"], PodAllocation { pod_level_resources: Some(None), ..PodAllocation::default() });
        let none = BTreeMap::from([("pod1".to_string(), got["pod1"].clone())]);
        assert!(String::from_utf8(encode(&none)).unwrap().contains(r#"\"PodLevelResources\":null"#));
    }
}
