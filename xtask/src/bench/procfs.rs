//! What the bench reads about processes from `/proc` (CPU time, memory), and the clock it
//! shares with the agent's records and the kernel's events (`CLOCK_MONOTONIC`).

use std::{fs, time::Instant};

use anyhow::{Context as _, Result};

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of the agent's `mono_ns` fields and of
/// `bpf_ktime_get_ns()`, so differences between them are meaningful.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes into the timespec we own; CLOCK_MONOTONIC exists.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts);
    }
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// Clock ticks per second, the unit of `utime`/`stime` in `/proc/<pid>/stat`.
pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// `utime + stime` (clock ticks, all threads) from the text of `/proc/<pid>/stat`.
///
/// The command name (field 2) is in parentheses and may contain spaces and parentheses,
/// so the fields are counted from the last `)`: after it come field 3 (state), ...,
/// field 14 (utime) and field 15 (stime).
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

/// A `kB` line of `/proc/<pid>/status` (`VmRSS:   12345 kB`), in bytes.
pub fn parse_status_bytes(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let value = l.strip_prefix(key)?.strip_prefix(':')?;
        let mut words = value.split_whitespace();
        let n: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => Some(n * 1024),
            _ => None,
        }
    })
}

/// CPU time a process has used so far (user + system, all threads), in seconds.
pub fn cpu_seconds(pid: i32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let ticks = parse_stat_cpu_ticks(&stat).with_context(|| format!("parsing {path}: {stat:?}"))?;
    Ok(ticks as f64 / clock_ticks_per_sec() as f64)
}

/// CPU time a process has used so far (user + system, all its threads, exited ones
/// included), in nanoseconds: the kernel's own runtime account read through the process's
/// CPU-time clock (`clock_getcpuclockid(3)`). `/proc/<pid>/stat` has the same total, but
/// in clock ticks (10 ms), too coarse for what one request costs.
pub fn cpu_ns(pid: i32) -> Result<u64> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: clock_getcpuclockid only writes into the clockid_t we own.
    let rc = unsafe { libc::clock_getcpuclockid(pid, &raw mut clock) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc)).with_context(|| format!("CPU clock of pid {pid}"));
    }
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes into the timespec we own.
    if unsafe { libc::clock_gettime(clock, &raw mut ts) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("reading the CPU clock of pid {pid}"));
    }
    Ok((ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64)
}

/// Resident and peak resident memory (`VmRSS`, `VmHWM`) in bytes.
pub fn memory(pid: i32) -> Result<(u64, u64)> {
    let path = format!("/proc/{pid}/status");
    let status = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let rss = parse_status_bytes(&status, "VmRSS").with_context(|| format!("no VmRSS in {path}"))?;
    let hwm = parse_status_bytes(&status, "VmHWM").unwrap_or(rss);
    Ok((rss, hwm))
}

/// Whether `pid` runs in a cgroup whose path contains `container_id`: a guard against
/// killing a recycled pid that is no longer the container's.
pub fn in_container(pid: i32, container_id: &str) -> bool {
    fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(container_id))
}

/// A CPU-time reading of one process, to take differences over a wall-clock interval.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    pub cpu_seconds: f64,
    pub at: Instant,
}

impl CpuSample {
    pub fn take(pid: i32) -> Result<Self> {
        Ok(Self { cpu_seconds: cpu_seconds(pid)?, at: Instant::now() })
    }

    /// (CPU seconds used, wall seconds passed) since `earlier`.
    pub fn since(&self, earlier: &Self) -> (f64, f64) {
        ((self.cpu_seconds - earlier.cpu_seconds).max(0.0), self.at.duration_since(earlier.at).as_secs_f64())
    }
}

/// The busy ticks of one `/proc/stat` reading ([`machine_cpu_times`]): user nice system
/// idle iowait irq softirq steal …, all but idle and iowait.
pub fn busy_ticks(times: &[u64]) -> u64 {
    let idle = times.get(3).copied().unwrap_or(0) + times.get(4).copied().unwrap_or(0);
    times.iter().sum::<u64>().saturating_sub(idle)
}

/// The machine's busy share of all its CPUs (0..1) from two `/proc/stat` readings.
pub fn busy_share(before: &[u64], after: &[u64]) -> Option<f64> {
    let total: u64 = after.iter().zip(before).map(|(a, b)| a.saturating_sub(*b)).sum();
    (total > 0).then(|| busy_ticks(after).saturating_sub(busy_ticks(before)) as f64 / total as f64)
}

/// The machine's CPU times (the `cpu` line of `/proc/stat`, its first 8 fields, ticks).
pub fn machine_cpu_times() -> Option<Vec<u64>> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    line.split_whitespace().take(8).map(|f| f.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_share_leaves_out_idle_and_iowait() {
        let before = [100, 0, 100, 700, 100, 0, 0, 0];
        // 100 more user, 50 system, 250 idle, 100 iowait: 150 busy of 500.
        let after = [200, 0, 150, 950, 200, 0, 0, 0];
        assert!((busy_share(&before, &after).unwrap() - 0.3).abs() < 1e-9);
        assert_eq!(busy_share(&before, &before), None);
    }

    #[test]
    fn stat_cpu_ticks_counts_fields_after_the_command_name() {
        // A command name with spaces and a ')' of its own; utime 1234, stime 56.
        let stat = "4242 (swift let) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 1234 56 0 0 20 0 9 0 \
                    100 2000000 3000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(1290));
        assert_eq!(parse_stat_cpu_ticks("4242 (short) S 1 2"), None);
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn own_stat_parses() {
        let own = fs::read_to_string("/proc/self/stat").unwrap();
        assert!(parse_stat_cpu_ticks(&own).is_some());
        assert!(memory(std::process::id() as i32).unwrap().0 > 0);
    }

    #[test]
    fn cpu_clock_is_exact_proc_stat() {
        let pid = std::process::id() as i32;
        // /proc/<pid>/stat is the same account truncated to ticks: never ahead of the clock.
        let ticks_ns = (cpu_seconds(pid).unwrap() * 1e9) as u64;
        let a = cpu_ns(pid).unwrap();
        assert!(a >= ticks_ns, "clock {a} ns, stat {ticks_ns} ns");
        let spin_until = a + 2_000_000;
        let started = Instant::now();
        while cpu_ns(pid).unwrap() < spin_until && started.elapsed().as_secs() < 10 {}
        assert!(cpu_ns(pid).unwrap() >= spin_until);
        // No such process: pids stay below pid_max, which is at most 2^22.
        assert!(cpu_ns((1 << 22) + 1).is_err());
    }

    #[test]
    fn status_lines_in_bytes() {
        let status = "Name:\tswiftlet\nVmPeak:\t  200000 kB\nVmHWM:\t   30000 kB\nVmRSS:\t   12345 kB\nThreads:\t3\n";
        assert_eq!(parse_status_bytes(status, "VmRSS"), Some(12_345 * 1024));
        assert_eq!(parse_status_bytes(status, "VmHWM"), Some(30_000 * 1024));
        // `VmRSS` must not match a longer key, and a line without unit is not a size.
        assert_eq!(parse_status_bytes("VmRSSX:\t1 kB\n", "VmRSS"), None);
        assert_eq!(parse_status_bytes("Threads:\t3\n", "Threads"), None);
    }

    #[test]
    fn monotonic_clock_advances() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(b >= a && a > 0);
    }
}
