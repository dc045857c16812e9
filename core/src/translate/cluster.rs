//! Clusters: one EDS cluster per Service port, endpoints delivered over ADS.

use envoy_types::pb::envoy::config::cluster::v3::{
    CircuitBreakers, Cluster, OutlierDetection, circuit_breakers::Thresholds,
    cluster::ClusterDiscoveryType, cluster::DiscoveryType, cluster::EdsClusterConfig,
    cluster::LbPolicy,
};
use envoy_types::pb::envoy::config::core::v3::{
    HealthCheck, Http2ProtocolOptions, RoutingPriority, TransportSocket,
    health_check::HealthChecker, health_check::HttpHealthCheck, transport_socket,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, SubjectAltNameMatcher, UpstreamTlsContext,
    common_tls_context::ValidationContextType, subject_alt_name_matcher::SanType,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions, http_protocol_options::ExplicitHttpConfig,
    http_protocol_options::UpstreamProtocolOptions,
    http_protocol_options::explicit_http_config::ProtocolConfig,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use envoy_types::pb::envoy::r#type::v3::Int64Range;
use envoy_types::pb::google::protobuf::Any;

use super::proto;
use crate::model;

/// The key of `typed_extension_protocol_options` for upstream HTTP settings.
pub const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// Why Envoy would reject this cluster, if it would.
pub fn validate(c: &model::Cluster) -> Result<(), String> {
    if c.name.is_empty() {
        return Err("cluster name is empty".to_owned());
    }
    let timeout = c.settings.connect_timeout;
    if timeout.is_zero() {
        return Err("connect timeout must be positive".to_owned());
    }
    proto::check_duration("connect timeout", timeout)?;
    if let Some(od) = &c.settings.outlier_detection {
        positive("outlier detection interval", od.interval)?;
        positive(
            "outlier detection base ejection time",
            od.base_ejection_time,
        )?;
        if od.max_ejection_percent > 100 {
            return Err(format!(
                "outlier detection: max ejection percent {} is more than 100",
                od.max_ejection_percent
            ));
        }
    }
    if let Some(tls) = &c.settings.tls {
        if tls.sni.is_empty() {
            return Err("upstream TLS needs a server name".to_owned());
        }
        if tls.ca_certificates.trim().is_empty() {
            return Err("upstream TLS needs CA certificates".to_owned());
        }
    }
    if let Some(hc) = &c.settings.health_check {
        positive("health check interval", hc.interval)?;
        positive("health check timeout", hc.timeout)?;
        if hc.unhealthy_threshold == 0 || hc.healthy_threshold == 0 {
            return Err("health check thresholds must be at least 1".to_owned());
        }
    }
    Ok(())
}

/// Envoy refuses zero intervals (and durations past its maximum).
fn positive(what: &str, d: std::time::Duration) -> Result<(), String> {
    if d.is_zero() {
        return Err(format!("{what} must be positive"));
    }
    proto::check_duration(what, d)
}

pub fn cluster(c: &model::Cluster) -> Cluster {
    let settings = &c.settings;
    let mut cluster = Cluster {
        name: c.name.clone(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: Some(proto::ads()),
            // Empty: the ClusterLoadAssignment has the cluster's name.
            service_name: String::new(),
        }),
        connect_timeout: Some(proto::duration(settings.connect_timeout)),
        lb_policy: lb_policy(settings.lb_policy) as i32,
        circuit_breakers: match (&settings.circuit_breakers, settings.udp) {
            (Some(cb), _) => Some(CircuitBreakers {
                thresholds: vec![Thresholds {
                    priority: RoutingPriority::Default as i32,
                    max_connections: cb.max_connections.and_then(proto::u32_value),
                    max_pending_requests: cb.max_pending_requests.and_then(proto::u32_value),
                    max_requests: cb.max_requests.and_then(proto::u32_value),
                    max_retries: cb.max_retries.and_then(proto::u32_value),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            (None, true) => Some(unlimited_sessions()),
            (None, false) => None,
        },
        outlier_detection: settings.outlier_detection.as_ref().map(outlier_detection),
        health_checks: settings.health_check.iter().map(health_check).collect(),
        transport_socket: (settings.tls.as_ref()).map(|tls| upstream_tls(tls, settings.http2)),
        ..Default::default()
    };
    if settings.http2 {
        let options = HttpProtocolOptions {
            upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                        Http2ProtocolOptions::default(),
                    )),
                },
            )),
            ..Default::default()
        };
        cluster
            .typed_extension_protocol_options
            .insert(HTTP_PROTOCOL_OPTIONS.to_owned(), proto::pack(&options));
    }
    cluster
}

