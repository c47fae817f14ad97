//! Eviction signals and thresholds, parsed from the `KubeletConfiguration` as upstream's
//! `ParseThresholdConfig` (`pkg/kubelet/eviction/helpers.go`) does it, plus
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
//!   defaults fill the signals it leaves out.
//!
//! Unlike upstream, which stops at the first problem, parsing reports every problem, each
//! naming the setting and the signal.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::config::{DEFAULT_EVICTION_HARD, GoDuration, KubeletConfiguration};

use crate::types::quantity::{Format, Quantity};

/// An eviction signal (`evictionapi.Signal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    /// `memory.available`: node capacity − working set of the root cgroup.
    MemoryAvailable,
    /// `allocatableMemory.available`: the pods cgroup's limit − its working set.
    AllocatableMemoryAvailable,
    /// `nodefs.available`: free bytes of the kubelet's root filesystem.
    NodeFsAvailable,
    /// `nodefs.inodesFree`.
    NodeFsInodesFree,
    /// `imagefs.available`: free bytes of the runtime's image filesystem.
    ImageFsAvailable,
    /// `imagefs.inodesFree`.
    ImageFsInodesFree,
    /// `containerfs.available`: the filesystem of writable layers.
    ContainerFsAvailable,
    /// `containerfs.inodesFree`.
    ContainerFsInodesFree,
    /// `pid.available`: `pid_max` − running processes.
    PidAvailable,
}

impl Signal {
    /// Every signal.
    pub const ALL: [Self; 9] = [
        Self::MemoryAvailable,
        Self::AllocatableMemoryAvailable,
        Self::NodeFsAvailable,
        Self::NodeFsInodesFree,
        Self::ImageFsAvailable,
        Self::ImageFsInodesFree,
        Self::ContainerFsAvailable,
        Self::ContainerFsInodesFree,
        Self::PidAvailable,
    ];

    /// The configuration spelling (`memory.available`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::AllocatableMemoryAvailable => "allocatableMemory.available",
            Self::NodeFsAvailable => "nodefs.available",
            Self::NodeFsInodesFree => "nodefs.inodesFree",
            Self::ImageFsAvailable => "imagefs.available",
            Self::ImageFsInodesFree => "imagefs.inodesFree",
            Self::ContainerFsAvailable => "containerfs.available",
            Self::ContainerFsInodesFree => "containerfs.inodesFree",
            Self::PidAvailable => "pid.available",
        }
    }

    /// Parses the configuration spelling.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The resource to reclaim (`signalToResource`).
    #[must_use]
    pub fn resource(self) -> Resource {
        match self {
            Self::MemoryAvailable | Self::AllocatableMemoryAvailable => Resource::Memory,
            Self::NodeFsAvailable | Self::ImageFsAvailable | Self::ContainerFsAvailable => Resource::EphemeralStorage,
            Self::NodeFsInodesFree | Self::ImageFsInodesFree | Self::ContainerFsInodesFree => Resource::Inodes,
            Self::PidAvailable => Resource::Pids,
        }
    }

    /// The node condition reported while a threshold of this signal is met
    /// (`signalToNodeCondition`).
    #[must_use]
    pub fn node_condition(self) -> NodeCondition {
        match self.resource() {
            Resource::Memory => NodeCondition::MemoryPressure,
            Resource::EphemeralStorage | Resource::Inodes => NodeCondition::DiskPressure,
            Resource::Pids => NodeCondition::PidPressure,
        }
    }

    /// A memory signal: ranked before all others (`byEvictionPriority`).
    #[must_use]
    pub fn is_memory(self) -> bool {
        self.resource() == Resource::Memory
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A resource the eviction manager reclaims; `inodes` and `pids` are internal names, as
/// upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// `memory`.
    Memory,
    /// `ephemeral-storage`.
    EphemeralStorage,
    /// `inodes`.
    Inodes,
    /// `pids`.
    Pids,
}

impl Resource {
    /// The name in messages, events and pod requests.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::EphemeralStorage => "ephemeral-storage",
            Self::Inodes => "inodes",
            Self::Pids => "pids",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A node pressure condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeCondition {
    /// `MemoryPressure`.
    MemoryPressure,
    /// `DiskPressure`.
    DiskPressure,
    /// `PIDPressure`.
    PidPressure,
}

impl NodeCondition {
    /// The API spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemoryPressure => "MemoryPressure",
            Self::DiskPressure => "DiskPressure",
            Self::PidPressure => "PIDPressure",
        }
    }
}

