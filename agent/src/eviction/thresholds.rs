//! Eviction thresholds, parsed from the eviction settings ([`ThresholdSettings`]: the
//! `eviction*` fields of the `KubeletConfiguration`) as upstream's `ParseThresholdConfig`
//! (`pkg/kubelet/eviction/helpers.go`) does it, plus
//! `UpdateContainerFsThresholds` (the `containerfs.*` thresholds follow `nodefs.*` on a
//! single filesystem and `imagefs.*` on a dedicated image filesystem).
//!
//! Rules kept from upstream:
//! - the operator is always `<` (`LessThan`); it is implied by the signal;
//! - `0%` and `100%` thresholds are ignored; other percentages must be within [0, 100];
//!   quantities must be positive;
//! - every soft threshold needs a grace period; grace periods must not be negative;
//! - a minimum reclaim percentage must be positive, a minimum reclaim quantity not
//!   negative;
//! - `allocatableMemory.available` copies the hard `memory.available` threshold when
//!   `enforceNodeAllocatable` contains `pods`;
//! - `mergeDefaultEvictionSettings: false` (the default): a given `evictionHard` replaces
//!   the defaults, so signals it leaves out have no hard threshold; `true`: the Linux
//!   defaults fill the signals it leaves out (`settings::eviction` merges them).
//!
//! The signals, threshold values and the grammar of one entry are in the `types` leaf
//! ([`crate::types::eviction`]), which config validation uses too.
//!
//! Unlike upstream, which stops at the first problem, parsing reports every problem, each
//! naming the setting and the signal.

use std::collections::BTreeMap;
use std::time::Duration;

pub use crate::types::eviction::{Error, NodeCondition, Resource, Signal, Threshold, ThresholdValue};
use crate::types::eviction::{parse_grace_period, parse_min_reclaim, parse_threshold_value};

