//! What a Gateway rolls out, in units the TrafficRoute rollout already knows how to move:
//! each port of a Gateway is one unit (its listener, proven to be on every Envoy), and
//! each hostname on a port is one more (its virtual host). A unit resolves to the same
//! [`ResolvedRoute`] a TrafficRoute does, with the listener it is served on, so it goes
//! through the same two phases: new clusters ready everywhere before any route uses them,
//! old ones kept until every Envoy serves the new routes. Each unit's route is made by the
//! core's assembly step (`switchyard_core::route::assemble`) from the checked rules of the
//! translation, as a TrafficRoute's is: the same clusters and version recipe. Pure.

use std::collections::{BTreeMap, BTreeSet};

use switchyard_core::hash;
use switchyard_core::route::{
    ListenerProtocol, ResolvedListener, ResolvedRoute, ResolvedTls, Rule, SecretRef, assemble,
};

use super::service::GatewayKey;
use super::translate::{GatewayOutcome, GatewayVirtualHost, ListenerCertificate, PortConfig};
use crate::rollout::{LABEL_VALUE_MAX, fit};

/// A Gateway's probe twin of a fleet port sits this far below it (fleet ports are
/// 20000–29999, so probe ports 10000–19999: below the kernel's ephemeral range).
pub const PROBE_PORT_OFFSET: i32 = 10000;

