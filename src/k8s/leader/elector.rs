//! The replica's side of the election, on a thread of its own with a connection of its
//! own: however busy the operator's runtime is (a first pass over thousands of routes
//! keeps both cores busy), renewals are sent on time and their answers read at once.
//! It publishes the current [`Term`]; the leader's writes go through its [`WriteGate`].
//!
//! [`WriteGate`]: super::gate::WriteGate

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tracing::{debug, info, warn};

use super::LeaseSettings;
use super::gate::Term;
use super::lease::{Seen, Timing, released, renewed, taken};

/// How long a stopping leader waits for its Lease to be released.
const RELEASE_WITHIN: Duration = Duration::from_secs(5);

/// What the election shows on the metrics port.
#[derive(Clone)]
pub struct LeaseMetrics {
    pub renew_seconds: Histogram,
    pub fences: Counter,
    pub terms: Counter,
}

impl LeaseMetrics {
    pub fn register(registry: &mut Registry) -> LeaseMetrics {
        let metrics = LeaseMetrics {
            renew_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            fences: Counter::default(),
            terms: Counter::default(),
        };
        let r = registry.sub_registry_with_prefix("switchyard");
        r.register(
            "lease_renew_seconds",
            "Time a renewal of the leader's Lease took, from sending it to its answer (renewals that went through)",
            metrics.renew_seconds.clone(),
        );
        r.register(
            "lease_fences",
            "Times the leader stopped writing because no renewal had gone through for the lease duration less the grace",
            metrics.fences.clone(),
        );
        r.register(
            "lease_terms",
            "Times this replica took the Lease (renewals, and a fenced leader renewing again, are not counted)",
            metrics.terms.clone(),
        );
        metrics
    }
}

pub struct Elector {
    pub api: Api<Lease>,
    pub settings: LeaseSettings,
    pub timing: Timing,
    pub terms: watch::Sender<Option<Term>>,
    pub metrics: LeaseMetrics,
    /// The number the next term gets.
    pub next_term: u64,
}

/// A read of the Lease while leading.
enum Read {
    Lease(Option<Box<Lease>>),
    Failed,
    Stopped,
}

/// How leading ended.
enum Ended {
    /// Another replica holds the Lease, or it is gone.
    Lost,
    /// Asked to stop; the Lease as last written, to release.
    Stopped(Box<Lease>),
}

impl Elector {
    /// Follows and leads in turn until `stop` says so, then releases the Lease if it holds it.
    /// `changes` is bumped when the Lease changes (a release is then taken at once).
    pub async fn run(mut self, mut changes: watch::Receiver<u64>, mut stop: watch::Receiver<bool>) {
        loop {
            let Some((held, sent)) = self.follow(&mut changes, &mut stop).await else {
                return;
            };
            match self.lead(held, sent, &mut stop).await {
                Ended::Lost => self.terms.send_replace(None),
                Ended::Stopped(held) => {
                    self.terms.send_replace(None);
                    self.release(&held).await;
                    return;
                }
            };
        }
    }

