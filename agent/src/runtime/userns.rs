//! User namespaces for pods with `hostUsers: false` (upstream `pkg/kubelet/userns`,
//! `UserNamespacesSupport`, GA and locked on since 1.36).
//!
//! Each such pod gets a range of `userNamespaces.idsPerPod` (default 65536) host ids of its
//! own, container ids `0..n` mapped onto host ids `first..first+n`, the same for uids and
//! gids. The ranges are cut from the kubelet's mapping: the subordinate ids of the user
//! `kubelet` as `getsubids` reports them when that user exists and the tool is installed,
//! else every id from `idsPerPod` up (id 0's range is never handed out). A pod's range is
//! kept in `<root>/pods/<uid>/userns` (upstream's JSON, so that either agent reads the
//! other's), read back at start, and released when the pod is terminated or its directory
//! is found orphaned.
//!
//! The sandbox and every container get `NamespaceMode::Pod` with the mappings, and every
//! mount of the container the same mappings (the runtime makes them idmapped mounts); a
//! pod without `hostUsers: false` gets `NamespaceMode::Node`. A runtime handler that does
//! not say it supports user namespaces (CRI `Status`'s `runtime_handlers`) refuses the pod
//! with upstream's message.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;

use crate::container::api;
use crate::container::runtime_state::RuntimeState;

/// The unit every `idsPerPod` must be a multiple of.
pub const UNIT: u32 = 65_536;

/// The file in a pod's directory holding its mappings.
pub const MAPPINGS_FILE: &str = "userns";

/// The user whose subordinate ids are the kubelet's mapping.
const KUBELET_USER: &str = "kubelet";

/// One mapping of a pod's user namespace (upstream's `idMapping`, its JSON names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdMapping {
    pub host_id: u32,
    pub container_id: u32,
    pub length: u32,
}

/// A pod's mappings file (upstream's `userNamespace`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mappings {
    pub uid_mappings: Vec<IdMapping>,
    pub gid_mappings: Vec<IdMapping>,
}

impl Mappings {
    /// Container ids `0..length` on host ids `first..`, for users and groups alike.
    #[must_use]
    pub fn of_range(first: u32, length: u32) -> Self {
        let m = IdMapping { host_id: first, container_id: 0, length };
        Self { uid_mappings: vec![m], gid_mappings: vec![m] }
    }

    /// The one range of a file this manager (or upstream's) wrote, checked as upstream
    /// checks it.
    fn range(&self) -> Result<(u32, u32), String> {
        let [uid] = self.uid_mappings.as_slice() else {
            return Err("invalid user namespace configuration: no more than one mapping allowed.".into());
        };
        if self.gid_mappings.len() != 1 {
            return Err("invalid user namespace configuration: GID and UID mappings should be identical.".into());
        }
        if self.gid_mappings[0] != *uid {
            return Err("invalid user namespace configuration: GID and UID mapping should be identical".into());
        }
        if uid.container_id != 0 {
            return Err("invalid user namespace configuration: UID 0 must be mapped".into());
        }
        Ok((uid.host_id, uid.length))
    }

    fn to_cri(&self) -> api::UserNamespace {
        let cri = |v: &[IdMapping]| {
            v.iter()
                .map(|m| api::IdMapping { host_id: m.host_id, container_id: m.container_id, length: m.length })
                .collect()
        };
        api::UserNamespace {
            mode: api::NamespaceMode::Pod as i32,
            uids: cri(&self.uid_mappings),
            gids: cri(&self.gid_mappings),
        }
    }
}

