//! Caches in front of the webhook reviews, as upstream's
//! (`k8s.io/apiserver/pkg/authentication/token/cache`, the webhook authorizer's LRU):
//!
//! - [`CachedTokenAuthenticator`]: a token's result is kept for
//!   `authentication.webhook.cacheTTL` (default 2m), whether the token authenticated or
//!   not; errors (including a `TokenReview` that answers with `status.error`) are not kept,
//!   as upstream (`cacheErrs: false`). Entries are keyed by a SHA-256 of the token under a
//!   random per-process key, so the raw token is never stored, and a memory dump does not
//!   give a table to test guesses against.
//! - [`CachedAuthorizer`]: a decision is kept for `authorization.webhook.cacheAuthorizedTTL`
//!   (default 5m) when allowed, `cacheUnauthorizedTTL` (default 30s) when not; errors are
//!   not kept. Keyed by everything the `SubjectAccessReview` carries.
//!
//! Concurrent requests with the same key share one review (upstream's token cache uses a
//! singleflight group; here the authorizer does too), so a thousand scrapes arriving at
//! once with a new token make one `TokenReview`. Each cache holds at most
//! [`CACHE_CAPACITY`] entries; when full, expired entries go first, then the ones closest
//! to expiring. Time is `tokio::time`, so tests run it paused.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::auth::{Authorizer, Decision, RequestAttributes, ReviewError, TokenAuthenticator, UserInfo};

/// Entries each cache keeps at most (upstream: 1024 per authorizer LRU).
pub const CACHE_CAPACITY: usize = 4096;

/// Results of reviews by key, with one review in flight per key.
pub(crate) struct ReviewCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
    in_flight: Mutex<HashMap<K, Arc<OnceCell<V>>>>,
    capacity: usize,
}

impl<K, V> std::fmt::Debug for ReviewCache<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = self.entries.lock().unwrap_or_else(PoisonError::into_inner).len();
        f.debug_struct("ReviewCache").field("entries", &len).field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone, V: Clone> ReviewCache<K, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self { entries: Mutex::default(), in_flight: Mutex::default(), capacity: capacity.max(1) }
    }

    fn cached(&self, key: &K) -> Option<V> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        match entries.get(key) {
            Some((value, expires)) if *expires > Instant::now() => Some(value.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    fn insert(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, (_, expires)| *expires > now);
            if entries.len() >= self.capacity {
                let soonest = entries.iter().min_by_key(|(_, (_, expires))| *expires).map(|(k, _)| k.clone());
                if let Some(soonest) = soonest {
                    entries.remove(&soonest);
                }
            }
        }
        entries.insert(key, (value, now + ttl));
    }

    /// The cached value for `key`, else the result of `review` (shared with every caller
    /// asking for `key` meanwhile), kept for `ttl(&result)` (zero: not kept).
    pub(crate) async fn get_or_review<F, Fut>(&self, key: K, review: F, ttl: impl Fn(&V) -> Duration) -> V
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V>,
    {
        if let Some(value) = self.cached(&key) {
            return value;
        }
        let cell =
            self.in_flight.lock().unwrap_or_else(PoisonError::into_inner).entry(key.clone()).or_default().clone();
        let value = cell
            .get_or_init(|| async {
                // Another caller may have finished a review between our miss and here.
                if let Some(value) = self.cached(&key) {
                    return value;
                }
                let value = review().await;
                self.insert(key.clone(), value.clone(), ttl(&value));
                value
            })
            .await
            .clone();
        let mut in_flight = self.in_flight.lock().unwrap_or_else(PoisonError::into_inner);
        if in_flight.get(&key).is_some_and(|current| Arc::ptr_eq(current, &cell)) {
            in_flight.remove(&key);
        }
        value
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// Token results cached for `cacheTTL` (see the module docs).
pub struct CachedTokenAuthenticator {
    inner: Arc<dyn TokenAuthenticator>,
    ttl: Duration,
    hash_key: [u8; 32],
    cache: ReviewCache<[u8; 32], Result<Option<UserInfo>, ReviewError>>,
}

impl std::fmt::Debug for CachedTokenAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedTokenAuthenticator")
            .field("ttl", &self.ttl)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl CachedTokenAuthenticator {
    /// Caches `inner`'s results for `ttl`.
    #[must_use]
    pub fn new(inner: Arc<dyn TokenAuthenticator>, ttl: Duration) -> Self {
        Self { inner, ttl, hash_key: rand::random(), cache: ReviewCache::new(CACHE_CAPACITY) }
    }

    fn key(&self, token: &str) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(self.hash_key);
        hasher.update(token.as_bytes());
        hasher.finalize().into()
    }
}

