//! [`Sensors`]: the loaded, attached programs and everything userspace does with them
//! (choose what to watch, stream events, read counters).

use std::{
    fmt,
    path::Path,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use aya::{
    Ebpf,
    maps::{MapData, RingBuf},
};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{debug, warn};

use crate::{
    cgroup::{CgroupDir, CgroupId},
    error::Result,
    events::SensorEvent,
    loader::{self, LoadError, ProgramStats},
    maps::{self, CgroupCounters, MapsError, SensorMaps},
    ring_buf::{self, ReaderStats},
};

/// How the sensors are sized. `Default` gives the values documented on each field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SensorConfig {
    /// Ring buffer size in bytes: a power of two and a multiple of the page size.
    /// Default 256 KiB: ~2700 exit records (96 bytes with the ring header) or ~460 cgroup
    /// records (560 bytes) in flight.
    pub ring_buffer_bytes: u32,
    /// Decoded events buffered between the reader task and the consumer. Default 4096.
    pub channel_capacity: usize,
    /// How often the reader drains records written without a wakeup (reclaim, exits
    /// of processes other than a cgroup's main one). Bounds their delay when no other
    /// record wakes the reader first. Default 250 ms.
    pub pressure_flush_interval: Duration,
    /// The inode number of the pid namespace whose process ids [`Sensors::adopt_cgroup`]
    /// is given (and the kernel keeps for a cgroup's main process); `None` (the
    /// default): this process's own. An agent in a node container (kind's way) sees the
    /// node's pids, not the host's.
    pub pid_namespace_inum: Option<u64>,
}

impl Default for SensorConfig {
    fn default() -> Self {
        Self {
            ring_buffer_bytes: 256 * 1024,
            channel_capacity: 4096,
            pressure_flush_interval: Duration::from_millis(250),
            pid_namespace_inum: None,
        }
    }
}

impl SensorConfig {
    /// Checks what the kernel would reject, naming the setting.
    pub fn validate(&self) -> Result<(), LoadError> {
        let page = page_size();
        let bytes = self.ring_buffer_bytes;
        if !bytes.is_power_of_two() || u64::from(bytes) % page != 0 {
            return Err(LoadError::InvalidConfig {
                reason: format!(
                    "ring_buffer_bytes = {bytes}: must be a power of two and a multiple of the page size ({page})"
                ),
            });
        }
        if self.channel_capacity == 0 {
            return Err(LoadError::InvalidConfig { reason: "channel_capacity = 0: must be at least 1".into() });
        }
        if self.pressure_flush_interval.is_zero() {
            return Err(LoadError::InvalidConfig { reason: "pressure_flush_interval = 0: must be positive".into() });
        }
        Ok(())
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// The loaded and attached eBPF sensors.
///
/// Nothing is reported until a root is watched ([`Sensors::watch_cgroup`]). Dropping
/// `Sensors` detaches every program, frees the maps and stops the event stream.
pub struct Sensors {
    maps: SensorMaps,
    ring: Option<RingBuf<MapData>>,
    config: SensorConfig,
    reader_stats: Arc<ReaderStats>,
    /// Stops the reader task when `Sensors` drops, whatever the caller's token does.
    reader_guard: Option<DropGuard>,
    /// Owns the programs and their links; dropped last.
    ebpf: Ebpf,
}

// The agent shares `Sensors` between tasks (e.g. behind an `Arc` for `drops`).
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Sensors>();
    assert_send_sync::<SensorEvent>();
    assert_send_sync::<crate::Error>();
};

impl fmt::Debug for Sensors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sensors")
            .field("config", &self.config)
            .field("watched", &self.watched_cgroups())
            .field("stream_taken", &self.ring.is_none())
            .finish_non_exhaustive()
    }
}

impl Sensors {
    /// Loads the programs, attaches them to their tracepoints and creates the maps.
    ///
    /// Never panics; every failure is a [`LoadError`] saying why (no BTF, not enough
    /// privilege, verifier rejection with its log, a missing tracepoint, ...).
    pub fn load(cfg: &SensorConfig) -> Result<Self> {
        cfg.validate()?;
        let mut ebpf = loader::load_and_attach(cfg.ring_buffer_bytes, cfg.pid_namespace_inum)?;
        let maps = SensorMaps::take(&mut ebpf)?;
        let ring = ebpf.take_map(maps::EVENTS).ok_or(MapsError::Missing { name: maps::EVENTS })?;
        let ring = RingBuf::try_from(ring).map_err(|source| MapsError::Layout { name: maps::EVENTS, source })?;
        debug!(ring_buffer_bytes = cfg.ring_buffer_bytes, "eBPF sensors attached");
        Ok(Self { maps, ring: Some(ring), config: cfg.clone(), reader_stats: Arc::default(), reader_guard: None, ebpf })
    }

    /// Reports on `dir` and every cgroup below it, e.g. `/sys/fs/cgroup/unified/kubepods`
    /// or `/sys/fs/cgroup/memory/kubepods`. Returns the root's id.
    ///
    /// Cgroup events are matched in the root's own hierarchy; task events through the
    /// task's cgroup2 cgroup and its v1 memory cgroup, so on a v1 node watch the memory
    /// hierarchy's root (and the cgroup2 one where containers also live there). A root
    /// is forgotten by the kernel when its directory is removed.
    pub fn watch_cgroup(&mut self, dir: &Path) -> Result<CgroupId> {
        let resolved = CgroupDir::resolve(dir)?;
        self.maps.watch(resolved.id, resolved.level)?;
        debug!(dir = %dir.display(), cgroup = %resolved.id, "watching cgroup subtree");
        Ok(resolved.id)
    }

