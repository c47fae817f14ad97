//! [`FsUsageCache`]: `du` walks of writable layers and volumes, done in the background so
//! that a collection (a scrape) never walks a directory.
//!
//! A collection asks for a path's usage with [`FsUsageCache::get`]: it gets the latest
//! measurement (or nothing before the first one) and registers the path. A background
//! task ([`FsUsageCache::run`]) walks each registered path when it is due: at once when
//! first registered, then after `interval` plus a random jitter of up to
//! `jitter × interval` (upstream: cAdvisor's fs handler and the kubelet's volume stat
//! calculator both wait `period × (1 + rand)`, period 1 min). Walks run one after the other
//! on the blocking pool, never holding the cache's lock. Paths the collector no longer
//! reports are dropped ([`FsUsageCache::retain`]); paths nobody asked for during `idle`
//! are not walked any more until asked for again (a node nobody scrapes walks nothing).
//!
//! Each walk's duration goes to `kubelet_volume_metric_collection_duration_seconds` with
//! `metric_source="du"` when the cache has the agent's metrics
//! ([`FsUsageCache::with_metrics`]), as upstream's `fs.DiskUsage` observes every walk.
//!
//! A path that cannot be examined has no usage; the first failure (and the first walk that
//! meets unreadable directories) of a path is logged as a warning, later ones at debug.
//!
//! A CSI volume's path ([`FsUsageCache::get_from_driver`]) is not walked: on the same
//! schedule its driver is asked through the [`VolumeStatsSource`] set with
//! [`FsUsageCache::set_volume_stats_source`] (its duration observed with the driver's
//! name as `metric_source`, as upstream's `metricsCsi`), and the figures kept are the
//! driver's, capacity and inodes included. A driver that does not report stats, or a
//! failed call (logged as a walk's failure is), leaves the volume without figures.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::collector::{Clock, DriverVolume, UsageSample};
use super::fs::{self, DiskUsage, FsInfo};
use super::metrics::VolumeStatMetrics;

/// A volume's figures as its driver reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverVolumeStats {
    /// Capacity, available and used bytes, inodes and free inodes.
    pub fs: FsInfo,
    /// Used bytes and inodes.
    pub usage: DiskUsage,
}

/// Where CSI volumes' figures come from (the CSI drivers' `NodeGetVolumeStats`).
pub trait VolumeStatsSource: Send + Sync {
    /// The figures of `volume` published at `path`; `Ok(None)` when its driver does not
    /// report volume stats. Blocking.
    ///
    /// # Errors
    /// The driver could not be asked or failed; the message says why.
    fn volume_stats(&self, volume: &DriverVolume, path: &Path) -> Result<Option<DriverVolumeStats>, String>;
}

/// Settings of a [`FsUsageCache`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FsUsageConfig {
    /// The shortest time between two walks of a path. Default 1 min; the agent sets
    /// `volumeStatsAggPeriod`.
    pub interval: Duration,
    /// The random extra wait, as a fraction of `interval` (0 = none). Default 1.0.
    pub jitter: f64,
    /// A path nobody asked for this long is not walked until asked for again.
    /// Default 5 min.
    pub idle: Duration,
}

impl Default for FsUsageConfig {
    fn default() -> Self {
        Self { interval: Duration::from_mins(1), jitter: 1.0, idle: Duration::from_mins(5) }
    }
}

#[derive(Debug)]
struct Entry {
    /// The latest result: when measured, and the usage (`None`: could not be examined).
    last: Option<(SystemTime, Option<DiskUsage>)>,
    /// When the next walk is due.
    due: Instant,
    /// When a collection last asked for it.
    wanted: Instant,
    /// Whether the last walk failed or met unreadable directories (to warn once).
    troubled: bool,
    /// A CSI volume measured by its driver, and the driver's last figures.
    driver: Option<(DriverVolume, Option<FsInfo>)>,
}

/// Cached `du` of paths, refreshed in the background (see the module docs).
pub struct FsUsageCache {
    config: FsUsageConfig,
    clock: Clock,
    entries: Mutex<HashMap<PathBuf, Entry>>,
    wake: tokio::sync::Notify,
    walks: std::sync::atomic::AtomicU64,
    metrics: Option<Arc<VolumeStatMetrics>>,
    source: std::sync::OnceLock<Arc<dyn VolumeStatsSource>>,
}

impl std::fmt::Debug for FsUsageCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsUsageCache")
            .field("config", &self.config)
            .field("paths", &self.entries.lock().map(|e| e.len()).unwrap_or_default())
            .finish_non_exhaustive()
    }
}

