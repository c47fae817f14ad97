//! Container log rotation (upstream `pkg/kubelet/logs/container_log_manager.go`).
//!
//! Every `containerLogMonitorInterval` (10 s) the manager lists the running containers and,
//! with at most `containerLogMaxWorkers` at a time, looks at each one's log file (the
//! CRI status' `logPath`). One that has reached `containerLogMaxSize` is rotated the
//! kubelet's way:
//!
//! 1. leftovers of an interrupted rotation go: `*.tmp` files, and a rotated file whose
//!    `.gz` exists already;
//! 2. the oldest rotated files go until `containerLogMaxFiles − 2` remain (the current
//!    file and the one about to be rotated make up the rest);
//! 3. rotated files not yet compressed are gzipped (`<file>.gz.tmp`, then renamed);
//! 4. the current file is renamed `<log>.<YYYYMMDD-hhmmss>` (UTC, as the kubelet's clock
//!    formats it) and the runtime is asked to reopen the log (`ReopenContainerLog`). If
//!    that fails, the rename is undone, so the runtime goes on writing where readers look.
//!
//! Nothing is lost: the runtime writes into the renamed file until it reopens, and that
//! file is kept (uncompressed, as the newest rotated file) like any other. A log file
//! that is missing is reopened (the runtime recreates it), as upstream. Errors are logged
//! per container and never stop the others.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use k8s_cri::v1 as api;
use tokio_util::sync::CancellationToken;

use crate::container::RuntimeService;
use crate::types::io::PathIoError;

/// Suffix of compressed rotated files.
const COMPRESS_SUFFIX: &str = ".gz";
/// Suffix of files being written.
const TMP_SUFFIX: &str = ".tmp";

/// The rotation settings (`containerLogMax*` and `containerLogMonitorInterval`), as
/// `settings::log_rotation` takes them from the `KubeletConfiguration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationPolicy {
    /// `containerLogMaxSize` in bytes.
    pub max_size: u64,
    /// `containerLogMaxFiles` (≥ 2): the current file included.
    pub max_files: usize,
    /// `containerLogMaxWorkers` (≥ 1).
    pub max_workers: usize,
    /// `containerLogMonitorInterval`.
    pub monitor_interval: Duration,
}

/// Rotates the logs of running containers (see the module docs).
#[derive(Debug)]
pub struct ContainerLogManager {
    runtime: Arc<dyn RuntimeService>,
    policy: RotationPolicy,
}

/// What went wrong with one container's log.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Io(#[from] PathIoError),
    #[error("reopening the log of container {id}: {source}")]
    Reopen {
        id: String,
        #[source]
        source: crate::container::Error,
    },
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error + use<> {
    let at = PathIoError::at(op, path);
    move |source| Error::Io(at(source))
}

impl ContainerLogManager {
    #[must_use]
    pub fn new(runtime: Arc<dyn RuntimeService>, policy: RotationPolicy) -> Self {
        Self { runtime, policy }
    }

    /// Checks every `monitor_interval` until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        tracing::info!(
            max_size = self.policy.max_size,
            max_files = self.policy.max_files,
            workers = self.policy.max_workers,
            interval = ?self.policy.monitor_interval,
            "container log rotation"
        );
        let mut tick = tokio::time::interval(self.policy.monitor_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {
                    self.rotate_logs().await;
                }
            }
        }
    }

    /// One pass over the running containers; returns how many logs were rotated.
    pub async fn rotate_logs(&self) -> usize {
        let filter = api::ContainerFilter {
            state: Some(api::ContainerStateValue { state: api::ContainerState::ContainerRunning as i32 }),
            ..Default::default()
        };
        let containers = match self.runtime.list_containers(Some(filter)).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "listing containers for log rotation");
                return 0;
            }
        };
        futures::stream::iter(containers)
            .map(|c| async move {
                // The list may be stale: only a container still running is rotated.
                let status = match self.runtime.container_status(&c.id).await {
                    Ok(s) if s.state == api::ContainerState::ContainerRunning as i32 => s,
                    Ok(_) => return false,
                    Err(e) => {
                        tracing::debug!(container = %c.id, error = %e, "container status for log rotation");
                        return false;
                    }
                };
                if status.log_path.is_empty() {
                    return false;
                }
                match self.rotate_if_needed(&c.id, Path::new(&status.log_path)).await {
                    Ok(rotated) => rotated,
                    Err(e) => {
                        tracing::warn!(container = %c.id, error = %e, "container log rotation");
                        false
                    }
                }
            })
            .buffer_unordered(self.policy.max_workers)
            .filter(|rotated| std::future::ready(*rotated))
            .count()
            .await
    }

    /// Rotates `log` of container `id` if it reached the maximum size.
    ///
    /// # Errors
    /// A file operation or the runtime's reopen failed.
    pub async fn rotate_if_needed(&self, id: &str, log: &Path) -> Result<bool, Error> {
        let size = match tokio::fs::metadata(log).await {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // The log should always exist; have the runtime create it again.
                tracing::info!(container = %id, path = %log.display(), "container log is missing; reopening it");
                self.reopen(id).await?;
                return Ok(false);
            }
            Err(e) => return Err(io("stat", log)(e)),
        };
        if self.policy.max_size == 0 || size < self.policy.max_size {
            return Ok(false);
        }
        let log_owned = log.to_owned();
        let max_files = self.policy.max_files;
        // File work (listing, deleting, compressing) on the blocking pool.
        tokio::task::spawn_blocking(move || prepare_rotation(&log_owned, max_files))
            .await
            .map_err(|e| io("rotate", log)(std::io::Error::other(e)))??;
        let rotated = rotated_name(log, SystemTime::now());
        if rotated.exists() {
            // Rotated within the same second already: next time.
            return Ok(false);
        }
        tokio::fs::rename(log, &rotated).await.map_err(io("rename", log))?;
        if let Err(e) = self.reopen(id).await {
            // Put it back, so that the runtime's writes stay where readers look.
            if let Err(undo) = tokio::fs::rename(&rotated, log).await {
                tracing::error!(path = %rotated.display(), error = %undo, "undoing a log rotation");
            }
            return Err(e);
        }
        tracing::debug!(container = %id, path = %log.display(), size, "rotated container log");
        Ok(true)
    }

    async fn reopen(&self, id: &str) -> Result<(), Error> {
        self.runtime.reopen_container_log(id).await.map_err(|source| Error::Reopen { id: id.to_owned(), source })
    }
}

