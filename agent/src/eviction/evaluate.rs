//! The pure steps of upstream's `synchronize` (`helpers.go`): which thresholds are met,
//! since when, which node conditions they raise and for how long, and which threshold to
//! act on first.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::observations::Observations;
use super::thresholds::{NodeCondition, Signal, Threshold};

/// `thresholdsMet`: the thresholds whose signal's available quantity is below the
/// threshold; with `enforce_min_reclaim`, below threshold + minimum reclaim (how a
/// threshold already met stays met until the minimum reclaim is achieved). Thresholds
/// without an observation are never met.
#[must_use]
pub fn thresholds_met(
    thresholds: &[Threshold],
    observations: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(observed) = observations.get(&t.signal) else {
                tracing::debug!(signal = %t.signal, "eviction manager: no observation found for eviction signal");
                return false;
            };
            let mut quantity = t.value.quantity(observed.capacity);
            if enforce_min_reclaim && let Some(min) = t.min_reclaim {
                quantity = quantity + min.quantity(observed.capacity);
            }
            quantity > observed.available
        })
        .copied()
        .collect()
}

/// `mergeThresholds`: `a`, then the thresholds of `b` not already in it.
#[must_use]
pub fn merge_thresholds(a: Vec<Threshold>, b: &[Threshold]) -> Vec<Threshold> {
    let mut out = a;
    for t in b {
        if !out.iter().any(|o| o.same(t)) {
            out.push(*t);
        }
    }
    out
}

/// When each threshold was first met.
pub type ThresholdsObservedAt = Vec<(Threshold, Instant)>;

/// `thresholdsFirstObservedAt`: the met thresholds with the time they were first met
/// (kept from `last`, or `now` for newly met ones).
#[must_use]
pub fn thresholds_first_observed_at(
    met: &[Threshold],
    last: &ThresholdsObservedAt,
    now: Instant,
) -> ThresholdsObservedAt {
    met.iter()
        .map(|t| {
            let at = last.iter().find(|(l, _)| l == t).map_or(now, |&(_, at)| at);
            (*t, at)
        })
        .collect()
}

/// `thresholdsMetGracePeriod`: the thresholds met for at least their grace period.
#[must_use]
pub fn thresholds_met_grace_period(observed_at: &ThresholdsObservedAt, now: Instant) -> Vec<Threshold> {
    observed_at
        .iter()
        .filter(|(t, at)| {
            let met_for = now.saturating_duration_since(*at);
            let ok = met_for >= t.grace_period;
            if !ok {
                tracing::debug!(signal = %t.signal, ?met_for, grace_period = ?t.grace_period, "eviction manager: eviction criteria not yet met");
            }
            ok
        })
        .map(|(t, _)| *t)
        .collect()
}

/// `nodeConditions`: the conditions of the met thresholds, each once.
#[must_use]
pub fn node_conditions(met: &[Threshold]) -> Vec<NodeCondition> {
    let mut out: Vec<NodeCondition> = Vec::new();
    for t in met {
        let c = t.signal.node_condition();
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// When each condition was last observed.
pub type ConditionsObservedAt = BTreeMap<NodeCondition, Instant>;

/// `nodeConditionsLastObservedAt`: the current conditions at `now`, the others at their
/// previous time.
#[must_use]
pub fn node_conditions_last_observed_at(
    current: &[NodeCondition],
    last: &ConditionsObservedAt,
    now: Instant,
) -> ConditionsObservedAt {
    let mut out = last.clone();
    for c in current {
        out.insert(*c, now);
    }
    out
}

/// `nodeConditionsObservedSince`: the conditions observed within `period` of `now` (the
/// pressure transition period), in a fixed order (memory, disk, PID).
#[must_use]
pub fn node_conditions_observed_since(
    observed_at: &ConditionsObservedAt,
    period: Duration,
    now: Instant,
) -> Vec<NodeCondition> {
    observed_at.iter().filter(|(_, at)| now.saturating_duration_since(**at) < period).map(|(c, _)| *c).collect()
}

/// `thresholdsUpdatedStats`: the thresholds whose observation is newer than the one of the
/// previous pass (or has no time, or had no previous observation): stats that did not
/// change since the last decision must not cause a second eviction.
#[must_use]
pub fn thresholds_updated_stats(
    thresholds: &[Threshold],
    observations: &Observations,
    last: &Observations,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(observed) = observations.get(&t.signal) else { return false };
            match (last.get(&t.signal), observed.time) {
                (None, _) | (_, None) => true,
                (Some(previous), Some(time)) => previous.time.is_none_or(|p| time > p),
            }
        })
        .copied()
        .collect()
}

/// `byEvictionPriority`: memory thresholds first, the others in their order.
pub fn sort_by_eviction_priority(thresholds: &mut [Threshold]) {
    thresholds.sort_by_key(|t| !t.signal.is_memory());
}

/// The signals whose node-level reclaim (container and image garbage collection) comes
/// before evicting pods, and which reclaim functions apply (`buildSignalToNodeReclaimFuncs`
/// without split image/container filesystems).
#[must_use]
pub fn node_reclaim_functions(signal: Signal, dedicated_image_fs: bool) -> &'static [ReclaimFunction] {
    const BOTH: &[ReclaimFunction] = &[ReclaimFunction::DeleteAllUnusedContainers, ReclaimFunction::DeleteUnusedImages];
    match signal {
        Signal::NodeFsAvailable | Signal::NodeFsInodesFree if dedicated_image_fs => &[],
        Signal::NodeFsAvailable
        | Signal::NodeFsInodesFree
        | Signal::ImageFsAvailable
        | Signal::ImageFsInodesFree
        | Signal::ContainerFsAvailable
        | Signal::ContainerFsInodesFree => BOTH,
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable | Signal::PidAvailable => &[],
    }
}

/// A node-level reclaim function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReclaimFunction {
    /// Container GC of every dead container (`ContainerGC.DeleteAllUnusedContainers`).
    DeleteAllUnusedContainers,
    /// Image GC of every unused image (`ImageGC.DeleteUnusedImages`).
    DeleteUnusedImages,
}
