//! Per-node adjustments to a snapshot.
//!
//! - Several Envoys on one host (a laptop, a CI machine) cannot all bind 0.0.0.0 on the
//!   same ports. An Envoy whose node metadata carries `listen_address` gets every listener
//!   bound to that address instead.
//! - An Envoy that is about to stop (its Pod terminating) is drained: every HTTP
//!   connection closes after its next response (`Connection: close`, HTTP/2 GOAWAY), so
//!   that no client still holds a keep-alive connection to it when it exits, where the
//!   next request would meet a closed socket.
//!
//! - A delta Envoy takes route configurations in parts when the snapshot has them (see
//!   [`super::vhds`]): its listeners name the parts configurations.
//!
//! Everything else is identical for every node (I6).

use envoy_types::pb::envoy::config::core::v3::HttpProtocolOptions;
use envoy_types::pb::envoy::config::core::v3::{Node, address, socket_address};
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier::Rds;
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::pb::google::protobuf::value::Kind;
use prost::Message;
use std::sync::Arc;

use super::snapshot::{LISTENER, ROUTE, Resource, Snapshot};
use super::vhds;

pub const LISTEN_ADDRESS_KEY: &str = "listen_address";

pub fn listen_address(node: &Node) -> Option<String> {
    let value = node.metadata.as_ref()?.fields.get(LISTEN_ADDRESS_KEY)?;
    match &value.kind {
        Some(Kind::StringValue(address)) if !address.is_empty() => Some(address.clone()),
        _ => None,
    }
}

/// The snapshot with every listener bound to `address`. Shares everything else with the
/// snapshot it came from.
pub fn bind_listeners(snapshot: &Snapshot, address: &str) -> Snapshot {
    let mut bound = snapshot.clone();
    let listeners: Vec<Resource> = snapshot
        .resources(LISTENER)
        .into_iter()
        .flat_map(|resources| resources.values())
        .map(|resource| rebind(resource, address))
        .collect();
    for listener in listeners {
        bound.insert(std::sync::Arc::new(listener));
    }
    bound
}

/// The snapshot with every HTTP connection manager closing each connection after one
/// request: what a draining Envoy serves. The listeners change, so Envoy also drains the
/// connections of the ones they replace.
pub fn drain_connections(snapshot: &Snapshot) -> Snapshot {
    let mut drained = snapshot.clone();
    let listeners: Vec<Resource> = snapshot
        .resources(LISTENER)
        .into_iter()
        .flat_map(|resources| resources.values())
        .map(|resource| drain(resource))
        .collect();
    for listener in listeners {
        drained.insert(std::sync::Arc::new(listener));
    }
    drained
}

fn drain(resource: &Resource) -> Resource {
    edit_connection_managers(resource, |hcm| {
        hcm.common_http_protocol_options
            .get_or_insert_with(HttpProtocolOptions::default)
            .max_requests_per_connection = Some(UInt32Value { value: 1 });
    })
}

/// [`serve_routes_in_parts`] of the last snapshot asked for, made by the first delta
/// stream that needs it and shared by the others on that snapshot, rather than made by
/// each: its listeners are decoded, edited and encoded again. (A stream still on an
/// older snapshot makes that one again; the lock is held while it is made, so the
/// others wait for it instead of making it too.)
#[derive(Default)]
pub struct InParts(std::sync::Mutex<Option<(Arc<Snapshot>, Arc<Snapshot>)>>);

impl InParts {
    /// `source` served in parts; made by the first stream that asks for it.
    pub fn of(&self, source: &Arc<Snapshot>) -> Arc<Snapshot> {
        // Plain data: a panic elsewhere leaves nothing half-done.
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((made_from, in_parts)) = last.as_ref()
            && Arc::ptr_eq(made_from, source)
        {
            return in_parts.clone();
        }
        let in_parts = Arc::new(serve_routes_in_parts(source));
        *last = Some((source.clone(), in_parts.clone()));
        in_parts
    }
}

/// The snapshot with every listener naming the parts configuration of its route
/// configuration where the snapshot has one: what a delta Envoy serves. Shares
/// everything else with the snapshot it came from.
pub fn serve_routes_in_parts(snapshot: &Snapshot) -> Snapshot {
    let Some(routes) = snapshot.resources(ROUTE) else {
        return snapshot.clone();
    };
    let has_parts = |name: &str| routes.contains_key(&vhds::parts_name(name));
    if !routes.keys().any(|name| has_parts(name)) {
        return snapshot.clone();
    }
    let mut in_parts = snapshot.clone();
    let listeners: Vec<Resource> = snapshot
        .resources(LISTENER)
        .into_iter()
        .flat_map(|resources| resources.values())
        .map(|resource| {
            edit_connection_managers(resource, |hcm| {
                if let Some(Rds(rds)) = hcm.route_specifier.as_mut()
                    && has_parts(&rds.route_config_name)
                {
                    rds.route_config_name = vhds::parts_name(&rds.route_config_name);
                }
            })
        })
        .collect();
    for listener in listeners {
        in_parts.insert(std::sync::Arc::new(listener));
    }
    in_parts
}

