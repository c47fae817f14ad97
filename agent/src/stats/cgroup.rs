//! Reading one cgroup's usage files, on cgroup v1 and v2, as cAdvisor's libcontainer
//! handler does (`container/libcontainer/handler.go` `setCPUStats`/`setMemoryStats`,
//! runc's `fs`/`fs2` readers).
//!
//! What each number is:
//!
//! | value | v1 | v2 |
//! |---|---|---|
//! | cpu total | `cpuacct.usage` (ns) | `cpu.stat` `usage_usec` |
//! | cpu user/system | `cpuacct.stat` `user`/`system` (`USER_HZ` ticks) | `cpu.stat` `user_usec`/`system_usec` |
//! | throttling | `cpu.stat` `nr_periods`/`nr_throttled`/`throttled_time` (cpu hierarchy) | `cpu.stat` `nr_periods`/`nr_throttled`/`throttled_usec` |
//! | memory usage | `memory.usage_in_bytes` | `memory.current` (root: `anon` + `file` of `memory.stat`) |
//! | working set | usage − `total_inactive_file`, floored at 0 | usage − `inactive_file`, floored at 0 |
//! | rss / cache / mapped | `total_rss` / `total_cache` / `total_mapped_file` | `anon` / `file` / `file_mapped` |
//! | page faults | `pgfault` / `pgmajfault` (the cgroup's own, not `total_*`: cAdvisor's choice, so a pod cgroup without tasks of its own reports 0 on v1) | `pgfault` / `pgmajfault` (hierarchical) |
//! | max usage | `memory.max_usage_in_bytes` | `memory.peak` (5.19+) |
//! | failcnt | `memory.failcnt` | — |
//! | limit | `memory.limit_in_bytes` | `memory.max` |
//! | swap | `total_swap` (with swap accounting) | `memory.swap.current` |
//! | swap limit | `memory.memsw.limit_in_bytes` (memory+swap, as cAdvisor uses it) | `memory.swap.max` |
//! | OOM kills | `memory.oom_control` `oom_kill` (4.13+) | `memory.events` `oom_kill` |
//! | tasks | `pids.current` | `pids.current` |
//! | processes | lines of `cgroup.procs` (memory hierarchy) | lines of `cgroup.procs` |
//! | PSI | `{cpu,memory,io}.pressure` of the hybrid cgroup2 mount, if any | `{cpu,memory,io}.pressure` |
//! | spec: CPU period (when asked for) | `cpu.cfs_period_us` | second field of `cpu.max` |
//! | spec: CPU shares | `cpu.shares` | `cpu.weight` back to shares ([`weight_to_shares`]) |
//! | spec: memory reservation | `memory.soft_limit_in_bytes` | `memory.min` |
//! | spec: threads max | `pids.max` (`max`: 0) | `pids.max` (`max`: 0) |
//! | a cgroup's own processes ([`CgroupReader::pids`]) | `cgroup.procs` (cpu hierarchy) | `cgroup.procs` |
//! | block I/O operations per device (when asked for) | the first of `blkio.bfq.io_serviced_recursive`, `blkio.io_serviced_recursive`, `blkio.throttle.io_serviced_recursive` with device lines (runc's order) | `io.stat` `rios`/`wios` |
//!
//! Limits above 2^62 count as unlimited (upstream `isMemoryUnlimited`). The spec files
//! are read as cAdvisor's `container/common` `GetSpec` reads them (see [`CgroupSpec`]).
//! A file that is missing leaves its field `None` (a CPU spec file reads 0, as
//! cAdvisor's); a cgroup whose directories are all gone reads as vanished
//! ([`CgroupReader::read`] returns `None`), which the collector skips.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::processes::ProcessStats;

/// Above this a memory limit means "unlimited" (the kernel rounds `max` to a page
/// multiple, so it is not `i64::MAX`).
pub const UNLIMITED_THRESHOLD: u64 = 1 << 62;

/// Nanoseconds per `USER_HZ` tick in `cpuacct.stat` and `/proc/stat` (`USER_HZ` is 100 on
/// every Linux architecture the agent runs on).
pub const NANOS_PER_USER_HZ_TICK: u64 = 10_000_000;

/// Where the cgroup hierarchies are mounted. Cgroup paths given to the reader are
/// relative to each hierarchy's root (`/kubepods/burstable/pod<uid>/<id>`), the same in
/// every v1 hierarchy (both drivers place a container at the same path in each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupHierarchies {
    /// cgroup v1 (legacy, or hybrid with a controller-less cgroup2 mount).
    V1 {
        /// The `cpuacct` hierarchy.
        cpuacct: PathBuf,
        /// The `cpu` hierarchy (throttling), when mounted.
        cpu: Option<PathBuf>,
        /// The `memory` hierarchy.
        memory: PathBuf,
        /// The `pids` hierarchy, when mounted.
        pids: Option<PathBuf>,
        /// The `blkio` hierarchy, when mounted.
        blkio: Option<PathBuf>,
        /// The hybrid cgroup2 mount (`<root>/unified`), read for PSI only.
        unified: Option<PathBuf>,
    },
    /// cgroup v2 (unified).
    V2 {
        /// The cgroup2 mount.
        root: PathBuf,
    },
}

