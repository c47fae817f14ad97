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
/// the stats collector keeps each container's cgroup files open between collections, a
/// few thousand descriptors at 250 pods. Returns the soft limit in force.
#[must_use]
pub fn raise_open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid resource and a pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) == 0 {
                return Some(raised.rlim_cur);
            }
        }
    }
    Some(limit.rlim_cur)
}
