//! Client-side rate limits for the API server: a token bucket, and a tower layer that holds
//! every request of a kube client to `qps` on average with bursts of `burst` (the QPS and
//! burst settings of every Kubernetes controller).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower_layer::Layer;
use tower_service::Service;

/// Up to `burst` at once, `qps` on average.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    pub fn new(qps: f64, burst: f64) -> Self {
        let qps = qps.max(0.1);
        let burst = burst.max(1.0);
        Self {
            qps,
            burst,
            tokens: burst,
            at: Instant::now(),
        }
    }

    /// Takes a token; None when one is available now, else how long until it is (it is
    /// taken in advance: the caller waits, then goes).
    pub fn take(&mut self, now: Instant) -> Option<Duration> {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * self.qps;
        self.tokens = (self.tokens + refill).min(self.burst) - 1.0;
        self.at = now;
        (self.tokens < 0.0).then(|| Duration::from_secs_f64(-self.tokens / self.qps))
    }
}

/// Holds every request through the layered service to one shared bucket.
#[derive(Clone)]
pub struct ApiRateLimit {
    bucket: Arc<Mutex<TokenBucket>>,
}

impl ApiRateLimit {
    pub fn new(qps: f64, burst: u32) -> Self {
        Self {
            bucket: Arc::new(Mutex::new(TokenBucket::new(qps, f64::from(burst)))),
        }
    }
}

impl<S> Layer<S> for ApiRateLimit {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
            wait: None,
            permitted: false,
        }
    }
}

pub struct RateLimited<S> {
    inner: S,
    bucket: Arc<Mutex<TokenBucket>>,
    /// The token is taken; this is the wait for its turn.
    wait: Option<Pin<Box<Sleep>>>,
    /// A token is held for the next call.
    permitted: bool,
}

impl<S, R> Service<R> for RateLimited<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if !self.permitted {
            if self.wait.is_none() {
                let wait = self
                    .bucket
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take(Instant::now());
                self.wait = wait.map(|d| Box::pin(tokio::time::sleep(d)));
            }
            if let Some(wait) = self.wait.as_mut() {
                ready!(wait.as_mut().poll(cx));
                self.wait = None;
            }
            self.permitted = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.permitted = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_goes_at_once_then_qps_paces_the_rest() {
        let mut bucket = TokenBucket::new(10.0, 3.0);
        let now = Instant::now();
        assert_eq!(bucket.take(now), None);
        assert_eq!(bucket.take(now), None);
        assert_eq!(bucket.take(now), None);
        let wait = bucket.take(now).expect("the burst is spent");
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        // A second later ten more have come, but never more than the burst.
        let later = now + Duration::from_secs(1);
        assert_eq!(bucket.take(later), None);
    }

    #[test]
    fn one_seconds_worth_at_once_then_the_rate() {
        let start = Instant::now();
        let mut limit = TokenBucket::new(20.0, 20.0);
        for _ in 0..20 {
            assert_eq!(limit.take(start), None);
        }
        let wait = limit.take(start).expect("the bucket is empty");
        assert!((wait.as_secs_f64() - 0.05).abs() < 1e-9, "{wait:?}");
        // The caller that waited used the token that refilled meanwhile.
        let later = start + Duration::from_millis(50);
        assert!(limit.take(later).is_some());
        let idle = later + Duration::from_secs(5);
        assert_eq!(limit.take(idle), None, "refilled, up to the burst");
    }

    #[tokio::test(start_paused = true)]
    async fn requests_through_the_layer_are_paced() {
        use futures::future::{Ready, ready};
        struct Echo;
        impl Service<u32> for Echo {
            type Response = u32;
            type Error = ();
            type Future = Ready<Result<u32, ()>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ()>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, r: u32) -> Self::Future {
                ready(Ok(r))
            }
        }
        let mut service = ApiRateLimit::new(10.0, 2).layer(Echo);
        let started = Instant::now();
        for i in 0..12 {
            std::future::poll_fn(|cx| service.poll_ready(cx))
                .await
                .expect("ready");
            assert_eq!(service.call(i).await, Ok(i));
        }
        // Two at once, ten more at 10 per second.
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(999) && took < Duration::from_millis(1100),
            "{took:?}"
        );
    }
}