impl CgroupHierarchies {
    /// Finds the hierarchies under a cgroup filesystem root (`/sys/fs/cgroup`): unified if
    /// the root has `cgroup.controllers`, otherwise v1 with `cpuacct` (or a co-mounted
    /// `cpu,cpuacct`), `memory`, and optionally `cpu`, `pids` and `unified`.
    pub fn detect(fs_root: &Path) -> io::Result<Self> {
        if fs_root.join("cgroup.controllers").exists() {
            return Ok(Self::V2 { root: fs_root.to_path_buf() });
        }
        let first = |names: &[&str]| names.iter().map(|n| fs_root.join(n)).find(|p| p.is_dir());
        let not_found = |what: &str| {
            io::Error::new(io::ErrorKind::NotFound, format!("no {what} cgroup hierarchy under {}", fs_root.display()))
        };
        let cpuacct = first(&["cpuacct", "cpu,cpuacct", "cpuacct,cpu"]).ok_or_else(|| not_found("cpuacct"))?;
        let memory = first(&["memory"]).ok_or_else(|| not_found("memory"))?;
        let unified = first(&["unified"]).filter(|p| p.join("cgroup.procs").exists());
        Ok(Self::V1 {
            cpuacct,
            cpu: first(&["cpu", "cpu,cpuacct", "cpuacct,cpu"]),
            memory,
            pids: first(&["pids"]),
            blkio: first(&["blkio"]),
            unified,
        })
    }

    /// Whether this is cgroup v2.
    #[must_use]
    pub const fn is_v2(&self) -> bool {
        matches!(self, Self::V2 { .. })
    }
}

/// Joins a cgroup path (`/kubepods/pod1`, `kubepods/pod1` or `/`) under a hierarchy.
pub(crate) fn join(root: &Path, cgroup: &str) -> PathBuf {
    let rel = cgroup.trim_start_matches('/');
    if rel.is_empty() { root.to_path_buf() } else { root.join(rel) }
}

/// CPU usage of a cgroup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuUsage {
    /// Cumulative CPU time, nanoseconds.
    pub total_ns: u64,
    /// Cumulative user-mode time, nanoseconds.
    pub user_ns: Option<u64>,
    /// Cumulative kernel-mode time, nanoseconds.
    pub system_ns: Option<u64>,
    /// CFS throttling, when the quota controller is there.
    pub throttling: Option<Throttling>,
    /// Average usage in nano-cores since the previous collection (set by the collector;
    /// `None` on the first collection of a cgroup).
    pub nano_cores: Option<u64>,
}

/// CFS bandwidth throttling counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Throttling {
    /// Enforcement periods elapsed.
    pub periods: u64,
    /// Periods in which the cgroup was throttled.
    pub throttled_periods: u64,
    /// Total throttled time, nanoseconds.
    pub throttled_ns: u64,
}

/// Memory usage of a cgroup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// All memory charged, bytes.
    pub usage: u64,
    /// Usage minus inactive file pages (floored at 0); `None` without `memory.stat`.
    pub working_set: Option<u64>,
    /// Anonymous memory.
    pub rss: Option<u64>,
    /// Page cache.
    pub cache: Option<u64>,
    /// Mapped file pages.
    pub mapped_file: Option<u64>,
    /// Inactive file pages.
    pub inactive_file: Option<u64>,
    /// Minor page faults.
    pub pgfault: Option<u64>,
    /// Major page faults.
    pub pgmajfault: Option<u64>,
    /// Peak usage.
    pub max_usage: Option<u64>,
    /// Times the limit was hit (v1).
    pub failcnt: Option<u64>,
    /// The limit; `None` when unlimited or unknown.
    pub limit: Option<u64>,
    /// Swap in use.
    pub swap: Option<u64>,
    /// Swap limit (v1: memory+swap); `None` when unlimited or unknown.
    pub swap_limit: Option<u64>,
    /// Processes killed by the OOM killer in this cgroup.
    pub oom_kills: Option<u64>,
}

/// One line of a PSI file.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PsiLine {
    /// `avg10`, percent.
    pub avg10: f64,
    /// `avg60`, percent.
    pub avg60: f64,
    /// `avg300`, percent.
    pub avg300: f64,
    /// `total`, microseconds.
    pub total: u64,
}

/// A PSI file (`cpu.pressure`, `memory.pressure`, `io.pressure`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pressure {
    /// `some` line.
    pub some: PsiLine,
    /// `full` line (absent for cpu on kernels before 5.13: zero).
    pub full: PsiLine,
}

/// Everything read from one cgroup in one collection.
#[derive(Debug, Clone, PartialEq)]
pub struct CgroupStats {
    /// When it was read.
    pub time: SystemTime,
    /// CPU usage, when `cpuacct.usage`/`cpu.stat` could be read.
    pub cpu: Option<CpuUsage>,
    /// Memory usage, when the usage file could be read.
    pub memory: Option<MemoryUsage>,
    /// Tasks (threads) in the cgroup (`pids.current`).
    pub tasks: Option<u64>,
    /// Processes in the cgroup (`cgroup.procs`), when asked for.
    pub processes: Option<u64>,
    /// One process of the cgroup (the first of `cgroup.procs`), when asked for.
    pub first_pid: Option<u32>,
    /// CPU pressure.
    pub cpu_pressure: Option<Pressure>,
    /// Memory pressure.
    pub memory_pressure: Option<Pressure>,
    /// IO pressure.
    pub io_pressure: Option<Pressure>,
    /// Block I/O operations per device, when asked for (empty without data).
    pub io: Vec<DeviceIo>,
    /// The spec files, when asked for.
    pub spec: Option<CgroupSpec>,
    /// Descriptors and sockets of the cgroup's processes and its root process's
    /// open-files limit, when walked (by the collector, see [`super::processes`]).
    pub process_stats: Option<ProcessStats>,
}

