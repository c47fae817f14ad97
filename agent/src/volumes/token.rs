//! Service account tokens for projected volumes (upstream `pkg/kubelet/token`): tokens are
//! requested through the [`ObjectSource`] and cached per (service account, audiences,
//! lifetime, bound pod); a cached token is used until 80 % of its lifetime has passed or it
//! is older than 24 hours, then a new one is requested (and written by the next sync).
//! Upstream adds up to 10 s of random jitter to both bounds to spread requests; this cache
//! does not, so that refresh times are exact and testable.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::source::{self, BoundPod, ObjectSource, ServiceAccountToken};
use crate::container::backoff::Clock;

/// Upstream `maxTTL`: a token older than this is refreshed whatever its expiry.
const MAX_TTL: Duration = Duration::from_hours(24);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    namespace: String,
    service_account: String,
    audiences: Vec<String>,
    expiration_seconds: i64,
    pod: BoundPod,
}

#[derive(Debug, Clone)]
struct Cached {
    token: String,
    expiration: SystemTime,
}

/// Caches tokens and refreshes them before they expire.
#[derive(Debug)]
pub struct TokenManager {
    cache: Mutex<HashMap<Key, Cached>>,
    clock: Arc<dyn Clock>,
}

impl TokenManager {
    /// An empty cache on `clock`.
    #[must_use]
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self { cache: Mutex::default(), clock }
    }

    /// Upstream `requiresRefresh`, without jitter.
    fn requires_refresh(&self, key: &Key, cached: &Cached) -> bool {
        let now = self.clock.now();
        let ttl = Duration::from_secs(key.expiration_seconds.max(0).unsigned_abs());
        let issued = cached.expiration.checked_sub(ttl).unwrap_or(SystemTime::UNIX_EPOCH);
        now > issued + MAX_TTL || now > cached.expiration.checked_sub(ttl / 5).unwrap_or(SystemTime::UNIX_EPOCH)
    }

    /// A valid token for the request, from the cache or freshly requested, with its
    /// expiry (CSI drivers are handed both).
    pub async fn get(
        &self,
        source: &dyn ObjectSource,
        namespace: &str,
        service_account: &str,
        audiences: &[String],
        expiration_seconds: i64,
        pod: &BoundPod,
    ) -> source::Result<ServiceAccountToken> {
        let key = Key {
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
            audiences: audiences.to_vec(),
            expiration_seconds,
            pod: pod.clone(),
        };
        let cached = self.cache.lock().unwrap().get(&key).cloned();
        if let Some(c) = cached
            && !self.requires_refresh(&key, &c)
        {
            return Ok(ServiceAccountToken { token: c.token, expiration: c.expiration });
        }
        let fresh =
            source.service_account_token(namespace, service_account, audiences, expiration_seconds, pod).await?;
        tracing::debug!(namespace, service_account, pod = %pod.name, "requested a service account token");
        let cached = Cached { token: fresh.token.clone(), expiration: fresh.expiration };
        self.cache.lock().unwrap().insert(key, cached);
        Ok(fresh)
    }

    /// Drops the tokens bound to a pod (upstream `DeleteServiceAccountToken`).
    pub fn forget_pod(&self, uid: &str) {
        self.cache.lock().unwrap().retain(|k, _| k.pod.uid != uid);
    }
}

#[cfg(test)]
mod tests {
    use super::super::source::FakeObjectSource;
    use super::*;
    use crate::volumes::tests_support::ManualClock;

    /// A token manager and a fake API on one manual clock, and the pod the tokens are for.
    fn setup() -> (Arc<ManualClock>, FakeObjectSource, TokenManager, BoundPod) {
        let clock = Arc::new(ManualClock::default());
        let src = FakeObjectSource::new().with_clock(clock.clone());
        let tm = TokenManager::new(clock.clone());
        (clock, src, tm, BoundPod { name: "p".into(), uid: "u".into() })
    }

    #[tokio::test]
    async fn refreshes_after_eighty_percent_of_the_lifetime() {
        let (clock, src, tm, pod) = setup();
        let aud = vec!["vault".to_string()];
        let get = || tm.get(&src, "ns", "sa", &aud, 1000, &pod);
        assert_eq!(get().await.unwrap().token, "token-1");
        clock.advance(Duration::from_secs(799));
        assert_eq!(get().await.unwrap().token, "token-1");
        clock.advance(Duration::from_secs(2));
        assert_eq!(get().await.unwrap().token, "token-2");
        // Different audiences are different tokens.
        assert_eq!(tm.get(&src, "ns", "sa", &[], 1000, &pod).await.unwrap().token, "token-3");
        tm.forget_pod("u");
        assert_eq!(get().await.unwrap().token, "token-4");
        let req = &src.token_requests()[0];
        assert_eq!((req.audiences.clone(), req.expiration_seconds), (aud.clone(), 1000));
    }

    #[tokio::test]
    async fn long_lived_tokens_are_refreshed_daily() {
        let (clock, src, tm, pod) = setup();
        let week = 7 * 24 * 3600;
        assert_eq!(tm.get(&src, "ns", "sa", &[], week, &pod).await.unwrap().token, "token-1");
        clock.advance(Duration::from_hours(23));
        assert_eq!(tm.get(&src, "ns", "sa", &[], week, &pod).await.unwrap().token, "token-1");
        clock.advance(Duration::from_hours(2));
        assert_eq!(tm.get(&src, "ns", "sa", &[], week, &pod).await.unwrap().token, "token-2");
    }
}