/// The listener with `edit` applied to every HTTP connection manager of it.
fn edit_connection_managers(
    resource: &Resource,
    edit: impl Fn(&mut HttpConnectionManager),
) -> Resource {
    let Ok(mut listener) = Listener::decode(resource.body.value.as_slice()) else {
        // Our own translator produced it; leave anything undecodable untouched.
        return resource.clone();
    };
    for chain in listener
        .filter_chains
        .iter_mut()
        .chain(listener.default_filter_chain.as_mut())
    {
        for filter in &mut chain.filters {
            let Some(filter::ConfigType::TypedConfig(any)) = filter.config_type.as_mut() else {
                continue;
            };
            if !any.type_url.ends_with("HttpConnectionManager") {
                continue;
            }
            let Ok(mut hcm) = HttpConnectionManager::decode(any.value.as_slice()) else {
                continue;
            };
            edit(&mut hcm);
            any.value = hcm.encode_to_vec();
        }
    }
    let mut body = resource.body.clone();
    body.value = listener.encode_to_vec();
    Resource::new(resource.name.clone(), body)
}

fn rebind(resource: &Resource, address: &str) -> Resource {
    let Ok(mut listener) = Listener::decode(resource.body.value.as_slice()) else {
        // Our own translator produced it; leave anything undecodable untouched.
        return resource.clone();
    };
    if let Some(address::Address::SocketAddress(socket)) =
        listener.address.as_mut().and_then(|a| a.address.as_mut())
    {
        socket.address = address.to_string();
        if socket.port_specifier.is_none() {
            socket.port_specifier = Some(socket_address::PortSpecifier::PortValue(0));
        }
    }
    let mut body = resource.body.clone();
    body.value = listener.encode_to_vec();
    Resource::new(resource.name.clone(), body)
}

#[cfg(test)]
pub(crate) mod tests {
    use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain};
    use envoy_types::pb::google::protobuf::Any;
    use prost::Name;

    use super::*;

    /// An "http" listener with an HTTP connection manager, as the translator makes them.
    pub(crate) fn listener_with_hcm() -> Resource {
        let hcm = HttpConnectionManager {
            stat_prefix: "http".into(),
            ..Default::default()
        };
        let listener = Listener {
            name: "http".into(),
            filter_chains: vec![FilterChain {
                filters: vec![Filter {
                    name: "hcm".into(),
                    config_type: Some(filter::ConfigType::TypedConfig(Any {
                        type_url: HttpConnectionManager::type_url(),
                        value: hcm.encode_to_vec(),
                    })),
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        Resource::new(
            "http",
            Any {
                type_url: LISTENER.to_string(),
                value: listener.encode_to_vec(),
            },
        )
    }

    /// Whether this listener's connection manager closes connections after one request.
    pub(crate) fn closes_after_one_request(listener: &Any) -> bool {
        hcm_of_listener(listener)
            .common_http_protocol_options
            .and_then(|o| o.max_requests_per_connection)
            .is_some_and(|v| v.value == 1)
    }

    fn hcm_of(snapshot: &Snapshot) -> HttpConnectionManager {
        let resource = snapshot
            .resources(LISTENER)
            .and_then(|r| r.values().next())
            .expect("a listener");
        hcm_of_listener(&resource.body)
    }

    fn hcm_of_listener(body: &Any) -> HttpConnectionManager {
        let listener = Listener::decode(body.value.as_slice()).expect("a listener");
        let Some(filter::ConfigType::TypedConfig(any)) =
            listener.filter_chains[0].filters[0].config_type.clone()
        else {
            panic!("no typed config");
        };
        HttpConnectionManager::decode(any.value.as_slice()).expect("an HCM")
    }

    #[test]
    fn a_draining_node_closes_every_connection_after_one_request() {
        let snapshot = Snapshot::new([listener_with_hcm()]);
        let drained = drain_connections(&snapshot);
        let limit = hcm_of(&drained)
            .common_http_protocol_options
            .and_then(|o| o.max_requests_per_connection)
            .map(|v| v.value);
        assert_eq!(limit, Some(1));
        assert_eq!(hcm_of(&snapshot).common_http_protocol_options, None);
        // A changed listener, so Envoy replaces it and drains the old one's connections.
        assert_ne!(
            drained.type_version(LISTENER),
            snapshot.type_version(LISTENER)
        );
    }

    #[test]
    fn a_delta_node_names_the_parts_configuration_where_there_is_one() {
        use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::Rds as RdsConfig;

        let listener = edit_connection_managers(&listener_with_hcm(), |hcm| {
            hcm.route_specifier = Some(Rds(RdsConfig {
                route_config_name: "switchyard".into(),
                ..Default::default()
            }));
        });
        let route = |name: &str| {
            Resource::new(
                name,
                Any {
                    type_url: ROUTE.into(),
                    value: name.as_bytes().to_vec(),
                },
            )
        };
        let rds_name = |snapshot: &Snapshot| match hcm_of(snapshot).route_specifier {
            Some(Rds(rds)) => rds.route_config_name,
            other => panic!("{other:?}"),
        };
        let whole = Snapshot::new([listener.clone(), route("switchyard")]);
        assert_eq!(rds_name(&serve_routes_in_parts(&whole)), "switchyard");
        let both = Snapshot::new([listener, route("switchyard"), route("switchyard+vhds")]);
        assert_eq!(rds_name(&serve_routes_in_parts(&both)), "switchyard+vhds");
        assert_eq!(
            rds_name(&both),
            "switchyard",
            "the snapshot itself is untouched"
        );
    }
}
