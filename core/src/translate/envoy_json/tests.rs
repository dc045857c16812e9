use std::collections::HashMap;

use envoy_types::pb::envoy::r#type::v3::Percent;
use prost_reflect::{DeserializeOptions, ReflectMessage};

use super::*;
use crate::model;
use crate::translate::{proto, translate};
use crate::xds::snapshot::{CLUSTER, LISTENER, SECRET};

/// A virtual host on HTTPS with its certificate, forwarding to one cluster.
fn config() -> model::Config {
    model::Config {
        listeners: model::ListenerSettings {
            probe_token: "tok".into(),
            ..Default::default()
        },
        virtual_hosts: vec![model::VirtualHost {
            listener: None,
            leaving: false,
            created: None,
            name: "ns/vh".into(),
            hosts: vec!["a.example.com".into()],
            tls: Some(model::VirtualHostTls {
                secret: "ns/cert".into(),
                redirect_http: true,
                listener_hostname: None,
            }),
            routes: vec![model::Route {
                name: "to-web".into(),
                path: model::PathMatch::Prefix("/".into()),
                headers: vec![],
                method: None,
                query: Vec::new(),
                action: model::RouteAction::Forward(model::Forward {
                    backends: vec![model::WeightedCluster {
                        cluster: "ns/web/80".into(),
                        weight: 1,
                        request_headers: model::HeaderEdits::default(),
                    }],
                    ..Default::default()
                }),
                request_headers: Default::default(),
                response_headers: Default::default(),
            }],
        }],
        clusters: vec![model::Cluster {
            name: "ns/web/80".into(),
            service: model::ServiceRef {
                namespace: "ns".into(),
                name: "web".into(),
                port: 80,
            },
            settings: Default::default(),
            endpoints: vec![model::Endpoint {
                address: "10.0.0.1".into(),
                port: 8080,
                condition: model::EndpointCondition::READY,
                zone: None,
                leaving: false,
            }],
        }],
        secrets: vec![model::TlsSecret {
            name: "ns/cert".into(),
            certificate_chain: "CERT".into(),
            private_key: "TOPSECRET".into(),
        }],
        ..Default::default()
    }
}

fn resource<'a>(snapshot: &'a Snapshot, type_url: &str, name: &str) -> &'a Resource {
    &snapshot.resources(type_url).expect("the type")[name]
}

/// Whether two messages say the same, with the messages inside `Any`s compared decoded:
/// their bytes differ where a map (a JSON format's fields) was encoded in another order.
fn same_message(a: &DynamicMessage, b: &DynamicMessage) -> bool {
    if a.descriptor() != b.descriptor() {
        return false;
    }
    // A field not set reads as an empty Any, of no type.
    if a.descriptor().full_name() == "google.protobuf.Any" && a != b {
        let inner = |m: &DynamicMessage| {
            let any: Any = m.transcode_to().expect("an Any");
            let name = any
                .type_url
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned();
            let descriptor = pool().get_message_by_name(&name).expect("a known type");
            DynamicMessage::decode(descriptor, any.value.as_slice()).expect("decodes")
        };
        return same_message(&inner(a), &inner(b));
    }
    // Fields set on neither are equal: reading them would build defaults without end
    // (recursive types).
    a.descriptor()
        .fields()
        .all(|f| match (a.has_field(&f), b.has_field(&f)) {
            (false, false) => true,
            (true, true) => same_value(&a.get_field(&f), &b.get_field(&f)),
            _ => false,
        })
}

