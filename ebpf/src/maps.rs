//! The sensors' maps as userspace sees them: the watched roots (the kernel-side
//! filter), the per-cgroup counters and the ring-buffer drop counter.

use aya::maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray};

use crate::{cgroup::CgroupId, events::ExitStatus};

pub(crate) const WATCHED_ROOTS: &str = "watched_roots";
pub(crate) const WATCHED_LEVELS: &str = "watched_levels";
pub(crate) const CGROUP_COUNTERS: &str = "cgroup_counters";
pub(crate) const DROPS: &str = "drops";
pub(crate) const EVENTS: &str = "events";

/// Why a map operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    /// The embedded object lacks a map (a build mismatch, not an operator error).
    #[error("the eBPF object has no map `{name}`")]
    Missing {
        /// The map name.
        name: &'static str,
    },

    /// The map exists but has another type or key/value size than this crate expects.
    #[error("eBPF map `{name}` does not have the expected type or layout")]
    Layout {
        /// The map name.
        name: &'static str,
        /// aya's description.
        #[source]
        source: MapError,
    },

    /// Adding a watched root failed (e.g. more than the map's 64 roots).
    #[error("cannot add cgroup {cgroup} to the watched roots")]
    Watch {
        /// The cgroup.
        cgroup: CgroupId,
        /// The map update error.
        #[source]
        source: MapError,
    },

    /// The root is deeper than the kernel-side filter walks.
    #[error("cgroup {cgroup} is at level {level}; watched roots must be at level {max} or above")]
    TooDeep {
        /// The cgroup.
        cgroup: CgroupId,
        /// Its level below the hierarchy root.
        level: u32,
        /// The deepest level supported.
        max: u32,
    },

    /// Seeding a cgroup's counters failed.
    #[error("cannot record the main process of cgroup {cgroup}")]
    Adopt {
        /// The cgroup.
        cgroup: CgroupId,
        /// The map error.
        #[source]
        source: MapError,
    },

    /// Removing a watched root failed for another reason than its absence.
    #[error("cannot remove cgroup {cgroup} from the watched roots")]
    Unwatch {
        /// The cgroup.
        cgroup: CgroupId,
        /// The map delete error.
        #[source]
        source: MapError,
    },
}

/// Deepest level of a watched root the kernel side checks (`SWL_MAX_DEPTH` - 1).
pub(crate) const MAX_ROOT_LEVEL: u32 = 31;
/// Hierarchy ids with a level mask (`SWL_MAX_HIERARCHIES`); others check every level.
const MAX_HIERARCHIES: u32 = 64;

/// Map key of `watched_roots` and `cgroup_counters` (`struct swl_cgroup_key`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CgroupKey {
    cgroup_id: u64,
    hierarchy_id: u32,
    /// Always 0: the kernel hashes keys byte for byte.
    pad: u32,
}

impl From<CgroupId> for CgroupKey {
    fn from(cgroup: CgroupId) -> Self {
        Self { cgroup_id: cgroup.id, hierarchy_id: cgroup.hierarchy_id, pad: 0 }
    }
}

impl From<CgroupKey> for CgroupId {
    fn from(key: CgroupKey) -> Self {
        Self { hierarchy_id: key.hierarchy_id, id: key.cgroup_id }
    }
}

/// Value of `cgroup_counters` (`struct swl_counters`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RawCounters {
    execs: u64,
    exits: u64,
    group_exits: u64,
    oom_kills: u64,
    reclaims: u64,
    reclaim_ns: u64,
    last_exit_ktime_ns: u64,
    last_exit_status: u32,
    main_tgid: u32,
}

const _: () = {
    assert!(size_of::<CgroupKey>() == 16);
    assert!(size_of::<RawCounters>() == 64);
};

// SAFETY: `#[repr(C)]`, integers only, no padding (sizes asserted above): every bit
// pattern is valid.
unsafe impl aya::Pod for CgroupKey {}
// SAFETY: as above.
unsafe impl aya::Pod for RawCounters {}