/// The eviction settings the thresholds are parsed from: the `eviction*` fields of the
/// `KubeletConfiguration`, as `settings::eviction` takes them from it. The maps are keyed
/// by signal name (`memory.available`) and hold the values as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThresholdSettings {
    /// The `evictionHard` map in effect: `evictionHard`, and with
    /// `mergeDefaultEvictionSettings` the Linux defaults for the signals it leaves out.
    pub hard: BTreeMap<String, String>,
    /// `evictionSoft`.
    pub soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod` (Go durations).
    pub soft_grace_period: BTreeMap<String, String>,
    /// `evictionMinimumReclaim`.
    pub minimum_reclaim: BTreeMap<String, String>,
    /// `enforceNodeAllocatable` contains `pods`: `allocatableMemory.available` copies the
    /// hard `memory.available` threshold.
    pub enforce_pods_allocatable: bool,
    /// `evictionPressureTransitionPeriod`.
    pub pressure_transition_period: Duration,
    /// `evictionMaxPodGracePeriod`, seconds.
    pub max_pod_grace_period_seconds: i64,
    /// `localStorageCapacityIsolation`.
    pub local_storage_capacity_isolation: bool,
}

/// The eviction manager's configuration (`eviction.Config`).
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionConfig {
    /// Hard thresholds, then soft ones, then `allocatableMemory.available`.
    pub thresholds: Vec<Threshold>,
    /// How long a pressure condition stays after its last threshold was met.
    /// Default: 5 minutes.
    pub pressure_transition_period: Duration,
    /// Upper bound of the grace period of soft evictions, seconds. Default: 0.
    pub max_pod_grace_period_seconds: i64,
    /// `localStorageCapacityIsolation`: evict pods over their local storage limits
    /// ([`super::local_storage`]). Default: true.
    pub local_storage_capacity_isolation: bool,
}

/// Every problem of the eviction settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid eviction settings: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct Errors(pub Vec<Error>);

/// Parses a per-signal setting (`evictionSoftGracePeriod`, `evictionMinimumReclaim`) into
/// a map by signal; each bad entry goes to `errors`.
fn by_signal<V, F>(map: &BTreeMap<String, String>, parse: F, errors: &mut Vec<Error>) -> BTreeMap<Signal, V>
where
    F: Fn(&str, &str) -> Result<(Signal, V), Error>,
{
    let mut out = BTreeMap::new();
    for (name, text) in map {
        match parse(name, text) {
            Ok((signal, v)) => {
                out.insert(signal, v);
            }
            Err(e) => errors.push(e),
        }
    }
    out
}

impl EvictionConfig {
    /// Parses the eviction settings.
    ///
    /// # Errors
    /// Every bad setting, each naming the setting and the signal.
    pub fn from_settings(settings: &ThresholdSettings) -> Result<Self, Errors> {
        let mut errors = Vec::new();
        let mut statements = |setting: &'static str, map: &BTreeMap<String, String>| {
            let mut out = Vec::new();
            for (name, text) in map {
                match parse_threshold_value(setting, name, text) {
                    Ok(Some(parsed)) => out.push(parsed),
                    Ok(None) => {}
                    Err(e) => errors.push(e),
                }
            }
            out
        };
        let hard = statements("evictionHard", &settings.hard);
        let soft = statements("evictionSoft", &settings.soft);
        let grace_periods = by_signal(&settings.soft_grace_period, parse_grace_period, &mut errors);
        let min_reclaims = by_signal(&settings.minimum_reclaim, parse_min_reclaim, &mut errors);
        let mut thresholds: Vec<Threshold> = hard
            .into_iter()
            .map(|(signal, value)| Threshold { signal, value, grace_period: Duration::ZERO, min_reclaim: None })
            .collect();
        for (signal, value) in soft {
            match grace_periods.get(&signal) {
                Some(&grace_period) => thresholds.push(Threshold { signal, value, grace_period, min_reclaim: None }),
                None => errors.push(Error::MissingGracePeriod { signal: signal.as_str().to_owned() }),
            }
        }
        for t in &mut thresholds {
            t.min_reclaim = min_reclaims.get(&t.signal).copied();
        }
        if settings.enforce_pods_allocatable {
            let allocatable: Vec<Threshold> = thresholds
                .iter()
                .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
                .map(|t| Threshold { signal: Signal::AllocatableMemoryAvailable, ..*t })
                .collect();
            thresholds.extend(allocatable);
        }
        if !errors.is_empty() {
            return Err(Errors(errors));
        }
        Ok(Self {
            thresholds,
            pressure_transition_period: settings.pressure_transition_period,
            max_pod_grace_period_seconds: settings.max_pod_grace_period_seconds,
            local_storage_capacity_isolation: settings.local_storage_capacity_isolation,
        })
    }
}

/// `UpdateContainerFsThresholds` without split image/container filesystems (which the
/// stats never report): the `containerfs.*` thresholds become copies of the `nodefs.*`
/// ones on a single filesystem, of the `imagefs.*` ones with a dedicated image
/// filesystem, replacing any given ones (upstream logs that it ignores them).
#[must_use]
pub fn with_container_fs_thresholds(thresholds: &[Threshold], dedicated_image_fs: bool) -> Vec<Threshold> {
    let (bytes_from, inodes_from) = if dedicated_image_fs {
        (Signal::ImageFsAvailable, Signal::ImageFsInodesFree)
    } else {
        (Signal::NodeFsAvailable, Signal::NodeFsInodesFree)
    };
    let mut out: Vec<Threshold> = thresholds
        .iter()
        .filter(|t| !matches!(t.signal, Signal::ContainerFsAvailable | Signal::ContainerFsInodesFree))
        .copied()
        .collect();
    for (from, to) in [(bytes_from, Signal::ContainerFsAvailable), (inodes_from, Signal::ContainerFsInodesFree)] {
        for hard in [true, false] {
            if let Some(t) = thresholds.iter().find(|t| t.signal == from && t.is_hard() == hard) {
                out.push(Threshold { signal: to, ..*t });
            }
        }
    }
    out
}
