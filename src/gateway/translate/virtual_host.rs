//! What a Gateway serves, by port: the rules of every route attached to the port's
//! listeners merged per hostname, most precedent first. Listeners on one port share it
//! (one Envoy listener), so a hostname reached through two of them is one virtual host.
//!
//! Listeners are isolated (GatewayHTTPListenerIsolation): a request goes to the most
//! specific listener whose hostname matches it, and only the routes attached there answer
//! it. Envoy picks the virtual host with the most specific domain, so it is enough that
//! a hostname served through a listener is one no more specific listener of the port
//! claims whole, and that each listener hostname has a virtual host of its own (empty, so
//! 404, when no route serves it) wherever a less specific listener would answer for it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use super::attach::{Attached, Ranked};
use super::gateway::{Listener, Listening};
use super::hostname::{self, Claim};
use super::{GatewayRule, GatewayVirtualHost, ListenerCertificate, PortConfig};
use switchyard_core::translate::NO_LISTENER;

/// The ports of `gateway`'s usable listeners, sorted, with their certificates and
/// virtual hosts (sorted by hostname).
pub fn ports(gateway: &Listening<'_>, attached: &[Attached]) -> Vec<PortConfig> {
    let mut ports: BTreeMap<i32, PortConfig> = BTreeMap::new();
    let mut hosts: BTreeMap<(i32, String), Vec<(Claim, &Ranked)>> = BTreeMap::new();
    let usable: Vec<(usize, &Listener<'_>)> = (gateway.listeners.iter().enumerate())
        .filter(|(_, l)| l.usable)
        .collect();
    // Each port's listeners: index and hostname. On a TLS port, one that routes attach to
    // but that cannot serve (its certificates do not resolve) still claims its hostname:
    // its connections are refused, never passed through to a less specific listener's
    // backends.
    let claims = |l: &Listener<'_>| l.usable || (l.attachable && l.spec.protocol == "TLS");
    let claimants: Vec<(usize, &Listener<'_>)> = (gateway.listeners.iter().enumerate())
        .filter(|(_, l)| claims(l))
        .collect();
    let mut on_port: BTreeMap<i32, Vec<(usize, Option<&str>)>> = BTreeMap::new();
    for &(index, listener) in &claimants {
        (on_port.entry(listener.spec.port).or_default())
            .push((index, listener.spec.hostname.as_deref()));
    }
    for &(index, listener) in claimants.iter().filter(|(_, l)| !l.usable) {
        let port = listener.spec.port;
        let neighbours = on_port.get(&port).map(Vec::as_slice).unwrap_or_default();
        if let Some(own) = listener.spec.hostname.as_deref()
            && (neighbours.iter()).any(|(i, l)| *i != index && hostname::admits(*l, own))
        {
            hosts.entry((port, own.to_ascii_lowercase())).or_default();
        }
    }
    for &(index, listener) in &usable {
        let port = listener.spec.port;
        let config = ports.entry(port).or_insert_with(|| PortConfig {
            port,
            protocol: listener.spec.protocol.clone(),
            certificates: Vec::new(),
            // The same for every listener of the port: it is the port's.
            client_validation: listener.client_validation.clone(),
            virtual_hosts: Vec::new(),
        });
        let own = listener.spec.hostname.as_deref();
        if !listener.secrets.is_empty() {
            config.certificates.push(ListenerCertificate {
                hostname: own.unwrap_or("*").to_ascii_lowercase(),
                secrets: listener.secrets.clone(),
            });
        }
        let neighbours = on_port.get(&port).map(Vec::as_slice).unwrap_or_default();
        // Its own virtual host, for when a less specific listener would answer for it.
        if let Some(own) = own
            && (neighbours.iter()).any(|(i, l)| *i != index && hostname::admits(*l, own))
        {
            hosts.entry((port, own.to_ascii_lowercase())).or_default();
        }
        let gateway_key = (gateway.namespace.to_owned(), gateway.name.to_owned());
        for a in attached
            .iter()
            .filter(|a| a.gateway == gateway_key && a.listener == index)
        {
            for served in &a.hostnames {
                let claimant = claimant(neighbours, &served.hostname).map(|(i, _)| i);
                if claimant != Some(index) {
                    // A more specific listener takes every request for this hostname.
                    continue;
                }
                hosts
                    .entry((port, served.hostname.clone()))
                    .or_default()
                    .extend(a.rules.iter().map(|r| (served.claim, r)));
            }
        }
    }
    for ((port, hostname), mut rules) in hosts {
        rules.sort_by_key(|(claim, r)| (Reverse(*claim), Reverse(r.specificity), r.order));
        // A route attached through two listeners of one port gives its rules twice.
        let mut seen = BTreeSet::new();
        rules.retain(|(_, r)| seen.insert(r.order));
        if let Some(config) = ports.get_mut(&port) {
            if forwards_connections(&config.protocol) {
                // A connection goes to one route: the most precedent (the oldest, as
                // attached), though every one attached is accepted.
                rules.truncate(1);
            }
            let rules = (rules.into_iter())
                .map(|(_, r)| on_port_rule(r.rule.clone(), port, &config.protocol))
                .collect();
            config.virtual_hosts.push(GatewayVirtualHost {
                hostname,
                rules,
                listener_hostname: None,
            });
        }
    }
    for config in ports.values_mut() {
        config
            .certificates
            .sort_by(|a, b| a.hostname.cmp(&b.hostname));
        let listeners = on_port
            .get(&config.port)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if config.protocol == "HTTPS" && listeners.len() > 1 {
            tag_listeners(config, listeners);
        }
        if config.protocol == "TLS" {
            // Which listener's mode (and certificate) each name is served with.
            for vh in &mut config.virtual_hosts {
                vh.listener_hostname = claimant(listeners, &vh.hostname)
                    .map(|(_, l)| l.unwrap_or("*").to_ascii_lowercase());
            }
        }
    }
    ports.into_values().collect()
}

/// Whether a port of `protocol` forwards connections whole (TLS, TCP), or datagrams
/// (UDP), not requests.
pub fn forwards_connections(protocol: &str) -> bool {
    matches!(protocol, "TLS" | "TCP" | "UDP")
}

/// Tags each virtual host of an HTTPS port with the listener that claims it, and gives
/// the port a virtual host for every other name (`*`): a request for a name no route
/// serves, come in on another listener's certificate, is misdirected too.
fn tag_listeners(config: &mut PortConfig, listeners: &[(usize, Option<&str>)]) {
    if !config.virtual_hosts.iter().any(|v| v.hostname == "*") {
        config.virtual_hosts.insert(
            0,
            GatewayVirtualHost {
                hostname: "*".to_owned(),
                rules: Vec::new(),
                listener_hostname: None,
            },
        );
    }
    for vh in &mut config.virtual_hosts {
        vh.listener_hostname = Some(match claimant(listeners, &vh.hostname) {
            None => NO_LISTENER.to_owned(),
            Some((_, None)) => "*".to_owned(),
            Some((_, Some(h))) => h.to_ascii_lowercase(),
        });
    }
}

/// Of a port's listeners (index, hostname), the one that takes every request for
/// `hostname`: the most specific whose hostname covers it whole.
fn claimant<'a>(
    listeners: &[(usize, Option<&'a str>)],
    hostname: &str,
) -> Option<(usize, Option<&'a str>)> {
    (listeners.iter().copied())
        .filter(|(_, l)| hostname::admits(*l, hostname))
        .max_by_key(|(_, l)| hostname::listener_rank(*l))
}

/// A rule as the listeners on `port` serve it. The Gateway API: a redirect that names
/// neither a scheme nor a port keeps the listener's port, and the Location names no port
/// that is the scheme's own (80 for HTTP, 443 for HTTPS), where the port the request was
/// sent to (the Host header's, which Envoy keeps) is right.
fn on_port_rule(mut rule: GatewayRule, port: i32, protocol: &str) -> GatewayRule {
    let own = match protocol {
        "HTTPS" => 443,
        _ => 80,
    };
    if port != own {
        rule.rule = rule.rule.redirecting_to_port(port);
    }
    rule
}
