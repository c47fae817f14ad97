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