/// What the kernel counted for one cgroup since its first event (or since the sensors
/// loaded). Kept in the kernel until the cgroup is removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupCounters {
    /// Every `execve` by a task of the cgroup, reported or not.
    pub execs: u64,
    /// Every task exit, threads included.
    pub exits: u64,
    /// Exits of whole processes (the last thread of a thread group).
    pub process_exits: u64,
    /// OOM-killer victims in the cgroup.
    pub oom_kills: u64,
    /// Reclaim episodes (memcg or direct) that tasks of the cgroup went through.
    pub reclaims: u64,
    /// Total nanoseconds those tasks spent in reclaim.
    pub reclaim_ns: u64,
    /// The last process exit; `None` until a process of the cgroup has exited.
    pub last_exit: Option<LastExit>,
    /// Process id (initial pid namespace) of the cgroup's first exec: the container's
    /// main process. `None` before the first exec.
    pub main_tgid: Option<u32>,
}

/// The last process exit in a cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastExit {
    /// How it ended: exit code or signal.
    pub status: ExitStatus,
    /// When (kernel `CLOCK_MONOTONIC`, nanoseconds).
    pub ktime_ns: u64,
}

impl From<RawCounters> for CgroupCounters {
    fn from(raw: RawCounters) -> Self {
        Self {
            execs: raw.execs,
            exits: raw.exits,
            process_exits: raw.group_exits,
            oom_kills: raw.oom_kills,
            reclaims: raw.reclaims,
            reclaim_ns: raw.reclaim_ns,
            last_exit: (raw.last_exit_ktime_ns != 0).then_some(LastExit {
                status: ExitStatus::from_wait_status(raw.last_exit_status),
                ktime_ns: raw.last_exit_ktime_ns,
            }),
            main_tgid: (raw.main_tgid != 0).then_some(raw.main_tgid),
        }
    }
}

/// Userspace handles on the sensors' state maps.
pub(crate) struct SensorMaps {
    watched_roots: HashMap<MapData, CgroupKey, u32>,
    watched_levels: Array<MapData, u64>,
    counters: HashMap<MapData, CgroupKey, RawCounters>,
    drops: PerCpuArray<MapData, u64>,
}

impl std::fmt::Debug for SensorMaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SensorMaps").finish_non_exhaustive()
    }
}

impl SensorMaps {
    /// Takes the maps out of a loaded object (the programs keep their own references).
    pub(crate) fn take(ebpf: &mut aya::Ebpf) -> Result<Self, MapsError> {
        fn take<T: TryFrom<Map, Error = MapError>>(ebpf: &mut aya::Ebpf, name: &'static str) -> Result<T, MapsError> {
            let map = ebpf.take_map(name).ok_or(MapsError::Missing { name })?;
            T::try_from(map).map_err(|source| MapsError::Layout { name, source })
        }
        Ok(Self {
            watched_roots: take(ebpf, WATCHED_ROOTS)?,
            watched_levels: take(ebpf, WATCHED_LEVELS)?,
            counters: take(ebpf, CGROUP_COUNTERS)?,
            drops: take(ebpf, DROPS)?,
        })
    }

    /// Adds a root at `level` below its hierarchy's root.
    pub(crate) fn watch(&mut self, cgroup: CgroupId, level: u32) -> Result<(), MapsError> {
        if level != crate::cgroup::LEVEL_UNKNOWN && level > MAX_ROOT_LEVEL {
            return Err(MapsError::TooDeep { cgroup, level, max: MAX_ROOT_LEVEL });
        }
        self.watched_roots
            .insert(CgroupKey::from(cgroup), level, 0)
            .map_err(|source| MapsError::Watch { cgroup, source })?;
        // After the root: until the bit is set the kernel skips that level.
        self.sync_levels(cgroup.hierarchy_id).map_err(|source| MapsError::Watch { cgroup, source })
    }

