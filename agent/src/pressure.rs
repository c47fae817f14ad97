//! Kernel memory-pressure signals: the eviction manager's fast path.
//!
//! The kubelet looks at memory every 10 s (and, with `kernelMemcgNotification`, at a memcg
//! usage threshold). swiftlet listens to what the kernel says as it happens, and wakes the
//! eviction manager at once; the manager still decides from its own observations, so a
//! signal is only ever a reason to look now:
//! - **PSI triggers** ([`PsiTrigger`]): a `some <stall> <window>` trigger on
//!   `/proc/pressure/memory` (and, on cgroup v2, on the pods cgroup's
//!   `memory.pressure`): the kernel wakes the poller once tasks stalled on memory for
//!   `stall` within `window`.
//! - **memcg thresholds** ([`MemcgThreshold`], cgroup v1, upstream's
//!   `memoryThresholdNotifier`): an eventfd registered in `cgroup.event_control` against
//!   `memory.usage_in_bytes`, fired when usage crosses the threshold where the working set
//!   meets the eviction threshold (capacity − threshold + inactive file, recomputed by the
//!   manager as the cache changes).
//! - **eBPF**: direct reclaim starting in the pods' memory cgroups and OOM kills, from the
//!   evented PLEG's sensors ([`PressureSignals::send`] from its reclaim hook).
//!
//! Signals are coalesced: a full channel drops the new one, since the manager is about to
//! look anyway.

use std::io::Write as _;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Where a pressure signal came from (also the `source` label of the latency metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PressureSource {
    /// A PSI trigger fired.
    Psi,
    /// A memcg usage threshold was crossed.
    MemcgThreshold,
    /// The eBPF sensors saw direct reclaim in a pod's cgroup.
    KernelReclaim,
    /// The eBPF sensors saw an OOM kill.
    KernelOom,
}

impl PressureSource {
    /// The label value.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Psi => "psi",
            Self::MemcgThreshold => "memcg_threshold",
            Self::KernelReclaim => "ebpf_reclaim",
            Self::KernelOom => "ebpf_oom",
        }
    }
}

/// One signal, with when it was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PressureSignal {
    pub source: PressureSource,
    pub at: tokio::time::Instant,
}

/// The sending side, cheap to clone.
#[derive(Debug, Clone)]
pub struct PressureSignals {
    tx: mpsc::Sender<PressureSignal>,
}

impl PressureSignals {
    /// A channel for signals; the receiver goes to the eviction manager.
    #[must_use]
    pub fn channel() -> (Self, mpsc::Receiver<PressureSignal>) {
        let (tx, rx) = mpsc::channel(8);
        (Self { tx }, rx)
    }

    /// Sends a signal seen now; dropped when the receiver has enough already.
    pub fn send(&self, source: PressureSource) {
        let _ = self.tx.try_send(PressureSignal { source, at: tokio::time::Instant::now() });
    }
}

fn io_error(what: &str, path: &Path, e: &std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// A PSI trigger on a pressure file (`/proc/pressure/memory` or a cgroup's
/// `memory.pressure`).
#[derive(Debug)]
pub struct PsiTrigger {
    fd: AsyncFd<std::fs::File>,
    path: PathBuf,
}

impl PsiTrigger {
    /// Registers `some <stall> <window>` on `path`. The kernel wants a stall no longer than
    /// the window, a window up to 10 s, and — without `CAP_SYS_RESOURCE`, as on nodes whose
    /// root lacks it — a multiple of 2 s. A trigger fires at most once per window. Must
    /// run in a tokio runtime.
    ///
    /// # Errors
    /// The file cannot be opened or the kernel refuses the trigger (no PSI, bad values).
    pub fn new(path: &Path, stall: Duration, window: Duration) -> std::io::Result<Self> {
        if stall.is_zero() || stall > window {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("PSI trigger on {}: stall {stall:?} must be within the window {window:?}", path.display()),
            ));
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| io_error("opening", path, &e))?;
        let trigger = format!("some {} {}\0", stall.as_micros(), window.as_micros());
        file.write_all(trigger.as_bytes()).map_err(|e| io_error("registering a PSI trigger on", path, &e))?;
        // SAFETY: the `File` owns its descriptor, which stays open as long as the `AsyncFd`.
        let fd = unsafe { AsyncFd::register_with_interest(file, Interest::PRIORITY) }
            .map_err(|e| io_error("polling", path, &e.into()))?;
        Ok(Self { fd, path: path.to_owned() })
    }

    /// Waits for the trigger to fire.
    ///
    /// # Errors
    /// Polling failed (e.g. the cgroup went away).
    pub async fn fired(&self) -> std::io::Result<()> {
        let mut guard = self.fd.ready(Interest::PRIORITY).await?;
        if guard.ready().is_error() {
            return Err(std::io::Error::other(format!("PSI trigger on {} failed", self.path.display())));
        }
        guard.clear_ready();
        Ok(())
    }

    /// Forwards every firing as a [`PressureSource::Psi`] signal until `shutdown`.
    pub async fn forward(self, signals: PressureSignals, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                fired = self.fired() => match fired {
                    Ok(()) => signals.send(PressureSource::Psi),
                    Err(e) => {
                        tracing::warn!(error = %e, "PSI trigger stopped");
                        return;
                    }
                },
            }
        }
    }
}