/// One unit of a Gateway's rollout.
#[derive(Clone, Debug, PartialEq)]
pub struct Unit {
    pub gateway: GatewayKey,
    /// The Gateway's port (as its listeners name it).
    pub port: i32,
    /// None for the port's own unit.
    pub hostname: Option<String>,
    /// The "route" its ProxyConfigs belong to: `<name>-live`, `<name>-probe`.
    pub name: String,
    pub resolved: ResolvedRoute,
    /// The routes whose rules it serves: kind, and `namespace/name`.
    pub routes: BTreeSet<(&'static str, String)>,
}

/// Every unit of the Gateways: for each port that has a fleet port (`fleet_ports`, by
/// Gateway: port → fleet port), its own unit and one per hostname. Sorted by name.
pub fn units(
    gateways: &[GatewayOutcome],
    fleet_ports: &BTreeMap<GatewayKey, Vec<(i32, i32)>>,
) -> Vec<Unit> {
    let mut out = Vec::new();
    for g in gateways {
        let key = (g.namespace.clone(), g.name.clone());
        let Some(ports) = fleet_ports.get(&key) else {
            continue;
        };
        for port in &g.ports {
            let Some((_, fleet)) = ports.iter().find(|(p, _)| *p == port.port) else {
                continue;
            };
            let listener = listener(&key, port, *fleet);
            out.push(port_unit(&key, port, &listener));
            let presenting = g.backend_client_certificate.as_ref();
            for vh in &port.virtual_hosts {
                out.push(host_unit(&key, port, &listener, vh, presenting));
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The model's listener of a Gateway port on `fleet`.
fn listener(gateway: &GatewayKey, port: &PortConfig, fleet: i32) -> ResolvedListener {
    let protocol = port.protocol.to_ascii_lowercase();
    let tls = port.protocol == "HTTPS";
    // For names no virtual host has: the certificate of the listener without a hostname,
    // else the first one's.
    let default_certificate = tls
        .then(|| {
            certificate(&port.certificates, "*")
                .or_else(|| port.certificates.first()?.secrets.first().cloned())
        })
        .flatten()
        .map(|(namespace, name)| SecretRef { namespace, name });
    ResolvedListener {
        name: format!("{}/{}/{}/{protocol}", gateway.0, gateway.1, port.port),
        port: fleet,
        probe_port: fleet - PROBE_PORT_OFFSET,
        tls,
        default_certificate,
        client_validation: port.client_validation.clone().filter(|_| tls),
        protocol: match port.protocol.as_str() {
            "TLS" => ListenerProtocol::Tls,
            "TCP" => ListenerProtocol::Tcp,
            "UDP" => ListenerProtocol::Udp,
            _ => ListenerProtocol::Http,
        },
    }
}

/// The unit's name: the Gateway's, the port, and for a hostname a digest of it (hostnames
/// may hold `*`). It is the value of the ProxyConfigs' route label, so at most 63
/// characters: a Gateway name too long for that is cut and followed by a digest of it.
fn unit_name(gateway: &str, port: i32, hostname: Option<&str>) -> String {
    let suffix = match hostname {
        None => format!("-{port}"),
        Some(h) => format!("-{port}-{}", &hash::digest(h.as_bytes())[..10]),
    };
    let room = LABEL_VALUE_MAX - "gw-".len() - suffix.len();
    format!("gw-{}{suffix}", fit(gateway, room))
}

/// A port's own unit: its listener, with no virtual host.
fn port_unit(gateway: &GatewayKey, port: &PortConfig, listener: &ResolvedListener) -> Unit {
    Unit {
        gateway: gateway.clone(),
        port: port.port,
        hostname: None,
        name: unit_name(&gateway.1, port.port, None),
        resolved: assemble(Vec::new(), None, Vec::new(), Some(listener.clone())),
        routes: BTreeSet::new(),
    }
}

/// A hostname's unit; its TLS backends are sent the certificate `presenting`, the
/// Gateway's client certificate, when it has one.
fn host_unit(
    gateway: &GatewayKey,
    port: &PortConfig,
    listener: &ResolvedListener,
    vh: &GatewayVirtualHost,
    presenting: Option<&SecretRef>,
) -> Unit {
    let namespace = &gateway.0;
    // A tagged virtual host needs a filter chain of its own to tag its requests: for a
    // name no listener's certificate covers (`*` on a port without a listener for every
    // name), the port's default certificate.
    let default = || {
        (vh.listener_hostname.is_some())
            .then(|| listener.default_certificate.clone())
            .flatten()
            .map(|s| (s.namespace, s.name))
    };
    let tls = if listener.protocol == ListenerProtocol::Tls {
        // Its listener's certificate when that listener decrypts; none: passed through.
        (port.certificates.iter())
            .find(|c| Some(&c.hostname) == vh.listener_hostname.as_ref())
            .and_then(|c| c.secrets.first().cloned())
            .map(|(ns, name)| ResolvedTls {
                namespace: (ns != *namespace).then_some(ns),
                secret_name: name,
                redirect_http: false,
                listener_hostname: None,
            })
    } else {
        listener
            .tls
            .then(|| certificate(&port.certificates, &vh.hostname).or_else(default))
            .flatten()
            .map(|(ns, name)| ResolvedTls {
                namespace: (ns != *namespace).then_some(ns),
                secret_name: name,
                redirect_http: false,
                listener_hostname: vh.listener_hostname.clone(),
            })
    };
    // A connection passed through is the client's TLS: the Gateway adds none of its own.
    let passed_through = listener.protocol == ListenerProtocol::Tls && tls.is_none();
    // The unit's ProxyConfigs are in the Gateway's namespace: a cluster's namespace is
    // written out unless it is the Gateway's.
    let rules: Vec<Rule> = vh
        .rules
        .iter()
        .map(|r| {
            let route_ns = r.route.split_once('/').map_or("", |(ns, _)| ns);
            let rule = match (&r.passed_through, passed_through) {
                (Some(passed), true) => passed.clone(),
                _ => r.rule.clone(),
            };
            let rule = rule.moved(route_ns, namespace);
            match presenting {
                Some(secret) => rule.presenting(secret),
                None => rule,
            }
        })
        .collect();
    Unit {
        gateway: gateway.clone(),
        port: port.port,
        hostname: Some(vh.hostname.clone()),
        name: unit_name(&gateway.1, port.port, Some(&vh.hostname)),
        resolved: assemble(
            vec![vh.hostname.clone()],
            tls,
            rules,
            Some(listener.clone()),
        ),
        routes: (vh.rules.iter())
            .map(|r| (r.kind, r.route.clone()))
            .collect(),
    }
}

/// The certificate for `hostname`: that of the listener whose hostname matches it most
/// closely (the same name, then the longest wildcard that covers it, then none given).
fn certificate(certificates: &[ListenerCertificate], hostname: &str) -> Option<(String, String)> {
    let rank = |listener: &str| -> Option<usize> {
        if listener == hostname {
            Some(usize::MAX)
        } else if listener == "*" {
            Some(0)
        } else if let Some(suffix) = listener.strip_prefix('*') {
            let covered = hostname.ends_with(suffix)
                || hostname
                    .strip_prefix('*')
                    .is_some_and(|h| h.ends_with(suffix));
            covered.then_some(suffix.len())
        } else {
            None
        }
    };
    certificates
        .iter()
        .filter_map(|c| Some((rank(&c.hostname)?, c)))
        .max_by_key(|(rank, _)| *rank)
        .and_then(|(_, c)| c.secrets.first().cloned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::translate::GatewayRule;

    use switchyard_core::route::{Checks, Draft, ResolvedBackend, ResolvedCluster};

    fn rule(route: &str, service_ns: Option<&str>) -> GatewayRule {
        let backends = vec![ResolvedBackend {
            cluster: ResolvedCluster {
                namespace: service_ns.map(str::to_owned),
                service: "web".into(),
                port: 80,
                ..ResolvedCluster::default()
            },
            weight: 1,
            request_headers: None,
        }];
        let checked =
            switchyard_core::route::assemble::check("", Checks::Lowered, Draft::default())
                .expect("a rule without options passes the checks");
        GatewayRule {
            route: route.into(),
            kind: crate::gateway::translate::gateway::HTTP_ROUTE,
            rule: checked.rule("r".into(), backends),
            passed_through: None,
        }
    }

    fn gateway(ports: Vec<PortConfig>) -> GatewayOutcome {
        GatewayOutcome {
            namespace: "infra".into(),
            name: "edge".into(),
            generation: 1,
            conditions: Vec::new(),
            backend_client_certificate: None,
            listeners: Vec::new(),
            attached_listener_sets: 0,
            infrastructure: Default::default(),
            ports,
        }
    }

    #[test]
    fn each_port_and_each_hostname_is_a_unit_on_its_fleet_port() {
        let g = gateway(vec![PortConfig {
            port: 80,
            protocol: "HTTP".into(),
            certificates: Vec::new(),
            client_validation: None,
            virtual_hosts: vec![
                GatewayVirtualHost {
                    hostname: "*".into(),
                    rules: vec![rule("apps/a", None)],
                    listener_hostname: None,
                },
                GatewayVirtualHost {
                    hostname: "shop.example.com".into(),
                    rules: vec![rule("apps/b", Some("shop")), rule("infra/c", None)],
                    listener_hostname: None,
                },
            ],
        }]);
        let ports = BTreeMap::from([(("infra".into(), "edge".into()), vec![(80, 20000)])]);
        let units = units(&[g], &ports);
        assert_eq!(units.len(), 3);
        let port = units.iter().find(|u| u.hostname.is_none()).unwrap();
        assert_eq!(port.name, "gw-edge-80");
        let listener = port.resolved.listener.clone().unwrap();
        assert_eq!(listener.name, "infra/edge/80/http");
        assert_eq!((listener.port, listener.probe_port), (20000, 10000));
        assert!(port.resolved.virtual_host.hosts.is_empty());
        let shop = units
            .iter()
            .find(|u| u.hostname.as_deref() == Some("shop.example.com"))
            .unwrap();
        assert_eq!(
            shop.routes,
            BTreeSet::from([
                ("HTTPRoute", "apps/b".to_owned()),
                ("HTTPRoute", "infra/c".to_owned())
            ])
        );
        // Clusters are named from the Gateway's namespace: another namespace is written out.
        let namespaces: Vec<Option<&str>> = shop
            .resolved
            .virtual_host
            .rules
            .iter()
            .map(|r| r.backends[0].cluster.namespace.as_deref())
            .collect();
        assert_eq!(namespaces, [Some("shop"), None]);
        let any = units
            .iter()
            .find(|u| u.hostname.as_deref() == Some("*"))
            .unwrap();
        assert_eq!(
            any.resolved.virtual_host.rules[0].backends[0]
                .cluster
                .namespace
                .as_deref(),
            Some("apps")
        );
    }

    #[test]
    fn a_port_without_a_fleet_port_has_no_unit() {
        let g = gateway(vec![PortConfig {
            port: 80,
            protocol: "HTTP".into(),
            certificates: Vec::new(),
            client_validation: None,
            virtual_hosts: Vec::new(),
        }]);
        assert_eq!(units(&[g], &BTreeMap::new()), []);
    }

    #[test]
    fn the_version_changes_with_the_listener() {
        let port = PortConfig {
            port: 80,
            protocol: "HTTP".into(),
            certificates: Vec::new(),
            client_validation: None,
            virtual_hosts: Vec::new(),
        };
        let key = ("infra".to_owned(), "edge".to_owned());
        let a = port_unit(&key, &port, &listener(&key, &port, 20000));
        let b = port_unit(&key, &port, &listener(&key, &port, 20001));
        assert_ne!(a.resolved.version, b.resolved.version);
    }

    #[test]
    fn the_closest_listener_hostname_gives_the_certificate() {
        let cert = |hostname: &str, name: &str| ListenerCertificate {
            hostname: hostname.into(),
            secrets: vec![("infra".into(), name.into())],
        };
        let certs = [
            cert("*", "any"),
            cert("*.example.com", "wild"),
            cert("shop.example.com", "shop"),
        ];
        let name = |h: &str| certificate(&certs, h).map(|(_, n)| n);
        assert_eq!(name("shop.example.com").as_deref(), Some("shop"));
        assert_eq!(name("blog.example.com").as_deref(), Some("wild"));
        assert_eq!(name("*.example.com").as_deref(), Some("wild"));
        assert_eq!(name("other.org").as_deref(), Some("any"));
        assert_eq!(certificate(&certs[1..], "other.org"), None);
    }

    #[test]
    fn unit_names_fit_in_a_label_value() {
        let short = unit_name("web", 443, Some("*.example.com"));
        assert!(short.starts_with("gw-web-443-"), "{short}");
        assert_eq!(unit_name("web", 80, None), "gw-web-80");
        let long = "http-listener-isolation-with-hostname-intersection";
        let named = unit_name(long, 80, Some("abc.foo.example.com"));
        assert!(named.len() <= 63, "{named}");
        assert!(
            named.starts_with("gw-http-listener-isolation-with-"),
            "{named}"
        );
        let longest = "a".repeat(253);
        assert!(unit_name(&longest, 65535, Some("x")).len() <= 63);
        // Cut to the same prefix, told apart by the digest.
        let other = format!("{}b", &longest[..252]);
        assert_ne!(unit_name(&longest, 80, None), unit_name(&other, 80, None));
    }
}