/// `<log>.<YYYYMMDD-hhmmss>` (UTC).
fn rotated_name(log: &Path, now: SystemTime) -> PathBuf {
    let ts = jiff::Timestamp::try_from(now).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    let mut name = log.as_os_str().to_owned();
    name.push(format!(".{}", ts.strftime("%Y%m%d-%H%M%S")));
    PathBuf::from(name)
}

/// The rotated files of `log` (`<log>.*`), sorted by name (= by rotation time).
fn rotated_files(log: &Path) -> Result<Vec<PathBuf>, Error> {
    let dir = log.parent().unwrap_or(Path::new("."));
    let prefix = format!("{}.", log.file_name().unwrap_or_default().to_string_lossy());
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io("read", dir))?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    files.sort();
    Ok(files)
}

/// Steps 1–3 of the module docs: leftovers, excess files, compression.
fn prepare_rotation(log: &Path, max_files: usize) -> Result<(), Error> {
    let files = rotated_files(log)?;
    let (mut in_use, unused): (Vec<PathBuf>, Vec<PathBuf>) = files.iter().cloned().partition(|f| is_in_use(f, &files));
    for f in unused {
        remove(&f)?;
    }
    let keep = max_files.saturating_sub(2);
    let excess = in_use.len().saturating_sub(keep);
    for f in in_use.drain(..excess) {
        remove(&f)?;
    }
    for f in in_use.iter().filter(|f| !f.to_string_lossy().ends_with(COMPRESS_SUFFIX)) {
        compress(f)?;
    }
    Ok(())
}

/// Upstream `isInUse`: temporary files are not; compressed files are; a file whose
/// compressed twin exists is not.
fn is_in_use(file: &Path, all: &[PathBuf]) -> bool {
    let name = file.to_string_lossy();
    if name.ends_with(TMP_SUFFIX) {
        return false;
    }
    if name.ends_with(COMPRESS_SUFFIX) {
        return true;
    }
    let compressed = format!("{name}{COMPRESS_SUFFIX}");
    !all.iter().any(|f| f.to_string_lossy() == compressed)
}

fn remove(path: &Path) -> Result<(), Error> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", path)(e)),
        _ => Ok(()),
    }
}

/// Gzips `file` into `<file>.gz` (through `<file>.gz.tmp`) and removes it.
fn compress(file: &Path) -> Result<(), Error> {
    let gz = PathBuf::from(format!("{}{COMPRESS_SUFFIX}", file.display()));
    let tmp = PathBuf::from(format!("{}{TMP_SUFFIX}", gz.display()));
    let result = (|| {
        let mut input = std::fs::File::open(file).map_err(io("open", file))?;
        let output = std::fs::File::create(&tmp).map_err(io("create", &tmp))?;
        let mut encoder = flate2::write::GzEncoder::new(output, flate2::Compression::default());
        std::io::copy(&mut input, &mut encoder).map_err(io("compress", file))?;
        encoder.finish().and_then(|f| f.sync_all()).map_err(io("write", &tmp))?;
        std::fs::rename(&tmp, &gz).map_err(io("rename", &tmp))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    remove(file)
}

#[cfg(test)]
mod tests;
