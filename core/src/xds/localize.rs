//! Per-node adjustments to a snapshot.
//!
//! Several Envoys on one host (a laptop, a CI machine) cannot all bind 0.0.0.0 on the same
//! ports. An Envoy whose node metadata carries `listen_address` gets every listener bound to
//! that address instead; everything else is identical for every node (I6).

use envoy_types::pb::envoy::config::core::v3::{Node, address, socket_address};
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::google::protobuf::value::Kind;
use prost::Message;

use super::snapshot::{LISTENER, Resource, Snapshot};

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