#[async_trait::async_trait]
impl TokenAuthenticator for CachedTokenAuthenticator {
    async fn authenticate_token(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        let ttl = self.ttl;
        self.cache
            .get_or_review(
                self.key(token),
                || self.inner.authenticate_token(token),
                |result| {
                    if result.is_ok() { ttl } else { Duration::ZERO }
                },
            )
            .await
    }
}

/// What a `SubjectAccessReview` is about (its whole spec): the cache key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ReviewKey {
    user: UserInfo,
    verb: String,
    name: String,
    subresource: String,
}

/// Decisions cached for `cacheAuthorizedTTL` / `cacheUnauthorizedTTL` (see the module docs).
pub struct CachedAuthorizer {
    inner: Arc<dyn Authorizer>,
    authorized_ttl: Duration,
    unauthorized_ttl: Duration,
    cache: ReviewCache<ReviewKey, Result<Decision, ReviewError>>,
}

impl std::fmt::Debug for CachedAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedAuthorizer")
            .field("authorized_ttl", &self.authorized_ttl)
            .field("unauthorized_ttl", &self.unauthorized_ttl)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl CachedAuthorizer {
    /// Caches `inner`'s allowed decisions for `authorized_ttl`, the others for
    /// `unauthorized_ttl`.
    #[must_use]
    pub fn new(inner: Arc<dyn Authorizer>, authorized_ttl: Duration, unauthorized_ttl: Duration) -> Self {
        Self { inner, authorized_ttl, unauthorized_ttl, cache: ReviewCache::new(CACHE_CAPACITY) }
    }
}

