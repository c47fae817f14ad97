//! The claims known to this node (upstream `claimInfoCache`), keyed by namespace and
//! name, written through to the checkpoint ([`super::checkpoint`]) on every change that
//! must survive a restart.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::checkpoint::{self, CheckpointData, ClaimInfo};
use super::metrics::ANY_DRIVER;

/// One claim and what only this process needs to know about it.
#[derive(Clone, Debug)]
pub struct Entry {
    pub info: ClaimInfo,
    /// `NodeUnprepareResources` is under way for its last pod: no new pod may join
    /// (upstream `unpreparing`; not checkpointed, an unprepare is simply retried).
    pub unpreparing: bool,
}

/// The claims, and where they are checkpointed.
#[derive(Debug)]
pub struct Cache {
    path: PathBuf,
    boot_id: String,
    claims: BTreeMap<(String, String), Entry>,
}

impl Cache {
    /// The checkpoint at `path`, or an empty cache (and an empty checkpoint written, as
    /// upstream's `GetOrCreate`) when there is none. Claims written in another boot than
    /// `boot_id` are restored as not prepared.
    ///
    /// # Errors
    /// The checkpoint cannot be read, is corrupt, or cannot be created.
    pub fn load(path: &Path, boot_id: &str) -> Result<Self, checkpoint::Error> {
        let mut cache = Self { path: path.to_owned(), boot_id: boot_id.to_owned(), claims: BTreeMap::new() };
        let Some(data) = checkpoint::read(path)? else {
            cache.sync()?;
            return Ok(cache);
        };
        let same_boot = !boot_id.is_empty() && data.boot_id.as_deref() == Some(boot_id);
        for mut info in data.claims {
            info.prepared &= same_boot;
            let key = (info.namespace.clone(), info.claim_name.clone());
            cache.claims.insert(key, Entry { info, unpreparing: false });
        }
        Ok(cache)
    }

    /// Writes every claim to the checkpoint.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn sync(&self) -> Result<(), checkpoint::Error> {
        let claims = self.claims.values().map(|e| e.info.clone()).collect();
        checkpoint::write(&self.path, &CheckpointData::new(claims, &self.boot_id))
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<&Entry> {
        self.claims.get(&(namespace.to_owned(), name.to_owned()))
    }

    pub fn get_mut(&mut self, namespace: &str, name: &str) -> Option<&mut Entry> {
        self.claims.get_mut(&(namespace.to_owned(), name.to_owned()))
    }

    /// Adds `info` unless its claim is known; the entry either way.
    pub fn get_or_insert(&mut self, info: ClaimInfo) -> &mut Entry {
        let key = (info.namespace.clone(), info.claim_name.clone());
        self.claims.entry(key).or_insert(Entry { info, unpreparing: false })
    }

    pub fn remove(&mut self, namespace: &str, name: &str) {
        self.claims.remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// The names of the claims pod `uid` uses (upstream `claimNamesForPod`).
    pub fn claim_names_for_pod(&self, uid: &str) -> Vec<String> {
        self.claims.values().filter(|e| e.info.pod_uids.contains(uid)).map(|e| e.info.claim_name.clone()).collect()
    }

    /// Whether pod `uid` uses a claim (upstream `hasPodReference`).
    pub fn has_pod(&self, uid: &str) -> bool {
        self.claims.values().any(|e| e.info.pod_uids.contains(uid))
    }

    /// The pods using claims, with their namespace and those claims' names.
    pub fn pods(&self) -> BTreeMap<String, (String, BTreeSet<String>)> {
        let mut out: BTreeMap<String, (String, BTreeSet<String>)> = BTreeMap::new();
        for e in self.claims.values() {
            for uid in &e.info.pod_uids {
                let (_, names) = out.entry(uid.clone()).or_insert_with(|| (e.info.namespace.clone(), BTreeSet::new()));
                names.insert(e.info.claim_name.clone());
            }
        }
        out
    }

    /// The pods using a claim that holds device `pool`/`device` of `driver`.
    pub fn pods_holding(&self, driver: &str, pool: &str, device: &str) -> BTreeSet<String> {
        self.claims
            .values()
            .filter(|e| {
                e.info
                    .driver_state
                    .get(driver)
                    .is_some_and(|s| s.devices.iter().any(|d| d.pool_name == pool && d.device_name == device))
            })
            .flat_map(|e| e.info.pod_uids.iter().cloned())
            .collect()
    }

    /// Prepared claims per driver, and [`ANY_DRIVER`] for all (upstream `claimsInUse`).
    pub fn claims_in_use(&self) -> BTreeMap<String, u64> {
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        let mut total = 0;
        for e in self.claims.values().filter(|e| e.info.prepared) {
            total += 1;
            for driver in e.info.driver_state.keys() {
                *counts.entry(driver.clone()).or_default() += 1;
            }
        }
        counts.insert(ANY_DRIVER.to_owned(), total);
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::checkpoint::DriverState;

    fn info(name: &str, pods: &[&str], drivers: &[&str], prepared: bool) -> ClaimInfo {
        ClaimInfo {
            claim_uid: format!("{name}-uid"),
            claim_name: name.into(),
            namespace: "ns".into(),
            pod_uids: pods.iter().map(|p| (*p).to_owned()).collect(),
            driver_state: drivers.iter().map(|d| ((*d).to_owned(), DriverState::default())).collect(),
            prepared,
        }
    }

    #[test]
    fn a_missing_checkpoint_is_created_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dra_manager_state");
        let cache = Cache::load(&path, "boot").unwrap();
        assert!(cache.claims.is_empty());
        assert_eq!(checkpoint::read(&path).unwrap().unwrap().claims, Vec::new());
    }

    #[test]
    fn prepared_holds_within_a_boot_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dra_manager_state");
        let mut cache = Cache::load(&path, "boot-1").unwrap();
        cache.get_or_insert(info("a", &["p1"], &["d1"], true));
        cache.sync().unwrap();
        assert!(Cache::load(&path, "boot-1").unwrap().get("ns", "a").unwrap().info.prepared);
        let rebooted = Cache::load(&path, "boot-2").unwrap();
        let e = rebooted.get("ns", "a").unwrap();
        assert!(!e.info.prepared);
        assert!(e.info.pod_uids.contains("p1"), "the users are kept");
    }

    #[test]
    fn claims_in_use_counts_prepared_claims_per_driver_and_overall() {
        let dir = tempfile::tempdir().unwrap();
        let mut cache = Cache::load(&dir.path().join("s"), "b").unwrap();
        assert_eq!(cache.claims_in_use(), BTreeMap::from([(ANY_DRIVER.to_owned(), 0)]));
        cache.get_or_insert(info("a", &["p1"], &["d1", "d2"], true));
        cache.get_or_insert(info("b", &["p1", "p2"], &["d1"], true));
        cache.get_or_insert(info("c", &["p3"], &["d3"], false));
        assert_eq!(
            cache.claims_in_use(),
            BTreeMap::from([(ANY_DRIVER.to_owned(), 2), ("d1".to_owned(), 2), ("d2".to_owned(), 1)])
        );
        assert_eq!(cache.claim_names_for_pod("p1"), ["a", "b"]);
        assert!(cache.has_pod("p3") && !cache.has_pod("p4"));
        assert_eq!(cache.pods()["p2"], ("ns".to_owned(), BTreeSet::from(["b".to_owned()])));
    }
}
