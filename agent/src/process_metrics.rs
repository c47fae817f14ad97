//! The `process_*` families every Go binary serves (the Prometheus Go client's process
//! collector), read from `/proc/self` at scrape time: CPU seconds, open and maximum file
//! descriptors, resident and virtual memory, the virtual memory limit and the start time.
//! Dashboards that watch the kubelet's own footprint use them.
//!
//! One deviation: `process_open_fds` is counted at most every [`OPEN_FDS_TTL`] (10 s).
//! The stats keep every cgroup file they read open (thousands of descriptors at 250 pods),
//! and listing `/proc/self/fd` costs the kernel about 0.6 µs per descriptor — 4 ms at
//! 7,500, more than the rest of a `/metrics` scrape.

use std::path::{Path, PathBuf};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// One reading of the process's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
    pub resident_bytes: f64,
    pub virtual_bytes: f64,
    /// `None`: unlimited (the Go client then reports the maximum `uint64` as a float).
    pub virtual_max_bytes: Option<f64>,
    pub start_time_seconds: f64,
}

/// Parses `/proc/<pid>/stat` (fields after the `comm` in parentheses), `limits` and the
/// `fd` directory under `proc_pid`, with `boot_time` from `/proc/stat` and the clock tick.
fn read(proc_pid: &Path, boot_time: f64, ticks_per_second: f64, page_size: f64) -> Option<ProcessStats> {
    let stat = std::fs::read_to_string(proc_pid.join("stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields counted from `state` (field 3 of proc(5)) at index 0.
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    let utime = num(11)?;
    let stime = num(12)?;
    let start_ticks = num(19)?;
    let vsize = num(20)?;
    let rss_pages = num(21)?;
    let open_fds = open_fds(proc_pid);
    let limits = std::fs::read_to_string(proc_pid.join("limits")).unwrap_or_default();
    let soft_limit = |name: &str| -> Option<Option<f64>> {
        let line = limits.lines().find(|l| l.starts_with(name))?;
        let soft = line[name.len()..].split_whitespace().next()?;
        Some(if soft == "unlimited" { None } else { soft.parse().ok() })
    };
    Some(ProcessStats {
        cpu_seconds: (utime + stime) / ticks_per_second,
        open_fds,
        max_fds: soft_limit("Max open files").flatten(),
        resident_bytes: rss_pages * page_size,
        virtual_bytes: vsize,
        virtual_max_bytes: soft_limit("Max address space").flatten(),
        start_time_seconds: boot_time + start_ticks / ticks_per_second,
    })
}

/// How long a count of open descriptors is served again.
pub const OPEN_FDS_TTL: std::time::Duration = std::time::Duration::from_secs(10);

/// The number of entries of `<proc_pid>/fd`, counted at most every [`OPEN_FDS_TTL`] per
/// directory.
fn open_fds(proc_pid: &Path) -> Option<f64> {
    type Counts = std::collections::HashMap<PathBuf, (std::time::Instant, Option<f64>)>;
    static LAST: std::sync::Mutex<Option<Counts>> = std::sync::Mutex::new(None);
    let dir = proc_pid.join("fd");
    let mut last = LAST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let counts = last.get_or_insert_with(Counts::new);
    if let Some((at, count)) = counts.get(&dir)
        && at.elapsed() < OPEN_FDS_TTL
    {
        return *count;
    }
    let count = std::fs::read_dir(&dir).ok().map(|d| d.count() as f64);
    counts.insert(dir, (std::time::Instant::now(), count));
    count
}

fn boot_time(proc_root: &Path) -> f64 {
    std::fs::read_to_string(proc_root.join("stat"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse().ok())))
        .unwrap_or(0.0)
}

/// Serves the `process_*` families of this process.
#[derive(Debug, Clone)]
pub struct ProcessCollector {
    proc_root: PathBuf,
    pid: String,
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self { proc_root: PathBuf::from("/proc"), pid: "self".into() }
    }
}