#[async_trait::async_trait]
impl Authorizer for CachedAuthorizer {
    async fn authorize(&self, attributes: &RequestAttributes) -> Result<Decision, ReviewError> {
        let key = ReviewKey {
            user: attributes.user.clone(),
            verb: attributes.verb.clone(),
            name: attributes.name.clone(),
            subresource: attributes.subresource.clone(),
        };
        let (allowed, denied) = (self.authorized_ttl, self.unauthorized_ttl);
        self.cache
            .get_or_review(
                key,
                || self.inner.authorize(attributes),
                |result| match result {
                    Ok(Decision::Allow) => allowed,
                    Ok(Decision::Deny(_)) => denied,
                    Err(_) => Duration::ZERO,
                },
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::server::FakeAuthorizer;
    use crate::server::auth::FakeTokenAuthenticator;

    fn user(name: &str) -> UserInfo {
        UserInfo { name: name.to_owned(), ..UserInfo::default() }
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_are_cached_for_the_ttl_whether_or_not_they_authenticate() {
        let fake = Arc::new(FakeTokenAuthenticator::default());
        fake.add("good", user("alice"));
        let cached = CachedTokenAuthenticator::new(fake.clone(), Duration::from_mins(2));

        assert_eq!(cached.authenticate_token("good").await.unwrap(), Some(user("alice")));
        assert_eq!(cached.authenticate_token("bad").await.unwrap(), None);
        assert_eq!(fake.calls(), 2);
        // Within the TTL neither is asked again, even after the table changed.
        fake.clear();
        fake.add("bad", user("mallory"));
        tokio::time::advance(Duration::from_secs(119)).await;
        assert_eq!(cached.authenticate_token("good").await.unwrap(), Some(user("alice")));
        assert_eq!(cached.authenticate_token("bad").await.unwrap(), None);
        assert_eq!(fake.calls(), 2);
        // After it, both are reviewed again.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(cached.authenticate_token("good").await.unwrap(), None);
        assert_eq!(cached.authenticate_token("bad").await.unwrap(), Some(user("mallory")));
        assert_eq!(fake.calls(), 4);
    }

    /// Fails the first `failures` times, then authenticates everything as `alice`.
    struct Flaky {
        failures: usize,
        calls: AtomicUsize,
        delay: Duration,
    }

    #[async_trait::async_trait]
    impl TokenAuthenticator for Flaky {
        async fn authenticate_token(&self, _token: &str) -> Result<Option<UserInfo>, ReviewError> {
            let call = self.calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            if call < self.failures {
                return Err(ReviewError::Rejected { review: "TokenReview", message: "expired".into() });
            }
            Ok(Some(user("alice")))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn token_errors_are_not_cached() {
        let flaky = Arc::new(Flaky { failures: 2, calls: AtomicUsize::new(0), delay: Duration::ZERO });
        let cached = CachedTokenAuthenticator::new(flaky.clone(), Duration::from_mins(2));
        assert!(cached.authenticate_token("t").await.is_err());
        assert!(cached.authenticate_token("t").await.is_err());
        assert_eq!(cached.authenticate_token("t").await.unwrap(), Some(user("alice")));
        assert_eq!(cached.authenticate_token("t").await.unwrap(), Some(user("alice")));
        assert_eq!(flaky.calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_requests_share_one_review() {
        let slow = Arc::new(Flaky { failures: 0, calls: AtomicUsize::new(0), delay: Duration::from_millis(300) });
        let cached = Arc::new(CachedTokenAuthenticator::new(slow.clone(), Duration::from_mins(2)));
        let tasks: Vec<_> = (0..100)
            .map(|_| {
                let cached = cached.clone();
                tokio::spawn(async move { cached.authenticate_token("same").await })
            })
            .collect();
        for task in tasks {
            assert_eq!(task.await.unwrap().unwrap(), Some(user("alice")));
        }
        assert_eq!(slow.calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn the_cache_key_is_not_the_token() {
        let cached = CachedTokenAuthenticator::new(Arc::new(FakeTokenAuthenticator::default()), Duration::ZERO);
        let other = CachedTokenAuthenticator::new(Arc::new(FakeTokenAuthenticator::default()), Duration::ZERO);
        let key = cached.key("secret-token");
        assert_eq!(key, cached.key("secret-token"));
        assert_ne!(key, cached.key("secret-tokem"));
        assert_ne!(key, other.key("secret-token"), "keyed per process (per cache)");
        assert_ne!(key, <[u8; 32]>::from(Sha256::digest("secret-token")));
        assert!(!format!("{cached:?}").contains("secret"));
    }

    fn attributes(user_name: &str, subresource: &str) -> RequestAttributes {
        RequestAttributes {
            user: user(user_name),
            verb: "get".into(),
            name: "node-1".into(),
            subresource: subresource.into(),
            path: "/x".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn decisions_are_cached_for_their_ttls() {
        let fake = Arc::new(FakeAuthorizer::from_fn(|a| {
            Ok(if a.user.name == "alice" { Decision::Allow } else { Decision::Deny("no".into()) })
        }));
        let cached = CachedAuthorizer::new(fake.clone(), Duration::from_mins(5), Duration::from_secs(30));
        let alice = attributes("alice", "pods");
        let bob = attributes("bob", "pods");
        assert_eq!(cached.authorize(&alice).await.unwrap(), Decision::Allow);
        assert_eq!(cached.authorize(&bob).await.unwrap(), Decision::Deny("no".into()));
        assert_eq!(fake.seen().len(), 2);
        // Another subresource, verb or user is another review.
        cached.authorize(&attributes("alice", "proxy")).await.unwrap();
        assert_eq!(fake.seen().len(), 3);

        tokio::time::advance(Duration::from_secs(29)).await;
        cached.authorize(&alice).await.unwrap();
        cached.authorize(&bob).await.unwrap();
        assert_eq!(fake.seen().len(), 3, "both cached");
        tokio::time::advance(Duration::from_secs(2)).await;
        cached.authorize(&alice).await.unwrap();
        cached.authorize(&bob).await.unwrap();
        assert_eq!(fake.seen().len(), 4, "the denial expired after 30s, the allowance did not");
        tokio::time::advance(Duration::from_secs(270)).await;
        cached.authorize(&alice).await.unwrap();
        assert_eq!(fake.seen().len(), 5, "the allowance expired after 5m");
    }

    #[tokio::test(start_paused = true)]
    async fn authorization_errors_are_not_cached() {
        let fake = Arc::new(FakeAuthorizer::from_fn(|_| {
            Err(ReviewError::Timeout { review: "SubjectAccessReview", timeout: Duration::from_secs(10) })
        }));
        let cached = CachedAuthorizer::new(fake.clone(), Duration::from_mins(5), Duration::from_secs(30));
        assert!(cached.authorize(&attributes("alice", "pods")).await.is_err());
        assert!(cached.authorize(&attributes("alice", "pods")).await.is_err());
        assert_eq!(fake.seen().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_cache_drops_expired_then_soonest_entries() {
        let cache: ReviewCache<u32, u32> = ReviewCache::new(3);
        for (key, ttl) in [(1, 10), (2, 20), (3, 30)] {
            cache.get_or_review(key, || async move { key }, |_| Duration::from_secs(ttl)).await;
        }
        assert_eq!(cache.len(), 3);
        cache.get_or_review(4, || async { 4 }, |_| Duration::from_secs(40)).await;
        assert_eq!(cache.len(), 3);
        assert!(cache.cached(&1).is_none(), "the soonest to expire went");
        tokio::time::advance(Duration::from_secs(25)).await;
        cache.get_or_review(5, || async { 5 }, |_| Duration::from_secs(40)).await;
        assert!(cache.cached(&2).is_none());
        assert_eq!((cache.cached(&3), cache.cached(&4), cache.cached(&5)), (Some(3), Some(4), Some(5)));
    }
}
