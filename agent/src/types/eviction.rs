//! The eviction API's value types and the grammar of one eviction setting, shared by the
//! configuration's validation and the eviction manager: signals, the resources they
//! measure and the node conditions they raise, threshold values (upstream's
//! `pkg/kubelet/eviction/api`), and the parsing of one `evictionHard`/`evictionSoft`,
//! `evictionMinimumReclaim` or `evictionSoftGracePeriod` entry (the statement parsing of
//! `pkg/kubelet/eviction/helpers.go`). Turning whole settings into thresholds is the
//! eviction manager's (`eviction::thresholds`).

use std::fmt;
use std::time::Duration;

use crate::types::duration::GoDuration;
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
pub fn parse_threshold_value(
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
pub fn parse_min_reclaim(name: &str, text: &str) -> Result<(Signal, ThresholdValue), Error> {
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
pub fn parse_grace_period(name: &str, text: &str) -> Result<(Signal, Duration), Error> {
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