impl fmt::Display for NodeCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A threshold value: a quantity, or a fraction of the signal's capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    /// An absolute quantity (`100Mi`).
    Quantity(Quantity),
    /// A fraction in (0, 1], kept as Go's `float32`.
    Percentage(f32),
}

impl ThresholdValue {
    /// `GetThresholdQuantity`: the quantity as given, or `capacity × percentage`
    /// truncated, in bytes format.
    #[must_use]
    pub fn quantity(self, capacity: Quantity) -> Quantity {
        match self {
            Self::Quantity(q) => q,
            #[expect(clippy::cast_precision_loss, clippy::cast_possible_truncation, reason = "as Go's float64 math")]
            Self::Percentage(p) => Quantity::new((capacity.units() as f64 * f64::from(p)) as i64, Format::BinarySi),
        }
    }
}

/// An eviction threshold (`evictionapi.Threshold`); the operator is always `<`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    /// What is measured.
    pub signal: Signal,
    /// The level under which the threshold is met.
    pub value: ThresholdValue,
    /// How long it must be met before evicting; zero for a hard threshold.
    pub grace_period: Duration,
    /// How much to reclaim beyond the threshold once met.
    pub min_reclaim: Option<ThresholdValue>,
}

impl Threshold {
    /// A hard threshold: no grace period (`isHardEvictionThreshold`).
    #[must_use]
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }

    /// Upstream's `hasThreshold` identity: signal, value and grace period (not the
    /// minimum reclaim).
    #[must_use]
    pub fn same(&self, other: &Self) -> bool {
        self.signal == other.signal && self.value == other.value && self.grace_period == other.grace_period
    }
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

impl Default for EvictionConfig {
    fn default() -> Self {
        Self::from_kubelet_configuration(&KubeletConfiguration::default())
            .expect("the default KubeletConfiguration has valid eviction settings")
    }
}

/// A bad eviction setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The signal is not one of [`Signal::ALL`].
    #[error("{setting}[{signal}]: unsupported eviction signal {signal}")]
    UnsupportedSignal {
        /// `evictionHard`, `evictionSoft`, ...
        setting: &'static str,
        /// The signal as given.
        signal: String,
    },
    /// The value is not valid for the setting.
    #[error("{setting}[{signal}]: {message}")]
    InvalidValue {
        /// `evictionHard`, `evictionSoft`, ...
        setting: &'static str,
        /// The signal.
        signal: String,
        /// What is wrong, with the value.
        message: String,
    },
    /// A soft threshold without a grace period.
    #[error(
        "evictionSoftGracePeriod[{signal}]: grace period must be specified for the soft eviction threshold {signal}"
    )]
    MissingGracePeriod {
        /// The signal.
        signal: String,
    },
}

/// Every problem of the eviction settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid eviction settings: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct Errors(pub Vec<Error>);

fn invalid(setting: &'static str, signal: &str, message: String) -> Error {
    Error::InvalidValue { setting, signal: signal.to_owned(), message }
}

fn signal_of(setting: &'static str, name: &str) -> Result<Signal, Error> {
    Signal::from_name(name).ok_or_else(|| Error::UnsupportedSignal { setting, signal: name.to_owned() })
}

/// `parsePercentage`: `"10%"` → 0.1 as `float32`.
fn parse_percentage(setting: &'static str, signal: &str, text: &str) -> Result<f32, Error> {
    let number = text.trim_end_matches('%');
    let value: f64 = number.parse().map_err(|_| invalid(setting, signal, format!("invalid percentage {text:?}")))?;
    #[expect(clippy::cast_possible_truncation, reason = "Go parses the percentage as a float32")]
    Ok(value as f32 / 100.0)
}

/// `parseThresholdStatement`; `Ok(None)` for the ignored `0%` and `100%`.
fn parse_threshold_value(
    setting: &'static str,
    name: &str,
    text: &str,
) -> Result<Option<(Signal, ThresholdValue)>, Error> {
    let signal = signal_of(setting, name)?;
    if text.ends_with('%') {
        if text == "0%" || text == "100%" {
            return Ok(None);
        }
        let p = parse_percentage(setting, name, text)?;
        if p < 0.0 {
            return Err(invalid(setting, name, format!("eviction percentage threshold {name} must be >= 0%: {text}")));
        }
        if p > 1.0 {
            return Err(invalid(
                setting,
                name,
                format!("eviction percentage threshold {name} must be <= 100%: {text}"),
            ));
        }
        return Ok(Some((signal, ThresholdValue::Percentage(p))));
    }
    let q = Quantity::parse(text).map_err(|e| invalid(setting, name, e.to_string()))?;
    if q.is_negative() || q.is_zero() {
        return Err(invalid(setting, name, format!("eviction threshold {name} must be positive: {q}")));
    }
    Ok(Some((signal, ThresholdValue::Quantity(q))))
}

