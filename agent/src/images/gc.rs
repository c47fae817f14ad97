//! Image garbage collection (upstream `realImageGCManager` in
//! `pkg/kubelet/images/image_gc_manager.go`, and the loop of
//! `Kubelet.StartGarbageCollection`).
//!
//! The manager keeps a record of every image the runtime has (CRI `ListImages`): when it
//! was first seen, when a container last used it (an image is in use while any container,
//! running or exited, refers to it: CRI `ListContainers`), its size and whether the
//! runtime pinned it. Every [`IMAGE_GC_PERIOD`] (the first time at once) it:
//! 1. with `imageMaximumGCAge` set, and once the agent has run that long, removes every
//!    unused image not used for longer than that (reason `age`);
//! 2. reads the image filesystem's usage: the filesystem from CRI `ImageFsInfo`, its
//!    capacity and available bytes from `statvfs(2)` of its mount point;
//! 3. when usage ≥ `imageGCHighThresholdPercent`, removes unused images, least recently
//!    used first (ties: first seen first), skipping those seen for less than
//!    `imageMinimumGCAge`, until the usage would be at `imageGCLowThresholdPercent`
//!    (reason `space`). Finding too little to remove is a `FreeDiskSpaceFailed` event on
//!    the node.
//!
//! Never removed: images in use, pinned images, and the sandbox (pause) image, which
//! containerd 1.6 does not pin. A failure to remove one image does not stop the round:
//! the next candidates are tried and the round fails with every error. A round that
//! fails twice in a row is an `ImageGCFailed` event on the node. Removals are counted in
//! `kubelet_image_garbage_collected_total{reason}`.
//!
//! With `imageGCHighThresholdPercent` 100 and no maximum age the loop does not run, as
//! upstream. Times are tokio's, so the schedule is tested on paused time.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::metrics::{ImageGcReasonLabels, ImageMetrics};
use super::puller::{aggregate_errors, go_duration, go_error_text};
use crate::container::RuntimeService;
use crate::events::{EventRecorder, EventType, node_ref};
use crate::stats::fs::FsInfo;

/// How often image GC runs (upstream `ImageGCPeriod`).
pub const IMAGE_GC_PERIOD: Duration = Duration::from_mins(5);
/// `reason` label of images removed for not being used for `imageMaximumGCAge`.
pub const REASON_AGE: &str = "age";
/// `reason` label of images removed to bring disk usage down.
pub const REASON_SPACE: &str = "space";

/// Event reasons on the node (upstream `pkg/kubelet/events`).
pub mod events {
    pub const IMAGE_GC_FAILED: &str = "ImageGCFailed";
    pub const FREE_DISK_SPACE_FAILED: &str = "FreeDiskSpaceFailed";
    pub const INVALID_DISK_CAPACITY: &str = "InvalidDiskCapacity";
}

/// When images are collected (upstream `ImageGCPolicy`), as `settings::image_gc` takes it
/// from the `KubeletConfiguration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// `imageGCHighThresholdPercent`: usage percent at or above which images are removed.
    /// Default: 85.
    pub high_threshold_percent: i32,
    /// `imageGCLowThresholdPercent`: usage percent removal aims for. Default: 80.
    pub low_threshold_percent: i32,
    /// `imageMinimumGCAge`: an image seen for less than this is not removed for space.
    /// Default: 2 min.
    pub min_age: Duration,
    /// `imageMaximumGCAge`: unused images not used for longer than this are removed
    /// whatever the usage; zero turns it off. Default: zero.
    pub max_age: Duration,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        Self {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age: Duration::from_mins(2),
            max_age: Duration::ZERO,
        }
    }
}

impl ImageGcPolicy {
    /// Whether image GC runs at all: not with a high threshold of 100 and no maximum age.
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.high_threshold_percent != 100 || !self.max_age.is_zero()
    }

    /// The checks of upstream `NewImageGCManager`.
    fn validate(&self) -> Result<(), Error> {
        let (high, low) = (self.high_threshold_percent, self.low_threshold_percent);
        if !(0..=100).contains(&high) {
            return Err(Error::InvalidHighThreshold(high));
        }
        if !(0..=100).contains(&low) {
            return Err(Error::InvalidLowThreshold(low));
        }
        if low > high {
            return Err(Error::LowAboveHigh { low, high });
        }
        Ok(())
    }
}

