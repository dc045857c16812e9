//! What the Envoys connected to each replica rejected, shared through the API server, so
//! that a NACK reaches a route's status whichever replica its Envoy is connected to.
//!
//! Every replica heartbeats a Lease of its own (as a kubelet does for its node) that
//! carries, in an annotation, its Envoys' NACKs and the routes its snapshot builder left
//! out because an Envoy refused them. The leader watches its replicas' Leases and merges
//! what the others report with what its own Envoys say: [`FleetView`]. A Lease whose
//! heartbeat stopped (a replica that is gone) is ignored once it runs out.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{debug, warn};

use super::envoys::{BlockingNack, Envoys};
use super::watched::{View, Watched};
use crate::translate::{Cause, Problem, Subject};

/// The label of a replica's report Lease: the name of the leader election's Lease, which
/// the replicas of one installation share.
pub const REPLICA_OF_LABEL: &str = "switchyard.dev/replica-of";
/// The annotation holding the report (JSON).
pub const REPORT_ANNOTATION: &str = "switchyard.dev/envoy-report";

/// How often a replica renews its report when nothing changes.
const HEARTBEAT: Duration = Duration::from_secs(10);
/// A report not renewed for this long is a gone replica's.
const LEASE_SECONDS: i32 = 30;
/// Changes arriving within this interval are written together.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Bounds that keep a report well inside an annotation's size limit (256 KiB for all);
/// past MAX_ENVOYS, an Envoy that moved may be told by two replicas for a while.
const MAX_REJECTIONS: usize = 100;
const MAX_LEFT_OUT: usize = 300;
const MAX_MESSAGE: usize = 512;
const MAX_ENVOYS: usize = 4000;

/// One replica's report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The Envoys connected to the replica, by node id.
    pub envoys: BTreeSet<String>,
    /// The NACKs holding them back.
    pub rejections: Vec<BlockingNack>,
    /// What its snapshot builder left out because an Envoy refused it.
    pub left_out: Vec<LeftOut>,
}

/// A problem from an Envoy's answer, as text: its route's id (`*`: every route) and its
/// message. Replicas of the previous version and of this one run side by side through a
/// rolling upgrade, and read each other's reports: this stays as every version writes it
/// (`{"route": "ns/web", "message": "Envoy envoy-0 rejected these routes: …"}`), and the
/// problem's cause is read back from its words ([`Problem::from_text`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LeftOut {
    pub route: String,
    pub message: String,
}

/// How the route field reads when a problem concerns every route.
const EVERY_ROUTE: &str = "*";

impl LeftOut {
    /// The words of a problem from an Envoy's answer, clipped to fit the report. Its
    /// subject is a route, or every route: the quarantine's verdicts are about nothing else.
    fn of(problem: &Problem) -> LeftOut {
        LeftOut {
            route: problem.subject().to_string(),
            message: clip(problem.message()),
        }
    }

    fn problem(self) -> Problem {
        let route = if self.route == EVERY_ROUTE {
            Subject::EveryRoute
        } else {
            Subject::VirtualHost(self.route)
        };
        Problem::from_text(route, self.message)
    }
}

