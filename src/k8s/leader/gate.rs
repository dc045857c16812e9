//! The fence, where it holds: a layer of the leader's API client that lets a request go
//! only while this replica's term may write. When renewals stop going through, requests
//! wait (they are not failed): once a renewal of the same term goes through, the leader
//! goes on where it stopped, with the reads and decisions it had; if another replica took
//! the Lease meanwhile, the term is over and its work is dropped unsent. A write handed on
//! just before the term stops writing, and not answered by then, is given up (it may be
//! waiting for a connection): only its answer is lost, and the next pass reads afresh.

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

/// The error of a request of a term that is over: it is never sent.
#[derive(Debug, thiserror::Error)]
#[error("this replica's term as the leader is over")]
pub struct TermOver;

/// A write not answered (or not yet sent) by the time its term stopped writing.
#[derive(Debug, thiserror::Error)]
#[error("not answered before this replica's term stopped writing")]
pub struct AnsweredTooLate;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl WriteGate {
    pub fn new(terms: watch::Receiver<Option<Term>>, number: u64) -> WriteGate {
        WriteGate { terms, number }
    }

    /// Until when this term may write: `Err` when it is over, `Ok(None)` when it may
    /// not write now.
    fn writes_until(
        term: Option<&Term>,
        number: u64,
        now: Instant,
    ) -> Result<Option<Instant>, TermOver> {
        match term {
            Some(t) if t.number == number => Ok((now < t.writes_until).then_some(t.writes_until)),
            _ => Err(TermOver),
        }
    }

    fn current(&self) -> Result<Option<Instant>, TermOver> {
        Self::writes_until(self.terms.borrow().as_ref(), self.number, Instant::now())
    }

    pub fn is_open(&self) -> bool {
        matches!(self.current(), Ok(Some(_)))
    }

    /// Completes once the term may write again (a renewal went through), or with
    /// `TermOver` once it is over.
    fn opened(&self) -> impl Future<Output = Result<(), TermOver>> + Send + 'static {
        let (mut terms, number) = (self.terms.clone(), self.number);
        async move {
            loop {
                let now = Instant::now();
                if Self::writes_until(terms.borrow_and_update().as_ref(), number, now)?.is_some() {
                    return Ok(());
                }
                terms.changed().await.map_err(|_| TermOver)?;
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
    wait: Option<Opened>,
}

/// The wait for a term's gate to open again.
type Opened = Pin<Box<dyn Future<Output = Result<(), TermOver>> + Send>>;

type Answer<R> = Pin<Box<dyn Future<Output = Result<R, BoxError>> + Send>>;

impl<S, B, R> Service<http::Request<B>> for Gated<S>
where
    S: Service<http::Request<B>, Response = R>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    R: Send + 'static,
{
    type Response = R;
    type Error = BoxError;
    type Future = Answer<R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Checked at every poll: the term may run out while the inner service is busy.
        if self.wait.is_none() && !self.gate.is_open() {
            self.wait = Some(Box::pin(self.gate.opened()));
        }
        if let Some(wait) = self.wait.as_mut() {
            let opened = ready!(wait.as_mut().poll(cx));
            self.wait = None;
            opened?;
        }
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Answer<R> {
        // A write not answered by the time the term stops writing is given up (it may
        // still be waiting for a connection); the term's renewals meanwhile move that time
        // on. Reads may take as long as they take.
        let deadline = if is_read(request.method()) {
            None
        } else {
            match self.gate.current() {
                Ok(Some(until)) => Some(until),
                // Shut since `poll_ready` let it through: not sent at all.
                Ok(None) => return Box::pin(std::future::ready(Err(AnsweredTooLate.into()))),
                Err(over) => return Box::pin(std::future::ready(Err(over.into()))),
            }
        };
        let gate = self.gate.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let Some(mut deadline) = deadline else {
                return answer.await.map_err(Into::into);
            };
            tokio::pin!(answer);
            loop {
                tokio::select! {
                    answered = &mut answer => return answered.map_err(Into::into),
                    () = tokio::time::sleep_until(deadline) => match gate.current() {
                        Ok(Some(until)) if until > deadline => deadline = until,
                        _ => return Err(AnsweredTooLate.into()),
                    },
                }
            }
        })
    }
}

fn is_read(method: &http::Method) -> bool {
    matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    )
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
            .expect("the wait")
            .expect("the same term");
        // Another term: the gate of term 1 stays shut, whatever it may write until.
        tx.send_replace(Some(Term {
            number: 2,
            writes_until: Instant::now() + Duration::from_secs(60),
        }));
        assert!(!gate.is_open());
        assert!(WriteGate::new(rx.clone(), 2).is_open());
        let over = gate.opened().await;
        assert!(over.is_err(), "a term that is over never opens: {over:?}");
        // Term 2 out of time, and its elector gone: it never opens again either.
        tx.send_replace(Some(Term {
            number: 2,
            writes_until: Instant::now(),
        }));
        drop(tx);
        let gate_2 = WriteGate::new(rx, 2);
        assert!(
            gate_2.opened().await.is_err(),
            "nor one whose elector is gone"
        );
    }
}
