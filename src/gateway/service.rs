//! Each Gateway's own address: a Service in the Envoy fleet's namespace (a Service selects
//! Pods of its own namespace only), selecting the fleet's Pods, one port per listener port,
//! each mapped to a fleet port of its own. Gateways on the same port then reach the
//! same Envoys through different addresses, and the fleet tells them apart by the port.
//!
//! The Services hold the allocation: a port keeps its fleet port for as long as its
//! Gateway listens on it. Pure: what to write, from what is there.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::translate::Infrastructure;
use crate::hash;
use crate::rollout::label_value;

/// Labels of a Gateway's Service: which Gateway it is for, and which controller wrote it
/// (a digest of its controllerName, which a label value cannot hold).
pub const GATEWAY_NAMESPACE_LABEL: &str = "switchyard.dev/gateway-namespace";
pub const GATEWAY_NAME_LABEL: &str = "switchyard.dev/gateway-name";
/// The label of the ProxyConfigs of a Gateway's units: the Gateway's name.
pub const GATEWAY_LABEL: &str = "switchyard.dev/gateway";
pub const CONTROLLER_LABEL: &str = "switchyard.dev/gateway-controller";

/// The annotation of a Gateway's Service naming its Gateway, `namespace/name`: a Gateway's
/// name may be longer than a label value.
pub const GATEWAY_ANNOTATION: &str = "switchyard.dev/gateway";

/// The value of [`CONTROLLER_LABEL`] for `controller_name`.
pub fn controller_label(controller_name: &str) -> String {
    hash::digest_of(&controller_name)[..16].to_owned()
}

/// Whether a Service was written by the controller whose label value is `label`.
pub fn written_by(service: &Service, label: &str) -> bool {
    service
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(CONTROLLER_LABEL))
        .is_some_and(|v| v == label)
}

/// The fleet ports Gateways' listener ports are mapped to.
pub const FLEET_PORTS: std::ops::RangeInclusive<i32> = 20000..=29999;

/// A Gateway and the listener ports it serves.
#[derive(Clone, Debug, PartialEq)]
pub struct Wanted {
    pub namespace: String,
    pub name: String,
    pub ports: BTreeSet<i32>,
}

/// (Gateway namespace, Gateway name).
pub type GatewayKey = (String, String);

/// The name of a Gateway's Service: readable, unique per Gateway, within 63 characters.
pub fn service_name(namespace: &str, name: &str) -> String {
    let digest = hash::digest_of(&(namespace, name));
    // A Gateway's name may hold dots; a Service's may not.
    let readable: String = name
        .chars()
        .take(40)
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let readable = readable.trim_end_matches('-');
    format!("gw-{readable}-{}", &digest[..8])
}

/// The Gateway a Service of ours is for: its annotation says; a Service written before
/// there was one has it in its labels.
pub fn gateway_of(service: &Service) -> Option<GatewayKey> {
    let annotated = (service.metadata.annotations.as_ref())
        .and_then(|a| a.get(GATEWAY_ANNOTATION))
        .and_then(|g| g.split_once('/'));
    if let Some((namespace, name)) = annotated {
        return Some((namespace.to_owned(), name.to_owned()));
    }
    let labels = service.metadata.labels.as_ref()?;
    Some((
        labels.get(GATEWAY_NAMESPACE_LABEL)?.clone(),
        labels.get(GATEWAY_NAME_LABEL)?.clone(),
    ))
}

