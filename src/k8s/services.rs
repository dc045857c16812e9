//! Kubernetes Services as the core's lookup: what a backend (a TrafficRoute's, a Gateway
//! API backendRef) that names a Service port resolves to. Every front-end resolves its
//! backends here.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use k8s_openapi::api::core::v1::{Service, ServicePort};

use crate::api::proxy_config::ResolvedCluster;
use crate::api::traffic_route::Backend;
use switchyard_core::route::{ResolveError, ServiceLookup};

/// The cluster of the Service port `backend` names among `services` of `namespace`: what
/// a TrafficRoute's backend resolves to, for other front-ends (Gateway API backendRefs).
/// A port of `protocol`: TCP for requests and connections, UDP for datagrams.
pub fn service_cluster(
    namespace: &str,
    services: &[&Service],
    backend: &Backend,
    protocol: Protocol,
) -> Result<ResolvedCluster, ResolveError> {
    let mut index = ServiceIndex::new(Some(namespace), services);
    index.protocol = protocol;
    index.cluster(backend)
}

/// The transport protocol of a Service port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
        }
    }
}

/// The Services of one namespace, by name: the core's [`ServiceLookup`], for ports of
/// one protocol (TCP unless told).
pub(crate) struct ServiceIndex<'a> {
    by_name: BTreeMap<&'a str, &'a Service>,
    protocol: Protocol,
}

impl<'a> ServiceIndex<'a> {
    pub(crate) fn new(namespace: Option<&str>, services: &[&'a Service]) -> Self {
        let mut by_name: BTreeMap<&'a str, &'a Service> = BTreeMap::new();
        for &service in services {
            let Some(name) = service.metadata.name.as_deref() else {
                continue;
            };
            if let (Some(want), Some(have)) = (namespace, service.metadata.namespace.as_deref())
                && want != have
            {
                continue;
            }
            match by_name.entry(name) {
                Entry::Vacant(e) => {
                    e.insert(service);
                }
                // Two objects of one name (a stale cache): keep one, whatever their order.
                Entry::Occupied(mut e) => {
                    if tie_key(service) > tie_key(e.get()) {
                        e.insert(service);
                    }
                }
            }
        }
        Self {
            by_name,
            protocol: Protocol::Tcp,
        }
    }
}

fn tie_key(service: &Service) -> (Option<&str>, Option<&str>) {
    (
        service.metadata.uid.as_deref(),
        service.metadata.resource_version.as_deref(),
    )
}

impl ServiceLookup for ServiceIndex<'_> {
    fn cluster(&self, backend: &Backend) -> Result<ResolvedCluster, ResolveError> {
        let name = &backend.service;
        let service =
            self.by_name
                .get(name.as_str())
                .ok_or_else(|| ResolveError::ServiceNotFound {
                    service: name.clone(),
                })?;
        let unsupported = |message: String| ResolveError::UnsupportedBackend {
            service: name.clone(),
            message,
        };
        let spec = service.spec.as_ref();
        if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
            return Err(unsupported(
                "an ExternalName Service has no endpoints to route to".to_owned(),
            ));
        }
        let ports = spec.and_then(|s| s.ports.as_deref()).unwrap_or_default();
        let not_found = |port: String| ResolveError::PortNotFound {
            service: name.clone(),
            port,
        };
        let port = match (backend.port, &backend.port_name) {
            (Some(number), None) => {
                // A number may appear twice, once per protocol (53/TCP and 53/UDP).
                let mut same_number = ports.iter().filter(|p| p.port == number).peekable();
                let first = same_number
                    .peek()
                    .copied()
                    .ok_or_else(|| not_found(number.to_string()))?;
                match same_number.find(|p| self.is_wanted(p)) {
                    Some(p) => p,
                    None => {
                        return Err(unsupported(
                            self.not_wanted(&format!("port {number}"), first),
                        ));
                    }
                }
            }
            (None, Some(port_name)) => {
                let p = ports
                    .iter()
                    .find(|p| p.name.as_deref() == Some(port_name.as_str()))
                    .ok_or_else(|| not_found(port_name.clone()))?;
                if !self.is_wanted(p) {
                    return Err(unsupported(
                        self.not_wanted(&format!("port {port_name:?}"), p),
                    ));
                }
                p
            }
            // The spec's check refused every other combination before.
            _ => {
                return Err(unsupported("give exactly one of port, portName".to_owned()));
            }
        };
        Ok(ResolvedCluster {
            namespace: None,
            service: name.clone(),
            port: port.port,
            port_name: port.name.clone().unwrap_or_default(),
            http2: is_http2(port.app_protocol.as_deref()),
            ..ResolvedCluster::default()
        })
    }
}

impl ServiceIndex<'_> {
    fn is_wanted(&self, port: &ServicePort) -> bool {
        port.protocol.as_deref().unwrap_or("TCP") == self.protocol.name()
    }

    fn not_wanted(&self, what: &str, port: &ServicePort) -> String {
        format!(
            "{what} is {}; a {} port is needed",
            port.protocol.as_deref().unwrap_or("TCP"),
            self.protocol.name()
        )
    }
}

/// Upstream HTTP/2 without TLS: appProtocol `h2c`, `kubernetes.io/h2c` or `grpc`.
fn is_http2(app_protocol: Option<&str>) -> bool {
    app_protocol.is_some_and(|p| {
        ["h2c", "kubernetes.io/h2c", "grpc"]
            .iter()
            .any(|known| p.eq_ignore_ascii_case(known))
    })
}
