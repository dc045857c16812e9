//! Small protobuf helpers shared by the resource builders.

use std::collections::HashMap;
use std::hash::Hash;

use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, DataSource, HeaderValue, HeaderValueOption,
    config_source::ConfigSourceSpecifier, data_source, header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::SdsSecretConfig;
use envoy_types::pb::google::protobuf::{Any, BoolValue, Duration, UInt32Value};
use prost::{Message, Name};

/// The longest duration Envoy takes where it counts in milliseconds (timeouts): its
/// nanoseconds must fit in an i64 (about 292 years). Protobuf itself goes to 10000 years,
/// which Envoy refuses ("Duration out-of-range").
pub const MAX_DURATION_SECONDS: u64 = 9_223_372_036;

/// "Fetch this over the ADS stream, API v3."
pub fn ads() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    }
}

/// The secret `name`, fetched over the ADS stream (SDS).
pub fn sds(name: &str) -> SdsSecretConfig {
    SdsSecretConfig {
        name: name.to_owned(),
        sds_config: Some(ads()),
    }
}

/// `text` itself as a data source (PEM certificates, keys).
pub fn inline(text: &str) -> DataSource {
    DataSource {
        specifier: Some(data_source::Specifier::InlineString(text.to_owned())),
        ..Default::default()
    }
}

/// Converts a duration; callers validate it with [`check_duration`] first.
pub fn duration(d: std::time::Duration) -> Duration {
    Duration {
        seconds: i64::try_from(d.as_secs().min(MAX_DURATION_SECONDS)).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// Envoy rejects durations beyond protobuf's range.
pub fn check_duration(what: &str, d: std::time::Duration) -> Result<(), String> {
    if d.as_secs() > MAX_DURATION_SECONDS {
        Err(format!(
            "{what} of {}s is longer than the maximum of {MAX_DURATION_SECONDS}s",
            d.as_secs()
        ))
    } else {
        Ok(())
    }
}

pub fn bool_value(value: bool) -> Option<BoolValue> {
    Some(BoolValue { value })
}

pub fn u32_value(value: u32) -> Option<UInt32Value> {
    Some(UInt32Value { value })
}

pub fn header(key: &str, value: &str, action: HeaderAppendAction) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_owned(),
            value: value.to_owned(),
            ..Default::default()
        }),
        append_action: action as i32,
        ..Default::default()
    }
}

/// Packs a message whose encoding is deterministic: it must not contain a non-empty
/// `HashMap` field (see [`encode_with_sorted_map`] for those).
pub fn pack<M: Message + Name>(message: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: message.encode_to_vec(),
    }
}

pub fn pack_bytes<M: Name>(value: Vec<u8>) -> Any {
    Any {
        type_url: M::type_url(),
        value,
    }
}

/// Encodes a message with one `HashMap` field so that the bytes do not depend on the
/// map's (random) iteration order: the message without the map, then one single-entry
/// encoding per key in sorted order. Protobuf merges map entries from concatenated
/// encodings, so this decodes to the same message.
pub fn encode_with_sorted_map<M, K, V>(
    mut message: M,
    field: fn(&mut M) -> &mut HashMap<K, V>,
) -> Vec<u8>
where
    M: Message + Default,
    K: Ord + Hash + Eq,
{
    let map = std::mem::take(field(&mut message));
    let mut bytes = message.encode_to_vec();
    let mut entries: Vec<(K, V)> = map.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (key, value) in entries {
        let mut single = M::default();
        field(&mut single).insert(key, value);
        bytes.extend(single.encode_to_vec());
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::filters::http::health_check::v3::HealthCheck;
    use envoy_types::pb::envoy::r#type::v3::Percent;

    fn health_check(n: usize) -> HealthCheck {
        HealthCheck {
            pass_through_mode: bool_value(false),
            cluster_min_healthy_percentages: (0..n)
                .map(|i| (format!("ns/svc-{i}/80"), Percent { value: i as f64 }))
                .collect(),
            ..Default::default()
        }
    }

    fn sorted(h: &mut HealthCheck) -> &mut HashMap<String, Percent> {
        &mut h.cluster_min_healthy_percentages
    }

    #[test]
    fn sorted_map_encoding_is_deterministic_and_round_trips() {
        let first = encode_with_sorted_map(health_check(24), sorted);
        for _ in 0..20 {
            assert_eq!(encode_with_sorted_map(health_check(24), sorted), first);
        }
        let decoded = HealthCheck::decode(first.as_slice()).unwrap();
        assert_eq!(decoded, health_check(24));
    }

    #[test]
    fn plain_prost_encoding_of_a_hash_map_is_not_deterministic() {
        // Why encode_with_sorted_map exists: every HashMap gets its own random hash keys,
        // so the same message encodes to different bytes. If this ever stops holding, the
        // test above no longer proves anything.
        let encodings: std::collections::BTreeSet<Vec<u8>> =
            (0..20).map(|_| health_check(24).encode_to_vec()).collect();
        assert!(encodings.len() > 1);
    }

    #[test]
    fn durations_in_range() {
        assert!(
            check_duration(
                "timeout",
                std::time::Duration::from_secs(MAX_DURATION_SECONDS)
            )
            .is_ok()
        );
        assert!(
            check_duration(
                "timeout",
                std::time::Duration::from_secs(MAX_DURATION_SECONDS + 1)
            )
            .is_err()
        );
        let d = duration(std::time::Duration::from_millis(1500));
        assert_eq!((d.seconds, d.nanos), (1, 500_000_000));
    }
}