/// Envoy's UDP proxy counts each session against its cluster's `max_connections` (1024 by
/// default) and drops the datagrams of any session past it: a UDP cluster has no such cap
/// unless its rule sets one.
pub fn unlimited_sessions() -> CircuitBreakers {
    CircuitBreakers {
        thresholds: vec![Thresholds {
            priority: RoutingPriority::Default as i32,
            max_connections: proto::u32_value(u32::MAX),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// TLS to the endpoints: SNI, the authorities their certificate must chain to, and the
/// names it must hold one of (the SNI when none are given). HTTP/2 is offered by ALPN: a
/// gRPC server refuses a TLS connection that does not negotiate it.
fn upstream_tls(tls: &model::UpstreamTls, http2: bool) -> TransportSocket {
    let exact = |san_type: SanType, name: &str| SubjectAltNameMatcher {
        san_type: san_type as i32,
        matcher: Some(StringMatcher {
            match_pattern: Some(MatchPattern::Exact(name.to_owned())),
            ..Default::default()
        }),
        ..Default::default()
    };
    let names = if tls.subject_alt_names.is_empty() {
        vec![exact(SanType::Dns, &tls.sni)]
    } else {
        (tls.subject_alt_names.iter())
            .map(|n| match n {
                model::SubjectAltName::Dns(name) => exact(SanType::Dns, name),
                model::SubjectAltName::Uri(uri) => exact(SanType::Uri, uri),
            })
            .collect()
    };
    let context = UpstreamTlsContext {
        sni: tls.sni.clone(),
        common_tls_context: Some(CommonTlsContext {
            // Presented when the backend asks for a client certificate, from SDS.
            tls_certificate_sds_secret_configs: (tls.client_certificate.iter())
                .map(|name| proto::sds(name))
                .collect(),
            validation_context_type: Some(ValidationContextType::ValidationContext(
                CertificateValidationContext {
                    trusted_ca: Some(proto::inline(&tls.ca_certificates)),
                    match_typed_subject_alt_names: names,
                    ..Default::default()
                },
            )),
            alpn_protocols: if http2 {
                vec!["h2".to_owned()]
            } else {
                Vec::new()
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    TransportSocket {
        name: super::listener::TLS_TRANSPORT_SOCKET.to_owned(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(proto::pack(
            &context,
        ))),
    }
}

fn outlier_detection(od: &model::OutlierDetection) -> OutlierDetection {
    OutlierDetection {
        consecutive_5xx: proto::u32_value(od.consecutive_5xx),
        interval: Some(proto::duration(od.interval)),
        base_ejection_time: Some(proto::duration(od.base_ejection_time)),
        max_ejection_percent: proto::u32_value(od.max_ejection_percent),
        ..Default::default()
    }
}

/// Any answer within `timeout` other than 2xx is a failure, and failures of every kind
/// count towards the unhealthy threshold (Envoy's default marks a host unhealthy on the
/// first non-200). Checks go on at `interval` while a cluster has no traffic too: a
/// cluster staged for a rollout has none, and its readiness must not wait a minute.
fn health_check(hc: &model::HealthCheck) -> HealthCheck {
    let interval = proto::duration(hc.interval);
    HealthCheck {
        timeout: Some(proto::duration(hc.timeout)),
        interval: Some(interval),
        no_traffic_interval: Some(interval),
        unhealthy_threshold: proto::u32_value(hc.unhealthy_threshold),
        healthy_threshold: proto::u32_value(hc.healthy_threshold),
        health_checker: Some(HealthChecker::HttpHealthCheck(HttpHealthCheck {
            host: hc.host.clone(),
            path: hc.path.clone(),
            expected_statuses: vec![Int64Range {
                start: 200,
                end: 300,
            }],
            retriable_statuses: vec![Int64Range {
                start: 100,
                end: 600,
            }],
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn lb_policy(policy: model::LbPolicy) -> LbPolicy {
    match policy {
        model::LbPolicy::RoundRobin => LbPolicy::RoundRobin,
        model::LbPolicy::LeastRequest => LbPolicy::LeastRequest,
        model::LbPolicy::Random => LbPolicy::Random,
        model::LbPolicy::RingHash => LbPolicy::RingHash,
        model::LbPolicy::Maglev => LbPolicy::Maglev,
    }
}

/// Packs a cluster deterministically (it has a map field).
pub fn pack(cluster: Cluster) -> Any {
    proto::pack_bytes::<Cluster>(proto::encode_with_sorted_map(cluster, |c| {
        &mut c.typed_extension_protocol_options
    }))
}

/// The name of the ClusterLoadAssignment an EDS cluster asks for.
pub fn eds_name(cluster: &Cluster) -> &str {
    match &cluster.eds_cluster_config {
        Some(eds) if !eds.service_name.is_empty() => &eds.service_name,
        _ => &cluster.name,
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
    use std::time::Duration;

    use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
    use prost::{Message, Name};

    use super::*;

    fn model_cluster(settings: model::ClusterSettings) -> model::Cluster {
        let service = model::ServiceRef {
            namespace: "ns".into(),
            name: "web".into(),
            port: 8080,
        };
        model::Cluster {
            name: model::cluster_name(&service, &settings),
            service,
            settings,
            endpoints: vec![],
        }
    }

    #[test]
    fn upstream_tls_sends_the_sni_and_checks_the_certificate_names() {
        let tls = |names: Vec<model::SubjectAltName>| model::ClusterSettings {
            tls: Some(model::UpstreamTls {
                sni: "abc.example.com".into(),
                ca_certificates: "CA PEM".into(),
                subject_alt_names: names,
                client_certificate: None,
            }),
            ..Default::default()
        };
        let context = |settings| {
            let c = cluster(&model_cluster(settings));
            let socket = c.transport_socket.expect("a transport socket");
            assert_eq!(socket.name, "envoy.transport_sockets.tls");
            let Some(transport_socket::ConfigType::TypedConfig(any)) = socket.config_type else {
                panic!("not typed")
            };
            UpstreamTlsContext::decode(any.value.as_slice()).unwrap()
        };
        let names = |ctx: &UpstreamTlsContext| -> Vec<(i32, String)> {
            let Some(ValidationContextType::ValidationContext(v)) = ctx
                .common_tls_context
                .as_ref()
                .and_then(|c| c.validation_context_type.clone())
            else {
                panic!("no validation context")
            };
            let Some(Specifier::InlineString(ca)) = v.trusted_ca.and_then(|t| t.specifier) else {
                panic!("CA not inline")
            };
            assert_eq!(ca, "CA PEM");
            (v.match_typed_subject_alt_names.iter())
                .map(|m| {
                    let Some(MatchPattern::Exact(name)) =
                        m.matcher.as_ref().and_then(|m| m.match_pattern.clone())
                    else {
                        panic!("not exact")
                    };
                    (m.san_type, name)
                })
                .collect()
        };
        // Without names given, the certificate must be for the server name.
        let ctx = context(tls(Vec::new()));
        assert_eq!(ctx.sni, "abc.example.com");
        assert_eq!(
            names(&ctx),
            [(SanType::Dns as i32, "abc.example.com".into())]
        );
        // With names, one of them instead.
        let ctx = context(tls(vec![
            model::SubjectAltName::Dns("other.example.com".into()),
            model::SubjectAltName::Uri("spiffe://cluster/web".into()),
        ]));
        assert_eq!(
            names(&ctx),
            [
                (SanType::Dns as i32, "other.example.com".into()),
                (SanType::Uri as i32, "spiffe://cluster/web".into())
            ]
        );
        // A client certificate is presented from SDS.
        assert!(
            (ctx.common_tls_context.as_ref())
                .is_some_and(|c| c.tls_certificate_sds_secret_configs.is_empty())
        );
        let mut presenting = tls(Vec::new());
        if let Some(t) = presenting.tls.as_mut() {
            t.client_certificate = Some("infra/client".into());
        }
        let ctx = context(presenting);
        let sds = &ctx
            .common_tls_context
            .unwrap()
            .tls_certificate_sds_secret_configs;
        assert_eq!(sds.len(), 1);
        assert_eq!(sds[0].name, "infra/client");
        assert!(sds[0].sds_config.is_some());
        // HTTP/2 over TLS is offered by ALPN; HTTP/1.1 offers none (the backend's default).
        let alpn = |ctx: UpstreamTlsContext| ctx.common_tls_context.unwrap().alpn_protocols;
        assert!(alpn(context(tls(Vec::new()))).is_empty());
        let mut h2 = tls(Vec::new());
        h2.http2 = true;
        assert_eq!(alpn(context(h2)), ["h2"]);
        // Plain clusters have no transport socket.
        assert!(
            cluster(&model_cluster(Default::default()))
                .transport_socket
                .is_none()
        );
        let mut bad = tls(Vec::new());
        if let Some(t) = bad.tls.as_mut() {
            t.ca_certificates.clear();
        }
        assert!(validate(&model_cluster(bad)).is_err());
    }

    #[test]
    fn a_policy_other_than_round_robin_is_a_cluster_of_its_own() {
        let c = cluster(&model_cluster(Default::default()));
        assert_eq!(c.lb_policy, LbPolicy::RoundRobin as i32);
        let maglev = cluster(&model_cluster(model::ClusterSettings {
            lb_policy: model::LbPolicy::Maglev,
            ..Default::default()
        }));
        assert_eq!(maglev.lb_policy, LbPolicy::Maglev as i32);
        assert!(maglev.name.starts_with("ns/web/8080/"), "{}", maglev.name);
    }

    #[test]
    fn eds_over_ads() {
        let c = cluster(&model_cluster(Default::default()));
        assert_eq!(c.name, "ns/web/8080");
        assert_eq!(
            c.cluster_discovery_type,
            Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32))
        );
        let eds = c.eds_cluster_config.as_ref().unwrap();
        assert!(matches!(
            eds.eds_config.as_ref().unwrap().config_source_specifier,
            Some(ConfigSourceSpecifier::Ads(_))
        ));
        assert_eq!(eds_name(&c), "ns/web/8080");
        assert_eq!(c.connect_timeout.unwrap().seconds, 2);
        assert!(c.typed_extension_protocol_options.is_empty());
        assert!(c.circuit_breakers.is_none());
    }

    #[test]
    fn http2_and_circuit_breakers() {
        let c = cluster(&model_cluster(model::ClusterSettings {
            lb_policy: Default::default(),
            connect_timeout: Duration::from_millis(250),
            http2: true,
            circuit_breakers: Some(model::CircuitBreakers {
                max_connections: Some(10),
                max_pending_requests: None,
                max_requests: Some(100),
                max_retries: Some(0),
            }),
            ..Default::default()
        }));
        assert_eq!(c.connect_timeout.unwrap().nanos, 250_000_000);
        let any = &c.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS];
        assert_eq!(any.type_url, HttpProtocolOptions::type_url());
        let options = HttpProtocolOptions::decode(any.value.as_slice()).unwrap();
        assert!(matches!(
            options.upstream_protocol_options,
            Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(_))
                }
            ))
        ));
        let t = &c.circuit_breakers.as_ref().unwrap().thresholds[0];
        assert_eq!(t.priority, RoutingPriority::Default as i32);
        assert_eq!(t.max_connections.unwrap().value, 10);
        assert!(t.max_pending_requests.is_none());
        assert_eq!(t.max_retries.unwrap().value, 0);

        let packed = pack(c.clone());
        assert_eq!(Cluster::decode(packed.value.as_slice()).unwrap(), c);
    }

    fn checked() -> model::ClusterSettings {
        model::ClusterSettings {
            outlier_detection: Some(model::OutlierDetection {
                consecutive_5xx: 3,
                interval: Duration::from_secs(1),
                base_ejection_time: Duration::from_secs(30),
                max_ejection_percent: 50,
            }),
            health_check: Some(model::HealthCheck {
                path: "/healthz".into(),
                host: "web".into(),
                interval: Duration::from_millis(500),
                timeout: Duration::from_millis(200),
                unhealthy_threshold: 2,
                healthy_threshold: 1,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn outlier_detection_and_health_checks() {
        let c = cluster(&model_cluster(checked()));
        let od = c.outlier_detection.as_ref().unwrap();
        assert_eq!(od.consecutive_5xx.unwrap().value, 3);
        assert_eq!(od.interval.unwrap().seconds, 1);
        assert_eq!(od.max_ejection_percent.unwrap().value, 50);
        let [hc] = c.health_checks.as_slice() else {
            panic!("one health check: {:?}", c.health_checks)
        };
        assert_eq!(hc.no_traffic_interval, hc.interval);
        assert_eq!(hc.interval.unwrap().nanos, 500_000_000);
        let Some(HealthChecker::HttpHealthCheck(http)) = &hc.health_checker else {
            panic!("an HTTP health check: {hc:?}")
        };
        assert_eq!(
            (http.path.as_str(), http.host.as_str()),
            ("/healthz", "web")
        );
        assert_eq!(
            (
                http.expected_statuses[0].start,
                http.expected_statuses[0].end
            ),
            (200, 300)
        );
        assert!(validate(&model_cluster(checked())).is_ok());
    }

    #[test]
    fn zero_intervals_are_refused() {
        let mut c = model_cluster(checked());
        if let Some(hc) = c.settings.health_check.as_mut() {
            hc.interval = Duration::ZERO;
        }
        assert_eq!(
            validate(&c).unwrap_err(),
            "health check interval must be positive"
        );
        let mut c = model_cluster(checked());
        if let Some(od) = c.settings.outlier_detection.as_mut() {
            od.base_ejection_time = Duration::ZERO;
        }
        assert_eq!(
            validate(&c).unwrap_err(),
            "outlier detection base ejection time must be positive"
        );
    }

    #[test]
    fn invalid_connect_timeouts() {
        let mut c = model_cluster(Default::default());
        assert!(validate(&c).is_ok());
        c.settings.connect_timeout = Duration::ZERO;
        assert_eq!(
            validate(&c).unwrap_err(),
            "connect timeout must be positive"
        );
        c.settings.connect_timeout = Duration::from_secs(u64::MAX);
        assert!(validate(&c).is_err());
    }
}