/// Upstream `parseGetSubIdsOutput`: `0: kubelet 65536 2147483648` → (first, length).
///
/// # Errors
/// Not one line of four fields with two numbers.
pub fn parse_getsubids(output: &str) -> Result<(u32, u32), String> {
    let lines: Vec<&str> = output.trim_matches('\n').split('\n').collect();
    let [line] = lines.as_slice() else {
        return Err(format!("error parsing line {output:?}: it must contain only one line"));
    };
    let parts: Vec<&str> = line.split_whitespace().collect();
    let [_, _, first, length] = parts.as_slice() else { return Err(format!("invalid line {output:?}")) };
    let number = |s: &str| s.parse::<u32>().map_err(|e| format!("error parsing line {output:?}: {e}"));
    Ok((number(first)?, number(length)?))
}

/// Whether `user` has an entry in `passwd` (the text of `/etc/passwd`).
fn user_exists(passwd: &str, user: &str) -> bool {
    passwd.lines().any(|l| l.split(':').next() == Some(user))
}

/// The kubelet's mapping (upstream `getKubeletMappings`): the subordinate ids of the user
/// `kubelet` from `getsubids` when the user exists and the tool is on `PATH`, else every
/// id from `ids_per_pod` up.
///
/// # Errors
/// `getsubids` failed, or gave different ranges for users and groups.
pub fn kubelet_mappings(ids_per_pod: u32) -> Result<(u32, u32), String> {
    let default = (ids_per_pod, u32::try_from((1u64 << 32) - u64::from(ids_per_pod)).unwrap_or(u32::MAX));
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    if !user_exists(&passwd, KUBELET_USER) {
        tracing::debug!(user = KUBELET_USER, "user namespaces: user not found, using default mappings");
        return Ok(default);
    }
    let Some(getsubids) = find_on_path("getsubids") else {
        tracing::info!("user namespaces: executable getsubids not found, using default mappings");
        return Ok(default);
    };
    let run = |args: &[&str]| -> Result<String, String> {
        let out = std::process::Command::new(&getsubids)
            .args(args)
            .output()
            .map_err(|e| format!("error retrieving additional ids for user {KUBELET_USER:?}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "error retrieving additional ids for user {KUBELET_USER:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let uids = run(&[KUBELET_USER])?;
    let gids = run(&["-g", KUBELET_USER])?;
    if uids != gids {
        return Err(format!("mismatched subuids and subgids for user {KUBELET_USER:?}"));
    }
    parse_getsubids(&uids)
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// The ranges handed out and to whom.
#[derive(Debug, Default)]
struct Ranges {
    /// Range index (host first id / ids per pod − offset) per pod uid.
    used_by: HashMap<String, u32>,
    used: std::collections::BTreeSet<u32>,
}

/// Allocates, records and releases the pods' user namespace ranges.
#[derive(Debug)]
pub struct UsernsManager {
    pods_dir: PathBuf,
    ids_per_pod: u32,
    /// The first range index of the kubelet's mapping, and how many ranges it holds.
    offset: u32,
    count: u32,
    ranges: Mutex<Ranges>,
    runtime: Arc<RuntimeState>,
}

impl UsernsManager {
    /// Checks the mapping `(first, length)` as upstream does and reads back the ranges of
    /// the pods under `pods_dir` (`<root>/pods`).
    ///
    /// # Errors
    /// `idsPerPod` or the mapping out of line (named as upstream names them), or a pod's
    /// mappings file that cannot be read or does not fit.
    pub fn new(
        pods_dir: &Path,
        ids_per_pod: u32,
        mapping: (u32, u32),
        max_pods: u32,
        runtime: Arc<RuntimeState>,
    ) -> Result<Self, String> {
        let (first, length) = mapping;
        if ids_per_pod == 0 || !ids_per_pod.is_multiple_of(UNIT) {
            return Err(format!("kubelet user namespace length {ids_per_pod} is not a multiple of {UNIT}"));
        }
        if !first.is_multiple_of(ids_per_pod) {
            return Err(format!("kubelet user assigned ID {first} is not a multiple of {ids_per_pod}"));
        }
        if first < ids_per_pod {
            return Err(format!("kubelet user assigned ID {first} must be greater or equal to {ids_per_pod}"));
        }
        if !length.is_multiple_of(ids_per_pod) {
            return Err(format!("kubelet user assigned IDs length {length} is not a multiple of {ids_per_pod}"));
        }
        if length / ids_per_pod < max_pods {
            return Err(format!("kubelet user assigned IDs are not enough to support {max_pods} pods"));
        }
        let manager = Self {
            pods_dir: pods_dir.to_path_buf(),
            ids_per_pod,
            offset: first / ids_per_pod,
            count: length / ids_per_pod,
            ranges: Mutex::default(),
            runtime,
        };
        let Ok(entries) = std::fs::read_dir(pods_dir) else { return Ok(manager) };
        let mut ranges = manager.lock();
        for entry in entries.flatten() {
            let uid = entry.file_name().to_string_lossy().into_owned();
            let Some(mappings) = manager.read(&uid)? else { continue };
            manager
                .record(&mut ranges, &uid, &mappings)
                .map_err(|e| format!("record pod mappings for existing pod {uid:?}: {e}"))?;
        }
        drop(ranges);
        Ok(manager)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ranges> {
        self.ranges.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn file(&self, uid: &str) -> PathBuf {
        self.pods_dir.join(uid).join(MAPPINGS_FILE)
    }

    /// The pod's mappings file, if it has one.
    fn read(&self, uid: &str) -> Result<Option<Mappings>, String> {
        let path = self.file(uid);
        match std::fs::read(&path) {
            Ok(b) if b.is_empty() => Ok(None),
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| format!("invalid user namespace mappings file {}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("reading {}: {e}", path.display())),
        }
    }

    /// Marks the range of a pod's file as the pod's.
    fn record(&self, ranges: &mut Ranges, uid: &str, mappings: &Mappings) -> Result<(), String> {
        let (first, length) = mappings.range()?;
        if length != self.ids_per_pod {
            return Err(format!("wrong user namespace length {length}"));
        }
        if !first.is_multiple_of(self.ids_per_pod) {
            return Err(format!("wrong user namespace offset specified {first}"));
        }
        let index = first / self.ids_per_pod;
        if let Some(&had) = ranges.used_by.get(uid) {
            return if had == index {
                Ok(())
            } else {
                Err(format!("different user namespace range already used by pod {uid:?}"))
            };
        }
        if index < self.offset || index - self.offset >= self.count {
            return Err(format!("id {first} is out of range"));
        }
        if !ranges.used.insert(index) {
            return Err(format!("range picked for pod {uid:?} already taken"));
        }
        ranges.used_by.insert(uid.to_owned(), index);
        Ok(())
    }

    /// A free range for the pod, written to its directory (durably: the file, then the
    /// directory, synced) before it is used.
    fn allocate(&self, ranges: &mut Ranges, uid: &str) -> Result<Mappings, String> {
        let index = (self.offset..self.offset + self.count)
            .find(|i| !ranges.used.contains(i))
            .ok_or("could not find an empty slot to allocate a user namespace")?;
        let mappings = Mappings::of_range(index * self.ids_per_pod, self.ids_per_pod);
        self.write(uid, &mappings)?;
        ranges.used.insert(index);
        ranges.used_by.insert(uid.to_owned(), index);
        Ok(mappings)
    }

    fn write(&self, uid: &str, mappings: &Mappings) -> Result<(), String> {
        let fail = |e: std::io::Error| format!("writing the user namespace mappings of pod {uid}: {e}");
        let bytes = serde_json::to_vec(mappings).map_err(|e| e.to_string())?;
        crate::cm::checkpoint::write_atomic_with_mode(&self.file(uid), &bytes, 0o644).map_err(fail)?;
        // Durable as upstream makes it: the directory entry too.
        std::fs::File::open(self.pods_dir.join(uid)).and_then(|d| d.sync_all()).map_err(fail)
    }

    /// The sandbox's (and its containers') user namespace (upstream
    /// `GetOrCreateUserNamespaceMappings`): the node's unless the pod says `hostUsers:
    /// false`; then the pod's own range, allocated on first use, on a runtime `handler`
    /// that supports user namespaces.
    ///
    /// # Errors
    /// The handler does not support user namespaces, no range is free, or the pod's file
    /// is unreadable or does not fit.
    pub fn namespace(&self, pod: &Pod, handler: &str) -> Result<api::UserNamespace, String> {
        let host_users = pod.spec.as_ref().and_then(|s| s.host_users).unwrap_or(true);
        if host_users {
            return Ok(api::UserNamespace { mode: api::NamespaceMode::Node as i32, ..Default::default() });
        }
        let refused = if handler.is_empty() {
            "can't set `spec.hostUsers: false`, runtime does not support user namespaces".to_owned()
        } else {
            format!(
                "can't set `spec.hostUsers: false`, RuntimeClass handler {handler:?} does not support user namespaces"
            )
        };
        match self.runtime.handler_supports_user_namespaces(handler) {
            Ok(true) => {}
            Ok(false) => return Err(refused),
            Err(e) => return Err(format!("{refused}: {e}")),
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut ranges = self.lock();
        // Asked at every sync and container start: a range recorded already is its file's
        // content (recorded only after checking that), so the file is read once.
        if let Some(&index) = ranges.used_by.get(&uid) {
            return Ok(Mappings::of_range(index * self.ids_per_pod, self.ids_per_pod).to_cri());
        }
        let mappings = match self.read(&uid)? {
            Some(m) => {
                self.record(&mut ranges, &uid, &m).map_err(|e| format!("user namespace: {e}"))?;
                m
            }
            None => self.allocate(&mut ranges, &uid).map_err(|e| format!("create user namespace: {e}"))?,
        };
        Ok(mappings.to_cri())
    }

    /// Gives the pod's range back and removes its file (the pod is terminated).
    pub fn release(&self, uid: &str) {
        self.release_locked(&mut self.lock(), uid);
    }

    fn release_locked(&self, ranges: &mut Ranges, uid: &str) {
        if let Some(index) = ranges.used_by.remove(uid) {
            ranges.used.remove(&index);
            let _ = std::fs::remove_file(self.file(uid));
            tracing::debug!(pod_uid = uid, "released the pod's user namespace range");
        }
    }

    /// Releases the ranges of pods `known` does not know (upstream
    /// `CleanupOrphanedPodUsernsAllocations`): pod directories left behind, and ranges
    /// whose pod directory is gone. The directories are listed under the lock, as
    /// upstream does: a range allocated meanwhile (its directory made with it) is not
    /// taken for one whose directory is gone.
    pub fn cleanup_orphans(&self, known: impl Fn(&str) -> bool) {
        let mut ranges = self.lock();
        let on_disk: std::collections::HashSet<String> = std::fs::read_dir(&self.pods_dir)
            .map(|entries| entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let orphans: Vec<String> = on_disk
            .iter()
            .filter(|uid| !known(uid))
            .chain(ranges.used_by.keys().filter(|uid| !on_disk.contains(*uid)))
            .cloned()
            .collect();
        for uid in orphans {
            self.release_locked(&mut ranges, &uid);
        }
    }

    /// How many ranges are handed out.
    #[must_use]
    pub fn allocated(&self) -> usize {
        self.lock().used_by.len()
    }
}

/// `mounts` get the pod's mappings (idmapped by the runtime) when its containers run in a
/// user namespace of their own (upstream `applyPlatformSpecificContainerConfig`).
pub fn map_mounts(mounts: &mut [api::Mount], userns: Option<&api::UserNamespace>) {
    let Some(ns) = userns.filter(|n| n.mode == api::NamespaceMode::Pod as i32) else { return };
    for m in mounts {
        m.uid_mappings.clone_from(&ns.uids);
        m.gid_mappings.clone_from(&ns.gids);
    }
}

#[cfg(test)]
#[path = "userns_tests.rs"]
mod tests;