fn clip(message: &str) -> String {
    if message.len() <= MAX_MESSAGE {
        return message.to_owned();
    }
    let mut end = MAX_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

impl Report {
    /// What `envoys` and the builder's `problems` say now.
    pub fn of(envoys: &dyn Envoys, problems: &[Problem]) -> Report {
        let mut rejections = envoys.blocking_nacks();
        rejections.sort();
        rejections.truncate(MAX_REJECTIONS);
        for r in &mut rejections {
            r.error = clip(&r.error);
        }
        // What the input says, every replica's translation says alike.
        let mut left_out: Vec<LeftOut> = problems
            .iter()
            .filter(|p| p.from_an_envoy())
            .map(LeftOut::of)
            .collect();
        left_out.sort();
        left_out.dedup();
        left_out.truncate(MAX_LEFT_OUT);
        Report {
            envoys: envoys.connected().into_iter().take(MAX_ENVOYS).collect(),
            rejections,
            left_out,
        }
    }
}

/// Where a replica's report lives.
#[derive(Clone)]
pub struct ReportSettings {
    pub namespace: String,
    /// The leader election's Lease: the replicas of one installation share it.
    pub lease_name: String,
    pub identity: String,
    /// The replica's Pod (name, uid), when it runs in one: its report goes with it.
    pub pod: Option<(String, String)>,
}

impl ReportSettings {
    /// The report Lease's name: the election's, and the replica's identity, made a valid
    /// object name.
    fn object_name(&self) -> String {
        let raw = format!("{}-{}", self.lease_name, self.identity).to_ascii_lowercase();
        let name: String = raw
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '-'
                }
            })
            .take(253)
            .collect();
        name.trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_owned()
    }

    fn lease(&self, report: &Report) -> anyhow::Result<Lease> {
        let mut lease = Lease::default();
        lease.metadata.name = Some(self.object_name());
        lease.metadata.namespace = Some(self.namespace.clone());
        lease.metadata.labels = Some(BTreeMap::from([(
            REPLICA_OF_LABEL.to_owned(),
            self.lease_name.clone(),
        )]));
        lease.metadata.annotations = Some(BTreeMap::from([(
            REPORT_ANNOTATION.to_owned(),
            serde_json::to_string(report)?,
        )]));
        lease.metadata.owner_references = self.pod.as_ref().map(|(name, uid)| {
            vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: name.clone(),
                uid: uid.clone(),
                ..Default::default()
            }]
        });
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        });
        Ok(lease)
    }
}

/// Every replica: writes its report whenever it changes (at most once per DEBOUNCE) and
/// renews it every HEARTBEAT. Runs until the process ends.
pub async fn publish(
    client: Client,
    settings: ReportSettings,
    envoys: Arc<dyn Envoys>,
    mut problems: watch::Receiver<Vec<Problem>>,
) {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let params = PatchParams::apply(&format!("switchyard-report-{}", settings.identity)).force();
    let mut changes = envoys.changes();
    loop {
        let report = Report::of(envoys.as_ref(), &problems.borrow_and_update());
        let wrote = match settings.lease(&report) {
            Ok(lease) => api
                .patch(&settings.object_name(), &params, &Patch::Apply(&lease))
                .await
                .map_err(anyhow::Error::from),
            Err(e) => Err(e),
        };
        let written = match wrote {
            Ok(_) => {
                debug!(
                    envoys = report.envoys.len(),
                    rejections = report.rejections.len(),
                    "Envoy report written"
                );
                Some(report)
            }
            Err(error) => {
                warn!(%error, "cannot write this replica's Envoy report; retrying");
                None
            }
        };
        let retry = if written.is_some() {
            HEARTBEAT
        } else {
            Duration::from_secs(1)
        };
        let renew = tokio::time::sleep(retry);
        tokio::pin!(renew);
        // Wait for the heartbeat, or a change that alters the report.
        loop {
            tokio::select! {
                () = &mut renew => break,
                changed = changes.changed() => if changed.is_err() { return },
                changed = problems.changed() => if changed.is_err() { return },
            }
            tokio::time::sleep(DEBOUNCE).await;
            let now = Report::of(envoys.as_ref(), &problems.borrow());
            if written.as_ref() != Some(&now) {
                break;
            }
        }
    }
}

/// The reports of every replica of this installation, as the leader sees them.
#[derive(Clone)]
pub struct Reports {
    identity: String,
    leases: View<Lease>,
    /// What the leases bump at every event (see [`Reports::watch`]).
    _changes: Arc<watch::Sender<u64>>,
}

impl Reports {
    /// The replicas' report Leases, read from the process's watch of Leases in their
    /// namespace, and a channel bumped when one changes.
    pub fn watch(
        leases: &Watched<Lease>,
        settings: &ReportSettings,
    ) -> (Reports, watch::Receiver<u64>) {
        let changes = Arc::new(watch::channel(0).0);
        let lease_name = settings.lease_name.clone();
        let reports = leases.view(Arc::new(move |lease: &Lease| {
            lease.labels().get(REPLICA_OF_LABEL) == Some(&lease_name)
        }));
        reports.notify(&changes);
        let receiver = changes.subscribe();
        (
            Reports {
                identity: settings.identity.clone(),
                leases: reports,
                _changes: changes,
            },
            receiver,
        )
    }

