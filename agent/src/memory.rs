//! Keeping the agent's resident memory small on dense nodes.
//!
//! glibc's malloc gives threads their own arenas (up to 8 per core) and keeps memory freed
//! into them mapped. The agent's allocations come from a few tokio workers and a varying
//! set of blocking-pool threads (cgroup and volume work), so without a cap each of those
//! threads can pin an arena of its own; loading the eBPF programs also parses the kernel's
//! BTF (several MiB) and frees it again. [`limit_malloc_arenas`] caps the arenas at two and
//! [`trim`] hands freed memory back to the kernel (after the sensors load, and from
//! housekeeping). Other C libraries: both do nothing.

/// Caps glibc malloc at two arenas. Call once, early in `main`, before threads start.
pub fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; M_ARENA_MAX takes a count.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Returns free heap memory to the kernel (`malloc_trim(0)`).
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Raises the soft limit on open files to the hard one (as Go's runtime does since 1.19):
/// the stats collector keeps cgroup and process directories open between collections
/// (some 14 a pod on cgroup v1, up to half the soft limit: `stats::cgroup`'s budget).
/// Returns the soft limit in force.
#[must_use]
pub fn raise_open_files_limit() -> Option<u64> {
    let limit = open_files_limit()?;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
        // SAFETY: setrlimit with a valid resource and a pointer to a local struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) } == 0 {
            return Some(raised.rlim_cur);
        }
    }
    Some(limit.rlim_cur)
}

/// This process's limits on open files (`None` if getrlimit fails).
#[must_use]
pub fn open_files_limit() -> Option<libc::rlimit> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit(2) fills the struct it is given.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } == 0).then_some(limit)
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    /// This process's anonymous resident memory, in KiB.
    fn rss_anon_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("RssAnon:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Memory freed between allocations still in use is not at the top of the heap, so
    /// `free` keeps it resident (as after a burst of pods); `trim` hands it back.
    #[test]
    fn trim_returns_memory_freed_between_live_allocations() {
        const CHUNK: usize = 4096;
        const CHUNKS: usize = 16 * 1024; // 64 MiB, every page written
        let mut chunks: Vec<Option<Vec<u8>>> = (0..CHUNKS).map(|i| Some(vec![(i as u8) | 1; CHUNK])).collect();
        // Every 16th stays: 60 KiB holes that free() cannot give back.
        for (i, c) in chunks.iter_mut().enumerate() {
            if i % 16 != 0 {
                *c = None;
            }
        }
        let before = rss_anon_kib();
        super::trim();
        let after = rss_anon_kib();
        std::hint::black_box(&chunks);
        assert!(
            before.saturating_sub(after) >= 32 * 1024,
            "trim gave back {} KiB of ~60 MiB freed (RssAnon {before} -> {after} KiB)",
            before.saturating_sub(after)
        );
    }
}
