//! A snapshot as Envoy itself shows its configuration in `/config_dump`: the protobuf
//! proto3 JSON mapping, with Envoy's conventions, so that what `switchyard translate`
//! prints can be diffed against a live Envoy (as `egctl x translate` does for Envoy
//! Gateway).
//!
//! - Field names are the proto names (`connect_timeout`, snake_case), not the camelCase
//!   of the JSON mapping's default: config_dump prints these.
//! - Every `Any` is expanded: `"@type"` and the fields of the message it holds, nested
//!   `Any`s too (HTTP connection manager, filters, TLS contexts, protocol options).
//! - Well-known types as the mapping writes them: durations `"2s"`, wrappers as bare
//!   values, enums by name, 64-bit integers as strings.
//! - Fields at their default are left out (config_dump does the same): a cluster with the
//!   default `lb_policy` (ROUND_ROBIN) shows none.
//! - Sensitive fields are redacted as Envoy redacts them (its `MessageUtil::redact`): every
//!   field marked `(udpa.annotations.sensitive)` (a Secret's private key, among others), and
//!   everything inside one, is `"[redacted]"` if a string or bytes, left out otherwise.
//!
//! The document is a list, one entry per resource, by type (in the order xDS sends them:
//! clusters, endpoints, listeners, routes, secrets) then name:
//! `{name, version, resource}`, where `resource` is the expanded `Any` (its `"@type"` names
//! the type, as in config_dump's `dynamic_active_clusters[].cluster`). Object keys are
//! sorted, as `jq -S` sorts them: the protobuf maps (filter configurations per route,
//! protocol options per name) are hash maps whose order would otherwise change from run to
//! run. Compare with `jq -S` of config_dump's part.
//!
//! The descriptors come from `envoy_descriptors.bin`, the part of envoy-types' own
//! descriptor set that the resources below need; `tests/envoy_descriptors.rs` generates it
//! and fails when it is stale.

use std::collections::HashSet;
use std::sync::OnceLock;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::access_loggers::stream::v3::StdoutAccessLog;
use envoy_types::pb::envoy::extensions::filters::http::buffer::v3::{Buffer, BufferPerRoute};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::{Cors, CorsPolicy};
use envoy_types::pb::envoy::extensions::filters::http::health_check::v3::HealthCheck;
use envoy_types::pb::envoy::extensions::filters::http::local_ratelimit::v3::LocalRateLimit;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::proxy_protocol::v3::ProxyProtocol;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::extensions::filters::udp::udp_proxy::v3::{
    Route as UdpRoute, UdpProxyConfig,
};
use envoy_types::pb::envoy::extensions::http::early_header_mutation::header_mutation::v3::HeaderMutation as EarlyHeaderMutation;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    DownstreamTlsContext, Secret, UpstreamTlsContext,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};
use prost_reflect::{
    DescriptorPool, DynamicMessage, ReflectMessage, SerializeOptions, Value as ReflectValue,
};
use serde_json::{Map, Value, json};

use crate::xds::{Resource, Snapshot};

/// What Envoy prints in place of a sensitive field (`[redacted]`, its MessageUtil::redact).
pub const REDACTED: &str = "[redacted]";

/// The field option that marks a field sensitive.
const SENSITIVE: &str = "udpa.annotations.sensitive";
const ANY: &str = "google.protobuf.Any";

/// The types the descriptor set is made for: the resources the translator emits, and every
/// message it packs into an `Any` (the resource builders' `proto::pack`). A type missing
/// here cannot be printed (the printer fails naming it); `tests/envoy_descriptors.rs` keeps
/// their files and the files these import.
pub fn root_types() -> Vec<String> {
    vec![
        Listener::full_name(),
        RouteConfiguration::full_name(),
        VirtualHost::full_name(),
        Cluster::full_name(),
        ClusterLoadAssignment::full_name(),
        Secret::full_name(),
        HttpConnectionManager::full_name(),
        TcpProxy::full_name(),
        UdpProxyConfig::full_name(),
        UdpRoute::full_name(),
        HealthCheck::full_name(),
        StdoutAccessLog::full_name(),
        Router::full_name(),
        EarlyHeaderMutation::full_name(),
        Cors::full_name(),
        CorsPolicy::full_name(),
        LocalRateLimit::full_name(),
        Buffer::full_name(),
        BufferPerRoute::full_name(),
        TlsInspector::full_name(),
        ProxyProtocol::full_name(),
        HttpProtocolOptions::full_name(),
        DownstreamTlsContext::full_name(),
        UpstreamTlsContext::full_name(),
    ]
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no descriptor for {0} (envoy_json::root_types lacks it)")]
    UnknownType(String),
    #[error("cannot decode {type_url}: {message}")]
    Decode { type_url: String, message: String },
    #[error("cannot print {type_url}: {message}")]
    Serialize { type_url: String, message: String },
}

/// The descriptors of envoy_descriptors.bin, decoded once.
pub fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        // Generated and checked by a test: failing to decode is a build defect, not input.
        DescriptorPool::decode(include_bytes!("envoy_descriptors.bin").as_slice())
            .expect("envoy_descriptors.bin is a FileDescriptorSet")
    })
}

