//! Crash-loop back-off (`flowcontrol.Backoff` as the kubelet uses it): 10 s, doubling
//! up to 5 min per container; an entry resets once the container ran for twice the
//! maximum (10 min) before it exited again.
//!
//! Times are wall-clock (`SystemTime`) because the event time is the container's
//! `finishedAt` as reported by the runtime; the clock is injected so that the
//! arithmetic is tested without waiting.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Upstream `backOffPeriod`.
pub const INITIAL: Duration = Duration::from_secs(10);
/// Upstream `MaxContainerBackOff`.
pub const MAX: Duration = Duration::from_mins(5);

/// Source of "now"; the real one is [`SystemClock`].
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> SystemTime;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Wall time that moves with tokio's clock: anchored to the wall clock once, then
/// advanced by `tokio::time::Instant`. In production it follows the wall clock (and
/// ignores wall-clock jumps); under paused test time it moves only when the test's
/// time does, so back-off schedules are tested without waiting.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    wall: SystemTime,
    mono: tokio::time::Instant,
}

impl TokioClock {
    #[must_use]
    pub fn new() -> Self {
        Self { wall: SystemTime::now(), mono: tokio::time::Instant::now() }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> SystemTime {
        self.wall + self.mono.elapsed()
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    backoff: Duration,
    last_update: SystemTime,
}

/// Per-key exponential back-off.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    clock: Arc<dyn Clock>,
    entries: HashMap<String, Entry>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(INITIAL, MAX, Arc::new(SystemClock))
    }
}

fn has_expired(event: SystemTime, last_update: SystemTime, max: Duration) -> bool {
    event.duration_since(last_update).unwrap_or_default() > max * 2
}

impl Backoff {
    #[must_use]
    pub fn new(initial: Duration, max: Duration, clock: Arc<dyn Clock>) -> Self {
        Self { initial, max, clock, entries: HashMap::new() }
    }

    /// Whether `key` is still backing off at `now`, for a failure that happened at
    /// `event_time`. Returns the time left when it is.
    #[must_use]
    pub fn remaining_since(&self, key: &str, event_time: SystemTime) -> Option<Duration> {
        let entry = self.entries.get(key)?;
        if has_expired(event_time, entry.last_update, self.max) {
            return None;
        }
        let since = self.clock.now().duration_since(event_time).unwrap_or_default();
        entry.backoff.checked_sub(since).filter(|d| !d.is_zero())
    }

    /// Records a restart of `key` after a failure at `event_time`, growing its delay.
    pub fn next(&mut self, key: &str, event_time: SystemTime) {
        let now = self.clock.now();
        let initial = self.initial;
        let max = self.max;
        let entry = self.entries.entry(key.to_string()).or_insert(Entry { backoff: Duration::ZERO, last_update: now });
        if entry.backoff.is_zero() || has_expired(event_time, entry.last_update, max) {
            entry.backoff = initial;
        } else {
            entry.backoff = (entry.backoff * 2).min(max);
        }
        entry.last_update = now;
    }

    /// The current delay of `key` (for messages).
    #[must_use]
    pub fn current(&self, key: &str) -> Option<Duration> {
        self.entries.get(key).map(|e| e.backoff)
    }

    /// Drops entries whose last update is older than twice the maximum (upstream GC).
    pub fn gc(&mut self) {
        let now = self.clock.now();
        let max = self.max;
        self.entries.retain(|_, e| !has_expired(now, e.last_update, max));
    }

    /// Forgets every key starting with `prefix` (a pod that is gone).
    pub fn forget_prefix(&mut self, prefix: &str) {
        self.entries.retain(|k, _| !k.starts_with(prefix));
    }
}

/// Formats a back-off delay the way upstream messages do (`10s`, `2m40s`, `5m0s`).
#[must_use]
pub fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 { format!("{}m{}s", secs / 60, secs % 60) } else { format!("{secs}s") }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A clock moved by hand.
    #[derive(Debug)]
    pub(crate) struct ManualClock(pub Mutex<SystemTime>);

    impl ManualClock {
        pub(crate) fn advance(&self, d: Duration) {
            *self.0.lock().unwrap() += d;
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> SystemTime {
            *self.0.lock().unwrap()
        }
    }

    fn setup() -> (Arc<ManualClock>, Backoff) {
        let clock = Arc::new(ManualClock(Mutex::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000))));
        (clock.clone(), Backoff::new(INITIAL, MAX, clock))
    }

    /// Simulates a container that exits immediately after each start and is restarted
    /// as soon as the back-off allows; returns the waits between restarts.
    #[test]
    fn crash_loop_delays_double_up_to_five_minutes() {
        let (clock, mut b) = setup();
        let mut waits = Vec::new();
        for _ in 0..8 {
            let exited = clock.now();
            let wait = b.remaining_since("k", exited).unwrap_or_default();
            clock.advance(wait);
            assert!(b.remaining_since("k", exited).is_none());
            b.next("k", exited);
            waits.push(wait.as_secs());
        }
        assert_eq!(waits, vec![0, 10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn resets_after_running_ten_minutes() {
        let (clock, mut b) = setup();
        for _ in 0..4 {
            let t = clock.now();
            b.next("k", t);
        }
        assert_eq!(b.current("k"), Some(Duration::from_secs(80)));
        // Runs for 10 min + 1 s, then exits: no back-off, and the next delay starts over.
        clock.advance(Duration::from_secs(601));
        let exited = clock.now();
        assert!(b.remaining_since("k", exited).is_none());
        b.next("k", exited);
        assert_eq!(b.current("k"), Some(INITIAL));
    }

    #[test]
    fn gc_and_forget() {
        let (clock, mut b) = setup();
        let t = clock.now();
        b.next("pod1_a", t);
        b.next("pod2_a", t);
        b.forget_prefix("pod1_");
        assert!(b.current("pod1_a").is_none());
        clock.advance(Duration::from_secs(601));
        b.gc();
        assert!(b.current("pod2_a").is_none());
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(go_duration(Duration::from_secs(160)), "2m40s");
        assert_eq!(go_duration(Duration::from_mins(5)), "5m0s");
    }
}
