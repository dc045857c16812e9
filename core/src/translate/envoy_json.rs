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
//! - Private keys are redacted to `"[redacted]"`, the text Envoy puts in their place.
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

use std::sync::OnceLock;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
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
use envoy_types::pb::envoy::extensions::http::early_header_mutation::header_mutation::v3::HeaderMutation as EarlyHeaderMutation;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    DownstreamTlsContext, Secret, secret,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};
use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use serde_json::{Map, Value, json};

use crate::xds::{Resource, Snapshot};

/// What Envoy prints in place of a sensitive field (`[redacted]`, its MessageUtil::redact).
pub const REDACTED: &str = "[redacted]";

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
        "resource": any_json(&redacted(&resource.body))?,
    }))
}

/// An `Any` expanded: `"@type"` and the fields of its message, nested `Any`s expanded
/// (prost-reflect finds their types in the same pool). Keys sorted.
pub fn any_json(any: &Any) -> Result<Value, Error> {
    let name = any.type_url.rsplit('/').next().unwrap_or_default();
    let descriptor = pool()
        .get_message_by_name(name)
        .ok_or_else(|| Error::UnknownType(any.type_url.clone()))?;
    let message =
        DynamicMessage::decode(descriptor, any.value.as_slice()).map_err(|e| Error::Decode {
            type_url: any.type_url.clone(),
            message: e.to_string(),
        })?;
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

/// A Secret with its private key replaced by [`REDACTED`]; any other `Any` as it is. The
/// printed configuration goes to terminals, logs and bug reports: a key must never.
fn redacted(any: &Any) -> Any {
    if any.type_url != Secret::type_url() {
        return any.clone();
    }
    let Ok(mut s) = Secret::decode(any.value.as_slice()) else {
        // Printed as the bytes are: the printer then fails to decode them and says so,
        // with no key in the message.
        return any.clone();
    };
    if let Some(secret::Type::TlsCertificate(cert)) = &mut s.r#type
        && let Some(key) = &mut cert.private_key
    {
        *key = DataSource {
            specifier: Some(Specifier::InlineString(REDACTED.to_owned())),
            ..Default::default()
        };
    }
    Any {
        type_url: any.type_url.clone(),
        value: s.encode_to_vec(),
    }
}

#[cfg(test)]
mod tests;
