//! The CPU manager's state and its checkpoint `<root-dir>/cpu_manager_state` (upstream
//! `cpumanager/state`): the default (shared) cpuset and the exclusive assignments by pod
//! UID and container name, in upstream's v2 JSON format with upstream's checksum.
//!
//! ```json
//! {"policyName":"static","defaultCpuSet":"0,3","entries":{"<pod uid>":{"app":"1-2"}},"checksum":123}
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cm::checkpoint::{Spew, write_atomic};
use crate::types::cpuset::CpuSet;

/// Name of the checkpoint file in the root dir.
pub const CHECKPOINT_NAME: &str = "cpu_manager_state";

/// Exclusive assignments: pod UID → container name → CPUs.
pub type Assignments = BTreeMap<String, BTreeMap<String, CpuSet>>;

/// The CPU manager's state (upstream `stateMemory`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuState {
    /// The shared pool: CPUs not exclusively assigned (reserved CPUs included).
    pub default_cpuset: CpuSet,
    /// Exclusive CPUs per container.
    pub assignments: Assignments,
}

impl CpuState {
    /// The container's exclusive CPUs, if any.
    #[must_use]
    pub fn get(&self, pod_uid: &str, container: &str) -> Option<&CpuSet> {
        self.assignments.get(pod_uid)?.get(container)
    }

    /// The container's exclusive CPUs, else the shared pool (`GetCPUSetOrDefault`).
    #[must_use]
    pub fn get_or_default(&self, pod_uid: &str, container: &str) -> CpuSet {
        self.get(pod_uid, container).cloned().unwrap_or_else(|| self.default_cpuset.clone())
    }

    /// Records an exclusive assignment.
    pub fn set(&mut self, pod_uid: &str, container: &str, cpus: CpuSet) {
        self.assignments.entry(pod_uid.to_owned()).or_default().insert(container.to_owned(), cpus);
    }

    /// Forgets an assignment (not touching the shared pool).
    pub fn delete(&mut self, pod_uid: &str, container: &str) {
        if let Some(m) = self.assignments.get_mut(pod_uid) {
            m.remove(container);
            if m.is_empty() {
                self.assignments.remove(pod_uid);
            }
        }
    }
}

/// Reading the checkpoint failed; the agent must not start (upstream's advice applies:
/// drain the node and delete the file).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read or written.
    #[error("CPU manager checkpoint {path}: {source}")]
    Io {
        /// The checkpoint file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The checkpoint cannot be used.
    #[error(
        "could not restore state from checkpoint: {reason}, please drain this node and delete the CPU manager checkpoint file {path:?} before restarting Kubelet"
    )]
    Restore {
        /// The checkpoint file.
        path: PathBuf,
        /// Why (upstream's wording).
        reason: String,
    },
}

/// The checkpoint as upstream writes it (v2).
#[derive(Debug, Default, Serialize, Deserialize)]
struct CheckpointFile {
    #[serde(rename = "policyName")]
    policy_name: String,
    #[serde(rename = "defaultCpuSet", alias = "defaultCPUSet")]
    default_cpu_set: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    entries: BTreeMap<String, BTreeMap<String, String>>,
    checksum: u64,
}

impl CheckpointFile {
    /// Upstream's checksum: spew of `*state.CPUManagerCheckpoint` with the checksum zeroed.
    fn checksum(&self) -> u32 {
        let entries = self
            .entries
            .iter()
            .map(|(pod, m)| {
                let inner = m.iter().map(|(c, s)| (c.clone(), Spew::string(s))).collect();
                (pod.clone(), Spew::Map { ty: "map[string]string".into(), entries: Some(inner) })
            })
            .collect();
        Spew::Ptr(Box::new(Spew::Struct {
            ty: "state.CPUManagerCheckpoint".into(),
            fields: vec![
                ("PolicyName", Spew::string(&self.policy_name)),
                ("DefaultCPUSet", Spew::string(&self.default_cpu_set)),
                ("Entries", Spew::Map { ty: "map[string]map[string]string".into(), entries: Some(entries) }),
                ("Checksum", Spew::scalar("checksum.Checksum", 0)),
            ],
        }))
        .checksum()
    }
}

/// The checkpoint file of a policy in a root dir.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    path: PathBuf,
    policy_name: String,
}

impl Checkpoint {
    /// The checkpoint `<root_dir>/cpu_manager_state` for `policy_name`.
    #[must_use]
    pub fn new(root_dir: &Path, policy_name: &str) -> Self {
        Self { path: root_dir.join(CHECKPOINT_NAME), policy_name: policy_name.to_owned() }
    }

