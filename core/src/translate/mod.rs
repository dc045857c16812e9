//! Pure, deterministic translation of the routing model into Envoy xDS resources.
//!
//! [`translate`] turns a [`model::Config`] into a [`xds::Snapshot`]: three listeners that share
//! one route configuration ("switchyard"), an EDS cluster and a ClusterLoadAssignment for
//! every cluster that a surviving route or probe references, and the TLS secrets that
//! surviving virtual hosts use. The route configuration also holds one virtual host per
//! version probe and a catch-all that answers 404 for every other probe host.
//!
//! Bad input is contained (I8): a virtual host that Envoy would reject, or that refers to
//! something missing, is left out and reported as a [`Problem`] about its [`Subject`];
//! every other virtual host is unaffected. The output depends only on the content of the
//! configuration, never on the order of its lists (I6); only the order of routes inside a
//! virtual host (match order) is kept as given.

use std::collections::{BTreeMap, HashMap};

use crate::model;
use crate::xds;

mod access_log;
mod check;
mod cluster;
mod datagram;
mod endpoint;
pub mod envoy_json;
mod http_filters;
mod listener;
mod probe;
mod problem;
mod proto;
mod quarantine;
pub mod render;
mod route;
pub use route::{LISTENER_HEADER, NO_LISTENER};
mod secret;
mod stream;
mod translator;
mod validate;

pub use check::check_consistency;
pub use problem::{Cause, Problem, Subject};
pub use quarantine::Quarantine;
pub use translator::{Changes, Edit, Translator};

/// The name of the one route configuration that every listener uses.
pub const ROUTE_CONFIG_NAME: &str = "switchyard";
/// Listener names.
pub const HTTP_LISTENER: &str = "http";
pub const HTTPS_LISTENER: &str = "https";
pub const PROBE_LISTENER: &str = "probe";
/// Headers of an endpoint probe request (see DESIGN.md, "Cluster readiness").
pub const PROBE_ID_HEADER: &str = "x-switchyard-probe";
pub const PROBE_TOKEN_HEADER: &str = "x-switchyard-probe-token";
/// Response header of a version probe.
pub const VERSION_HEADER: &str = "x-switchyard-version";
/// Prefix of the names of the virtual hosts that answer version probes.
pub const VERSION_PROBE_VHOST_PREFIX: &str = "switchyard-probe/";
/// The virtual host that answers 404 for every probe host not (yet) installed.
pub const PROBE_CATCH_ALL_VHOST: &str = "switchyard-probe";
/// Every probe host name ends with this (see [`model::version_probe_host`]). User hosts in
/// `switchyard.invalid` are refused, and [`PROBE_CATCH_ALL_VHOST`] answers 404 for the
/// whole `*.probe.switchyard.invalid` wildcard, so a probe request never reaches a user's
/// backend (not even a user's `*` virtual host): "404" always means "not installed here".
pub const PROBE_DOMAIN_SUFFIX: &str = ".probe.switchyard.invalid";
/// The path the fleet's readiness probe asks on the probe port (the chart's
/// `readinessProbe`): Envoy answers it itself, 200 while it runs and does not fail its
/// health check (it fails it while draining). A hung Envoy answers nothing, so it stops
/// being ready and leaves the fleet the rollouts wait for, where a TCP connect (which
/// the kernel accepts for a frozen process) kept it in.
pub const READINESS_PATH: &str = "/ready";
/// The Host that endpoint-probe requests should carry: a probe that is not installed on an
/// Envoy then falls through the health-check filters to the catch-all 404.
pub const ENDPOINT_PROBE_HOST: &str = "endpoints.probe.switchyard.invalid";

/// The result of a translation: what to serve, and what was left out and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Translation {
    pub snapshot: xds::Snapshot,
    /// Sorted; empty when the whole configuration was served.
    pub problems: Vec<Problem>,
}

