//! The HTTP filters a route can turn on: CORS, a local rate limit and a request body
//! limit. Every connection manager carries them disabled; a route that asks for one
//! enables it with a configuration of its own (`typed_per_filter_config`). So routes
//! without them cost nothing, and changing one on a route changes the route configuration
//! only, never a listener (a listener change drains connections).

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::RuntimeFractionalPercent;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::XRateLimitHeadersRfcVersion;
use envoy_types::pb::envoy::extensions::filters::http::buffer::v3::{
    Buffer, BufferPerRoute, buffer_per_route,
};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::{Cors, CorsPolicy};
use envoy_types::pb::envoy::extensions::filters::http::local_ratelimit::v3::LocalRateLimit;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    RegexMatcher, StringMatcher, string_matcher::MatchPattern,
};
use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, TokenBucket, fractional_percent};
use envoy_types::pb::google::protobuf::Any;

use super::proto;
use crate::model;

pub const CORS_FILTER: &str = "envoy.filters.http.cors";
pub const RATE_LIMIT_FILTER: &str = "envoy.filters.http.local_ratelimit";
pub const BUFFER_FILTER: &str = "envoy.filters.http.buffer";

/// Stats of the rate limits: `http.<listener>.rate_limit.rate_limited` and so on.
const RATE_LIMIT_STATS: &str = "rate_limit";

/// The filters, in the order a request meets them: CORS first, so that a preflight is
/// answered without spending a token; the body limit last, just before the router.
pub fn disabled_filters() -> Vec<HttpFilter> {
    let filters = [
        (CORS_FILTER, proto::pack(&Cors::default())),
        (
            RATE_LIMIT_FILTER,
            proto::pack(&LocalRateLimit {
                stat_prefix: RATE_LIMIT_STATS.to_owned(),
                ..Default::default()
            }),
        ),
        (
            BUFFER_FILTER,
            // Required by the filter, used by no route: each route sets its own.
            proto::pack(&Buffer {
                max_request_bytes: proto::u32_value(1 << 20),
            }),
        ),
    ];
    filters
        .into_iter()
        .map(|(name, config)| HttpFilter {
            name: name.to_owned(),
            config_type: Some(http_filter::ConfigType::TypedConfig(config)),
            disabled: true,
            ..Default::default()
        })
        .collect()
}

/// The per-route configurations that turn the filters on for a forwarding route.
pub fn per_route(forward: &model::Forward) -> HashMap<String, Any> {
    let mut configs = HashMap::new();
    if let Some(cors) = &forward.cors {
        configs.insert(CORS_FILTER.to_owned(), proto::pack(&cors_policy(cors)));
    }
    if let Some(limit) = &forward.rate_limit {
        configs.insert(
            RATE_LIMIT_FILTER.to_owned(),
            proto::pack(&rate_limit(limit)),
        );
    }
    if let Some(bytes) = forward.max_request_bytes {
        let buffer = BufferPerRoute {
            r#override: Some(buffer_per_route::Override::Buffer(Buffer {
                max_request_bytes: proto::u32_value(bytes),
            })),
        };
        configs.insert(BUFFER_FILTER.to_owned(), proto::pack(&buffer));
    }
    configs
}

/// A preflight from an origin the policy does not allow is answered by Envoy (without CORS
/// headers) rather than forwarded: the backend is not asked what the route already decided,
/// as the Gateway API's CORS filter requires.
fn cors_policy(cors: &model::Cors) -> CorsPolicy {
    CorsPolicy {
        forward_not_matching_preflights: proto::bool_value(false),
        allow_origin_string_match: cors.allow_origins.iter().map(|o| origin(o)).collect(),
        allow_methods: cors.allow_methods.join(","),
        allow_headers: cors.allow_headers.join(","),
        expose_headers: cors.expose_headers.join(","),
        max_age: cors
            .max_age
            .map(|d| d.as_secs().to_string())
            .unwrap_or_default(),
        allow_credentials: cors
            .allow_credentials
            .then_some(true)
            .and_then(proto::bool_value),
        ..Default::default()
    }
}