/// A cgroup v1 memory usage threshold notification (`cgroup.event_control`).
#[derive(Debug)]
pub struct MemcgThreshold {
    eventfd: AsyncFd<OwnedFd>,
    cgroup: PathBuf,
    threshold: u64,
}

impl MemcgThreshold {
    /// Registers a notification when `memory.usage_in_bytes` of the v1 memory cgroup
    /// `cgroup` crosses `threshold` bytes (either way). Must run in a tokio runtime.
    ///
    /// # Errors
    /// Not a v1 memory cgroup, or the kernel refused the registration.
    pub fn new(cgroup: &Path, threshold: u64) -> std::io::Result<Self> {
        // SAFETY: eventfd(2) with valid flags; the result is checked before use.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor this function owns.
        let eventfd = unsafe { OwnedFd::from_raw_fd(raw) };
        let usage_path = cgroup.join("memory.usage_in_bytes");
        let usage = std::fs::File::open(&usage_path).map_err(|e| io_error("opening", &usage_path, &e))?;
        let control_path = cgroup.join("cgroup.event_control");
        let line = format!("{} {} {threshold}", eventfd.as_raw_fd(), usage.as_raw_fd());
        std::fs::OpenOptions::new()
            .write(true)
            .open(&control_path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(|e| io_error("registering a memory threshold in", &control_path, &e))?;
        // The registration holds its own reference to the usage file.
        drop(usage);
        // SAFETY: the `OwnedFd` owns its descriptor, which stays open as long as the `AsyncFd`.
        let eventfd = unsafe { AsyncFd::register_with_interest(eventfd, Interest::READABLE) }
            .map_err(|e| io_error("polling the eventfd of", cgroup, &e.into()))?;
        Ok(Self { eventfd, cgroup: cgroup.to_owned(), threshold })
    }

    /// The threshold in bytes.
    #[must_use]
    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    /// Waits until usage crosses the threshold.
    ///
    /// # Errors
    /// Reading the eventfd failed (e.g. the cgroup was removed).
    pub async fn crossed(&self) -> std::io::Result<()> {
        loop {
            let mut guard = self.eventfd.readable().await?;
            let mut count = [0u8; 8];
            // SAFETY: reads 8 bytes into a local buffer from the eventfd this owns.
            let n = unsafe { libc::read(self.eventfd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
            if n == 8 {
                return Ok(());
            }
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::WouldBlock {
                guard.clear_ready();
                continue;
            }
            return Err(std::io::Error::new(
                err.kind(),
                format!("memory threshold of {}: {err}", self.cgroup.display()),
            ));
        }
    }

    /// Forwards every crossing as a [`PressureSource::MemcgThreshold`] signal until
    /// `shutdown` or until the notification is replaced (drop the future).
    pub async fn forward(&self, signals: &PressureSignals, shutdown: &CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                crossed = self.crossed() => match crossed {
                    Ok(()) => signals.send(PressureSource::MemcgThreshold),
                    Err(e) => {
                        tracing::warn!(error = %e, "memory threshold notification stopped");
                        return;
                    }
                },
            }
        }
    }
}

/// Upstream's memcg threshold for a memory eviction threshold: usage at which the working
/// set reaches `capacity − threshold`, i.e. `capacity − threshold + inactive_file`.
#[must_use]
pub fn memcg_usage_threshold(capacity: u64, threshold: u64, inactive_file: u64) -> u64 {
    capacity.saturating_sub(threshold).saturating_add(inactive_file)
}

/// What the memcg threshold watchers of [`spawn_watchers`] need, as
/// `settings::memcg_thresholds` takes it from the `KubeletConfiguration`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemcgThresholdSettings {
    /// The pods cgroup from the memory hierarchy's root, as the cgroup manager names it
    /// for the driver (`/kubepods`, `/kubepods.slice`); `None`: not watched.
    pub pods_cgroup: Option<String>,
    /// `evictionHard[memory.available]`, as written (a quantity or a percentage).
    pub memory_available: Option<String>,
    /// `evictionHard[allocatableMemory.available]`, as written.
    pub allocatable_memory_available: Option<String>,
}