impl CgroupStats {
    /// Stats taken at `time` with nothing read (yet).
    #[must_use]
    pub fn empty(time: SystemTime) -> Self {
        Self {
            time,
            cpu: None,
            memory: None,
            tasks: None,
            processes: None,
            first_pid: None,
            cpu_pressure: None,
            memory_pressure: None,
            io_pressure: None,
            io: Vec::new(),
            spec: None,
            process_stats: None,
        }
    }
}

/// What a cgroup's spec files say (cAdvisor's `ContainerSpec` as `container/common`
/// `GetSpec` reads it), for the `container_spec_*` families and `container_threads_max`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupSpec {
    /// CPU period and shares; `None` when the cgroup has no cpu controller directory
    /// (cAdvisor's `HasCpu`).
    pub cpu: Option<CpuSpec>,
    /// The memory reservation (v1 `memory.soft_limit_in_bytes`, v2 `memory.min`);
    /// `None` when unlimited or missing.
    pub memory_reservation: Option<u64>,
    /// `pids.max`, `max` as 0 (runc's "no limit"); `None` when missing (the root).
    pub threads_max: Option<u64>,
}

/// The CPU spec of a cgroup. A file that is missing or does not parse reads 0, `max`
/// reads `u64::MAX`, as cAdvisor's `readUInt64`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuSpec {
    /// CFS period, µs: v1 `cpu.cfs_period_us`, v2 the second field of `cpu.max`.
    pub period: u64,
    /// v1 `cpu.shares`; v2 `cpu.weight` converted back to shares ([`weight_to_shares`]).
    pub shares: u64,
}

/// Block I/O operations of a cgroup on one device (cAdvisor's `IoServiced`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceIo {
    /// Device major number.
    pub major: u32,
    /// Device minor number.
    pub minor: u32,
    /// The device's name (`/dev/sda`), filled by the collector; empty when unknown.
    pub device: String,
    /// Read operations.
    pub reads: u64,
    /// Write operations.
    pub writes: u64,
}

/// What to read besides CPU and memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[expect(clippy::struct_excessive_bools, reason = "independent switches, each for one group of files")]
pub struct ReadOptions {
    /// Read `cgroup.procs` (process count and a pid for the network namespace).
    pub procs: bool,
    /// Read block I/O operations per device.
    pub io: bool,
    /// Read the spec files ([`CgroupSpec`]).
    pub spec: bool,
    /// Read only what the eviction manager uses: memory usage, working set and limit
    /// (usage, `memory.stat`, the limit), the task count, and `cgroup.procs` with
    /// `procs`; no CPU, other memory figures or pressure (overrides `io` and `spec`).
    pub memory_only: bool,
}

/// Reads cgroups, reusing one buffer for every file.
#[derive(Debug)]
pub struct CgroupReader {
    hierarchies: CgroupHierarchies,
    buf: String,
    /// The v1 `io_serviced` files this kernel has (looked up once at the blkio root).
    v1_io_files: Option<Vec<&'static str>>,
}

/// Whether an error means the file (or its cgroup) does not exist (any more).
fn is_gone(e: &io::Error) -> bool {
    // ENODEV: reading a file of a cgroup removed after it was opened.
    e.kind() == io::ErrorKind::NotFound
        || e.raw_os_error() == Some(libc::ENODEV)
        || e.raw_os_error() == Some(libc::ESRCH)
}

/// Directories of stats files (cgroup directories, `/proc/<pid>`), kept open between
/// collections as `O_PATH` descriptors: a collection opens each file relative to its
/// directory (`openat` of one name, instead of walking the whole long path from `/`
/// again, which was most of a collection's cost), reads it and closes it. Keeping the
/// files themselves open instead would cost the node kernel memory (a `seq_file` buffer
/// of a page for each of some 20 files a cgroup) and a descriptor each; a directory
/// costs one `O_PATH` descriptor. Entries not used during a collection are closed by
/// [`sweep_open_dirs`]. At most [`open_files_budget`] stay open: beyond it a file is
/// opened by its path.
static OPEN_DIRS: std::sync::LazyLock<std::sync::Mutex<OpenDirs>> =
    std::sync::LazyLock::new(|| std::sync::Mutex::new(OpenDirs::with_budget(open_files_budget())));

/// How many directories may stay open: half the soft limit on open files (read once,
/// after `main` has raised it to the hard limit), so the cache never takes the
/// descriptors the rest of the agent needs. A pod has about 10 directories (two
/// cgroups in up to six v1 hierarchies, and its processes): 5,000 at 500 pods.
fn open_files_budget() -> usize {
    let soft = crate::memory::open_files_limit().map_or(1024, |l| l.rlim_cur);
    usize::try_from(soft / 2).unwrap_or(usize::MAX)
}

/// A kept directory.
struct OpenDir {
    fd: std::os::fd::OwnedFd,
    /// Its device and inode when opened, to tell it from a directory made since at the
    /// same path (the descriptor pins the inode, so its number is not reused meanwhile).
    id: (u64, u64),
    /// The generation of the last read through it.
    used: u64,
    /// The generation in which a missing file made us check that the directory at the
    /// path is still this one (at most once a collection).
    checked: u64,
}

#[derive(Default)]
struct OpenDirs {
    dirs: std::collections::HashMap<PathBuf, OpenDir>,
    generation: u64,
    /// At most this many entries in `dirs`.
    budget: usize,
    /// What each read reads into.
    scratch: Vec<u8>,
}