/// `*` matches any origin; a `*` inside one, any run of characters other than `/`.
fn origin(pattern: &str) -> StringMatcher {
    let match_pattern = match origin_regex(pattern) {
        Some(regex) => MatchPattern::SafeRegex(RegexMatcher {
            regex,
            ..Default::default()
        }),
        None => MatchPattern::Exact(pattern.to_owned()),
    };
    StringMatcher {
        match_pattern: Some(match_pattern),
        ..Default::default()
    }
}

/// The regex of an origin pattern with a `*`; None for an exact origin.
fn origin_regex(pattern: &str) -> Option<String> {
    if pattern == "*" {
        Some(".*".to_owned())
    } else if pattern.contains('*') {
        let parts: Vec<String> = pattern.split('*').map(regex::escape).collect();
        Some(parts.join("[^/]*"))
    } else {
        None
    }
}

fn rate_limit(limit: &model::RateLimit) -> LocalRateLimit {
    let all = || {
        Some(RuntimeFractionalPercent {
            default_value: Some(FractionalPercent {
                numerator: 100,
                denominator: fractional_percent::DenominatorType::Hundred as i32,
            }),
            runtime_key: String::new(),
        })
    };
    LocalRateLimit {
        stat_prefix: RATE_LIMIT_STATS.to_owned(),
        token_bucket: Some(TokenBucket {
            max_tokens: limit.requests.saturating_add(limit.burst),
            tokens_per_fill: proto::u32_value(limit.requests),
            fill_interval: Some(proto::duration(limit.per)),
        }),
        filter_enabled: all(),
        filter_enforced: all(),
        enable_x_ratelimit_headers: XRateLimitHeadersRfcVersion::DraftVersion03 as i32,
        ..Default::default()
    }
}