/// Starts the kernel watchers that feed `signals` (see the module docs): a PSI trigger
/// on `/proc/pressure/memory` (100 ms of stall within 2 s), and, on cgroup v1, memcg
/// usage thresholds where the working set of the root memory cgroup meets the
/// `memory.available` hard threshold and that of the pods cgroup meets the
/// `allocatableMemory.available` one (recomputed every 10 s as the page cache changes).
/// What the kernel refuses is logged; the eviction manager's 10 s passes go on.
pub fn spawn_watchers(
    tracker: &tokio_util::task::TaskTracker,
    signals: &PressureSignals,
    settings: &MemcgThresholdSettings,
    shutdown: &CancellationToken,
) {
    match PsiTrigger::new(Path::new("/proc/pressure/memory"), Duration::from_millis(100), Duration::from_secs(2)) {
        Ok(trigger) => {
            tracing::info!("memory pressure: PSI trigger on /proc/pressure/memory");
            tracker.spawn(trigger.forward(signals.clone(), shutdown.clone()));
        }
        Err(e) => tracing::warn!(error = %e, "no PSI trigger: memory pressure is seen by the 10 s pass and eBPF only"),
    }
    let memory_root = Path::new("/sys/fs/cgroup/memory");
    if !memory_root.join("cgroup.event_control").exists() {
        return;
    }
    let pods = settings.pods_cgroup.as_ref().map(|p| memory_root.join(p.trim_start_matches('/')));
    let targets = [
        (settings.memory_available.clone(), Some(memory_root.to_path_buf()), None),
        (settings.allocatable_memory_available.clone(), pods, Some(())),
    ];
    for (threshold, cgroup, pods) in targets {
        let (Some(threshold), Some(cgroup)) = (threshold, cgroup) else { continue };
        let signals = signals.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            watch_memcg(&cgroup, &threshold, pods.is_some(), &signals, &shutdown).await;
        });
    }
}

/// Keeps a memcg usage threshold on `cgroup` where its working set meets `threshold`
/// (a quantity or a percentage of the capacity), re-registered when the page cache moves
/// it; forwards crossings.
async fn watch_memcg(
    cgroup: &Path,
    threshold: &str,
    limited: bool,
    signals: &PressureSignals,
    shutdown: &CancellationToken,
) {
    let mut current: Option<MemcgThreshold> = None;
    loop {
        let wanted = memcg_threshold_for(cgroup, threshold, limited);
        if let Some(usage) = wanted
            && current.as_ref().is_none_or(|c| c.threshold().abs_diff(usage) > usage / 100)
        {
            match MemcgThreshold::new(cgroup, usage) {
                Ok(n) => {
                    tracing::debug!(cgroup = %cgroup.display(), usage, "memory threshold notification");
                    current = Some(n);
                    // The kernel notifies crossings only: a threshold registered below the
                    // usage of now (the page cache moved it while memory was filling up)
                    // would stay silent, so that counts as a crossing.
                    let now = std::fs::read_to_string(cgroup.join("memory.usage_in_bytes"))
                        .ok()
                        .and_then(|u| u.trim().parse::<u64>().ok());
                    if now.is_some_and(|now| now >= usage) {
                        signals.send(PressureSource::MemcgThreshold);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "memory threshold notification");
                    return;
                }
            }
        }
        let refresh = tokio::time::sleep(Duration::from_secs(10));
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = refresh => {}
            () = async {
                match &current {
                    Some(n) => n.forward(signals, shutdown).await,
                    None => std::future::pending().await,
                }
            } => return,
        }
    }
}

/// The usage (bytes) at which `cgroup`'s working set reaches its capacity minus
/// `threshold`: capacity is `MemTotal` for the root, the cgroup's limit otherwise.
fn memcg_threshold_for(cgroup: &Path, threshold: &str, limited: bool) -> Option<u64> {
    let read = |f: &str| std::fs::read_to_string(cgroup.join(f)).ok();
    let capacity = if limited {
        read("memory.limit_in_bytes")?.trim().parse::<u64>().ok().filter(|l| *l < 1 << 60)?
    } else {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kb: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        kb * 1024
    };
    let stat = read("memory.stat")?;
    let inactive = stat
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let bytes = match threshold.strip_suffix('%') {
        Some(p) => (capacity as f64 * p.trim().parse::<f64>().ok()? / 100.0) as u64,
        None => {
            u64::try_from(threshold.parse::<crate::types::quantity::ParsedQuantity>().ok()?.value_saturating()).ok()?
        }
    };
    Some(memcg_usage_threshold(capacity, bytes, inactive))
}

#[cfg(test)]
mod tests;