fn same_value(a: &prost_reflect::Value, b: &prost_reflect::Value) -> bool {
    use prost_reflect::Value as V;
    match (a, b) {
        (V::Message(a), V::Message(b)) => same_message(a, b),
        (V::List(a), V::List(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_value(a, b))
        }
        (V::Map(a), V::Map(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(k, v)| b.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn every_root_type_has_its_descriptor() {
    for name in root_types() {
        assert!(pool().get_message_by_name(&name).is_some(), "{name}");
    }
}

#[test]
fn a_listener_round_trips_through_its_json() {
    let snapshot = translate(&config()).snapshot;
    let any = pool()
        .get_message_by_name("google.protobuf.Any")
        .expect("Any is imported by the listener's files");
    let listener = |name| {
        let body: &Any = &resource(&snapshot, LISTENER, name).body;
        DynamicMessage::decode(any.clone(), body.encode_to_vec().as_slice()).expect("decodes")
    };
    // The comparison sees a difference (nested in the Anys, the route config's name).
    assert!(!same_message(&listener("http"), &listener("https")));
    for name in ["http", "https"] {
        let body = &resource(&snapshot, LISTENER, name).body;
        let json = any_json(body).expect("prints");
        // Back through the JSON mapping, as Envoy reads a config file: an Any again.
        let parsed = DynamicMessage::deserialize_with_options(
            any.clone(),
            &json,
            &DeserializeOptions::new(),
        )
        .expect("the JSON parses back");
        let parsed: Any = parsed.transcode_to().expect("an Any");
        assert_eq!(parsed.type_url, body.type_url);
        let original = listener(name);
        let back = DynamicMessage::decode(any.clone(), parsed.encode_to_vec().as_slice())
            .expect("the parsed Any");
        assert!(same_message(&original, &back), "{name}: {json}");
        assert_eq!(any_json(&parsed).expect("prints"), json, "{name}");
    }
}

#[test]
fn private_keys_are_redacted() {
    let snapshot = translate(&config()).snapshot;
    let json = resource_json(resource(&snapshot, SECRET, "ns/cert")).expect("prints");
    let text = json.to_string();
    assert!(!text.contains("TOPSECRET"), "{text}");
    let cert = &json["resource"]["tls_certificate"];
    assert_eq!(cert["private_key"]["inline_string"], REDACTED, "{text}");
    assert_eq!(cert["certificate_chain"]["inline_string"], "CERT", "{text}");
    let all = snapshot_json(&snapshot).expect("prints").to_string();
    assert!(!all.contains("TOPSECRET"));
}

#[test]
fn follows_config_dump_conventions() {
    let snapshot = translate(&config()).snapshot;
    let json = resource_json(resource(&snapshot, CLUSTER, "ns/web/80")).expect("prints");
    let cluster = &json["resource"];
    assert_eq!(cluster["@type"], CLUSTER);
    // Proto field names; a duration as a string; the default ROUND_ROBIN left out.
    assert!(cluster["connect_timeout"].is_string(), "{cluster}");
    assert!(cluster.get("lb_policy").is_none(), "{cluster}");
    assert!(cluster.get("connectTimeout").is_none(), "{cluster}");
    let listener = resource_json(resource(&snapshot, LISTENER, "https")).expect("prints");
    let filter = &listener["resource"]["filter_chains"][0]["filters"][0]["typed_config"];
    assert_eq!(
        filter["@type"],
        HttpConnectionManager::type_url(),
        "{listener}"
    );
}

#[test]
fn maps_print_in_key_order() {
    let health = HealthCheck {
        cluster_min_healthy_percentages: (0..24)
            .map(|i| (format!("ns/svc-{i:02}/80"), Percent { value: 50.0 }))
            .collect::<HashMap<_, _>>(),
        ..Default::default()
    };
    let any = proto::pack_bytes::<HealthCheck>(health.encode_to_vec());
    let first = any_json(&any).expect("prints");
    let keys: Vec<&String> = first["cluster_min_healthy_percentages"]
        .as_object()
        .expect("a map")
        .keys()
        .collect();
    let mut in_order = keys.clone();
    in_order.sort();
    assert_eq!(keys, in_order);
    for _ in 0..10 {
        assert_eq!(
            any_json(&any).expect("prints").to_string(),
            first.to_string()
        );
    }
}

#[test]
fn sensitive_fields_are_found_in_the_descriptors() {
    let fields = sensitive_fields();
    for name in [
        "envoy.extensions.transport_sockets.tls.v3.TlsCertificate.private_key",
        "envoy.extensions.transport_sockets.tls.v3.TlsCertificate.password",
        "envoy.extensions.transport_sockets.tls.v3.TlsSessionTicketKeys.keys",
    ] {
        assert!(fields.contains(name), "{name}: {fields:?}");
    }
}

#[test]
fn sensitive_fields_are_redacted_inside_anys_and_everything_under_them() {
    use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        CommonTlsContext, TlsCertificate, TlsSessionTicketKeys, downstream_tls_context,
    };
    let inline = |text: &str| DataSource {
        specifier: Some(Specifier::InlineString(text.into())),
        ..Default::default()
    };
    let tls = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificates: vec![TlsCertificate {
                certificate_chain: Some(inline("CERT")),
                private_key: Some(inline("KEY-IN-CONTEXT")),
                ..Default::default()
            }],
            ..Default::default()
        }),
        session_ticket_keys_type: Some(
            downstream_tls_context::SessionTicketKeysType::SessionTicketKeys(
                TlsSessionTicketKeys {
                    keys: vec![inline("TICKET-KEY")],
                },
            ),
        ),
        ..Default::default()
    };
    // Nested in an Any, as in a listener's transport socket.
    let listener = Listener {
        name: "l".into(),
        listener_filters: vec![
            envoy_types::pb::envoy::config::listener::v3::ListenerFilter {
                name: "not-really-a-filter".into(),
                config_type: Some(
                    envoy_types::pb::envoy::config::listener::v3::listener_filter::ConfigType::TypedConfig(
                        proto::pack(&tls),
                    ),
                ),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let json = any_json(&proto::pack(&listener))
        .expect("prints")
        .to_string();
    for secret in ["KEY-IN-CONTEXT", "TICKET-KEY"] {
        assert!(!json.contains(secret), "{secret}: {json}");
    }
    assert!(json.contains("CERT"), "{json}");
    assert_eq!(json.matches(REDACTED).count(), 2, "{json}");
}

#[test]
fn an_unknown_type_is_an_error() {
    let any = Any {
        type_url: "type.googleapis.com/example.Unknown".into(),
        value: Vec::new(),
    };
    assert!(matches!(any_json(&any), Err(Error::UnknownType(_))));
}