/// What the model may not ask of these filters (the spec's check refuses it first).
pub fn forward_errors(forward: &model::Forward) -> Vec<String> {
    let mut errors = Vec::new();
    if let Some(cors) = &forward.cors {
        if cors.allow_origins.is_empty() {
            errors.push("CORS policy allows no origin".to_owned());
        }
        for o in &cors.allow_origins {
            if o.is_empty() {
                errors.push("CORS origin is empty".to_owned());
            } else if let Some(Err(e)) = origin_regex(o).map(|r| super::validate::regex(&r)) {
                errors.push(format!("CORS origin {o:?}: {e}"));
            }
        }
        let lists = [
            &cors.allow_methods,
            &cors.allow_headers,
            &cors.expose_headers,
        ];
        for item in lists.into_iter().flatten() {
            if item.is_empty() || !item.bytes().all(|b| b.is_ascii_graphic() && b != b',') {
                errors.push(format!("CORS list item {item:?} is not a token"));
            }
        }
    }
    if let Some(limit) = &forward.rate_limit {
        if limit.requests == 0 {
            errors.push("rate limit of 0 requests".to_owned());
        }
        // Envoy's token buckets refill at most every 50 ms.
        if limit.per < std::time::Duration::from_millis(50) {
            errors.push(format!("rate limit per {:?}: less than 50ms", limit.per));
        }
        if let Err(e) = proto::check_duration("rate limit interval", limit.per) {
            errors.push(e);
        }
    }
    if forward.max_request_bytes == Some(0) {
        errors.push("request body limit of 0 bytes".to_owned());
    }
    errors
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prost::{Message, Name};

    use super::*;

    fn forward() -> model::Forward {
        model::Forward {
            backends: vec![model::WeightedCluster {
                cluster: "ns/web/80".into(),
                weight: 1,
                request_headers: model::HeaderEdits::default(),
            }],
            cors: Some(Box::new(model::Cors {
                allow_origins: vec![
                    "https://app.example.com".into(),
                    "https://*.example.com".into(),
                ],
                allow_methods: vec!["GET".into(), "PUT".into()],
                max_age: Some(Duration::from_secs(600)),
                allow_credentials: true,
                ..model::Cors::default()
            })),
            rate_limit: Some(model::RateLimit {
                requests: 5,
                per: Duration::from_secs(60),
                burst: 2,
            }),
            max_request_bytes: Some(1024),
            ..model::Forward::default()
        }
    }

    #[test]
    fn every_filter_is_disabled_until_a_route_turns_it_on() {
        let filters = disabled_filters();
        let names: Vec<_> = filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, [CORS_FILTER, RATE_LIMIT_FILTER, BUFFER_FILTER]);
        assert!(filters.iter().all(|f| f.disabled));
        assert!(per_route(&model::Forward::default()).is_empty());
    }

    #[test]
    fn a_route_turns_on_what_it_asks_for() {
        let configs = per_route(&forward());
        let cors = CorsPolicy::decode(configs[CORS_FILTER].value.as_slice()).unwrap();
        assert_eq!(configs[CORS_FILTER].type_url, CorsPolicy::type_url());
        let patterns: Vec<_> = cors
            .allow_origin_string_match
            .iter()
            .map(|m| m.match_pattern.clone().unwrap())
            .collect();
        assert_eq!(
            patterns,
            [
                MatchPattern::Exact("https://app.example.com".into()),
                MatchPattern::SafeRegex(RegexMatcher {
                    regex: r"https://[^/]*\.example\.com".into(),
                    ..Default::default()
                }),
            ]
        );
        assert_eq!(cors.allow_methods, "GET,PUT");
        assert_eq!(cors.max_age, "600");
        assert_eq!(cors.allow_credentials, proto::bool_value(true));
        // A preflight from another origin is answered by Envoy, never forwarded.
        assert_eq!(
            cors.forward_not_matching_preflights,
            proto::bool_value(false)
        );

        let limit = LocalRateLimit::decode(configs[RATE_LIMIT_FILTER].value.as_slice()).unwrap();
        let bucket = limit.token_bucket.unwrap();
        assert_eq!(bucket.max_tokens, 7, "requests and burst");
        assert_eq!(bucket.tokens_per_fill, proto::u32_value(5));
        assert_eq!(
            bucket.fill_interval,
            Some(proto::duration(Duration::from_secs(60)))
        );
        assert_eq!(
            limit
                .filter_enforced
                .unwrap()
                .default_value
                .unwrap()
                .numerator,
            100
        );

        let buffer = BufferPerRoute::decode(configs[BUFFER_FILTER].value.as_slice()).unwrap();
        assert_eq!(
            buffer.r#override,
            Some(buffer_per_route::Override::Buffer(Buffer {
                max_request_bytes: proto::u32_value(1024)
            }))
        );
    }

    #[test]
    fn the_regex_of_an_origin_anchors_nothing_envoy_does_not() {
        // Envoy's safe_regex matches the whole value: no anchors needed, and dots escaped.
        assert_eq!(origin_regex("*").as_deref(), Some(".*"));
        assert_eq!(origin_regex("https://app.example.com"), None);
        assert_eq!(
            origin_regex("http://*.a-b.test:8080").as_deref(),
            Some(r"http://[^/]*\.a\-b\.test:8080")
        );
    }

    #[test]
    fn what_envoy_would_refuse_is_named() {
        let mut bad = forward();
        bad.cors = Some(Box::default());
        bad.rate_limit = Some(model::RateLimit {
            requests: 0,
            per: Duration::from_millis(10),
            burst: 0,
        });
        bad.max_request_bytes = Some(0);
        assert_eq!(
            forward_errors(&bad),
            [
                "CORS policy allows no origin",
                "rate limit of 0 requests",
                "rate limit per 10ms: less than 50ms",
                "request body limit of 0 bytes",
            ]
        );
        assert!(forward_errors(&forward()).is_empty());
    }
}
