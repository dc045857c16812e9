//! What a Gateway serves, by port: the rules of every route attached to the port's
//! listeners merged per hostname, most precedent first. Listeners on one port share it
//! (one Envoy listener), so a hostname reached through two of them is one virtual host.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use super::gateway::Listening;
use super::http_route::{Attached, Ranked};
use super::{GatewayRule, GatewayVirtualHost, ListenerCertificate, PortConfig};

/// The ports of `gateway`'s usable listeners, sorted, with their certificates and
/// virtual hosts (sorted by hostname).
pub fn ports(gateway: &Listening<'_>, attached: &[Attached]) -> Vec<PortConfig> {
    let mut ports: BTreeMap<i32, PortConfig> = BTreeMap::new();
    let mut hosts: BTreeMap<(i32, String), Vec<&Ranked>> = BTreeMap::new();
    for (index, listener) in gateway.listeners.iter().enumerate() {
        if !listener.usable {
            continue;
        }
        let port = listener.spec.port;
        let config = ports.entry(port).or_insert_with(|| PortConfig {
            port,
            protocol: listener.spec.protocol.clone(),
            certificates: Vec::new(),
            virtual_hosts: Vec::new(),
        });
        if !listener.secrets.is_empty() {
            config.certificates.push(ListenerCertificate {
                hostname: listener
                    .spec
                    .hostname
                    .as_deref()
                    .unwrap_or("*")
                    .to_ascii_lowercase(),
                secrets: listener.secrets.clone(),
            });
        }
        let gateway_key = (gateway.namespace.to_owned(), gateway.name.to_owned());
        for a in attached
            .iter()
            .filter(|a| a.gateway == gateway_key && a.listener == index)
        {
            for hostname in &a.hostnames {
                hosts
                    .entry((port, hostname.clone()))
                    .or_default()
                    .extend(a.rules.iter());
            }
        }
    }
    for ((port, hostname), mut rules) in hosts {
        rules.sort_by_key(|r| (Reverse(r.specificity), r.order));
        // A route attached through two listeners of one port gives its rules twice.
        rules.dedup_by_key(|r| r.order);
        if let Some(config) = ports.get_mut(&port) {
            let rules = (rules.into_iter())
                .map(|r| on_port(r.rule.clone(), port, &config.protocol))
                .collect();
            config
                .virtual_hosts
                .push(GatewayVirtualHost { hostname, rules });
        }
    }
    for config in ports.values_mut() {
        config
            .certificates
            .sort_by(|a, b| a.hostname.cmp(&b.hostname));
    }
    ports.into_values().collect()
}

/// A rule as the listeners on `port` serve it. The Gateway API: a redirect that names
/// neither a scheme nor a port keeps the listener's port, and the Location names no port
/// that is the scheme's own (80 for HTTP, 443 for HTTPS), where the port the request was
/// sent to (the Host header's, which Envoy keeps) is right.
fn on_port(mut rule: GatewayRule, port: i32, protocol: &str) -> GatewayRule {
    let own = match protocol {
        "HTTPS" => 443,
        _ => 80,
    };
    if port != own {
        rule.rule = rule.rule.redirecting_to_port(port);
    }
    rule
}