/// Errors of image GC; the messages are upstream's.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid HighThresholdPercent {0}, must be in range [0-100]")]
    InvalidHighThreshold(i32),
    #[error("invalid LowThresholdPercent {0}, must be in range [0-100]")]
    InvalidLowThreshold(i32),
    #[error("LowThresholdPercent {low} can not be higher than HighThresholdPercent {high}")]
    LowAboveHigh { low: i32, high: i32 },
    /// Listing images or containers, or `ImageFsInfo`, failed.
    #[error(transparent)]
    Runtime(#[from] crate::container::Error),
    #[error("imageFs information is unavailable")]
    ImageFsUnavailable,
    #[error("get filesystem info of {}: {source}", mountpoint.display())]
    FsInfo {
        mountpoint: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity,
    /// Every candidate was removed, and it was not enough.
    #[error(
        "Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, but only found {freed} bytes eligible to free."
    )]
    NotEnoughFreed { wanted: i64, freed: i64 },
    /// Some removals for space failed; the others went on.
    #[error(
        "wanted to free {wanted} bytes, but freed {freed} bytes space with errors in image deletion: {}",
        aggregate_errors(.errors)
    )]
    Deletion { wanted: i64, freed: i64, errors: Vec<String> },
    /// Some removals for age failed; the others went on.
    #[error(
        "wanted to free images older than {}, encountered errors in image deletion: {}",
        go_duration(*.max_age),
        aggregate_errors(.errors)
    )]
    AgeDeletion { max_age: Duration, errors: Vec<String> },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Capacity and free space of the filesystem holding a path (cAdvisor's `GetDirFsInfo`);
/// the real one is [`Statvfs`], tests inject their own.
pub trait FsInfoSource: Send + Sync + std::fmt::Debug {
    fn fs_info(&self, path: &Path) -> std::io::Result<FsInfo>;
}

/// `statvfs(2)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Statvfs;

impl FsInfoSource for Statvfs {
    fn fs_info(&self, path: &Path) -> std::io::Result<FsInfo> {
        crate::stats::fs::statvfs(path)
    }
}

/// What the manager knows of one image (upstream `imageRecord`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ImageRecord {
    /// When the image was first seen.
    first_detected: Instant,
    /// When a container was last seen using it; `None`: never (upstream's zero time).
    last_used: Option<Instant>,
    size: u64,
    pinned: bool,
}

/// A removal candidate.
#[derive(Debug, Clone)]
struct Candidate {
    id: String,
    record: ImageRecord,
}

/// What one round removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcOutcome {
    /// Bytes of the removed images (their sizes as the runtime reported them).
    pub freed_bytes: u64,
    /// Ids of the removed images, in removal order.
    pub removed: Vec<String>,
}

/// Collects unused images (see the module docs).
#[derive(Debug)]
pub struct ImageGcManager {
    rt: Arc<dyn RuntimeService>,
    fs: Arc<dyn FsInfoSource>,
    policy: ImageGcPolicy,
    metrics: Arc<ImageMetrics>,
    recorder: Option<(Arc<dyn EventRecorder>, String)>,
    sandbox_image: Option<String>,
    /// How often [`Self::run`] runs a round.
    period: Duration,
    /// By image id.
    records: Mutex<HashMap<String, ImageRecord>>,
    /// One round at a time: the periodic one and an eviction's `delete_unused_images`.
    round: tokio::sync::Mutex<()>,
}

impl ImageGcManager {
    /// A manager for the images of `rt`, measuring the image filesystem with `fs`.
    /// Fails on a policy upstream refuses (thresholds outside 0..=100, low above high).
    pub fn new(
        rt: Arc<dyn RuntimeService>,
        fs: Arc<dyn FsInfoSource>,
        policy: ImageGcPolicy,
        metrics: Arc<ImageMetrics>,
    ) -> Result<Self> {
        policy.validate()?;
        Ok(Self {
            rt,
            fs,
            policy,
            metrics,
            recorder: None,
            sandbox_image: None,
            period: IMAGE_GC_PERIOD,
            records: Mutex::default(),
            round: tokio::sync::Mutex::new(()),
        })
    }

    /// Records the GC events on the node named `node_name`.
    #[must_use]
    pub fn with_recorder(mut self, recorder: Arc<dyn EventRecorder>, node_name: &str) -> Self {
        self.recorder = Some((recorder, node_name.to_string()));
        self
    }

    /// Rounds every `period` instead of [`IMAGE_GC_PERIOD`] (swiftlet's `--image-gc-period`).
    #[must_use]
    pub fn with_period(mut self, period: Duration) -> Self {
        self.period = period;
        self
    }