/// The inputs that routes and probes may refer to, by name, with the reasons why some
/// clusters cannot be used.
struct Inputs<'a> {
    clusters: &'a HashMap<String, model::Cluster>,
    /// Clusters that exist but that Envoy would reject, with the reason.
    invalid_clusters: &'a HashMap<String, String>,
    secrets: &'a HashMap<String, model::TlsSecret>,
}

impl Inputs<'_> {
    /// Why a reference to this cluster cannot be served, if it cannot.
    fn cluster_error(&self, name: &str) -> Option<String> {
        if let Some(reason) = self.invalid_clusters.get(name) {
            Some(format!("cluster {name:?} is invalid: {reason}"))
        } else if !self.clusters.contains_key(name) {
            Some(format!("cluster {name:?} is not defined"))
        } else {
            None
        }
    }

    /// Why the endpoints of this cluster cannot count as ready for a switch to it, if they
    /// cannot: every one is held after its Service's EndpointSlices were deleted. They keep
    /// traffic that is live on the cluster flowing, but a route moved there would be left
    /// with nothing once the hold ends.
    fn switch_error(&self, name: &str) -> Option<String> {
        let endpoints = &self.clusters.get(name)?.endpoints;
        (!endpoints.is_empty() && endpoints.iter().all(|e| e.leaving)).then(|| {
            format!(
                "cluster {name:?} has only held endpoints (its Service's EndpointSlices \
                 were deleted): they serve what is live on it, never a switch to it"
            )
        })
    }
}

/// Translates the routing model into the xDS resources every Envoy should serve: a fresh
/// [`Translator`] brought to `config`.
pub fn translate(config: &model::Config) -> Translation {
    Translator::new().update(config)
}

/// Indexes items by name. A name defined more than once with different content is
/// ambiguous: every definition of it is left out and reported, whatever the input order.
/// `content` gives the canonical content of an item (two items are the same definition
/// when their contents are equal); `kind` names what the items are, and `subject` what a
/// problem with one of them is about, by its name.
fn unique_by_name<'a, T>(
    items: &'a [T],
    name: impl Fn(&T) -> &str,
    (kind, subject): (&str, fn(String) -> Subject),
    content: impl Fn(&T) -> String,
    problems: &mut Vec<Problem>,
) -> BTreeMap<&'a str, &'a T> {
    // Sorted by name (stably), then one group per name: no allocation per item.
    let mut sorted: Vec<&'a T> = items.iter().collect();
    sorted.sort_by(|a, b| name(a).cmp(name(b)));
    let mut unique = Vec::with_capacity(sorted.len());
    for defs in sorted.chunk_by(|a, b| name(a) == name(b)) {
        let key = name(defs[0]);
        // Contents are compared only for names defined more than once: rendering every
        // item's content was most of the translation time.
        let mut distinct: BTreeMap<String, &'a T> = BTreeMap::new();
        if defs.len() > 1 {
            for def in defs {
                distinct.entry(content(def)).or_insert(def);
            }
        }
        if distinct.len() <= 1 {
            unique.push((key, defs[0]));
        } else {
            problems.push(Problem::new(
                subject(key.to_owned()),
                format!(
                    "{kind} {key:?} is defined {} times with {} different contents; all are left out",
                    defs.len(),
                    distinct.len()
                ),
            ));
        }
    }
    // Already in name order: the map is built in bulk.
    unique.into_iter().collect()
}

/// Canonical content: the JSON form (the model's Serialize impls are canonical).
fn serde_content<T: serde::Serialize>(item: &T) -> String {
    serde_json::to_string(item).unwrap_or_default()
}

/// A cluster's endpoints are a set: their order does not make a different definition.
fn cluster_content(c: &model::Cluster) -> String {
    let mut c = c.clone();
    c.endpoints.sort();
    serde_content(&c)
}

fn secret_content(s: &model::TlsSecret) -> String {
    // The key is not serialized; add it so that two different keys count as different.
    format!("{}{}", serde_content(s), s.private_key)
}

#[cfg(test)]
mod tests;