/// For each wanted Gateway, its listener ports with their fleet ports: those it has kept,
/// then the next fleet ports nobody holds from `from` on (wrapping around the range), and
/// where the next search is to start. `ours` are the Services this controller wrote;
/// `others`, those of other controllers in the same namespace, whose ports are not to be
/// given again (a port both hold, taken by each before it saw the other's Service, stays
/// with the older Service: every controller decides alike, so one of them moves, where
/// both moved and took the next port together again); `listening`, the fleet ports
/// ProxyConfigs still define a listener on (a removed port's, while its old
/// configuration drains), not given to a new port until
/// they are gone: the fleet would keep the old listener there. A port left without one
/// (the range is used up) is missing from the answer.
///
/// The search goes on from the last port given rather than from the lowest: a Gateway
/// just deleted has no ProxyConfig left to say so, but every replica still serves its
/// listeners for the hold of deleted routes, and a new port given its fleet port would
/// wait that long behind them.
pub fn allocate(
    wanted: &[Wanted],
    ours: &[Service],
    others: &[Service],
    listening: &BTreeSet<i32>,
    from: i32,
) -> (BTreeMap<GatewayKey, Vec<(i32, i32)>>, i32) {
    let held: BTreeMap<GatewayKey, (BTreeMap<i32, i32>, Age)> = ours
        .iter()
        .filter_map(|s| Some((gateway_of(s)?, (fleet_ports(s), Age::of(s)))))
        .collect();
    // The oldest of other controllers' Services holding each port.
    let mut theirs: BTreeMap<i32, Age> = BTreeMap::new();
    for service in others {
        let age = Age::of(service);
        for fleet in fleet_ports(service).into_values() {
            let oldest = theirs.entry(fleet).or_insert_with(|| age.clone());
            if age < *oldest {
                *oldest = age.clone();
            }
        }
    }
    // Ports held by other controllers, and by a Gateway of ours that is wanted; a gone
    // Gateway's are free again.
    let mut taken: BTreeSet<i32> = theirs.keys().copied().collect();
    let mut kept_here: BTreeSet<i32> = BTreeSet::new();
    let mut out: BTreeMap<GatewayKey, Vec<(i32, i32)>> = BTreeMap::new();
    for w in wanted {
        let key = (w.namespace.clone(), w.name.clone());
        let (kept, age) = held.get(&key).cloned().unwrap_or_default();
        let ports: Vec<(i32, i32)> = w
            .ports
            .iter()
            .filter_map(|p| kept.get(p).map(|f| (*p, *f)))
            .filter(|(_, f)| FLEET_PORTS.contains(f) && !kept_here.contains(f))
            .filter(|(_, f)| theirs.get(f).is_none_or(|their| age < *their))
            .collect();
        kept_here.extend(ports.iter().map(|(_, f)| *f));
        taken.extend(ports.iter().map(|(_, f)| *f));
        out.insert(key, ports);
    }
    let from = from.clamp(*FLEET_PORTS.start(), *FLEET_PORTS.end());
    let mut free = (from..=*FLEET_PORTS.end())
        .chain(*FLEET_PORTS.start()..from)
        .filter(|p| !taken.contains(p) && !listening.contains(p));
    let mut next = from;
    for w in wanted {
        let key = (w.namespace.clone(), w.name.clone());
        let Some(ports) = out.get_mut(&key) else {
            continue;
        };
        for port in &w.ports {
            if ports.iter().any(|(p, _)| p == port) {
                continue;
            }
            if let Some(fleet) = free.next() {
                ports.push((*port, fleet));
                next = if fleet == *FLEET_PORTS.end() {
                    *FLEET_PORTS.start()
                } else {
                    fleet + 1
                };
            }
        }
        ports.sort();
    }
    (out, next)
}

/// When a Service was created, and its name: of two Services holding one fleet port, the
/// older keeps it (one not created yet, or of unknown age, counts as the youngest).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Age {
    unknown: bool,
    created: Option<k8s_openapi::jiff::Timestamp>,
    name: String,
}

impl Age {
    fn of(service: &Service) -> Age {
        let created = service.metadata.creation_timestamp.as_ref().map(|t| t.0);
        Age {
            unknown: created.is_none(),
            created,
            name: service.metadata.name.clone().unwrap_or_default(),
        }
    }
}

/// Where a controller starting anew searches for fleet ports: after the highest of its
/// own Services (the lowest, with none).
pub fn first_search(ours: &[Service]) -> i32 {
    let highest = (ours.iter())
        .flat_map(|s| fleet_ports(s).into_values())
        .max();
    match highest {
        Some(p) if FLEET_PORTS.contains(&p) && p < *FLEET_PORTS.end() => p + 1,
        _ => *FLEET_PORTS.start(),
    }
}