impl ProcessCollector {
    /// The figures now, if `/proc` can be read.
    #[must_use]
    pub fn stats(&self) -> Option<ProcessStats> {
        // SAFETY: sysconf only reads configuration values.
        let (ticks, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
        read(&self.proc_root.join(&self.pid), boot_time(&self.proc_root), ticks.max(1) as f64, page.max(1) as f64)
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(s) = self.stats() else { return Ok(()) };
        let counter = |e: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: f64| -> Result<(), std::fmt::Error> {
            ConstCounter::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
        };
        let gauge = |e: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: f64| -> Result<(), std::fmt::Error> {
            ConstGauge::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
        };
        // prometheus-client appends `_total` to counters.
        counter(&mut encoder, "process_cpu_seconds", "Total user and system CPU time spent in seconds", s.cpu_seconds)?;
        if let Some(v) = s.max_fds {
            gauge(&mut encoder, "process_max_fds", "Maximum number of open file descriptors", v)?;
        }
        if let Some(v) = s.open_fds {
            gauge(&mut encoder, "process_open_fds", "Number of open file descriptors", v)?;
        }
        gauge(&mut encoder, "process_resident_memory_bytes", "Resident memory size in bytes", s.resident_bytes)?;
        gauge(
            &mut encoder,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            s.start_time_seconds,
        )?;
        gauge(&mut encoder, "process_virtual_memory_bytes", "Virtual memory size in bytes", s.virtual_bytes)?;
        gauge(
            &mut encoder,
            "process_virtual_memory_max_bytes",
            "Maximum amount of virtual memory available in bytes",
            s.virtual_max_bytes.unwrap_or(u64::MAX as f64),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;

    #[test]
    fn reads_proc_fixtures() {
        let dir = tempfile::tempdir().unwrap();
        let pid = dir.path().join("42");
        std::fs::create_dir_all(pid.join("fd")).unwrap();
        for fd in ["0", "1", "2"] {
            std::fs::write(pid.join("fd").join(fd), "").unwrap();
        }
        // comm with a space and a parenthesis, as the kernel allows.
        std::fs::write(
            pid.join("stat"),
            "42 (sw (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 6 0 1000 104857600 2560 18446744073709551615\n",
        )
        .unwrap();
        std::fs::write(
            pid.join("limits"),
            "Limit                     Soft Limit           Hard Limit           Units\n\
             Max open files            1024                 524288               files\n\
             Max address space         unlimited            unlimited            bytes\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("stat"), "cpu 1 2 3\nbtime 1700000000\n").unwrap();
        let s = read(&pid, boot_time(dir.path()), 100.0, 4096.0).unwrap();
        assert!((s.cpu_seconds - 4.0).abs() < 1e-6, "cpu_seconds");
        assert_eq!(s.open_fds, Some(3.0));
        assert_eq!(s.max_fds, Some(1024.0));
        assert!((s.resident_bytes - 2560.0 * 4096.0).abs() < 1e-6, "resident_bytes");
        assert!((s.virtual_bytes - 104_857_600.0).abs() < 1e-6, "virtual_bytes");
        assert_eq!(s.virtual_max_bytes, None);
        assert!((s.start_time_seconds - 1_700_000_010.0).abs() < 1e-6, "start_time_seconds");
        // A descriptor opened since: not counted again before OPEN_FDS_TTL.
        std::fs::write(pid.join("fd").join("3"), "").unwrap();
        assert_eq!(read(&pid, 0.0, 100.0, 4096.0).unwrap().open_fds, Some(3.0));
    }

    #[test]
    fn serves_the_go_client_families_for_this_process() {
        let mut r = Registry::default();
        r.register_collector(Box::new(ProcessCollector::default()));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        for (family, kind) in [
            ("process_cpu_seconds_total", "counter"),
            ("process_max_fds", "gauge"),
            ("process_open_fds", "gauge"),
            ("process_resident_memory_bytes", "gauge"),
            ("process_start_time_seconds", "gauge"),
            ("process_virtual_memory_bytes", "gauge"),
            ("process_virtual_memory_max_bytes", "gauge"),
        ] {
            let base = family.trim_end_matches("_total");
            assert!(out.contains(&format!("# TYPE {base} {kind}")), "{family}: {out}");
        }
        let rss: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!(rss > 1e6, "this test process has more than 1 MB resident: {rss}");
    }
}