/// The full names of the fields marked sensitive, found once in the pool's options.
pub fn sensitive_fields() -> &'static HashSet<String> {
    static FIELDS: OnceLock<HashSet<String>> = OnceLock::new();
    FIELDS.get_or_init(|| {
        let Some(sensitive) = pool().get_extension_by_name(SENSITIVE) else {
            // Not in the pool: no field is found sensitive, and a test fails (the private
            // key of a Secret must be among them).
            return HashSet::new();
        };
        pool()
            .all_messages()
            .flat_map(|m| m.fields().collect::<Vec<_>>())
            .filter(|f| f.options().get_extension(&sensitive).as_bool() == Some(true))
            .map(|f| f.full_name().to_owned())
            .collect()
    })
}

/// Every resource of the snapshot, by type then name, as described in the module doc.
pub fn snapshot_json(snapshot: &Snapshot) -> Result<Value, Error> {
    let mut out = Vec::new();
    for (_, resources) in snapshot.types() {
        for resource in resources.values() {
            out.push(resource_json(resource)?);
        }
    }
    Ok(Value::Array(out))
}

/// One resource: `{name, version, resource}`.
pub fn resource_json(resource: &Resource) -> Result<Value, Error> {
    Ok(json!({
        "name": resource.name,
        "version": resource.version,
        "resource": any_json(&resource.body)?,
    }))
}

/// An `Any` expanded: `"@type"` and the fields of its message, nested `Any`s expanded
/// (prost-reflect finds their types in the same pool). Keys sorted.
pub fn any_json(any: &Any) -> Result<Value, Error> {
    let mut message = unpack(&any.type_url, &any.value)?;
    // Before anything is printed: the printed configuration goes to terminals, logs and
    // bug reports, a key must never.
    redact(&mut message, false)?;
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(true);
    let fields = message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|e| Error::Serialize {
            type_url: any.type_url.clone(),
            message: e.to_string(),
        })?;
    let mut object = Map::new();
    object.insert("@type".to_owned(), Value::String(any.type_url.clone()));
    if let Value::Object(fields) = fields {
        object.extend(fields);
    }
    Ok(sorted(Value::Object(object)))
}

/// The value with every object's keys in order, whatever map serde_json is built with
/// (its `preserve_order` feature would keep the hash maps' random order).
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(object) => {
            let mut entries: Vec<(String, Value)> = object.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// The message an `Any` holds, by its type URL.
fn unpack(type_url: &str, bytes: &[u8]) -> Result<DynamicMessage, Error> {
    let name = type_url.rsplit('/').next().unwrap_or_default();
    let descriptor = pool()
        .get_message_by_name(name)
        .ok_or_else(|| Error::UnknownType(type_url.to_owned()))?;
    DynamicMessage::decode(descriptor, bytes).map_err(|e| Error::Decode {
        type_url: type_url.to_owned(),
        message: e.to_string(),
    })
}

/// Envoy's redaction: the sensitive fields, and every field under one (`inside`), strings
/// and bytes `"[redacted]"`, other values removed; the messages in `Any`s too.
fn redact(message: &mut DynamicMessage, inside: bool) -> Result<(), Error> {
    if message.descriptor().full_name() == ANY {
        return redact_any(message, inside);
    }
    let set: Vec<_> = message.fields().map(|(field, _)| field).collect();
    for field in set {
        let sensitive = inside || sensitive_fields().contains(field.full_name());
        if !redact_value(message.get_field_mut(&field), sensitive)? {
            message.clear_field(&field);
        }
    }
    Ok(())
}

/// Redacts the value in place; false when it must go instead (a number, a bool or an enum
/// under a sensitive field: Envoy clears those).
fn redact_value(value: &mut ReflectValue, inside: bool) -> Result<bool, Error> {
    match value {
        ReflectValue::Message(m) => redact(m, inside)?,
        ReflectValue::List(items) => {
            for item in items {
                if !redact_value(item, inside)? {
                    return Ok(false);
                }
            }
        }
        ReflectValue::Map(map) => {
            for item in map.values_mut() {
                if !redact_value(item, inside)? {
                    return Ok(false);
                }
            }
        }
        ReflectValue::String(s) if inside => *s = REDACTED.to_owned(),
        ReflectValue::Bytes(b) if inside => *b = REDACTED.as_bytes().to_vec().into(),
        _ => return Ok(!inside),
    }
    Ok(true)
}

/// The message an `Any` holds, decoded, redacted and encoded back in its place.
fn redact_any(any: &mut DynamicMessage, inside: bool) -> Result<(), Error> {
    let packed: Any = any.transcode_to().map_err(|e| Error::Decode {
        type_url: ANY.to_owned(),
        message: e.to_string(),
    })?;
    if packed.type_url.is_empty() {
        return Ok(());
    }
    let mut message = unpack(&packed.type_url, &packed.value)?;
    redact(&mut message, inside)?;
    any.set_field_by_name("value", ReflectValue::Bytes(message.encode_to_vec().into()));
    Ok(())
}

#[cfg(test)]
mod tests;