impl FsUsageCache {
    /// A cache stamping measurements with `clock`.
    #[must_use]
    pub fn new(config: FsUsageConfig, clock: Clock) -> Self {
        Self {
            config,
            clock,
            entries: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            walks: std::sync::atomic::AtomicU64::new(0),
            metrics: None,
            source: std::sync::OnceLock::new(),
        }
    }

    /// Where the figures of CSI volumes come from; set once (later calls are ignored).
    /// Without one, CSI volumes have no figures.
    pub fn set_volume_stats_source(&self, source: Arc<dyn VolumeStatsSource>) {
        let _ = self.source.set(source);
    }

    /// Observes each walk's duration in `metrics`'
    /// `kubelet_volume_metric_collection_duration_seconds{metric_source="du"}`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Option<Arc<VolumeStatMetrics>>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The settings.
    #[must_use]
    pub const fn config(&self) -> &FsUsageConfig {
        &self.config
    }

    /// How many walks were made so far.
    #[must_use]
    pub fn walks(&self) -> u64 {
        self.walks.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The latest measurement of `path`, registering it for the background walks. Never
    /// walks. `None` before the first measurement and when the path could not be
    /// examined.
    pub fn get(&self, path: &Path) -> Option<UsageSample> {
        self.touch(
            path,
            |_, _| false,
            |e| e.last.and_then(|(time, usage)| usage.map(|u| UsageSample { time, usage: Some(u) })),
        )
    }

    /// The latest figures of the CSI volume `volume` published at `path`, registering it
    /// for the background measurements (by its driver, never walked). `None` before the
    /// first measurement and when the driver gave no figures.
    pub fn get_from_driver(&self, path: &Path, volume: &DriverVolume) -> Option<(UsageSample, FsInfo)> {
        self.touch(
            path,
            |entry, now| {
                let changed = entry.driver.as_ref().is_none_or(|(v, _)| v != volume);
                if changed {
                    // New, or another volume at this path: measure it afresh.
                    entry.driver = Some((volume.clone(), None));
                    entry.last = None;
                    entry.due = now;
                }
                changed
            },
            |e| {
                let fs = e.driver.as_ref().and_then(|(_, fs)| *fs);
                e.last.and_then(|(time, usage)| Some((UsageSample { time, usage: Some(usage?) }, fs?)))
            },
        )
    }

    /// Finds `path`'s entry or registers it, lets `adjust` change it (`true`: measure it
    /// at once), marks it wanted and reads it with `read`; wakes the background task for a
    /// new or adjusted path, and for an idle one asked for again (due at once).
    fn touch<T>(
        &self,
        path: &Path,
        adjust: impl FnOnce(&mut Entry, Instant) -> bool,
        read: impl FnOnce(&Entry) -> T,
    ) -> T {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut wake = false;
        let entry = entries.entry(path.to_path_buf()).or_insert_with(|| {
            wake = true;
            Entry { last: None, due: now, wanted: now, troubled: false, driver: None }
        });
        wake |= adjust(entry, now);
        if entry.due <= now && now.saturating_duration_since(entry.wanted) >= self.config.idle {
            wake = true;
        }
        entry.wanted = now;
        let out = read(entry);
        drop(entries);
        if wake {
            self.wake.notify_one();
        }
        out
    }

    /// Forgets every path not in `keep`.
    pub fn retain(&self, keep: &HashSet<PathBuf>) {
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.retain(|p, _| keep.contains(p));
    }

    /// The number of registered paths.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or_default()
    }