/// `parseMinimumReclaims` for one entry.
fn parse_min_reclaim(name: &str, text: &str) -> Result<(Signal, ThresholdValue), Error> {
    const SETTING: &str = "evictionMinimumReclaim";
    let signal = signal_of(SETTING, name)?;
    if text.ends_with('%') {
        let p = parse_percentage(SETTING, name, text)?;
        if p <= 0.0 {
            return Err(invalid(
                SETTING,
                name,
                format!("eviction percentage minimum reclaim {name} must be positive: {text}"),
            ));
        }
        return Ok((signal, ThresholdValue::Percentage(p)));
    }
    let q = Quantity::parse(text).map_err(|e| invalid(SETTING, name, e.to_string()))?;
    if q.is_negative() {
        return Err(invalid(SETTING, name, format!("negative eviction minimum reclaim specified for {name}")));
    }
    Ok((signal, ThresholdValue::Quantity(q)))
}

/// `parseGracePeriods` for one entry.
fn parse_grace_period(name: &str, text: &str) -> Result<(Signal, Duration), Error> {
    const SETTING: &str = "evictionSoftGracePeriod";
    let signal = signal_of(SETTING, name)?;
    let d: GoDuration = text.parse().map_err(|e| invalid(SETTING, name, format!("{e}")))?;
    if d.is_negative() {
        return Err(invalid(
            SETTING,
            name,
            format!("invalid eviction grace period specified: {text}, must be a positive value"),
        ));
    }
    Ok((signal, d.to_std()))
}

/// Checks one `evictionHard`/`evictionSoft` value the way parsing does: `None` when valid
/// (for config validation, which reports `field[signal]: message`).
#[must_use]
pub fn check_threshold(setting: &'static str, signal: &str, value: &str) -> Option<String> {
    let result = if setting == "evictionMinimumReclaim" {
        parse_min_reclaim(signal, value).map(|_| ())
    } else {
        parse_threshold_value(setting, signal, value).map(|_| ())
    };
    result.err().map(|e| match e {
        Error::InvalidValue { message, .. } => message,
        other => other.to_string(),
    })
}

/// The `evictionHard` map in effect: with `mergeDefaultEvictionSettings`, the Linux
/// defaults fill the signals the given map leaves out.
#[must_use]
pub fn effective_eviction_hard(kc: &KubeletConfiguration) -> BTreeMap<String, String> {
    let mut hard = kc.eviction_hard.clone();
    if kc.merge_default_eviction_settings {
        for (signal, value) in DEFAULT_EVICTION_HARD {
            hard.entry(signal.to_owned()).or_insert_with(|| value.to_owned());
        }
    }
    hard
}

impl EvictionConfig {
    /// Parses the eviction settings of a (defaulted) configuration.
    ///
    /// # Errors
    /// Every bad setting, each naming the setting and the signal.
    pub fn from_kubelet_configuration(kc: &KubeletConfiguration) -> Result<Self, Errors> {
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
        let hard = statements("evictionHard", &effective_eviction_hard(kc));
        let soft = statements("evictionSoft", &kc.eviction_soft);
        let mut grace_periods = BTreeMap::new();
        for (name, text) in &kc.eviction_soft_grace_period {
            match parse_grace_period(name, text) {
                Ok((signal, d)) => {
                    grace_periods.insert(signal, d);
                }
                Err(e) => errors.push(e),
            }
        }
        let mut min_reclaims = BTreeMap::new();
        for (name, text) in &kc.eviction_minimum_reclaim {
            match parse_min_reclaim(name, text) {
                Ok((signal, v)) => {
                    min_reclaims.insert(signal, v);
                }
                Err(e) => errors.push(e),
            }
        }
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
        if kc.enforce_node_allocatable.iter().any(|k| k == "pods") {
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
        let max_pod_grace_period_seconds = i64::from(kc.eviction_max_pod_grace_period);
        Ok(Self {
            thresholds,
            pressure_transition_period: kc.eviction_pressure_transition_period.to_std(),
            max_pod_grace_period_seconds,
            local_storage_capacity_isolation: kc.local_storage_capacity_isolation,
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
