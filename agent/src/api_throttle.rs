//! Client-side rate limiting of API requests (`kubeAPIQPS`, `kubeAPIBurst`), as client-go's
//! token bucket does for the kubelet: a burst of requests goes out at once, then they are
//! spaced to the QPS. Applied as a tower layer under the kube client.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// A token bucket; `qps <= 0` disables limiting.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    #[must_use]
    pub fn new(qps: f32, burst: i32) -> Self {
        let burst = f64::from(burst.max(1));
        Self { qps: f64::from(qps), burst, state: Mutex::new((burst, Instant::now())) }
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        if self.qps <= 0.0 {
            return;
        }
        let wait = {
            let mut s = self.state.lock().await;
            let now = Instant::now();
            let tokens = (s.0 + now.duration_since(s.1).as_secs_f64() * self.qps).min(self.burst);
            s.1 = now;
            // Take the token now (possibly going negative): later callers queue behind.
            s.0 = tokens - 1.0;
            if s.0 >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-s.0 / self.qps) }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// The tower layer.
#[derive(Debug, Clone)]
pub struct ThrottleLayer(pub Arc<TokenBucket>);

impl<S> tower::Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttle { inner, bucket: self.0.clone() }
    }
}

/// The service: each request waits for a token before it is sent.
#[derive(Debug, Clone)]
pub struct Throttle<S> {
    inner: S,
    bucket: Arc<TokenBucket>,
}

impl<S, Req> tower::Service<Req> for Throttle<S>
where
    S: tower::Service<Req>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        // The inner future does its work when polled, which is after the token.
        let fut = self.inner.call(req);
        let bucket = self.bucket.clone();
        Box::pin(async move {
            bucket.acquire().await;
            fut.await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_qps() {
        let b = TokenBucket::new(5.0, 3);
        let start = Instant::now();
        for _ in 0..3 {
            b.acquire().await;
        }
        assert!(start.elapsed() < Duration::from_millis(1), "the burst goes at once");
        for _ in 0..5 {
            b.acquire().await;
        }
        // 5 more at 5 qps take about a second.
        let t = start.elapsed().as_secs_f64();
        assert!((0.95..1.1).contains(&t), "{t}");
    }

    #[tokio::test(start_paused = true)]
    async fn zero_qps_is_unlimited() {
        let b = TokenBucket::new(0.0, 1);
        let start = Instant::now();
        for _ in 0..100 {
            b.acquire().await;
        }
        assert!(start.elapsed().is_zero());
    }
}