/// Opens `name` in the directory `dir` for reading.
fn open_at(dir: std::os::fd::BorrowedFd<'_>, name: &std::ffi::OsStr) -> io::Result<File> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _};
    use std::os::unix::ffi::OsStrExt as _;
    let name = std::ffi::CString::new(name.as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `dir` is an open descriptor and `name` a NUL-terminated string; a
    // descriptor returned by openat is ours alone.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The (device, inode) of a file.
fn file_id(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt as _;
    (meta.dev(), meta.ino())
}

impl OpenDirs {
    fn with_budget(budget: usize) -> Self {
        Self { budget, ..Self::default() }
    }

    /// Closes the directories no read used since the last sweep.
    fn sweep(&mut self) {
        let generation = self.generation;
        self.dirs.retain(|_, d| d.used == generation);
        self.generation += 1;
    }

    /// Opens `path` through its kept directory, keeping the directory (while the budget
    /// allows) when it is not yet.
    fn open(&mut self, path: &Path) -> io::Result<File> {
        use std::os::fd::AsFd as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return File::open(path) };
        let generation = self.generation;
        if let Some(d) = self.dirs.get_mut(dir) {
            d.used = generation;
            match open_at(d.fd.as_fd(), name) {
                // A file the directory does not have, or a directory removed (and
                // perhaps made again at the same path, as a static pod's cgroup or a
                // reused pid): check which, once a collection.
                Err(e) if is_gone(&e) && d.checked != generation => {
                    d.checked = generation;
                    let same = std::fs::metadata(dir).is_ok_and(|m| file_id(&m) == d.id);
                    if same {
                        return Err(e);
                    }
                    self.dirs.remove(dir);
                }
                other => return other,
            }
        }
        if self.dirs.len() >= self.budget {
            return File::open(path);
        }
        let Ok(dir_file) =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_DIRECTORY).open(dir)
        else {
            return File::open(path);
        };
        let Ok(meta) = dir_file.metadata() else { return File::open(path) };
        let fd = std::os::fd::OwnedFd::from(dir_file);
        let file = open_at(fd.as_fd(), name);
        self.dirs.insert(dir.to_owned(), OpenDir { fd, id: file_id(&meta), used: generation, checked: generation });
        file
    }

    /// Reads all of `path` into `buf`. `None` if it cannot be read.
    fn read<'a>(&mut self, buf: &'a mut String, path: &Path) -> Option<&'a str> {
        buf.clear();
        let file = self.open(path);
        match file.and_then(|f| read_all(&f, &mut self.scratch, buf)) {
            Ok(()) => Some(buf.as_str()),
            Err(e) => {
                if !is_gone(&e) {
                    tracing::debug!(path = %path.display(), error = %e, "stats: cannot read");
                }
                buf.clear();
                None
            }
        }
    }
}

/// Closes the directories no read used since the last sweep (call once per collection).
pub(crate) fn sweep_open_dirs() {
    OPEN_DIRS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).sweep();
}

/// A read that returns fewer bytes than this was the file's last: a `seq_file` (every
/// cgroup and proc file) fills a read up to its page-sized buffer and stops short of it
/// only at the end or when its next record does not fit, and the records of the files
/// read here are lines far shorter than a page less this. Stopping there saves the read
/// that would return 0, a third of the system calls of a collection.
const SHORT_READ: usize = 2048;

/// Reads all of a freshly opened `file` into `buf`, through `scratch`.
fn read_all(mut file: &File, scratch: &mut Vec<u8>, buf: &mut String) -> io::Result<()> {
    use std::io::Read as _;
    if scratch.len() < 8192 {
        scratch.resize(8192, 0);
    }
    let mut bytes = std::mem::take(buf).into_bytes();
    bytes.clear();
    loop {
        let n = match file.read(scratch) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        bytes.extend_from_slice(&scratch[..n]);
        if n < SHORT_READ {
            break;
        }
    }
    *buf = String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(())
}

/// Reads a whole small file into `buf`; `None` if it does not exist. Its directory
/// stays open for the next collection while the budget allows (see [`OPEN_DIRS`]).
pub(crate) fn read_into<'a>(buf: &'a mut String, path: &Path) -> Option<&'a str> {
    OPEN_DIRS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).read(buf, path)
}

/// Parses a single unsigned integer file.
pub(crate) fn parse_u64(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// Parses a v2 limit file: `None` for `max` (unlimited) or an unreadable value.
fn parse_v2_limit(text: &str) -> Option<u64> {
    text.trim().parse().ok().and_then(limited)
}

/// A limit, or `None` above the unlimited threshold.
const fn limited(v: u64) -> Option<u64> {
    if v > UNLIMITED_THRESHOLD { None } else { Some(v) }
}

/// Looks a key up in a flat keyed file (`key value` per line).
pub(crate) fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        if k == key { v.trim().parse().ok() } else { None }
    })
}

/// Parses a PSI file (`some avg10=… avg60=… avg300=… total=…`, then `full …`).
pub(crate) fn parse_pressure(text: &str) -> Option<Pressure> {
    let mut out = Pressure::default();
    let mut found = false;
    for line in text.lines() {
        let mut fields = line.split_ascii_whitespace();
        let target = match fields.next() {
            Some("some") => &mut out.some,
            Some("full") => &mut out.full,
            _ => continue,
        };
        for field in fields {
            let Some((k, v)) = field.split_once('=') else { continue };
            match k {
                "avg10" => target.avg10 = v.parse().ok()?,
                "avg60" => target.avg60 = v.parse().ok()?,
                "avg300" => target.avg300 = v.parse().ok()?,
                "total" => target.total = v.parse().ok()?,
                _ => {}
            }
        }
        found = true;
    }
    found.then_some(out)
}