    /// Stops reporting on the subtree rooted at `dir` (which must still exist; use
    /// [`Sensors::unwatch_cgroup_id`] otherwise). Not watching it is not an error.
    pub fn unwatch_cgroup(&mut self, dir: &Path) -> Result<()> {
        let cgroup = CgroupId::of_dir(dir)?;
        self.unwatch_cgroup_id(cgroup)
    }

    /// Stops reporting on the subtree rooted at `cgroup`. Not watching it is not an error.
    pub fn unwatch_cgroup_id(&mut self, cgroup: CgroupId) -> Result<()> {
        Ok(self.maps.unwatch(cgroup)?)
    }

    /// Tells the sensors which process is `cgroup`'s main process, for containers that
    /// started before the sensors loaded (after an agent restart): without it the next
    /// exec in the cgroup (a probe, say) would be taken for the first one, and the main
    /// process's exit would not wake the reader. `main_tgid` is the process id in the
    /// node's pid namespace (CRI's container pid). Call it for both `TaskInfo::cgroup2`
    /// and `TaskInfo::memcg` cgroups when both are watched.
    pub fn adopt_cgroup(&mut self, cgroup: CgroupId, main_tgid: u32) -> Result<()> {
        Ok(self.maps.adopt(cgroup, main_tgid)?)
    }

    /// The watched roots, as the kernel has them (removed directories drop out).
    #[must_use]
    pub fn watched_cgroups(&self) -> Vec<CgroupId> {
        self.maps.watched()
    }

    /// Starts the reader task on the current tokio runtime and returns its events.
    ///
    /// The task ends when the receiver is dropped, `cancel` fires, or `Sensors` drops.
    /// Can be called once; the ring buffer has a single consumer.
    pub fn take_event_stream(&mut self, cancel: &CancellationToken) -> Result<mpsc::Receiver<SensorEvent>> {
        let token = cancel.child_token();
        let rx = ring_buf::spawn(
            &mut self.ring,
            self.config.channel_capacity,
            self.config.pressure_flush_interval,
            token.clone(),
            Arc::clone(&self.reader_stats),
        )?;
        self.reader_guard = Some(token.drop_guard());
        Ok(rx)
    }

    /// Records the kernel could not write because the ring buffer was full, summed over
    /// CPUs, since load. Any drop means the relisting PLEG must repair state.
    #[must_use]
    pub fn drops(&self) -> u64 {
        self.maps.drops().unwrap_or_else(|error| {
            warn!(%error, "cannot read the sensor drop counter");
            0
        })
    }

    /// Records that reached userspace but could not be decoded (a bug, never expected).
    #[must_use]
    pub fn decode_errors(&self) -> u64 {
        self.reader_stats.decode_errors.load(Ordering::Relaxed)
    }

    /// The kernel's counters for one cgroup at or below a watched root; `None` before its
    /// first counted event and after it is removed. Keyed per hierarchy: pass
    /// `TaskInfo::cgroup2` or `TaskInfo::memcg` from an event, or [`CgroupId::of_dir`].
    #[must_use]
    pub fn cgroup_counters(&self, cgroup: CgroupId) -> Option<CgroupCounters> {
        self.maps.counters(cgroup).unwrap_or_else(|error| {
            warn!(%error, %cgroup, "cannot read cgroup counters");
            None
        })
    }

    /// Kernel-side cost of each program (run counts and times need BPF statistics on).
    #[must_use]
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        loader::program_stats(&self.ebpf)
    }

    /// `CLOCK_MONOTONIC` now, in nanoseconds: the clock of every event's `ktime_ns`, so
    /// `monotonic_now_ns() - event.ktime_ns()` is the kernel-to-here latency.
    #[must_use]
    pub fn monotonic_now_ns() -> u64 {
        crate::clock::monotonic_now_ns()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented default: records written without a wakeup (direct reclaim, the
    /// kernel's memory pressure signal) reach the reader within 250 ms.
    #[test]
    fn records_without_a_wakeup_are_drained_every_250_ms() {
        assert_eq!(SensorConfig::default().pressure_flush_interval, Duration::from_millis(250));
    }

    #[test]
    fn default_config_is_valid() {
        let cfg = SensorConfig::default();
        assert_eq!(cfg.ring_buffer_bytes, 256 * 1024);
        cfg.validate().unwrap();
    }

    #[test]
    fn ring_sizes_must_be_power_of_two_pages() {
        for bytes in [0, 1000, 4096 * 3, 2048] {
            let error = SensorConfig { ring_buffer_bytes: bytes, ..Default::default() }.validate().unwrap_err();
            assert!(error.to_string().contains("ring_buffer_bytes"), "{error}");
        }
        SensorConfig { ring_buffer_bytes: 4096, ..Default::default() }.validate().unwrap();
    }

    #[test]
    fn zero_capacity_and_interval_are_rejected() {
        let zero_capacity = SensorConfig { channel_capacity: 0, ..Default::default() };
        assert!(zero_capacity.validate().unwrap_err().to_string().contains("channel_capacity"));
        let zero_flush = SensorConfig { pressure_flush_interval: Duration::ZERO, ..Default::default() };
        assert!(zero_flush.validate().unwrap_err().to_string().contains("pressure_flush_interval"));
    }
}
