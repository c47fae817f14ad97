//! A limit on how many sandbox and container starts the runtime is asked for at once
//! (`--runtime-start-concurrency`; swiftlet only, upstream sends them all).
//!
//! Why: on a small node a burst of pods makes containerd, its shims, runc and the CNI
//! plugins compete for the same few CPUs, and started all at once they get through the
//! burst later than started a few at a time. Measured on the 2-core test machine (README,
//! Performance): at most 4 `RunPodSandbox` and 4 `CreateContainer`+`StartContainer` at a
//! time took the 100-pod burst from p50/p99 8.3/10.0 s to about 5/7.3 s.
//!
//! A permit is not held by a call that hangs: after [`HOLD`] the call gives its permit
//! back and goes on without one, so a stuck CNI plugin or runtime slows at most one start
//! slot for that long and never stalls the other pods.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

/// How long one call may keep its permit. Starts on a loaded node take well under a
/// second each; a call still running after this is waiting on something other than CPU.
pub const HOLD: Duration = Duration::from_secs(5);

/// The default limit: twice the CPUs this process may use, at least 4. The runtime's start
/// work is CPU-bound, so the useful parallelism grows with the CPUs.
#[must_use]
pub fn default_limit() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    (2 * cpus).max(4)
}

/// Lets at most `limit` wrapped calls run at a time, each for at most `hold` with a permit.
#[derive(Debug, Clone)]
pub struct StartGate {
    limit: usize,
    permits: Option<Arc<Semaphore>>,
    hold: Duration,
}

impl Default for StartGate {
    /// No limit.
    fn default() -> Self {
        Self::new(0)
    }
}

impl StartGate {
    /// At most `limit` calls at once (0: no limit), each holding its permit for at most [`HOLD`].
    #[must_use]
    pub fn new(limit: usize) -> Self {
        Self::with_hold(limit, HOLD)
    }

    /// As [`Self::new`] with another hold time.
    #[must_use]
    pub fn with_hold(limit: usize, hold: Duration) -> Self {
        Self { limit, permits: (limit > 0).then(|| Arc::new(Semaphore::new(limit))), hold }
    }

    /// The limit; 0 when there is none.
    #[must_use]
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Runs `call` once a permit is free. The permit goes back when `call` finishes or
    /// after the hold time, whichever is first; `call` is always run to its end.
    pub async fn run<F: Future>(&self, what: &'static str, call: F) -> F::Output {
        let Some(permits) = &self.permits else {
            return call.await;
        };
        let waited = tokio::time::Instant::now();
        // The semaphore is never closed.
        let permit = permits.acquire().await.expect("start gate semaphore closed");
        let waited = waited.elapsed();
        if waited >= Duration::from_millis(100) {
            tracing::debug!(call = what, ?waited, "waited for a runtime start slot");
        }
        let mut call = std::pin::pin!(call);
        tokio::select! {
            out = &mut call => return out,
            () = tokio::time::sleep(self.hold) => {}
        }
        drop(permit);
        tracing::debug!(call = what, hold = ?self.hold, "a runtime start is slow; its slot goes to the next one");
        call.await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A call that records how many calls run at once and takes `took`.
    async fn tracked(running: &AtomicUsize, peak: &AtomicUsize, took: Duration) {
        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
        peak.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(took).await;
        running.fetch_sub(1, Ordering::SeqCst);
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_limit_calls_run_at_once() {
        let gate = StartGate::new(3);
        let (running, peak) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let started = tokio::time::Instant::now();
        let calls = (0..10).map(|_| gate.run("test", tracked(&running, &peak, Duration::from_millis(100))));
        futures::future::join_all(calls).await;
        assert_eq!(peak.load(Ordering::SeqCst), 3);
        // 10 calls of 100 ms, 3 at a time: four rounds.
        assert_eq!(started.elapsed(), Duration::from_millis(400));
    }

    #[tokio::test(start_paused = true)]
    async fn no_limit_runs_everything_at_once() {
        let gate = StartGate::new(0);
        assert_eq!(gate.limit(), 0);
        let (running, peak) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let calls = (0..10).map(|_| gate.run("test", tracked(&running, &peak, Duration::from_millis(100))));
        futures::future::join_all(calls).await;
        assert_eq!(peak.load(Ordering::SeqCst), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_call_gives_its_permit_back_after_the_hold() {
        let gate = StartGate::with_hold(1, Duration::from_secs(5));
        let hung = tokio::spawn({
            let gate = gate.clone();
            async move { gate.run("hung", std::future::pending::<()>()).await }
        });
        // Let the hung call take the only permit.
        tokio::task::yield_now().await;
        let started = tokio::time::Instant::now();
        let out = gate.run("next", async { 7 }).await;
        assert_eq!(out, 7);
        assert_eq!(started.elapsed(), Duration::from_secs(5), "the next call ran once the hold was over");
        // The hung call is still awaited, not dropped.
        assert!(!hung.is_finished());
        hung.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_call_still_returns_its_output_after_giving_the_permit_back() {
        let gate = StartGate::with_hold(1, Duration::from_secs(1));
        let out = gate
            .run("slow", async {
                tokio::time::sleep(Duration::from_secs(3)).await;
                "done"
            })
            .await;
        assert_eq!(out, "done");
        // The permit is free again for the next call.
        assert_eq!(gate.run("next", async { 1 }).await, 1);
    }

    #[test]
    fn the_default_limit_is_at_least_four() {
        assert!(default_limit() >= 4);
        assert_eq!(default_limit() % 2, 0);
    }
}