/// The v1 `memory.stat` fields we use (hierarchical `total_*` where cAdvisor uses them).
#[derive(Debug, Default)]
struct V1MemoryStat {
    total_inactive_file: Option<u64>,
    total_rss: Option<u64>,
    total_cache: Option<u64>,
    total_mapped_file: Option<u64>,
    total_swap: Option<u64>,
    rss: Option<u64>,
    cache: Option<u64>,
    mapped_file: Option<u64>,
    inactive_file: Option<u64>,
    swap: Option<u64>,
    pgfault: Option<u64>,
    pgmajfault: Option<u64>,
}

fn parse_v1_memory_stat(text: &str) -> V1MemoryStat {
    let mut s = V1MemoryStat::default();
    for line in text.lines() {
        let Some((k, v)) = line.split_once(' ') else { continue };
        let slot = match k {
            "total_inactive_file" => &mut s.total_inactive_file,
            "total_rss" => &mut s.total_rss,
            "total_cache" => &mut s.total_cache,
            "total_mapped_file" => &mut s.total_mapped_file,
            "total_swap" => &mut s.total_swap,
            "rss" => &mut s.rss,
            "cache" => &mut s.cache,
            "mapped_file" => &mut s.mapped_file,
            "inactive_file" => &mut s.inactive_file,
            "swap" => &mut s.swap,
            "pgfault" => &mut s.pgfault,
            "pgmajfault" => &mut s.pgmajfault,
            _ => continue,
        };
        *slot = v.trim().parse().ok();
    }
    s
}

/// The v2 `memory.stat` fields we use.
#[derive(Debug, Default)]
struct V2MemoryStat {
    anon: Option<u64>,
    file: Option<u64>,
    file_mapped: Option<u64>,
    inactive_file: Option<u64>,
    pgfault: Option<u64>,
    pgmajfault: Option<u64>,
}

fn parse_v2_memory_stat(text: &str) -> V2MemoryStat {
    let mut s = V2MemoryStat::default();
    for line in text.lines() {
        let Some((k, v)) = line.split_once(' ') else { continue };
        let slot = match k {
            "anon" => &mut s.anon,
            "file" => &mut s.file,
            "file_mapped" => &mut s.file_mapped,
            "inactive_file" => &mut s.inactive_file,
            "pgfault" => &mut s.pgfault,
            "pgmajfault" => &mut s.pgmajfault,
            _ => continue,
        };
        *slot = v.trim().parse().ok();
    }
    s
}

/// Counts the lines of `cgroup.procs` and returns the first pid.
fn parse_procs(text: &str) -> (u64, Option<u32>) {
    let mut count = 0;
    let mut first = None;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        count += 1;
        if first.is_none() {
            first = line.trim().parse().ok();
        }
    }
    (count, first)
}

impl CgroupReader {
    /// A reader of the given hierarchies.
    #[must_use]
    pub fn new(hierarchies: CgroupHierarchies) -> Self {
        Self { hierarchies, buf: String::with_capacity(4096), v1_io_files: None }
    }

    /// The hierarchies read.
    #[must_use]
    pub const fn hierarchies(&self) -> &CgroupHierarchies {
        &self.hierarchies
    }

    /// Reads one cgroup at `time`. `None` if the cgroup does not exist (it vanished
    /// between listing and reading, or never existed); files that are missing in an
    /// existing cgroup leave their fields `None`.
    pub fn read(&mut self, cgroup: &str, time: SystemTime, opts: ReadOptions) -> Option<CgroupStats> {
        let Self { hierarchies, buf, v1_io_files } = self;
        let mut stats = CgroupStats::empty(time);
        let exists = match &*hierarchies {
            CgroupHierarchies::V1 { cpuacct, cpu, memory, pids, blkio, unified } => {
                let cpuacct_dir = join(cpuacct, cgroup);
                let memory_dir = join(memory, cgroup);
                let cpu_dir = cpu.as_deref().map(|c| join(c, cgroup));
                let pids_dir = pids.as_deref().map(|p| join(p, cgroup));
                stats.memory = v1_memory(buf, &memory_dir, !opts.memory_only);
                if let Some(p) = &pids_dir {
                    stats.tasks = read_into(buf, &p.join("pids.current")).and_then(parse_u64);
                }
                if opts.memory_only {
                    if opts.procs {
                        procs(buf, &memory_dir, &mut stats);
                    }
                    return (stats.memory.is_some() || memory_dir.is_dir()).then_some(stats);
                }
                stats.cpu = v1_cpu(buf, &cpuacct_dir, cpu_dir.as_deref());
                if opts.spec {
                    stats.spec = Some(v1_spec(buf, cpu_dir.as_deref(), &memory_dir, pids_dir.as_deref()));
                }
                if opts.procs {
                    procs(buf, &memory_dir, &mut stats);
                }
                if opts.io
                    && let Some(b) = blkio
                {
                    let files = v1_io_files
                        .get_or_insert_with(|| V1_IO_SERVICED.into_iter().filter(|f| b.join(f).exists()).collect());
                    stats.io = v1_io(buf, &join(b, cgroup), files);
                }
                if let Some(u) = unified {
                    pressure(buf, &join(u, cgroup), &mut stats);
                }
                stats.cpu.is_some() || stats.memory.is_some() || cpuacct_dir.is_dir() || memory_dir.is_dir()
            }
            CgroupHierarchies::V2 { root } => {
                let dir = join(root, cgroup);
                let is_root = cgroup.trim_matches('/').is_empty();
                stats.memory = v2_memory(buf, &dir, is_root, !opts.memory_only);
                stats.tasks = read_into(buf, &dir.join("pids.current")).and_then(parse_u64);
                if opts.memory_only {
                    if opts.procs {
                        procs(buf, &dir, &mut stats);
                    }
                    return (stats.memory.is_some() || dir.is_dir()).then_some(stats);
                }
                stats.cpu = v2_cpu(buf, &dir);
                if opts.procs {
                    procs(buf, &dir, &mut stats);
                }
                if opts.io {
                    stats.io = read_into(buf, &dir.join("io.stat")).map(parse_io_stat).unwrap_or_default();
                }
                if opts.spec {
                    stats.spec = Some(v2_spec(buf, &dir));
                }
                pressure(buf, &dir, &mut stats);
                stats.cpu.is_some() || stats.memory.is_some() || dir.is_dir()
            }
        };
        exists.then_some(stats)
    }