    /// Removes a watched root; removing one that is not there (or was removed by the
    /// kernel on rmdir) is not an error.
    pub(crate) fn unwatch(&mut self, cgroup: CgroupId) -> Result<(), MapsError> {
        match self.watched_roots.remove(&CgroupKey::from(cgroup)) {
            Ok(()) | Err(MapError::KeyNotFound) => {}
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
            Err(source) => return Err(MapsError::Unwatch { cgroup, source }),
        }
        self.sync_levels(cgroup.hierarchy_id).map_err(|source| MapsError::Unwatch { cgroup, source })
    }

    /// Recomputes a hierarchy's level mask from the roots the kernel still has (it
    /// drops roots on rmdir but cannot clear their bit; a stale bit costs one lookup).
    fn sync_levels(&mut self, hierarchy_id: u32) -> Result<(), MapError> {
        if hierarchy_id >= MAX_HIERARCHIES {
            return Ok(());
        }
        let mut mask = 0u64;
        for entry in &self.watched_roots {
            let (key, level) = entry?;
            if key.hierarchy_id == hierarchy_id {
                mask |= if level == crate::cgroup::LEVEL_UNKNOWN { u64::MAX } else { 1u64 << level.min(63) };
            }
        }
        self.watched_levels.set(hierarchy_id, mask, 0)
    }

    pub(crate) fn watched(&self) -> Vec<CgroupId> {
        self.watched_roots.keys().filter_map(Result::ok).map(CgroupId::from).collect()
    }

    /// Records `main_tgid` as the cgroup's main process, keeping any counts.
    pub(crate) fn adopt(&mut self, cgroup: CgroupId, main_tgid: u32) -> Result<(), MapsError> {
        let key = CgroupKey::from(cgroup);
        let adopt_error = |source| MapsError::Adopt { cgroup, source };
        let mut raw = match self.counters.get(&key, 0) {
            Ok(raw) => raw,
            Err(MapError::KeyNotFound) => RawCounters::default(),
            Err(source) => return Err(adopt_error(source)),
        };
        raw.main_tgid = main_tgid;
        // Read-modify-write: an increment by the kernel in between is lost. This runs
        // once per container, at adoption; counts are best effort anyway.
        self.counters.insert(key, raw, 0).map_err(adopt_error)
    }

    pub(crate) fn counters(&self, cgroup: CgroupId) -> Result<Option<CgroupCounters>, MapError> {
        match self.counters.get(&CgroupKey::from(cgroup), 0) {
            Ok(raw) => Ok(Some(raw.into())),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn drops(&self) -> Result<u64, MapError> {
        Ok(self.drops.get(&0, 0)?.iter().copied().fold(0u64, u64::wrapping_add))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_without_an_exit_have_no_last_exit() {
        let counters = CgroupCounters::from(RawCounters { execs: 2, exits: 3, group_exits: 1, ..Default::default() });
        assert_eq!((counters.execs, counters.exits, counters.process_exits), (2, 3, 1));
        assert_eq!(counters.last_exit, None);
    }

    #[test]
    fn last_exit_decodes_the_wait_status() {
        let raw = RawCounters { last_exit_status: 9, last_exit_ktime_ns: 5, ..Default::default() };
        let last = CgroupCounters::from(raw).last_exit.unwrap();
        assert_eq!(last.status.signal(), Some(9));
        assert_eq!(last.ktime_ns, 5);
    }

    #[test]
    fn main_tgid_zero_means_no_exec_yet() {
        assert_eq!(CgroupCounters::from(RawCounters::default()).main_tgid, None);
        let raw = RawCounters { main_tgid: 42, ..Default::default() };
        assert_eq!(CgroupCounters::from(raw).main_tgid, Some(42));
    }

    #[test]
    fn keys_round_trip_and_zero_the_padding() {
        let id = CgroupId { hierarchy_id: 4, id: 1 << 40 };
        let key = CgroupKey::from(id);
        assert_eq!(key.pad, 0);
        assert_eq!(CgroupId::from(key), id);
    }
}
