//! [`StartsInFlight`]: which pods have a sandbox or container start under way in the
//! runtime, so that the evented PLEG need not ask CRI about a start before the runtime
//! can agree to it.
//!
//! A container's processes exec (runc's helper first, then the container's own init)
//! while `CreateContainer`/`StartContainer` are still running, and a sandbox's pause
//! process while `RunPodSandbox` is; CRI reports the new state only once the call
//! returns, which in a burst of pods takes hundreds of ms. Polling CRI until then cost
//! several `ContainerStatus` (and, for a sandbox, `PodSandboxStatus`) calls per start,
//! on a runtime that has no CPU to spare at that moment. The runtime manager marks each
//! such call here ([`StartsInFlight::begin`]); the PLEG waits for the pod's calls to
//! return ([`StartsInFlight::settled`]). A call that succeeded is the runtime's own word
//! that the sandbox is ready or the container running ([`StartGuard::succeeded`]): the
//! PLEG takes it ([`StartsInFlight::take_started`]) and asks nothing; after a call that
//! failed it asks CRI.
//!
//! Nothing is lost by the wait: the pod worker that made the call is busy in that sync
//! until the call returns, and the event would wait for the sync to end anyway.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Shared between the runtime manager (marks calls) and the evented PLEG (waits).
#[derive(Debug, Default)]
pub struct StartsInFlight {
    /// Start calls under way per pod UID.
    pods: Mutex<HashMap<String, usize>>,
    /// Sandboxes and containers whose start call succeeded, not yet taken by the PLEG:
    /// id → (container name, empty for a sandbox; when).
    returned: Mutex<HashMap<String, (String, Instant)>>,
    ended: Notify,
}

/// How long a successful start is kept for the PLEG to take: its kernel event comes
/// within milliseconds; without an evented PLEG nobody takes it.
const RETURNED_KEPT: Duration = Duration::from_secs(30);

/// One start call under way; the call counts as returned when this is dropped.
#[derive(Debug)]
#[must_use = "the start counts as under way only while the guard lives"]
pub struct StartGuard {
    starts: Arc<StartsInFlight>,
    pod_uid: String,
}

impl StartGuard {
    /// The call succeeded: the runtime reports sandbox (or container) `id` ready (running);
    /// `name` is the container's, empty for a sandbox.
    pub fn succeeded(&self, id: &str, name: &str) {
        let now = Instant::now();
        let mut returned = self.starts.returned.lock().unwrap();
        returned.retain(|_, (_, at)| now.duration_since(*at) < RETURNED_KEPT);
        returned.insert(id.to_string(), (name.to_string(), now));
    }
}

impl Drop for StartGuard {
    fn drop(&mut self) {
        {
            let mut pods = self.starts.pods.lock().unwrap();
            if let Some(n) = pods.get_mut(&self.pod_uid) {
                *n -= 1;
                if *n == 0 {
                    pods.remove(&self.pod_uid);
                }
            }
        }
        self.starts.ended.notify_waiters();
    }
}

impl StartsInFlight {
    /// Marks a start call for pod `pod_uid` as under way until the guard is dropped.
    pub fn begin(self: &Arc<Self>, pod_uid: &str) -> StartGuard {
        *self.pods.lock().unwrap().entry(pod_uid.to_string()).or_default() += 1;
        StartGuard { starts: self.clone(), pod_uid: pod_uid.to_string() }
    }

    /// Whether pod `pod_uid` has a start call under way.
    #[must_use]
    pub fn in_flight(&self, pod_uid: &str) -> bool {
        self.pods.lock().unwrap().contains_key(pod_uid)
    }

    /// Takes the successful start of sandbox (or container) `id`, if its call returned
    /// one: the container's name (empty for a sandbox).
    #[must_use]
    pub fn take_started(&self, id: &str) -> Option<String> {
        self.returned.lock().unwrap().remove(id).map(|(name, _)| name)
    }

    /// Waits until pod `pod_uid` has no start call under way, for at most `limit`; true
    /// when it has none (at once, or within the limit).
    pub async fn settled(&self, pod_uid: &str, limit: Duration) -> bool {
        let wait = async {
            loop {
                let ended = self.ended.notified();
                tokio::pin!(ended);
                // Registered before the check, so that an end between the two is not missed.
                ended.as_mut().enable();
                if !self.in_flight(pod_uid) {
                    return;
                }
                ended.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_pod_settles_when_its_last_start_call_returns() {
        let starts = Arc::new(StartsInFlight::default());
        assert!(starts.settled("a", Duration::ZERO).await, "no call: settled at once");
        let sandbox = starts.begin("a");
        let container = starts.begin("a");
        let other = starts.begin("b");
        let waiter = tokio::spawn({
            let starts = starts.clone();
            async move { starts.settled("a", Duration::from_mins(1)).await }
        });
        tokio::task::yield_now().await;
        drop(sandbox);
        drop(other);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one of pod a's calls is still under way");
        assert!(starts.in_flight("a") && !starts.in_flight("b"));
        drop(container);
        assert!(waiter.await.unwrap());
        assert!(!starts.in_flight("a"));
    }

    #[test]
    fn a_successful_start_is_taken_once() {
        let starts = Arc::new(StartsInFlight::default());
        {
            let sandbox = starts.begin("a");
            sandbox.succeeded("sb1", "");
            let _failed = starts.begin("a");
        }
        assert_eq!(starts.take_started("sb1").as_deref(), Some(""));
        assert_eq!(starts.take_started("sb1"), None, "taken already");
        assert_eq!(starts.take_started("c1"), None, "its call failed: nothing to take");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_does_not_return_is_waited_for_only_up_to_the_limit() {
        let starts = Arc::new(StartsInFlight::default());
        let _stuck = starts.begin("a");
        let before = tokio::time::Instant::now();
        assert!(!starts.settled("a", Duration::from_secs(3)).await);
        assert_eq!(before.elapsed(), Duration::from_secs(3));
    }
}
