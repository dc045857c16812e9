//! Prometheus metrics. One registry, handed to the parts that record into it.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    pub r#type: String,
}

impl TypeLabel {
    pub fn of(type_url: &str) -> Self {
        Self {
            r#type: crate::xds::snapshot::short_type(type_url).to_string(),
        }
    }
}

/// Why a reconcile failed, by kind (e.g. "read", "write", "conflict").
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    pub error: &'static str,
}

/// A step of a rollout (e.g. "staged", "promoted").
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabel {
    pub step: &'static str,
}

#[derive(Clone)]
pub struct Metrics {
    pub connected_nodes: Gauge,
    pub streams_unanswered: Counter,
    pub pushes: Family<TypeLabel, Counter>,
    pub acks: Family<TypeLabel, Counter>,
    pub nacks: Family<TypeLabel, Counter>,
    pub push_ack_seconds: Family<TypeLabel, Histogram>,
    pub snapshot_build_seconds: Histogram,
    pub snapshot_resources: Family<TypeLabel, Gauge>,
    pub config_errors: Counter,
    pub xds_tls_reload_failures: Counter,
    pub trials_left_out: Gauge,
    pub fleet_envoys_rejecting: Gauge,
    pub fleet_routes_refused: Gauge,
    pub reconcile_failures: Family<ErrorLabel, Counter>,
    pub rollout_step_seconds: Family<StepLabel, Histogram>,
    pub status_writes_pending: Gauge,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            connected_nodes: Gauge::default(),
            streams_unanswered: Counter::default(),
            pushes: Family::default(),
            acks: Family::default(),
            nacks: Family::default(),
            push_ack_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 16))
            }),
            snapshot_build_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 18)),
            snapshot_resources: Family::default(),
            config_errors: Counter::default(),
            xds_tls_reload_failures: Counter::default(),
            trials_left_out: Gauge::default(),
            fleet_envoys_rejecting: Gauge::default(),
            fleet_routes_refused: Gauge::default(),
            reconcile_failures: Family::default(),
            rollout_step_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 18))
            }),
            status_writes_pending: Gauge::default(),
        };
        let r = registry.sub_registry_with_prefix("switchyard");
        r.register(
            "xds_connected_nodes",
            "Envoy streams connected",
            metrics.connected_nodes.clone(),
        );
        r.register(
            "xds_streams_unanswered",
            "Streams closed because Envoy answered nothing for --xds-answer-timeout while a response waited",
            metrics.streams_unanswered.clone(),
        );
        r.register(
            "xds_pushes",
            "Responses sent to Envoy",
            metrics.pushes.clone(),
        );
        r.register("xds_acks", "Responses Envoy accepted", metrics.acks.clone());
        r.register(
            "xds_nacks",
            "Responses Envoy rejected",
            metrics.nacks.clone(),
        );
        r.register(
            "xds_push_ack_seconds",
            "Time from sending a response to Envoy's ACK or NACK",
            metrics.push_ack_seconds.clone(),
        );
        r.register(
            "snapshot_build_seconds",
            "Time to translate the model into a snapshot",
            metrics.snapshot_build_seconds.clone(),
        );
        r.register(
            "snapshot_resources",
            "Resources in the desired snapshot",
            metrics.snapshot_resources.clone(),
        );
        r.register(
            "config_errors",
            "Configuration loads or translations that reported a problem",
            metrics.config_errors.clone(),
        );
        r.register(
            "xds_tls_reload_failures",
            "Changes of the xDS TLS files that did not load (the last good ones stay in use)",
            metrics.xds_tls_reload_failures.clone(),
        );
        r.register(
            "trials_left_out",
            "Routes on trial left out of the route configuration because an Envoy rejected it",
            metrics.trials_left_out.clone(),
        );
        r.register(
            "fleet_envoys_rejecting",
            "Envoys of the whole fleet held back by a NACK, whichever replica they are connected to (the leader's view)",
            metrics.fleet_envoys_rejecting.clone(),
        );
        r.register(
            "fleet_routes_refused",
            "Routes on trial that an Envoy of the fleet refused, whichever replica it is connected to (the leader's view)",
            metrics.fleet_routes_refused.clone(),
        );
        r.register(
            "reconcile_failures",
            "Rollout passes that failed and are retried, by the kind of error",
            metrics.reconcile_failures.clone(),
        );
        r.register(
            "rollout_step_seconds",
            "Time each step of a rollout took, from the step before it (the first: from \
             the beginning of its reconcile pass): staged, endpoints_verified, \
             promoted, live_verified",
            metrics.rollout_step_seconds.clone(),
        );
        r.register(
            "status_writes_pending",
            "Statuses waiting to be written (at --status-qps) or being written",
            metrics.status_writes_pending.clone(),
        );
        metrics
    }
}

impl Metrics {
    /// Records a freshly built snapshot: its size per type and how long it took.
    pub fn record_snapshot(&self, snapshot: &crate::xds::Snapshot, built_in: std::time::Duration) {
        self.snapshot_build_seconds.observe(built_in.as_secs_f64());
        for (type_url, resources) in snapshot.types() {
            self.snapshot_resources
                .get_or_create(&TypeLabel::of(type_url))
                .set(resources.len() as i64);
        }
    }
}