    /// The other replicas' reports that are still renewed, newest first.
    fn others(&self, now: Timestamp) -> Vec<(Timestamp, Report)> {
        let mut out: Vec<(Timestamp, Report)> = self
            .leases
            .state()
            .iter()
            .filter_map(|lease| {
                let spec = lease.spec.as_ref()?;
                if spec.holder_identity.as_deref() == Some(self.identity.as_str()) {
                    return None;
                }
                let renewed = spec.renew_time.as_ref()?.0;
                let lasts = i64::from(spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS));
                let age = now.duration_since(renewed).as_secs();
                if age > lasts {
                    return None;
                }
                let json = lease.annotations().get(REPORT_ANNOTATION)?;
                match serde_json::from_str(json) {
                    Ok(report) => Some((renewed, report)),
                    Err(error) => {
                        warn!(lease = %lease.name_any(), %error, "unreadable Envoy report");
                        None
                    }
                }
            })
            .collect();
        out.sort_by_key(|(renewed, _)| std::cmp::Reverse(*renewed));
        out
    }
}

/// The fleet as the leader sees it: its own Envoys, and what the other replicas report of
/// theirs. An Envoy that moved between replicas is taken from the freshest word on it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetView {
    pub rejections: Vec<BlockingNack>,
    pub left_out: Vec<Problem>,
}

impl FleetView {
    pub fn merge(own: Report, others: Vec<Report>) -> FleetView {
        let mut seen: BTreeSet<String> = own.envoys.clone();
        let mut rejections = own.rejections;
        let mut left_out: BTreeSet<LeftOut> = own.left_out.into_iter().collect();
        for report in others {
            rejections.extend(
                report
                    .rejections
                    .into_iter()
                    .filter(|r| !seen.contains(&r.node)),
            );
            seen.extend(report.envoys);
            left_out.extend(report.left_out);
        }
        rejections.sort();
        rejections.dedup();
        FleetView {
            rejections,
            left_out: left_out.into_iter().map(LeftOut::problem).collect(),
        }
    }