    /// The directory of a cgroup in the hierarchy whose modification time stands for the
    /// cgroup's creation (cAdvisor's `CreationTime` of raw cgroups): cpuacct on v1.
    #[must_use]
    pub fn primary_dir(&self, cgroup: &str) -> PathBuf {
        match &self.hierarchies {
            CgroupHierarchies::V1 { cpuacct, .. } => join(cpuacct, cgroup),
            CgroupHierarchies::V2 { root } => join(root, cgroup),
        }
    }

    /// The reader's scratch buffer, for other small files read in the same pass.
    pub(crate) fn buffer(&mut self) -> &mut String {
        &mut self.buf
    }

    /// The processes of a cgroup itself (its `cgroup.procs`, not its children's) into
    /// `out`, from the cpu hierarchy on v1 as cAdvisor's process stats read them; `false`
    /// when there is none to read (no cpu hierarchy, or the cgroup is gone).
    pub fn pids(&mut self, cgroup: &str, out: &mut Vec<u32>) -> bool {
        out.clear();
        let dir = match &self.hierarchies {
            CgroupHierarchies::V1 { cpu: Some(cpu), .. } => join(cpu, cgroup),
            CgroupHierarchies::V1 { cpu: None, .. } => return false,
            CgroupHierarchies::V2 { root } => join(root, cgroup),
        };
        let Some(text) = read_into(&mut self.buf, &dir.join("cgroup.procs")) else { return false };
        out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        true
    }
}

/// A spec file's number as cAdvisor's `readUInt64`/`parseUint64String` read it: `max` is
/// `u64::MAX`; empty or unparsable is 0.
fn spec_u64(text: &str) -> u64 {
    match text {
        "max" => u64::MAX,
        t => t.parse().unwrap_or(0),
    }
}

/// cgroup v2 `cpu.weight` (1–10000) back to v1 shares (2–262144) with cAdvisor's linear
/// formula (`convertCPUWeightToCPULimit`); a weight out of range is 0. This is not the
/// exact inverse of runc's shares → weight mapping: 1024 shares (weight 39) read back as
/// 998, as upstream shows them.
#[must_use]
pub const fn weight_to_shares(weight: u64) -> u64 {
    if weight >= 1 && weight <= 10_000 { 2 + ((weight - 1) * 262_142) / 9_999 } else { 0 }
}

/// The period of a `cpu.max` (`$MAX $PERIOD`): its second field; 0 without one.
fn cpu_max_period(text: &str) -> u64 {
    text.split_once(' ').map_or(0, |(_, period)| spec_u64(period))
}

/// `pids.max`: `max` is 0 (runc's "no limit", which cAdvisor's help calls infinity).
fn pids_max(text: &str) -> Option<u64> {
    match text.trim() {
        "max" => Some(0),
        t => t.parse().ok(),
    }
}

/// The CPU spec when the cpu directory exists: read from its files when there are any,
/// zeros otherwise (the v2 root has no `cpu.weight` or `cpu.max`).
fn cpu_spec(dir: &Path, shares: Option<u64>, period: Option<u64>) -> Option<CpuSpec> {
    (shares.is_some() || period.is_some() || dir.is_dir())
        .then(|| CpuSpec { period: period.unwrap_or(0), shares: shares.unwrap_or(0) })
}

fn v1_spec(buf: &mut String, cpu: Option<&Path>, memory: &Path, pids: Option<&Path>) -> CgroupSpec {
    let cpu = cpu.and_then(|dir| {
        let shares = read_into(buf, &dir.join("cpu.shares")).map(|t| spec_u64(t.trim()));
        let period = read_into(buf, &dir.join("cpu.cfs_period_us")).map(|t| spec_u64(t.trim()));
        cpu_spec(dir, shares, period)
    });
    let reservation = read_into(buf, &memory.join("memory.soft_limit_in_bytes")).map(|t| spec_u64(t.trim()));
    CgroupSpec {
        cpu,
        memory_reservation: reservation.and_then(limited),
        threads_max: pids.and_then(|p| read_into(buf, &p.join("pids.max"))).and_then(pids_max),
    }
}

fn v2_spec(buf: &mut String, dir: &Path) -> CgroupSpec {
    let shares = read_into(buf, &dir.join("cpu.weight")).map(|t| weight_to_shares(spec_u64(t.trim())));
    let period = read_into(buf, &dir.join("cpu.max")).map(|t| cpu_max_period(t.trim()));
    let reservation = read_into(buf, &dir.join("memory.min")).map(|t| spec_u64(t.trim()));
    CgroupSpec {
        cpu: cpu_spec(dir, shares, period),
        memory_reservation: reservation.and_then(limited),
        threads_max: read_into(buf, &dir.join("pids.max")).and_then(pids_max),
    }
}

