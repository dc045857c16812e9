//! Route configurations served in parts (VHDS), so that a route change sends one virtual
//! host instead of every one.
//!
//! When the translator is asked to (`ListenerSettings::virtual_host_discovery`), it puts
//! beside each route configuration `R` (every virtual host inline, for SotW Envoys) a
//! *parts* configuration `R+vhds` with no virtual host and a `vhds` source, and each of
//! R's virtual hosts as a VirtualHost resource named `R+vhds/<id>`. A delta Envoy's
//! listeners name `R+vhds` (see [`crate::xds::localize::serve_routes_in_parts`]): Envoy
//! then subscribes to the namespace `R+vhds` of VirtualHost and takes every resource
//! under it. VHDS works over delta xDS only, so a SotW Envoy keeps the inline one.
//!
//! Envoy keys an update on the virtual host's own `name` and a removal on the
//! resource's: the two are the same here. The id is the virtual host's name with `/`
//! escaped, since Envoy takes the namespace to be everything before the last `/`.

use envoy_types::pb::google::protobuf::Any;

use super::snapshot::{Resource, VIRTUAL_HOST};

/// What a route configuration's parts configuration is called after it.
const PARTS_SUFFIX: &str = "+vhds";

/// The name of the parts configuration of route configuration `route_config`.
pub fn parts_name(route_config: &str) -> String {
    format!("{route_config}{PARTS_SUFFIX}")
}

/// Whether a route configuration's name is that of a parts configuration.
pub fn is_parts_name(name: &str) -> bool {
    name.ends_with(PARTS_SUFFIX)
}

/// The resource name of virtual host `vhost` of route configuration `route_config`.
pub fn virtual_host_name(route_config: &str, vhost: &str) -> String {
    let id = vhost.replace('%', "%25").replace('/', "%2F");
    format!("{}/{id}", parts_name(route_config))
}

/// The namespace a VirtualHost resource name belongs to: what a subscription names.
pub fn namespace(name: &str) -> &str {
    name.rsplit_once('/').map_or("", |(namespace, _)| namespace)
}

/// The VirtualHost resource of route configuration `route_config` from a virtual host as
/// the translator encoded it, renamed to its resource name: protobuf keeps the last value
/// of a field written twice, so the name is appended instead of re-encoding the message.
pub fn virtual_host(route_config: &str, vhost: &str, encoded: &[u8]) -> Resource {
    let name = virtual_host_name(route_config, vhost);
    let mut value = Vec::with_capacity(encoded.len() + name.len() + 4);
    value.extend_from_slice(encoded);
    prost::encoding::string::encode(1, &name, &mut value);
    Resource::new(
        name,
        Any {
            type_url: VIRTUAL_HOST.to_owned(),
            value,
        },
    )
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::route::v3::VirtualHost;
    use prost::Message;

    use super::*;

    #[test]
    fn a_virtual_host_resource_is_named_in_its_configurations_namespace() {
        let encoded = VirtualHost {
            name: "shop/web".into(),
            domains: vec!["shop.example.com".into()],
            ..Default::default()
        }
        .encode_to_vec();
        let resource = virtual_host("switchyard", "shop/web", &encoded);
        assert_eq!(resource.name, "switchyard+vhds/shop%2Fweb");
        assert_eq!(namespace(&resource.name), parts_name("switchyard"));
        let decoded = VirtualHost::decode(resource.body.value.as_slice()).expect("decodes");
        assert_eq!(decoded.name, resource.name, "Envoy keys updates on it");
        assert_eq!(decoded.domains, ["shop.example.com"]);
        assert_eq!(
            virtual_host_name("gw/ns/l", "50%/a"),
            "gw/ns/l+vhds/50%25%2Fa"
        );
        assert_eq!(namespace("gw/ns/l+vhds/50%25%2Fa"), "gw/ns/l+vhds");
    }
}
