//! The kernel's event clock: `bpf_ktime_get_ns()` is `CLOCK_MONOTONIC`, which
//! `std::time::Instant` uses too but does not expose as a number.

/// `CLOCK_MONOTONIC` in nanoseconds.
pub(crate) fn monotonic_now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux,
    // so the call cannot fail (and a zeroed `ts` would be the harmless result if it did).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_advances() {
        let a = monotonic_now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = monotonic_now_ns();
        assert!(b >= a + 2_000_000, "{a} -> {b}");
    }
}