/// The v1 files of I/O operations, in runc's order of preference.
const V1_IO_SERVICED: [&str; 3] =
    ["blkio.bfq.io_serviced_recursive", "blkio.io_serviced_recursive", "blkio.throttle.io_serviced_recursive"];

fn v1_io(buf: &mut String, dir: &Path, files: &[&str]) -> Vec<DeviceIo> {
    for file in files {
        if let Some(text) = read_into(buf, &dir.join(file)) {
            let io = parse_blkio_serviced(text);
            if !io.is_empty() {
                return io;
            }
        }
    }
    Vec::new()
}

fn device_entry(out: &mut Vec<DeviceIo>, dev: &str) -> Option<usize> {
    let (major, minor) = dev.split_once(':')?;
    let (major, minor) = (major.parse().ok()?, minor.parse().ok()?);
    if let Some(i) = out.iter().position(|d| d.major == major && d.minor == minor) {
        return Some(i);
    }
    out.push(DeviceIo { major, minor, ..DeviceIo::default() });
    Some(out.len() - 1)
}

/// Parses a v1 `io_serviced` file (`8:0 Read 12` lines and a final `Total` line).
pub(crate) fn parse_blkio_serviced(text: &str) -> Vec<DeviceIo> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.split_ascii_whitespace();
        let (Some(dev), Some(op), Some(v)) = (f.next(), f.next(), f.next()) else { continue };
        let Ok(v) = v.parse::<u64>() else { continue };
        let Some(i) = device_entry(&mut out, dev) else { continue };
        match op {
            "Read" => out[i].reads = v,
            "Write" => out[i].writes = v,
            _ => {}
        }
    }
    out
}

/// Parses a v2 `io.stat` (`8:0 rbytes=… wbytes=… rios=… wios=… dbytes=… dios=…`).
pub(crate) fn parse_io_stat(text: &str) -> Vec<DeviceIo> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.split_ascii_whitespace();
        let Some(dev) = f.next() else { continue };
        let Some(i) = device_entry(&mut out, dev) else { continue };
        for kv in f {
            let Some((k, v)) = kv.split_once('=') else { continue };
            let Ok(v) = v.parse::<u64>() else { continue };
            match k {
                "rios" => out[i].reads = v,
                "wios" => out[i].writes = v,
                _ => {}
            }
        }
    }
    out
}

fn procs(buf: &mut String, dir: &Path, stats: &mut CgroupStats) {
    if let Some(text) = read_into(buf, &dir.join("cgroup.procs")) {
        let (count, first) = parse_procs(text);
        stats.processes = Some(count);
        stats.first_pid = first;
    }
}

fn pressure(buf: &mut String, dir: &Path, stats: &mut CgroupStats) {
    stats.cpu_pressure = read_into(buf, &dir.join("cpu.pressure")).and_then(parse_pressure);
    stats.memory_pressure = read_into(buf, &dir.join("memory.pressure")).and_then(parse_pressure);
    stats.io_pressure = read_into(buf, &dir.join("io.pressure")).and_then(parse_pressure);
}

fn v1_cpu(buf: &mut String, cpuacct: &Path, cpu: Option<&Path>) -> Option<CpuUsage> {
    let total_ns = read_into(buf, &cpuacct.join("cpuacct.usage")).and_then(parse_u64)?;
    let mut out = CpuUsage { total_ns, ..CpuUsage::default() };
    if let Some(text) = read_into(buf, &cpuacct.join("cpuacct.stat")) {
        out.user_ns = keyed(text, "user").map(|t| t.saturating_mul(NANOS_PER_USER_HZ_TICK));
        out.system_ns = keyed(text, "system").map(|t| t.saturating_mul(NANOS_PER_USER_HZ_TICK));
    }
    if let Some(text) = cpu.and_then(|c| read_into(buf, &c.join("cpu.stat"))) {
        out.throttling = match (keyed(text, "nr_periods"), keyed(text, "nr_throttled"), keyed(text, "throttled_time")) {
            (Some(periods), Some(throttled_periods), Some(throttled_ns)) => {
                Some(Throttling { periods, throttled_periods, throttled_ns })
            }
            _ => None,
        };
    }
    Some(out)
}

/// A v1 memory cgroup's usage; with `full` also its peak, failures, limits and OOM kills.
fn v1_memory(buf: &mut String, dir: &Path, full: bool) -> Option<MemoryUsage> {
    let usage = read_into(buf, &dir.join("memory.usage_in_bytes")).and_then(parse_u64)?;
    let mut out = MemoryUsage { usage, ..MemoryUsage::default() };
    if let Some(text) = read_into(buf, &dir.join("memory.stat")) {
        let s = parse_v1_memory_stat(text);
        // memory.use_hierarchy is 1 on every kernel a kubelet supports: cAdvisor then
        // uses the hierarchical totals (falling back to the local ones without them).
        let inactive = s.total_inactive_file.or(s.inactive_file);
        out.working_set = Some(inactive.map_or(usage, |i| usage.saturating_sub(i)));
        out.inactive_file = inactive;
        out.rss = s.total_rss.or(s.rss);
        out.cache = s.total_cache.or(s.cache);
        out.mapped_file = s.total_mapped_file.or(s.mapped_file);
        out.swap = s.total_swap.or(s.swap);
        out.pgfault = s.pgfault;
        out.pgmajfault = s.pgmajfault;
    }
    // The limit, for the available bytes of the pods cgroup (the eviction manager's
    // allocatable memory) and of each pod.
    out.limit = read_into(buf, &dir.join("memory.limit_in_bytes")).and_then(parse_u64).and_then(limited);
    if !full {
        return Some(out);
    }
    out.max_usage = read_into(buf, &dir.join("memory.max_usage_in_bytes")).and_then(parse_u64);
    out.failcnt = read_into(buf, &dir.join("memory.failcnt")).and_then(parse_u64);
    out.swap_limit = read_into(buf, &dir.join("memory.memsw.limit_in_bytes")).and_then(parse_u64).and_then(limited);
    out.oom_kills = read_into(buf, &dir.join("memory.oom_control")).and_then(|t| keyed(t, "oom_kill"));
    Some(out)
}