    /// Whether no path is registered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn is_wanted(&self, e: &Entry, now: Instant) -> bool {
        now.saturating_duration_since(e.wanted) < self.config.idle
    }

    /// The paths due at `now` (wanted ones only).
    fn due(&self, now: Instant) -> Vec<PathBuf> {
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut due: Vec<(Instant, PathBuf)> = entries
            .iter()
            .filter(|(_, e)| e.due <= now && self.is_wanted(e, now))
            .map(|(p, e)| (e.due, p.clone()))
            .collect();
        due.sort();
        due.into_iter().map(|(_, p)| p).collect()
    }

    /// When the next path is due that will still be wanted then.
    fn next_due(&self, now: Instant) -> Option<Instant> {
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.values().filter(|e| self.is_wanted(e, e.due.max(now))).map(|e| e.due).min()
    }

    /// The wait after a walk: `interval × (1 + rand × jitter)`.
    fn next_wait(&self) -> Duration {
        let jitter = if self.config.jitter > 0.0 { rand::random::<f64>() * self.config.jitter } else { 0.0 };
        self.config.interval.mul_f64(1.0 + jitter)
    }

    /// Asks the driver of a CSI volume for its figures now (blocking) and records them.
    fn measure_by_driver(&self, path: &Path, volume: &DriverVolume) {
        let started = std::time::Instant::now();
        let result = match self.source.get() {
            Some(source) => source.volume_stats(volume, path),
            None => Ok(None),
        };
        if let Some(m) = &self.metrics {
            m.observe_volume_stat_duration(&volume.driver, started.elapsed());
        }
        let time = (self.clock)();
        let due = Instant::now() + self.next_wait();
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(entry) = entries.get_mut(path) else { return };
        if entry.driver.as_ref().is_none_or(|(v, _)| v != volume) {
            return;
        }
        let figures = match result {
            Ok(figures) => {
                if figures.is_none() {
                    tracing::debug!(driver = %volume.driver, "stats: the CSI driver does not report volume stats");
                }
                entry.troubled = false;
                figures
            }
            Err(e) => {
                if entry.troubled {
                    tracing::debug!(path = %path.display(), driver = %volume.driver, error = %e, "stats: NodeGetVolumeStats failed");
                } else {
                    tracing::warn!(path = %path.display(), driver = %volume.driver, error = %e, "stats: NodeGetVolumeStats failed");
                }
                entry.troubled = true;
                None
            }
        };
        entry.last = Some((time, figures.map(|f| f.usage)));
        entry.driver = Some((volume.clone(), figures.map(|f| f.fs)));
        entry.due = due;
    }

    /// Measures one path now (blocking) and records the result: walks it, or asks its
    /// driver when it is a CSI volume.
    pub fn measure(&self, path: &Path) {
        let driver = {
            let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            entries.get(path).and_then(|e| e.driver.as_ref().map(|(v, _)| v.clone()))
        };
        if let Some(volume) = driver {
            self.measure_by_driver(path, &volume);
            return;
        }
        let started = std::time::Instant::now();
        let result = fs::walk(path);
        if let Some(m) = &self.metrics {
            m.observe_volume_stat_duration(fs::DU, started.elapsed());
        }
        let time = (self.clock)();
        self.walks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let due = Instant::now() + self.next_wait();
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Dropped by `retain` while being walked: forget the result.
        let Some(entry) = entries.get_mut(path) else { return };
        let trouble = match &result {
            Ok(w) if w.unreadable == 0 => None,
            Ok(w) => Some(format!("{} directories could not be read", w.unreadable)),
            Err(e) => Some(e.to_string()),
        };
        match (&trouble, entry.troubled) {
            (Some(why), false) => {
                tracing::warn!(path = %path.display(), error = %why, "stats: cannot measure disk usage");
            }
            (Some(why), true) => {
                tracing::debug!(path = %path.display(), error = %why, "stats: cannot measure disk usage");
            }
            (None, _) => {}
        }
        entry.troubled = trouble.is_some();
        entry.last = Some((time, result.ok().map(|w| w.usage)));
        entry.due = due;
    }

    /// Walks every path due now, one after the other (blocking); returns how many.
    pub fn refresh_due(&self) -> usize {
        let due = self.due(Instant::now());
        for p in &due {
            self.measure(p);
        }
        due.len()
    }

    /// Walks now (blocking) every wanted path whose latest measurement is older than
    /// `max_age` or that was never measured; returns how many. For callers that cannot
    /// wait for the background walks (the eviction manager ranking pods by disk usage).
    pub fn refresh_older_than(&self, max_age: Duration) -> usize {
        let now = Instant::now();
        let stamp = (self.clock)();
        let stale: Vec<PathBuf> = {
            let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            entries
                .iter()
                .filter(|(_, e)| self.is_wanted(e, now))
                .filter(|(_, e)| {
                    e.last.is_none_or(|(time, _)| stamp.duration_since(time).unwrap_or_default() > max_age)
                })
                .map(|(p, _)| p.clone())
                .collect()
        };
        for p in &stale {
            self.measure(p);
        }
        stale.len()
    }

    /// The background task: walks paths as they fall due, on the blocking pool, until
    /// `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let now = Instant::now();
            if !self.due(now).is_empty() {
                let me = Arc::clone(&self);
                let walk = tokio::task::spawn_blocking(move || me.refresh_due());
                tokio::select! {
                    // A walk in progress finishes on its own; nobody waits for it.
                    () = shutdown.cancelled() => return,
                    r = walk => {
                        if let Err(e) = r {
                            tracing::warn!(error = %e, "stats: disk usage walk failed");
                        }
                    }
                }
                continue;
            }
            let sleep = tokio::time::sleep_until(self.next_due(now).unwrap_or(now + self.config.idle));
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.wake.notified() => {}
                () = sleep => {}
            }
        }
    }
}
