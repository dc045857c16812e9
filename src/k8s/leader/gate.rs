//! The fence, where it holds: a layer of the leader's API client that lets a request go
//! only while this replica's term may write. When renewals stop going through, requests
//! wait (they are not failed): once a renewal of the same term goes through, the leader
//! goes on where it stopped, with the reads and decisions it had; if another replica took
//! the Lease meanwhile, the term is over and its work is dropped unsent.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::sync::watch;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

/// One leadership: numbered anew each time this replica takes the Lease (not when it
/// renews it), and the moment until which it may write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Term {
    pub number: u64,
    pub writes_until: Instant,
}

/// Opens for the requests of one term while it may write.
#[derive(Clone)]
pub struct WriteGate {
    terms: watch::Receiver<Option<Term>>,
    number: u64,
}

impl WriteGate {
    pub fn new(terms: watch::Receiver<Option<Term>>, number: u64) -> WriteGate {
        WriteGate { terms, number }
    }

    fn open_for(term: Option<&Term>, number: u64, now: Instant) -> bool {
        term.is_some_and(|t| t.number == number && now < t.writes_until)
    }

    pub fn is_open(&self) -> bool {
        Self::open_for(self.terms.borrow().as_ref(), self.number, Instant::now())
    }

    /// Completes once the term may write again (a renewal went through); never, if the
    /// term is over.
    fn opened(&self) -> impl Future<Output = ()> + Send + 'static {
        let (mut terms, number) = (self.terms.clone(), self.number);
        async move {
            loop {
                let open =
                    Self::open_for(terms.borrow_and_update().as_ref(), number, Instant::now());
                if open {
                    return;
                }
                if terms.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

impl<S> Layer<S> for WriteGate {
    type Service = Gated<S>;

    fn layer(&self, inner: S) -> Gated<S> {
        Gated {
            inner,
            gate: self.clone(),
            wait: None,
        }
    }
}

pub struct Gated<S> {
    inner: S,
    gate: WriteGate,
    wait: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl<S, R> Service<R> for Gated<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        // Checked at every poll: the term may run out while the inner service is busy.
        if self.wait.is_none() && !self.gate.is_open() {
            self.wait = Some(Box::pin(self.gate.opened()));
        }
        if let Some(wait) = self.wait.as_mut() {
            ready!(wait.as_mut().poll(cx));
            self.wait = None;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_term_writes_until_its_time_then_waits_for_a_renewal_and_never_outlives_its_term() {
        let now = Instant::now();
        let (tx, rx) = watch::channel(Some(Term {
            number: 1,
            writes_until: now + Duration::from_secs(60),
        }));
        let gate = WriteGate::new(rx.clone(), 1);
        assert!(gate.is_open());
        // Run out: closed, and opened again by a renewal of the same term.
        tx.send_replace(Some(Term {
            number: 1,
            writes_until: now,
        }));
        assert!(!gate.is_open());
        let opened = tokio::spawn(gate.opened());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!opened.is_finished());
        tx.send_replace(Some(Term {
            number: 1,
            writes_until: Instant::now() + Duration::from_secs(60),
        }));
        tokio::time::timeout(Duration::from_secs(5), opened)
            .await
            .expect("opened by the renewal")
            .expect("the wait");
        // Another term: the gate of term 1 stays shut, whatever it may write until.
        tx.send_replace(Some(Term {
            number: 2,
            writes_until: Instant::now() + Duration::from_secs(60),
        }));
        assert!(!gate.is_open());
        assert!(WriteGate::new(rx.clone(), 2).is_open());
        let never = tokio::spawn(gate.opened());
        drop(tx);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!never.is_finished());
        never.abort();
    }
}