    /// How many routes on trial an Envoy refused.
    pub fn refused_routes(&self) -> usize {
        self.left_out
            .iter()
            .filter(|p| p.cause() == Cause::Refused)
            .map(Problem::subject)
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// How many Envoys are held back by a NACK.
    pub fn rejecting_envoys(&self) -> usize {
        self.rejections
            .iter()
            .map(|r| r.node.as_str())
            .collect::<BTreeSet<_>>()
            .len()
    }
}

/// The leader's view of the fleet, kept current: its own Envoys and problems, merged with
/// the other replicas' reports. Also re-read every HEARTBEAT, for reports that run out.
pub async fn keep_fleet_view(
    reports: Reports,
    mut report_changes: watch::Receiver<u64>,
    envoys: Arc<dyn Envoys>,
    mut problems: watch::Receiver<Vec<Problem>>,
    view: watch::Sender<FleetView>,
    (rejecting, refused): (Gauge, Gauge),
) {
    let mut changes = envoys.changes();
    loop {
        let own = Report::of(envoys.as_ref(), &problems.borrow_and_update());
        let merged = FleetView::merge(
            own,
            reports
                .others(Timestamp::now())
                .into_iter()
                .map(|(_, r)| r)
                .collect(),
        );
        rejecting.set(merged.rejecting_envoys() as i64);
        refused.set(merged.refused_routes() as i64);
        view.send_if_modified(|current| {
            let changed = *current != merged;
            *current = merged;
            changed
        });
        tokio::select! {
            () = tokio::time::sleep(HEARTBEAT) => {}
            changed = report_changes.changed() => if changed.is_err() { return },
            changed = changes.changed() => if changed.is_err() { return },
            changed = problems.changed() => if changed.is_err() { return },
            () = view.closed() => return,
        }
        // Envoys answer many times a second in a busy fleet: one look per DEBOUNCE.
        tokio::time::sleep(DEBOUNCE).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nack(node: &str, error: &str) -> BlockingNack {
        BlockingNack {
            node: node.into(),
            kind: "Cluster".into(),
            error: error.into(),
        }
    }

    fn report(envoys: &[&str], rejections: Vec<BlockingNack>, left_out: &[(&str, &str)]) -> Report {
        Report {
            envoys: envoys.iter().map(|e| e.to_string()).collect(),
            rejections,
            left_out: left_out
                .iter()
                .map(|(route, message)| LeftOut {
                    route: route.to_string(),
                    message: message.to_string(),
                })
                .collect(),
        }
    }

    #[test]
    fn the_view_holds_every_replicas_rejections_and_refusals() {
        let own = report(&["envoy-0"], vec![nack("envoy-0", "bad cluster")], &[]);
        let other = report(
            &["envoy-1"],
            vec![nack("envoy-1", "bad cluster")],
            &[("ns/web", "Envoy envoy-1 rejected these routes: regex")],
        );
        let view = FleetView::merge(own, vec![other]);
        assert_eq!(view.rejecting_envoys(), 2);
        assert_eq!(view.refused_routes(), 1);
        assert_eq!(
            view.left_out,
            [Problem::refused("ns/web", "envoy-1", "regex")]
        );
    }

    #[test]
    fn an_envoy_that_moved_is_taken_from_the_freshest_word() {
        // envoy-1 reconnected here and ACKs; the replica it left still lists its NACK.
        let own = report(&["envoy-0", "envoy-1"], Vec::new(), &[]);
        let left = report(&["envoy-1"], vec![nack("envoy-1", "old")], &[]);
        assert_eq!(FleetView::merge(own, vec![left]).rejecting_envoys(), 0);
        // Between two other replicas, the newer report (first) wins.
        let newer = report(&["envoy-2"], Vec::new(), &[]);
        let older = report(&["envoy-2"], vec![nack("envoy-2", "old")], &[]);
        let view = FleetView::merge(Report::default(), vec![newer, older]);
        assert_eq!(view.rejecting_envoys(), 0);
    }

    #[test]
    fn only_what_an_envoy_said_is_reported() {
        let problems = [
            Problem::refused("ns/a", "envoy-0", "x"),
            Problem::benched("ns/b"),
            Problem::new("ns/c", "no such Service"),
            Problem::unexplained("envoy-0", "y"),
        ];
        let kept: Vec<String> = problems
            .iter()
            .filter(|p| p.from_an_envoy())
            .map(|p| p.subject().to_string())
            .collect();
        assert_eq!(kept, ["ns/a", "ns/b", "*"]);
    }

    /// A report as the version before typed problems wrote it (and as this one must, for
    /// it to read): each problem's cause is read back from its words, and written out
    /// again it is the same text.
    #[test]
    fn a_report_reads_and_writes_as_the_previous_version_does() {
        let text = r#"{"envoys":["envoy-1"],"rejections":[{"node":"envoy-1","kind":"Cluster","error":"bad cluster"}],"leftOut":[{"route":"*","message":"Envoy envoy-1 rejected the route configuration, and no route on trial explains it: x"},{"route":"ns/a","message":"Envoy envoy-1 rejected these routes: regex"},{"route":"ns/b","message":"routes on trial held back for a moment: an Envoy rejected a route configuration that carried them with others, and the route to blame is being found"},{"route":"ns/c","message":"Envoy envoy-1 rejected these routes: long…"}]}"#;
        let report: Report = serde_json::from_str(text).expect("reads");
        let view = FleetView::merge(Report::default(), vec![report.clone()]);
        let read: Vec<(String, Cause)> = view
            .left_out
            .iter()
            .map(|p| (p.subject().to_string(), p.cause()))
            .collect();
        assert_eq!(
            read,
            [
                ("*".to_owned(), Cause::Unexplained),
                ("ns/a".to_owned(), Cause::Refused),
                ("ns/b".to_owned(), Cause::Benched),
                ("ns/c".to_owned(), Cause::Refused),
            ]
        );
        assert_eq!(view.left_out[0].subject(), &Subject::EveryRoute);
        assert_eq!(view.refused_routes(), 2);
        let written = Report {
            left_out: view.left_out.iter().map(LeftOut::of).collect(),
            ..report
        };
        assert_eq!(serde_json::to_string(&written).expect("writes"), text);
    }

    #[test]
    fn long_messages_are_clipped_on_a_character_boundary() {
        let long = "é".repeat(MAX_MESSAGE);
        let clipped = clip(&long);
        assert!(clipped.len() <= MAX_MESSAGE + '…'.len_utf8());
        assert!(clipped.ends_with('…'));
    }

    #[test]
    fn the_report_object_has_a_valid_name() {
        let settings = ReportSettings {
            namespace: "ns".into(),
            lease_name: "switchyard-leader".into(),
            identity: "Switchyard_7f/x".into(),
            pod: None,
        };
        assert_eq!(settings.object_name(), "switchyard-leader-switchyard-7f-x");
    }
}