    /// The file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Restores the state; a missing file is the empty state (and is written at once,
    /// as upstream does).
    ///
    /// # Errors
    /// [`Error::Restore`] for a corrupt file, a different policy, or unparsable cpusets.
    pub fn restore(&self) -> Result<CpuState, Error> {
        let restore = |reason: String| Error::Restore { path: self.path.clone(), reason };
        let text = match std::fs::read(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let state = CpuState::default();
                self.store(&state)?;
                return Ok(state);
            }
            Err(source) => return Err(Error::Io { path: self.path.clone(), source }),
        };
        let file: CheckpointFile = serde_json::from_slice(&text).map_err(|e| restore(e.to_string()))?;
        if file.checksum != 0 && file.checksum != u64::from(file.checksum()) {
            return Err(restore("checkpoint is corrupted".into()));
        }
        if file.policy_name != self.policy_name {
            return Err(restore(format!(
                "configured policy {:?} differs from state checkpoint policy {:?}",
                self.policy_name, file.policy_name
            )));
        }
        let default_cpuset = CpuSet::parse(&file.default_cpu_set)
            .map_err(|e| restore(format!("could not parse default cpu set {:?}: {e}", file.default_cpu_set)))?;
        let mut state = CpuState { default_cpuset, assignments: Assignments::new() };
        for (pod, containers) in &file.entries {
            for (name, text) in containers {
                let cpus = CpuSet::parse(text).map_err(|e| {
                    restore(format!("could not parse cpuset {text:?} for container {name:?} in pod {pod:?}: {e}"))
                })?;
                state.set(pod, name, cpus);
            }
        }
        Ok(state)
    }

    /// Writes the state.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be written.
    pub fn store(&self, state: &CpuState) -> Result<(), Error> {
        let mut file = CheckpointFile {
            policy_name: self.policy_name.clone(),
            default_cpu_set: state.default_cpuset.to_string(),
            entries: state
                .assignments
                .iter()
                .map(|(pod, m)| (pod.clone(), m.iter().map(|(c, s)| (c.clone(), s.to_string())).collect()))
                .collect(),
            checksum: 0,
        };
        file.checksum = u64::from(file.checksum());
        let json = serde_json::to_vec(&file).map_err(|e| Error::Io { path: self.path.clone(), source: e.into() })?;
        write_atomic(&self.path, &json).map_err(|source| Error::Io { path: self.path.clone(), source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_match_upstream_test_vectors() {
        // From upstream's state_checkpoint_test.go.
        let empty: CheckpointFile =
            serde_json::from_str(r#"{"policyName":"none","defaultCPUSet":"4-6","entries":{},"checksum":354655845}"#)
                .unwrap();
        assert_eq!(u64::from(empty.checksum()), 354_655_845);
        let full: CheckpointFile = serde_json::from_str(
            r#"{"policyName":"none","defaultCPUSet":"1-3","entries":{"pod":{"container1":"4-6","container2":"1-3"}},"checksum":3610638499}"#,
        )
        .unwrap();
        assert_eq!(u64::from(full.checksum()), 3_610_638_499);
    }

    #[test]
    fn round_trip_and_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::new(dir.path(), "static");
        assert_eq!(cp.restore().unwrap(), CpuState::default());
        assert!(cp.path().exists(), "a missing checkpoint is created");
        let mut s = CpuState { default_cpuset: CpuSet::parse("0,3").unwrap(), ..CpuState::default() };
        s.set("uid-1", "app", CpuSet::parse("1-2").unwrap());
        cp.store(&s).unwrap();
        let text = std::fs::read_to_string(cp.path()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["policyName"], "static");
        assert_eq!(v["defaultCpuSet"], "0,3");
        assert_eq!(v["entries"]["uid-1"]["app"], "1-2");
        assert!(v["checksum"].as_u64().unwrap() > 0);
        assert_eq!(cp.restore().unwrap(), s);
    }

    #[test]
    fn policy_mismatch_and_corruption_are_startup_errors() {
        let dir = tempfile::tempdir().unwrap();
        Checkpoint::new(dir.path(), "none").store(&CpuState::default()).unwrap();
        let e = Checkpoint::new(dir.path(), "static").restore().unwrap_err().to_string();
        assert!(
            e.starts_with(
                "could not restore state from checkpoint: configured policy \"static\" differs from state checkpoint policy \"none\", please drain this node and delete the CPU manager checkpoint file"
            ),
            "{e}"
        );
        let path = dir.path().join(CHECKPOINT_NAME);
        let text = std::fs::read_to_string(&path).unwrap().replace("\"defaultCpuSet\":\"\"", "\"defaultCpuSet\":\"0\"");
        std::fs::write(&path, text).unwrap();
        let e = Checkpoint::new(dir.path(), "none").restore().unwrap_err().to_string();
        assert!(e.contains("checkpoint is corrupted"), "{e}");
        std::fs::write(&path, r#"{"policyName":"static","defaultCpuSet":"x","checksum":0}"#).unwrap();
        let e = Checkpoint::new(dir.path(), "static").restore().unwrap_err().to_string();
        assert!(e.contains("could not parse default cpu set \"x\""), "{e}");
    }
}