/// A Service's listener ports and the fleet ports they map to.
pub fn fleet_ports(service: &Service) -> BTreeMap<i32, i32> {
    service
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .filter_map(|p| match &p.target_port {
            Some(IntOrString::Int(target)) => Some((p.port, *target)),
            _ => None,
        })
        .collect()
}

/// The annotation that tells which of the Gateway's infrastructure labels and annotations
/// the Service carries (their digest): a change, a removal too, rewrites the Service.
pub const INFRASTRUCTURE_ANNOTATION: &str = "switchyard.dev/infrastructure";

/// The Service of a Gateway: in the fleet's namespace, selecting its Pods, with the labels
/// and annotations of its `spec.infrastructure` (Switchyard's own win where they meet).
/// Its ports are TCP but for `udp_ports` (those of UDP listeners).
pub fn service(
    gateway: &GatewayKey,
    ports: &[(i32, i32)],
    udp_ports: &BTreeSet<i32>,
    infrastructure: &Infrastructure,
    fleet: (&str, &BTreeMap<String, String>),
    service_type: &str,
    controller_label: &str,
) -> Service {
    let (namespace, name) = gateway;
    let (fleet_namespace, fleet_selector) = fleet;
    let mut labels = infrastructure.labels.clone();
    labels.extend([
        (GATEWAY_NAMESPACE_LABEL.to_owned(), namespace.clone()),
        (GATEWAY_NAME_LABEL.to_owned(), label_value(name)),
        (CONTROLLER_LABEL.to_owned(), controller_label.to_owned()),
    ]);
    let mut annotations = infrastructure.annotations.clone();
    annotations.insert(GATEWAY_ANNOTATION.to_owned(), format!("{namespace}/{name}"));
    if !infrastructure.is_empty() {
        let digest = hash::digest_of(infrastructure);
        annotations.insert(INFRASTRUCTURE_ANNOTATION.to_owned(), digest);
    }
    Service {
        metadata: ObjectMeta {
            name: Some(service_name(namespace, name)),
            namespace: Some(fleet_namespace.to_owned()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some(service_type.to_owned()),
            selector: Some(fleet_selector.clone()),
            ports: Some(
                ports
                    .iter()
                    .map(|(port, fleet)| ServicePort {
                        name: Some(format!("port-{port}")),
                        port: *port,
                        target_port: Some(IntOrString::Int(*fleet)),
                        protocol: Some(
                            if udp_ports.contains(port) {
                                "UDP"
                            } else {
                                "TCP"
                            }
                            .to_owned(),
                        ),
                        ..ServicePort::default()
                    })
                    .collect(),
            ),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The addresses a Gateway's Service offers: its load balancer's, else its cluster IP.
pub fn addresses(service: &Service) -> Vec<(String, String)> {
    let ingress: Vec<(String, String)> = service
        .status
        .iter()
        .filter_map(|s| s.load_balancer.as_ref())
        .flat_map(|lb| lb.ingress.iter().flatten())
        .filter_map(|i| match (&i.ip, &i.hostname) {
            (Some(ip), _) => Some(("IPAddress".to_owned(), ip.clone())),
            (None, Some(host)) => Some(("Hostname".to_owned(), host.clone())),
            (None, None) => None,
        })
        .collect();
    if !ingress.is_empty() {
        return ingress;
    }
    service
        .spec
        .iter()
        .flat_map(|s| s.cluster_ips.iter().flatten().chain(s.cluster_ip.iter()))
        .filter(|ip| !ip.is_empty() && *ip != "None")
        .map(|ip| ("IPAddress".to_owned(), ip.clone()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(name: &str, ports: &[i32]) -> Wanted {
        Wanted {
            namespace: "web".into(),
            name: name.into(),
            ports: ports.iter().copied().collect(),
        }
    }

    fn existing(name: &str, ports: &[(i32, i32)]) -> Service {
        service(
            &("web".into(), name.into()),
            ports,
            &BTreeSet::new(),
            &Infrastructure::default(),
            ("fleet", &BTreeMap::new()),
            "ClusterIP",
            "ours",
        )
    }

    #[test]
    fn a_gateways_infrastructure_labels_and_annotations_go_on_its_service() {
        let infrastructure = Infrastructure {
            labels: [
                ("team".to_owned(), "web".to_owned()),
                (CONTROLLER_LABEL.to_owned(), "theirs".to_owned()),
            ]
            .into(),
            annotations: [("cost-center".to_owned(), "42".to_owned())].into(),
        };
        let gateway = ("web".to_owned(), "edge".to_owned());
        let with = |infrastructure: &Infrastructure| {
            let fleet = ("fleet", &BTreeMap::new());
            let udp = BTreeSet::new();
            service(
                &gateway,
                &[],
                &udp,
                infrastructure,
                fleet,
                "ClusterIP",
                "ours",
            )
            .metadata
        };
        let meta = with(&infrastructure);
        let labels = meta.labels.unwrap_or_default();
        assert_eq!(labels["team"], "web");
        // Switchyard's own labels win: they tell its Services apart.
        assert_eq!(labels[CONTROLLER_LABEL], "ours");
        let annotations = meta.annotations.unwrap_or_default();
        assert_eq!(annotations["cost-center"], "42");
        // Their digest changes with any of them, a removal too: the Service is rewritten.
        let mut fewer = infrastructure.clone();
        fewer.annotations.clear();
        let digest =
            |m: ObjectMeta| m.annotations.unwrap_or_default()[INFRASTRUCTURE_ANNOTATION].clone();
        assert_ne!(digest(with(&fewer)), annotations[INFRASTRUCTURE_ANNOTATION]);
        let none = with(&Infrastructure::default())
            .annotations
            .unwrap_or_default();
        assert!(!none.contains_key(INFRASTRUCTURE_ANNOTATION));
    }

    #[test]
    fn gateways_on_one_port_get_fleet_ports_of_their_own() {
        let (out, next) = allocate(
            &[wanted("a", &[80, 443]), wanted("b", &[80])],
            &[],
            &[],
            &BTreeSet::new(),
            FIRST,
        );
        assert_eq!(next, 20003);
        assert_eq!(
            out[&("web".into(), "a".into())],
            [(80, 20000), (443, 20001)]
        );
        assert_eq!(out[&("web".into(), "b".into())], [(80, 20002)]);
    }

    #[test]
    fn a_port_keeps_its_fleet_port_and_a_gone_gateway_frees_its_own() {
        let before = [
            existing("a", &[(80, 20005)]),
            existing("gone", &[(80, 20000)]),
        ];
        let (out, _) = allocate(
            &[wanted("a", &[80, 8080]), wanted("b", &[80])],
            &before,
            &[],
            &BTreeSet::new(),
            FIRST,
        );
        assert_eq!(
            out[&("web".into(), "a".into())],
            [(80, 20005), (8080, 20000)]
        );
        assert_eq!(out[&("web".into(), "b".into())], [(80, 20001)]);
    }

    #[test]
    fn the_ports_of_another_controller_are_never_given() {
        let theirs = [existing("theirs", &[(80, 20000), (443, 20002)])];
        let (out, _) = allocate(
            &[wanted("a", &[80, 443])],
            &[],
            &theirs,
            &BTreeSet::new(),
            FIRST,
        );
        assert_eq!(
            out[&("web".into(), "a".into())],
            [(80, 20001), (443, 20003)]
        );
    }

    /// Two controllers that each gave a Gateway the same fleet port before they saw the
    /// other's Service: the younger Service's Gateway moves, the older keeps it, whichever
    /// controller decides.
    #[test]
    fn a_fleet_port_two_controllers_took_at_once_stays_with_the_older_service() {
        let aged = |name: &str, seconds: i64| {
            let mut service = existing(name, &[(80, 20000)]);
            service.metadata.creation_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::from_second(seconds).expect("a time"),
                ));
            service
        };
        // The fleet ports `ours` keeps for its Gateway, another controller holding `theirs`.
        let kept = |ours: &Service, theirs: &Service| {
            let gateway = gateway_of(ours).expect("a Gateway's Service");
            let (out, _) = allocate(
                &[wanted(&gateway.1, &[80])],
                std::slice::from_ref(ours),
                std::slice::from_ref(theirs),
                &BTreeSet::new(),
                FIRST,
            );
            out[&gateway].clone()
        };
        let (older, younger) = (aged("a", 100), aged("b", 101));
        assert_eq!(kept(&older, &younger), [(80, 20000)]);
        assert_eq!(kept(&younger, &older), [(80, 20001)]);
        // Created in the same second: the name decides, alike for both.
        let twin = aged("c", 100);
        assert_eq!(kept(&twin, &older), [(80, 20001)]);
    }

    #[test]
    fn a_fleet_port_whose_old_listener_still_drains_is_not_given_to_a_new_port() {
        // Gateway a's 443 is replaced by 8080 in one change: 443's fleet port is no longer
        // its Service's, but its old configuration still defines a listener there.
        let before = [existing("a", &[(80, 20000), (443, 20001)])];
        let listening = BTreeSet::from([20000, 20001]);
        let (out, _) = allocate(&[wanted("a", &[80, 8080])], &before, &[], &listening, FIRST);
        assert_eq!(
            out[&("web".into(), "a".into())],
            [(80, 20000), (8080, 20002)]
        );
        // Once it is gone, the port is free again.
        let (out, _) = allocate(
            &[wanted("a", &[80, 8080])],
            &before,
            &[],
            &BTreeSet::from([20000]),
            FIRST,
        );
        assert_eq!(
            out[&("web".into(), "a".into())],
            [(80, 20000), (8080, 20001)]
        );
    }

    const FIRST: i32 = *FLEET_PORTS.start();

    #[test]
    fn a_new_port_gets_the_next_fleet_port_not_one_a_gone_gateway_just_freed() {
        // Gateway gone had 20000 and was deleted: its listener is still served for the
        // hold of deleted routes, with nothing left to say so.
        let (first, next) = allocate(&[wanted("gone", &[80])], &[], &[], &BTreeSet::new(), FIRST);
        assert_eq!(first[&("web".into(), "gone".into())], [(80, 20000)]);
        let (out, _) = allocate(&[wanted("new", &[80])], &[], &[], &BTreeSet::new(), next);
        assert_eq!(out[&("web".into(), "new".into())], [(80, 20001)]);
        // At the end of the range, the search wraps around to the free ports below.
        let last = *FLEET_PORTS.end();
        let (out, next) = allocate(&[wanted("a", &[80, 443])], &[], &[], &BTreeSet::new(), last);
        assert_eq!(out[&("web".into(), "a".into())], [(80, last), (443, 20000)]);
        assert_eq!(next, 20001);
        // A controller starting anew searches after its own Services' ports.
        assert_eq!(
            first_search(&[existing("a", &[(80, 20007), (443, 20003)])]),
            20008
        );
        assert_eq!(first_search(&[]), FIRST);
    }

    #[test]
    fn service_names_are_labels_of_63_characters_at_most() {
        let long = "a".repeat(253);
        let name = service_name("ns", &long);
        assert!(name.len() <= 63, "{name}");
        assert_ne!(service_name("a", "b-c"), service_name("a-b", "c"));
        assert!(service_name("ns", "edge.example").starts_with("gw-edge-example-"));
    }

    #[test]
    fn a_long_gateway_name_is_cut_in_labels_and_whole_in_the_annotation() {
        let long = format!("{}.example", "a".repeat(240));
        let svc = existing(&long, &[(80, 20000)]);
        let labels = svc.metadata.labels.clone().unwrap_or_default();
        assert!(labels.values().all(|v| v.len() <= 63), "{labels:?}");
        assert_eq!(gateway_of(&svc), Some(("web".into(), long.clone())));
        assert_eq!(label_value("web"), "web");
        assert_ne!(label_value(&long), label_value(&format!("{long}x")));
        // A Service written before the annotation: its labels name the Gateway.
        let mut before = existing("web-gw", &[(80, 20000)]);
        before.metadata.annotations = None;
        assert_eq!(gateway_of(&before), Some(("web".into(), "web-gw".into())));
    }
}