fn v2_cpu(buf: &mut String, dir: &Path) -> Option<CpuUsage> {
    let text = read_into(buf, &dir.join("cpu.stat"))?;
    let usec = |k| keyed(text, k).map(|v: u64| v.saturating_mul(1000));
    let throttling = match (keyed(text, "nr_periods"), keyed(text, "nr_throttled"), usec("throttled_usec")) {
        (Some(periods), Some(throttled_periods), Some(throttled_ns)) => {
            Some(Throttling { periods, throttled_periods, throttled_ns })
        }
        _ => None,
    };
    Some(CpuUsage {
        total_ns: usec("usage_usec")?,
        user_ns: usec("user_usec"),
        system_ns: usec("system_usec"),
        throttling,
        nano_cores: None,
    })
}

/// A v2 memory cgroup's usage; with `full` also its peak, limits, swap and OOM kills.
fn v2_memory(buf: &mut String, dir: &Path, is_root: bool, full: bool) -> Option<MemoryUsage> {
    let current = read_into(buf, &dir.join("memory.current")).and_then(parse_u64);
    let stat = read_into(buf, &dir.join("memory.stat")).map(parse_v2_memory_stat);
    // The root cgroup has no memory.current: runc emulates it as anon + file.
    let usage = match (current, &stat) {
        (Some(u), _) => u,
        (None, Some(s)) if is_root => s.anon?.saturating_add(s.file?),
        _ => return None,
    };
    let mut out = MemoryUsage { usage, ..MemoryUsage::default() };
    if let Some(s) = stat {
        out.working_set = Some(s.inactive_file.map_or(usage, |i| usage.saturating_sub(i)));
        out.inactive_file = s.inactive_file;
        out.rss = s.anon;
        out.cache = s.file;
        out.mapped_file = s.file_mapped;
        out.pgfault = s.pgfault;
        out.pgmajfault = s.pgmajfault;
    }
    if is_root {
        return Some(out);
    }
    out.limit = read_into(buf, &dir.join("memory.max")).and_then(parse_v2_limit);
    if !full {
        return Some(out);
    }
    out.max_usage = read_into(buf, &dir.join("memory.peak")).and_then(parse_u64);
    out.swap = read_into(buf, &dir.join("memory.swap.current")).and_then(parse_u64);
    out.swap_limit = read_into(buf, &dir.join("memory.swap.max")).and_then(parse_v2_limit);
    out.oom_kills = read_into(buf, &dir.join("memory.events")).and_then(|t| keyed(t, "oom_kill"));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past its budget the cache opens files by their paths, and still returns what is
    /// in them; a sweep closes what the last collection did not use; a directory removed
    /// and made again at the same path is looked up anew.
    #[test]
    fn kept_directories_stay_within_the_budget_and_follow_their_paths() {
        let base = std::env::temp_dir().join(format!("swiftlet-open-dirs-{}", std::process::id()));
        let dirs: Vec<PathBuf> = (0..5).map(|i| base.join(format!("d{i}"))).collect();
        for d in &dirs {
            fs_setup(d, 2);
        }
        let mut open = OpenDirs::with_budget(3);
        let mut buf = String::new();
        for round in 0..2 {
            for d in &dirs {
                for i in 0..2 {
                    let text = open.read(&mut buf, &d.join(format!("f{i}"))).map(str::to_owned);
                    assert_eq!(
                        text.as_deref(),
                        Some(format!("value {i}\n").as_str()),
                        "round {round}, {}",
                        d.display()
                    );
                }
                assert!(open.dirs.len() <= 3, "{} directories kept", open.dirs.len());
            }
        }
        assert_eq!(open.dirs.len(), 3);
        assert!(open.read(&mut buf, &dirs[0].join("missing")).is_none());
        assert!(buf.is_empty());
        // A file changed since is read as it is now.
        std::fs::write(dirs[0].join("f0"), "changed\n").unwrap();
        assert_eq!(open.read(&mut buf, &dirs[0].join("f0")), Some("changed\n"));
        // Removed and made again: the new directory's files.
        std::fs::remove_dir_all(&dirs[1]).unwrap();
        assert!(open.read(&mut buf, &dirs[1].join("f0")).is_none());
        std::fs::create_dir_all(&dirs[1]).unwrap();
        std::fs::write(dirs[1].join("f0"), "again\n").unwrap();
        open.sweep();
        assert_eq!(open.read(&mut buf, &dirs[1].join("f0")), Some("again\n"));
        // Every read so far in this generation used d1 only: a sweep keeps it alone.
        open.sweep();
        assert_eq!(open.dirs.keys().collect::<Vec<_>>(), [&dirs[1]]);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn the_budget_is_half_the_soft_limit() {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit(2) fills the struct it is given.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) }, 0);
        assert_eq!(open_files_budget() as u64, limit.rlim_cur / 2);
    }

    fn fs_setup(dir: &Path, n: usize) {
        std::fs::create_dir_all(dir).unwrap();
        for i in 0..n {
            std::fs::write(dir.join(format!("f{i}")), format!("value {i}\n")).unwrap();
        }
    }
}