    /// Reads the Lease every renew period (and when it changes) until this replica may
    /// take it and does; the Lease it wrote, and when that write was sent. `None` when
    /// asked to stop.
    async fn follow(
        &mut self,
        changes: &mut watch::Receiver<u64>,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<(Lease, Instant)> {
        let mut seen: Option<Seen> = None;
        let mut failing = false;
        let mut bumped = true;
        loop {
            if *stop.borrow() {
                return None;
            }
            let mut next = self.timing.renew_every;
            let read = timeout(
                self.timing.renew_every.max(Duration::from_secs(1)),
                self.api.get_opt(&self.settings.name),
            )
            .await;
            match read {
                Ok(Ok(lease)) => {
                    failing = false;
                    let now = Instant::now();
                    let may = match &lease {
                        Some(lease) => {
                            let this = Seen::of(lease, now.into_std(), seen.as_ref());
                            let may = this.may_take(
                                &self.settings.identity,
                                now.into_std(),
                                SystemTime::now(),
                                &self.timing,
                            );
                            seen = Some(this);
                            may
                        }
                        None => Ok(()),
                    };
                    match may {
                        Ok(()) => {
                            if let Some(taken) = self.take(lease.as_ref()).await {
                                return Some(taken);
                            }
                        }
                        Err(wait) => next = next.min(wait),
                    }
                }
                Ok(Err(error)) => {
                    if !failing {
                        warn!(%error, lease = %self.settings.name, "cannot read the leader Lease; retrying");
                    }
                    failing = true;
                }
                Err(_) => {
                    if !failing {
                        warn!(lease = %self.settings.name, "reading the leader Lease timed out; retrying");
                    }
                    failing = true;
                }
            }
            tokio::select! {
                () = sleep(next) => {}
                // Once nothing bumps it any more, the Lease is read every period.
                changed = changes.changed(), if bumped => bumped = changed.is_ok(),
                changed = stop.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
            }
        }
    }

    /// Writes the Lease as this replica's, over `read` (or as a new one): the Lease
    /// written and when the write was sent, or `None` when another replica was first.
    async fn take(&mut self, read: Option<&Lease>) -> Option<(Lease, Instant)> {
        let s = &self.settings;
        let lease = taken(read, &s.name, &s.namespace, &s.identity, &self.timing);
        let sent = Instant::now();
        let within = self.timing.renew_every.max(Duration::from_secs(1));
        let written = match read {
            Some(_) => {
                timeout(
                    within,
                    self.api.replace(&s.name, &PostParams::default(), &lease),
                )
                .await
            }
            None => timeout(within, self.api.create(&PostParams::default(), &lease)).await,
        };
        match written {
            Ok(Ok(lease)) => {
                let term = Term {
                    number: self.next_term,
                    writes_until: sent + self.timing.fence_after,
                };
                self.next_term += 1;
                self.metrics.terms.inc();
                info!(identity = %s.identity, lease = %s.name, "became the leader");
                self.terms.send_replace(Some(term));
                Some((lease, sent))
            }
            Ok(Err(kube::Error::Api(e))) if e.code == 409 => {
                debug!(lease = %s.name, "another replica took the Lease first");
                None
            }
            Ok(Err(error)) => {
                warn!(%error, lease = %s.name, "taking the Lease failed; retrying");
                None
            }
            Err(_) => {
                warn!(lease = %s.name, "taking the Lease timed out; retrying");
                None
            }
        }
    }

    /// Renews `held` every renew period until the Lease is lost or `stop` says so. When no
    /// renewal has gone through for the fence period, the term's writes stop (its gate
    /// shuts by the clock); renewals go on, and one that goes through while the Lease still
    /// names this replica opens them again: nobody else can have led in between, since a
    /// write of the Lease by anyone would have refused this one.
    async fn lead(
        &mut self,
        mut held: Lease,
        sent: Instant,
        stop: &mut watch::Receiver<bool>,
    ) -> Ended {
        let number = self.next_term - 1;
        let mut writes_until = sent + self.timing.fence_after;
        let mut next = sent + self.timing.renew_every;
        let mut fenced = false;
        let mut failing = false;
        loop {
            tokio::select! {
                () = sleep_until(next) => {}
                () = sleep_until(writes_until), if !fenced => {
                    fenced = self.fence();
                    continue;
                }
                changed = stop.changed() => {
                    if changed.is_err() {
                        return Ended::Stopped(Box::new(held));
                    }
                }
            }
            if *stop.borrow() {
                return Ended::Stopped(Box::new(held));
            }
            let sent = Instant::now();
            next = sent + self.timing.renew_every;
            let within = self
                .timing
                .request_within(writes_until.saturating_duration_since(sent));
            let (renewal, params) = (renewed(&held), PostParams::default());
            let attempt = timeout(
                within,
                self.api.replace(&self.settings.name, &params, &renewal),
            );
            tokio::pin!(attempt);
            let answer = loop {
                tokio::select! {
                    answer = &mut attempt => break answer,
                    () = sleep_until(writes_until), if !fenced => fenced = self.fence(),
                    // A stop does not wait for a slow renewal: the release goes at once.
                    changed = stop.changed() => {
                        if changed.is_err() || *stop.borrow() {
                            return Ended::Stopped(Box::new(held));
                        }
                    }
                }
            };
            match answer {
                Ok(Ok(lease)) => {
                    held = lease;
                    self.metrics
                        .renew_seconds
                        .observe(sent.elapsed().as_secs_f64());
                    writes_until = sent + self.timing.fence_after;
                    self.terms.send_replace(Some(Term {
                        number,
                        writes_until,
                    }));
                    if fenced {
                        info!(identity = %self.settings.identity, "the lease is renewed: writes go on where they stopped");
                    }
                    (fenced, failing) = (false, false);
                }
                Ok(Err(kube::Error::Api(e))) if e.code == 409 => {
                    // Written by someone since: still this replica's only if it names it (a
                    // user's edit, say); the next renewal goes over what it is now.
                    match self.read_bounded(stop).await {
                        Read::Stopped => return Ended::Stopped(Box::new(held)),
                        Read::Lease(Some(lease)) if is_held_by(&lease, &self.settings.identity) => {
                            held = *lease;
                        }
                        Read::Lease(_) => {
                            warn!(identity = %self.settings.identity, "lost the lease: stopping writes");
                            return Ended::Lost;
                        }
                        Read::Failed => {}
                    }
                }
                Ok(Err(kube::Error::Api(e))) if e.code == 404 => {
                    warn!(identity = %self.settings.identity, "the Lease was deleted: stopping writes");
                    return Ended::Lost;
                }
                Ok(Err(error)) => {
                    if !failing {
                        warn!(%error, "renewing the lease failed; retrying");
                    }
                    failing = true;
                }
                Err(_) => {
                    if !failing {
                        warn!(?within, "renewing the lease timed out; retrying");
                    }
                    failing = true;
                }
            }
        }
    }

    /// Logs and counts the fence (the gate has shut by itself); true.
    fn fence(&self) -> bool {
        self.metrics.fences.inc();
        warn!(
            identity = %self.settings.identity,
            unrenewed = ?self.timing.fence_after,
            "the lease was not seen renewed: stopping writes before it can run out"
        );
        true
    }

    /// The Lease read within a renew period, unless `stop` says so first.
    async fn read_bounded(&self, stop: &mut watch::Receiver<bool>) -> Read {
        let read = timeout(
            self.timing.renew_every,
            self.api.get_opt(&self.settings.name),
        );
        tokio::select! {
            read = read => match read {
                Ok(Ok(lease)) => Read::Lease(lease.map(Box::new)),
                Ok(Err(error)) => {
                    warn!(%error, "reading the Lease after a refused renewal failed");
                    Read::Failed
                }
                Err(_) => {
                    warn!("reading the Lease after a refused renewal timed out");
                    Read::Failed
                }
            },
            _ = stop.wait_for(|stop| *stop) => Read::Stopped,
        }
    }

    /// Gives the Lease up (bounded): a follower takes it at once. Written over the Lease
    /// as last read when the one held is out of date (a renewal that went through
    /// unanswered), if it still names this replica.
    async fn release(&self, held: &Lease) {
        let release = async {
            let params = PostParams::default();
            match self
                .api
                .replace(&self.settings.name, &params, &released(held))
                .await
            {
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    let current = self.api.get_opt(&self.settings.name).await?;
                    match current.filter(|l| is_held_by(l, &self.settings.identity)) {
                        Some(current) => {
                            (self
                                .api
                                .replace(&self.settings.name, &params, &released(&current)))
                            .await
                            .map(|_| ())
                        }
                        None => Ok(()),
                    }
                }
                other => other.map(|_| ()),
            }
        };
        match timeout(RELEASE_WITHIN, release).await {
            Ok(Ok(())) => {
                info!(identity = %self.settings.identity, "stopped; the lease is released")
            }
            Ok(Err(error)) => warn!(%error, "could not release the lease"),
            Err(_) => warn!("releasing the lease took longer than {RELEASE_WITHIN:?}"),
        }
    }
}

fn is_held_by(lease: &Lease, identity: &str) -> bool {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        == Some(identity)
}