    /// Never removes `image` (the runtime's sandbox image, e.g. `registry.k8s.io/pause:3.9`):
    /// it is treated as in use, as upstream did before runtimes pinned it.
    #[must_use]
    pub fn with_sandbox_image(mut self, image: &str) -> Self {
        self.sandbox_image = Some(image.to_string());
        self
    }

    /// The policy in force.
    #[must_use]
    pub fn policy(&self) -> ImageGcPolicy {
        self.policy
    }

    fn node_event(&self, type_: EventType, reason: &str, message: String) {
        if let Some((r, node)) = &self.recorder {
            r.record(node_ref(node), type_, reason, message);
        }
    }

    /// Runs a round every period ([`IMAGE_GC_PERIOD`] unless [`Self::with_period`]), the first at once, until `shutdown`; does
    /// nothing when the policy turns GC off. A failed round is logged; the second and
    /// later failures in a row are also an `ImageGCFailed` event (the first may only be
    /// stats that are not ready yet).
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        if !self.policy.enabled() {
            tracing::info!("imageGCHighThresholdPercent is 100 and imageMaximumGCAge is 0: image GC is off");
            return;
        }
        let began = Instant::now();
        let mut tick = tokio::time::interval(self.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failed_before = false;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            failed_before = self.collect_and_report(began, failed_before).await;
        }
    }

    /// One round of [`Self::run`]; returns whether it failed.
    async fn collect_and_report(&self, began: Instant, failed_before: bool) -> bool {
        match self.garbage_collect(began).await {
            Ok(outcome) => {
                if outcome.removed.is_empty() {
                    tracing::debug!("image garbage collection succeeded");
                } else {
                    tracing::info!(
                        freed_bytes = outcome.freed_bytes,
                        images = outcome.removed.len(),
                        "image garbage collection succeeded"
                    );
                }
                false
            }
            Err(e) if failed_before => {
                tracing::error!(error = %e, "image garbage collection failed multiple times in a row");
                self.node_event(EventType::Warning, events::IMAGE_GC_FAILED, e.to_string());
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "image garbage collection failed once; stats may not be ready yet");
                true
            }
        }
    }

    /// One round of image GC (upstream `GarbageCollect`); `began` is when the loop started
    /// (no image is removed for age before `imageMaximumGCAge` has passed since).
    pub async fn garbage_collect(&self, began: Instant) -> Result<GcOutcome> {
        let _round = self.round.lock().await;
        let free_time = Instant::now();
        let candidates = self.images_in_eviction_order(free_time).await?;
        let mut outcome = GcOutcome::default();
        let candidates = self.free_old_images(candidates, free_time, began, &mut outcome).await?;

        let (capacity, available) = self.image_fs_usage().await?;
        if capacity == 0 {
            let e = Error::InvalidCapacity;
            self.node_event(EventType::Warning, events::INVALID_DISK_CAPACITY, e.to_string());
            return Err(e);
        }
        let usage_percent = 100 - available * 100 / capacity;
        if usage_percent >= i64::from(self.policy.high_threshold_percent) {
            let wanted = capacity * i64::from(100 - self.policy.low_threshold_percent) / 100 - available;
            tracing::info!(
                usage = usage_percent,
                high_threshold = self.policy.high_threshold_percent,
                low_threshold = self.policy.low_threshold_percent,
                bytes_to_free = wanted,
                "disk usage on the image filesystem is over the high threshold; freeing bytes down to the low threshold"
            );
            let freed = self.free_space(wanted, free_time, &candidates, &mut outcome).await?;
            if freed < wanted {
                let e = Error::NotEnoughFreed { wanted, freed };
                self.node_event(EventType::Warning, events::FREE_DISK_SPACE_FAILED, e.to_string());
                return Err(e);
            }
        }
        Ok(outcome)
    }

    /// Removes every unused image that may be removed (old enough, not pinned, not the
    /// sandbox image), whatever the disk usage: the eviction manager's reclaim of the
    /// image filesystem (upstream `DeleteUnusedImages`).
    pub async fn delete_unused_images(&self) -> Result<GcOutcome> {
        let _round = self.round.lock().await;
        tracing::info!("attempting to delete unused images");
        let free_time = Instant::now();
        let candidates = self.images_in_eviction_order(free_time).await?;
        let mut outcome = GcOutcome::default();
        self.free_space(i64::MAX, free_time, &candidates, &mut outcome).await?;
        Ok(outcome)
    }

    /// (capacity, available) of the image filesystem, available capped at capacity.
    async fn image_fs_usage(&self) -> Result<(i64, i64)> {
        let info = self.rt.image_fs_info().await?;
        // Only the first image filesystem counts, as upstream.
        let fs = info.image_filesystems.first().ok_or(Error::ImageFsUnavailable)?;
        let mountpoint = PathBuf::from(fs.fs_id.as_ref().map(|f| f.mountpoint.as_str()).unwrap_or_default());
        let stat = self.fs.fs_info(&mountpoint).map_err(|source| Error::FsInfo { mountpoint, source })?;
        let capacity = i64::try_from(stat.capacity).unwrap_or(i64::MAX);
        let mut available = i64::try_from(stat.available).unwrap_or(i64::MAX);
        if available > capacity {
            tracing::info!(available, capacity, "availability is larger than capacity");
            available = capacity;
        }
        Ok((capacity, available))
    }

    /// Updates the records from the runtime (upstream `detectImages`); returns the ids of
    /// the images in use. Images new to the records were first seen at `detect_time`;
    /// those in use were last used now.
    async fn detect_images(&self, detect_time: Instant) -> Result<HashSet<String>> {
        // References that keep an image: every container's (running or not), the images
        // its image volumes mount, and the sandbox image's id.
        let mut refs = HashSet::new();
        if let Some(sandbox) = &self.sandbox_image
            && let Ok(Some(image)) = self.rt.image_status(sandbox).await
        {
            refs.insert(image.id);
        }
        let images = self.rt.list_images().await?;
        for c in self.rt.list_containers(None).await? {
            // Upstream `handleImageVolumes`: the mounts are only in the container's status.
            match self.rt.container_status(&c.id).await {
                Ok(status) => refs.extend(status.mounts.into_iter().filter_map(|m| Some(m.image?.image))),
                // Removed since the list: nothing of it to keep.
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
            refs.insert(c.image_ref);
            if let Some(spec) = c.image {
                refs.insert(spec.image);
            }
        }
        refs.remove("");

        let now = Instant::now();
        let mut in_use = HashSet::new();
        let mut records = self.records.lock().unwrap();
        for image in &images {
            // Upstream matches the container's image ref against the image id; the tags
            // and digests too here, so that a runtime reporting references still keeps them.
            let used =
                std::iter::once(&image.id).chain(&image.repo_tags).chain(&image.repo_digests).any(|r| refs.contains(r));
            let record = records.entry(image.id.clone()).or_insert(ImageRecord {
                first_detected: detect_time,
                last_used: None,
                size: 0,
                pinned: false,
            });
            if used {
                record.last_used = Some(now);
                in_use.insert(image.id.clone());
            }
            record.size = image.size;
            record.pinned = image.pinned;
        }
        let current: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        records.retain(|id, _| current.contains(id.as_str()));
        Ok(in_use)
    }

    /// Unused, unpinned images, least recently used first, ties by first detection
    /// (upstream `imagesInEvictionOrder`).
    async fn images_in_eviction_order(&self, free_time: Instant) -> Result<Vec<Candidate>> {
        let in_use = self.detect_images(free_time).await?;
        let records = self.records.lock().unwrap();
        let mut candidates: Vec<Candidate> = records
            .iter()
            .filter(|(id, r)| !in_use.contains(*id) && !r.pinned)
            .map(|(id, r)| Candidate { id: id.clone(), record: *r })
            .collect();
        candidates.sort_by(|a, b| {
            (a.record.last_used, a.record.first_detected, &a.id).cmp(&(
                b.record.last_used,
                b.record.first_detected,
                &b.id,
            ))
        });
        Ok(candidates)
    }

    /// Removes the candidates not used for longer than the maximum age (upstream
    /// `freeOldImages`); returns the others. Nothing happens before the maximum age has
    /// passed since `began`, lest images be removed before their use was ever seen.
    async fn free_old_images(
        &self,
        candidates: Vec<Candidate>,
        free_time: Instant,
        began: Instant,
        outcome: &mut GcOutcome,
    ) -> Result<Vec<Candidate>> {
        let max_age = self.policy.max_age;
        if max_age.is_zero() || free_time.saturating_duration_since(began) <= max_age {
            return Ok(candidates);
        }
        let mut errors = Vec::new();
        let mut remaining = Vec::with_capacity(candidates.len());
        for c in candidates {
            // Never used counts as used at the beginning of time (upstream's zero time).
            let unused_for = c.record.last_used.map_or(Duration::MAX, |t| free_time.saturating_duration_since(t));
            if unused_for <= max_age {
                remaining.push(c);
                continue;
            }
            match self.free_image(&c, REASON_AGE).await {
                Ok(()) => {
                    outcome.freed_bytes += c.record.size;
                    outcome.removed.push(c.id);
                }
                Err(e) => {
                    errors.push(e);
                    remaining.push(c);
                }
            }
        }
        if errors.is_empty() { Ok(remaining) } else { Err(Error::AgeDeletion { max_age, errors }) }
    }

    /// Removes candidates in order until `wanted` bytes are freed, skipping those used
    /// at or after `free_time` and those seen for less than the minimum age (upstream
    /// `freeSpace`); returns the bytes freed.
    async fn free_space(
        &self,
        wanted: i64,
        free_time: Instant,
        candidates: &[Candidate],
        outcome: &mut GcOutcome,
    ) -> Result<i64> {
        let mut errors = Vec::new();
        let mut freed: i64 = 0;
        for c in candidates {
            if c.record.last_used.is_some_and(|t| t >= free_time) {
                continue;
            }
            // Just pulled, and likely about to be used by the container it was pulled for.
            if free_time.saturating_duration_since(c.record.first_detected) < self.policy.min_age {
                tracing::debug!(image = %c.id, min_age = ?self.policy.min_age, "image is too new to be removed");
                continue;
            }
            if let Err(e) = self.free_image(c, REASON_SPACE).await {
                errors.push(e);
                continue;
            }
            outcome.freed_bytes += c.record.size;
            outcome.removed.push(c.id.clone());
            freed = freed.saturating_add(i64::try_from(c.record.size).unwrap_or(i64::MAX));
            if freed >= wanted {
                break;
            }
        }
        if errors.is_empty() { Ok(freed) } else { Err(Error::Deletion { wanted, freed, errors }) }
    }

    /// Removes one image and forgets it (upstream `freeImage`); the error as the Go CRI
    /// client prints it.
    async fn free_image(&self, c: &Candidate, reason: &str) -> Result<(), String> {
        tracing::info!(image = %c.id, size = c.record.size, reason, "removing image to free bytes");
        if let Err(e) = self.rt.remove_image(&c.id).await {
            let text = go_error_text(&e, false);
            tracing::warn!(image = %c.id, error = %text, "failed to remove image");
            return Err(text);
        }
        self.records.lock().unwrap().remove(&c.id);
        self.metrics.image_garbage_collected.get_or_create(&ImageGcReasonLabels { reason: reason.to_string() }).inc();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;
    use crate::container::api;
    use crate::container::fake::FakeRuntime;
    use crate::events::MemoryRecorder;

    /// A filesystem whose numbers the test sets.
    #[derive(Debug)]
    struct TestFs(Mutex<FsInfo>);

    impl TestFs {
        fn set(&self, capacity: u64, available: u64) {
            *self.0.lock().unwrap() = FsInfo { capacity, available, ..FsInfo::default() };
        }
    }

    impl FsInfoSource for TestFs {
        fn fs_info(&self, path: &Path) -> std::io::Result<FsInfo> {
            assert_eq!(path, Path::new("/var/lib/containerd"), "the mount point from ImageFsInfo");
            Ok(*self.0.lock().unwrap())
        }
    }

    struct Harness {
        rt: Arc<FakeRuntime>,
        fs: Arc<TestFs>,
        recorder: MemoryRecorder,
        registry: Registry,
        gc: Arc<ImageGcManager>,
    }

    impl Harness {
        fn new(policy: ImageGcPolicy) -> Self {
            let rt = Arc::new(FakeRuntime::default());
            let fs = Arc::new(TestFs(Mutex::default()));
            fs.set(1000, 1000);
            let mut registry = Registry::default();
            let metrics = Arc::new(ImageMetrics::new(&mut registry));
            let recorder = MemoryRecorder::new("node-a");
            let gc = ImageGcManager::new(rt.clone(), fs.clone(), policy, metrics)
                .unwrap()
                .with_recorder(Arc::new(recorder.clone()), "node-a")
                .with_sandbox_image("registry.k8s.io/pause:3.9");
            Self { rt, fs, recorder, registry, gc: Arc::new(gc) }
        }

        fn image(&self, name: &str, size: u64) {
            self.rt.add_image(api::Image {
                id: format!("sha256:{name}"),
                repo_tags: vec![format!("example.com/{name}:1")],
                size,
                ..Default::default()
            });
        }

        /// Starts a container using image `name`; returns its id.
        async fn use_image(&self, name: &str) -> String {
            self.use_images(name, &[]).await
        }

        /// Starts a container using image `name` with image volumes of `volumes`.
        async fn use_images(&self, name: &str, volumes: &[&str]) -> String {
            let sandbox = self.rt.run_pod_sandbox(api::PodSandboxConfig::default(), String::new()).await.unwrap();
            let image = |name: &str| api::ImageSpec { image: format!("sha256:{name}"), ..Default::default() };
            let config = api::ContainerConfig {
                image: Some(image(name)),
                mounts: volumes
                    .iter()
                    .map(|v| api::Mount {
                        container_path: format!("/{v}"),
                        image: Some(image(v)),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            };
            let id = self.rt.create_container(&sandbox, config, api::PodSandboxConfig::default()).await.unwrap();
            self.rt.start_container(&id).await.unwrap();
            id
        }

        fn events(&self) -> Vec<(String, String)> {
            self.recorder.list().into_iter().map(|e| (e.reason.unwrap(), e.message.unwrap())).collect()
        }

        fn collected(&self, reason: &str) -> u64 {
            let mut out = String::new();
            prometheus_client::encoding::text::encode_registry(&mut out, &self.registry).unwrap();
            let prefix = format!("kubelet_image_garbage_collected_total{{reason=\"{reason}\"}} ");
            out.lines().find_map(|l| l.strip_prefix(&prefix)).map_or(0, |v| v.parse().unwrap())
        }

        fn local(&self) -> Vec<String> {
            let mut ids: Vec<String> = self.rt.images().into_iter().map(|i| i.id).collect();
            ids.sort();
            ids
        }
    }

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| format!("sha256:{n}")).collect()
    }

    #[test]
    fn the_policy_is_checked_like_upstream() {
        let new = |high, low| {
            let policy =
                ImageGcPolicy { high_threshold_percent: high, low_threshold_percent: low, ..Default::default() };
            let metrics = Arc::new(ImageMetrics::default());
            ImageGcManager::new(Arc::new(FakeRuntime::default()), Arc::new(Statvfs), policy, metrics)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert_eq!(new(85, 80), Ok(()));
        assert_eq!(new(101, 80).unwrap_err(), "invalid HighThresholdPercent 101, must be in range [0-100]");
        assert_eq!(new(85, -1).unwrap_err(), "invalid LowThresholdPercent -1, must be in range [0-100]");
        assert_eq!(new(70, 80).unwrap_err(), "LowThresholdPercent 80 can not be higher than HighThresholdPercent 70");

        assert!(ImageGcPolicy::default().enabled());
        let off = ImageGcPolicy { high_threshold_percent: 100, ..Default::default() };
        assert!(!off.enabled());
        assert!(ImageGcPolicy { max_age: Duration::from_hours(1), ..off }.enabled());
    }

    /// Unused images go least recently used first (never used before all), until the
    /// usage would be at the low threshold.
    #[tokio::test(start_paused = true)]
    async fn removes_least_recently_used_images_down_to_the_low_threshold() {
        let h = Harness::new(ImageGcPolicy::default());
        for name in ["a", "b", "c", "d"] {
            h.image(name, 100);
        }
        let began = Instant::now();
        // c is used at t0, a at t0+1m, b at t0+2m; d never.
        let mut using = h.use_image("c").await;
        for name in ["a", "b"] {
            assert_eq!(h.gc.garbage_collect(began).await.unwrap(), GcOutcome::default(), "usage is low");
            tokio::time::advance(Duration::from_mins(1)).await;
            h.rt.remove_container(&using).await.unwrap();
            using = h.use_image(name).await;
        }
        h.gc.garbage_collect(began).await.unwrap();
        h.rt.remove_container(&using).await.unwrap();
        tokio::time::advance(Duration::from_mins(1)).await;

        // 100% used: free 1000 × 20% = 200 bytes.
        h.fs.set(1000, 0);
        let outcome = h.gc.garbage_collect(began).await.unwrap();
        assert_eq!(outcome, GcOutcome { freed_bytes: 200, removed: ids(&["d", "c"]) });
        assert_eq!(h.local(), ids(&["a", "b"]));
        assert_eq!(h.rt.removed_images(), ids(&["d", "c"]));
        assert_eq!(h.collected(REASON_SPACE), 2);
        assert!(h.events().is_empty(), "{:?}", h.events());

        // 86% used: free 1000 × 20% − 140 = 60 bytes: one image.
        h.fs.set(1000, 140);
        assert_eq!(h.gc.garbage_collect(began).await.unwrap().removed, ids(&["a"]));
        // 84% used: under the high threshold.
        h.fs.set(1000, 160);
        assert_eq!(h.gc.garbage_collect(began).await.unwrap(), GcOutcome::default());
    }

    #[tokio::test(start_paused = true)]
    async fn images_in_use_pinned_and_the_sandbox_image_are_kept() {
        let h = Harness::new(ImageGcPolicy::default());
        for name in ["running", "exited", "pinned", "free"] {
            h.image(name, 100);
        }
        h.rt.add_image(api::Image {
            pinned: true,
            ..h.rt.images().into_iter().find(|i| i.id == "sha256:pinned").unwrap()
        });
        h.rt.add_image(api::Image {
            id: "sha256:pause".into(),
            repo_tags: vec!["registry.k8s.io/pause:3.9".into()],
            size: 100,
            ..Default::default()
        });
        h.use_image("running").await;
        let exited = h.use_image("exited").await;
        h.rt.stop_container(&exited, 0).await.unwrap();
        tokio::time::advance(Duration::from_mins(3)).await;
        h.gc.garbage_collect(Instant::now()).await.unwrap();
        tokio::time::advance(Duration::from_mins(3)).await;

        h.fs.set(1000, 0);
        let e = h.gc.garbage_collect(Instant::now()).await.unwrap_err();
        let msg = "Failed to garbage collect required amount of images. Attempted to free 200 bytes, but only found 100 bytes eligible to free.";
        assert_eq!(e.to_string(), msg);
        assert_eq!(h.rt.removed_images(), ids(&["free"]));
        assert_eq!(h.local(), ids(&["exited", "pause", "pinned", "running"]));
        assert_eq!(h.events(), vec![(events::FREE_DISK_SPACE_FAILED.to_string(), msg.to_string())]);
        assert_eq!(h.recorder.list()[0].involved_object.kind.as_deref(), Some("Node"));
    }

    #[tokio::test(start_paused = true)]
    async fn images_mounted_as_image_volumes_are_in_use() {
        let h = Harness::new(ImageGcPolicy::default());
        for name in ["app", "tools", "free"] {
            h.image(name, 100);
        }
        let c = h.use_images("app", &["tools"]).await;
        h.rt.stop_container(&c, 0).await.unwrap();
        tokio::time::advance(Duration::from_mins(3)).await;
        h.gc.garbage_collect(Instant::now()).await.unwrap();
        tokio::time::advance(Duration::from_mins(3)).await;

        h.fs.set(1000, 0);
        h.gc.garbage_collect(Instant::now()).await.unwrap_err();
        assert_eq!(h.rt.removed_images(), ids(&["free"]));
        assert_eq!(h.local(), ids(&["app", "tools"]));
    }

    #[tokio::test(start_paused = true)]
    async fn images_younger_than_the_minimum_age_are_kept() {
        let h = Harness::new(ImageGcPolicy::default());
        h.image("new", 300);
        h.fs.set(1000, 0);
        let began = Instant::now();
        assert!(matches!(h.gc.garbage_collect(began).await, Err(Error::NotEnoughFreed { wanted: 200, freed: 0 })));
        tokio::time::advance(Duration::from_secs(119)).await;
        assert!(h.gc.garbage_collect(began).await.is_err());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(h.gc.garbage_collect(began).await.unwrap().freed_bytes, 300);
    }

    /// `imageMaximumGCAge`: unused images not used for that long go whatever the usage,
    /// but only once the loop has run that long.
    #[tokio::test(start_paused = true)]
    async fn the_maximum_age_removes_unused_images_regardless_of_usage() {
        let policy = ImageGcPolicy { max_age: Duration::from_hours(1), ..Default::default() };
        let h = Harness::new(policy);
        for name in ["used-earlier", "never-used", "in-use"] {
            h.image(name, 100);
        }
        let began = Instant::now();
        let earlier = h.use_image("used-earlier").await;
        h.use_image("in-use").await;
        h.gc.garbage_collect(began).await.unwrap();
        tokio::time::advance(Duration::from_mins(30)).await;
        h.gc.garbage_collect(began).await.unwrap();
        h.rt.remove_container(&earlier).await.unwrap();

        tokio::time::advance(Duration::from_mins(30)).await;
        assert_eq!(h.gc.garbage_collect(began).await.unwrap(), GcOutcome::default(), "not before 1h since the start");
        tokio::time::advance(Duration::from_secs(1)).await;
        let outcome = h.gc.garbage_collect(began).await.unwrap();
        assert_eq!(outcome, GcOutcome { freed_bytes: 100, removed: ids(&["never-used"]) });
        tokio::time::advance(Duration::from_mins(30)).await;
        assert_eq!(h.gc.garbage_collect(began).await.unwrap().removed, ids(&["used-earlier"]));
        assert_eq!(h.local(), ids(&["in-use"]));
        assert_eq!((h.collected(REASON_AGE), h.collected(REASON_SPACE)), (2, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_removal_goes_on_with_the_next_image() {
        let h = Harness::new(ImageGcPolicy::default());
        for name in ["a", "b", "c", "d"] {
            h.image(name, 100);
            // Distinct first-detection times: a, b, c, d.
            h.gc.garbage_collect(Instant::now()).await.unwrap();
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        tokio::time::advance(Duration::from_mins(2)).await;
        h.rt.fail_remove_image("sha256:a");
        h.fs.set(1000, 0);
        let e = h.gc.garbage_collect(Instant::now()).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "wanted to free 200 bytes, but freed 200 bytes space with errors in image deletion: \
             rpc error: code = Unknown desc = failed to remove image \"sha256:a\": image is busy"
        );
        assert!(matches!(e, Error::Deletion { wanted: 200, freed: 200, .. }));
        assert_eq!(h.rt.removed_images(), ids(&["b", "c"]));
        assert_eq!(h.local(), ids(&["a", "d"]));
        assert!(h.events().is_empty(), "no FreeDiskSpaceFailed: the round failed on the removal");
    }

    #[tokio::test(start_paused = true)]
    async fn delete_unused_images_removes_every_eligible_image() {
        let h = Harness::new(ImageGcPolicy::default());
        for name in ["a", "b", "in-use"] {
            h.image(name, 100);
        }
        h.use_image("in-use").await;
        h.gc.garbage_collect(Instant::now()).await.unwrap();
        tokio::time::advance(Duration::from_mins(2)).await;
        h.image("too-new", 100);
        let outcome = h.gc.delete_unused_images().await.unwrap();
        assert_eq!(outcome.freed_bytes, 200);
        assert_eq!(h.local(), ids(&["in-use", "too-new"]));
    }

    #[tokio::test(start_paused = true)]
    async fn capacity_zero_is_an_invalid_disk_capacity_event() {
        let h = Harness::new(ImageGcPolicy::default());
        h.fs.set(0, 0);
        let e = h.gc.garbage_collect(Instant::now()).await.unwrap_err();
        assert_eq!(e.to_string(), "invalid capacity 0 on image filesystem");
        assert_eq!(h.events(), vec![(events::INVALID_DISK_CAPACITY.to_string(), e.to_string())]);
    }

    /// The loop: a round at once, then every 5 min; only repeated failures are events.
    #[tokio::test(start_paused = true)]
    async fn the_loop_reports_repeated_failures() {
        let h = Harness::new(ImageGcPolicy::default());
        h.rt.set_image_fs_info(api::ImageFsInfoResponse::default());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(h.gc.clone().run(shutdown.clone()));
        let image_fs_calls = || h.rt.calls().iter().filter(|c| *c == "image_fs_info").count();

        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(image_fs_calls(), 1, "the first round runs at once");
        assert!(h.events().is_empty(), "a first failure is only logged");
        tokio::time::sleep(IMAGE_GC_PERIOD).await;
        assert_eq!(image_fs_calls(), 2);
        let failed = (events::IMAGE_GC_FAILED.to_string(), "imageFs information is unavailable".to_string());
        assert_eq!(h.events(), vec![failed.clone()]);

        h.rt.set_image_fs_info(api::ImageFsInfoResponse {
            image_filesystems: vec![api::FilesystemUsage {
                fs_id: Some(api::FilesystemIdentifier { mountpoint: "/var/lib/containerd".into() }),
                ..Default::default()
            }],
            container_filesystems: Vec::new(),
        });
        tokio::time::sleep(IMAGE_GC_PERIOD).await;
        assert_eq!(image_fs_calls(), 3);
        h.rt.set_image_fs_info(api::ImageFsInfoResponse::default());
        tokio::time::sleep(IMAGE_GC_PERIOD).await;
        assert_eq!(image_fs_calls(), 4);
        assert_eq!(h.events(), vec![failed], "a failure after a success is only logged");

        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn off_when_the_high_threshold_is_100_and_there_is_no_maximum_age() {
        let h = Harness::new(ImageGcPolicy { high_threshold_percent: 100, ..Default::default() });
        tokio::time::timeout(Duration::from_secs(1), h.gc.clone().run(CancellationToken::new()))
            .await
            .expect("returns at once");
        assert!(h.rt.calls().is_empty());
    }
}
