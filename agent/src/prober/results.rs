//! Probe result caches (upstream `pkg/kubelet/prober/results`): one per probe type,
//! keyed by container id. The update stream lives in the manager, which sends a
//! [`super::ProbeUpdate`] when [`ResultsCache::set`] reports a change.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{ProbeResult, ProbeType};

/// The published results of one probe type, by container id (`containerd://<id>`).
#[derive(Debug)]
pub struct ResultsCache {
    probe_type: ProbeType,
    cache: Mutex<HashMap<String, ProbeResult>>,
}

impl ResultsCache {
    pub(super) fn new(probe_type: ProbeType) -> Self {
        Self { probe_type, cache: Mutex::new(HashMap::new()) }
    }

    /// The probe type whose results this holds.
    #[must_use]
    pub fn probe_type(&self) -> ProbeType {
        self.probe_type
    }

    /// The cached result of the container, if its worker has seen it.
    #[must_use]
    pub fn get(&self, container_id: &str) -> Option<ProbeResult> {
        self.cache.lock().unwrap().get(container_id).copied()
    }

    /// Stores a result; returns whether it differs from the cached one (or there was
    /// none), i.e. whether an update must be sent.
    pub(super) fn set(&self, container_id: &str, result: ProbeResult) -> bool {
        let mut cache = self.cache.lock().unwrap();
        match cache.get(container_id) {
            Some(prev) if *prev == result => false,
            _ => {
                cache.insert(container_id.to_string(), result);
                true
            }
        }
    }

    /// Forgets a container (no update is sent).
    pub(super) fn remove(&self, container_id: &str) {
        self.cache.lock().unwrap().remove(container_id);
    }

    /// How many containers have a result.
    #[must_use]
    pub fn len(&self) -> usize {
        self.cache.lock().unwrap().len()
    }

    /// Whether no container has a result.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
