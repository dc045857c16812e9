//! Envoy bootstrap configuration that points an Envoy at Switchyard's ADS server.

use std::fmt::Write;

use crate::xds::Protocol;
use crate::xds::localize::LISTEN_ADDRESS_KEY;

#[derive(Clone, Debug)]
pub struct Bootstrap {
    pub node_id: String,
    pub node_cluster: String,
    /// Switchyard replicas to connect to; Envoy fails over between them.
    pub xds: Vec<(String, u16)>,
    pub protocol: Protocol,
    /// Admin interface: never off loopback (it is unauthenticated and can mutate).
    pub admin_address: String,
    pub admin_port: u16,
    /// Bind every listener to this address instead of 0.0.0.0 (several Envoys on one host).
    pub listen_address: Option<String>,
    /// Mutual TLS to the xDS server; plaintext when `None`.
    pub tls: Option<XdsTls>,
}

/// Files (paths as Envoy sees them) for mutual TLS between Envoy and the xDS server: Envoy
/// presents `cert`/`key` and accepts a server certificate signed by `ca` whose subject
/// alternative names include the xDS host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdsTls {
    pub cert: String,
    pub key: String,
    pub ca: String,
}

impl Bootstrap {
    pub fn to_yaml(&self) -> String {
        let api_type = match self.protocol {
            Protocol::Sotw => "GRPC",
            Protocol::Delta => "DELTA_GRPC",
        };
        let endpoints: String = self
            .xds
            .iter()
            .map(|(host, port)| {
                format!(
                    "        - endpoint:\n            address:\n              socket_address: {{ address: \"{host}\", port_value: {port} }}\n"
                )
            })
            .collect();
        let mut metadata = String::new();
        if let Some(address) = &self.listen_address {
            let _ = write!(
                metadata,
                "\n  metadata:\n    {LISTEN_ADDRESS_KEY}: \"{address}\""
            );
        }
        let mut yaml = format!(
            r#"node:
  id: "{node_id}"
  cluster: "{node_cluster}"{metadata}
admin:
  address:
    socket_address: {{ address: "{admin_address}", port_value: {admin_port} }}
dynamic_resources:
  ads_config:
    api_type: {api_type}
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services:
    - envoy_grpc: {{ cluster_name: switchyard-xds }}
  cds_config: {{ ads: {{}}, resource_api_version: V3 }}
  lds_config: {{ ads: {{}}, resource_api_version: V3 }}
static_resources:
  clusters:
  - name: switchyard-xds
    type: STRICT_DNS
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        # A connection that stops answering (a black hole on the way, a wedged
        # replica) is closed within 10 s and Envoy connects again.
        explicit_http_config: {{ http2_protocol_options: {{ connection_keepalive: {{ interval: 5s, timeout: 5s }} }} }}
    load_assignment:
      cluster_name: switchyard-xds
      endpoints:
      - lb_endpoints:
{endpoints}"#,
            node_id = self.node_id,
            node_cluster = self.node_cluster,
            admin_address = self.admin_address,
            admin_port = self.admin_port,
        );
        if let Some(tls) = &self.tls {
            yaml.push_str(&self.transport_socket(tls));
        }
        yaml
    }

    /// The xDS cluster's `transport_socket` (indented as its key): TLS with Envoy's client
    /// certificate, HTTP/2 by ALPN, and the server certificate checked against the CA and
    /// the xDS host names. SNI is the first host, unless it is an IP address (RFC 6066).
    fn transport_socket(&self, tls: &XdsTls) -> String {
        let mut hosts: Vec<&str> = Vec::new();
        for (host, _) in &self.xds {
            if !hosts.contains(&host.as_str()) {
                hosts.push(host);
            }
        }
        let sni = hosts
            .first()
            .filter(|h| h.parse::<std::net::IpAddr>().is_err())
            .map(|h| format!("        sni: \"{h}\"\n"))
            .unwrap_or_default();
        let sans: String = hosts
            .iter()
            .map(|host| {
                let kind = if host.parse::<std::net::IpAddr>().is_ok() {
                    "IP_ADDRESS"
                } else {
                    "DNS"
                };
                format!("            - {{ san_type: {kind}, matcher: {{ exact: \"{host}\" }} }}\n")
            })
            .collect();
        format!(
            r#"    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
{sni}        common_tls_context:
          alpn_protocols: ["h2"]
          tls_certificates:
          - certificate_chain: {{ filename: "{cert}" }}
            private_key: {{ filename: "{key}" }}
          validation_context:
            trusted_ca: {{ filename: "{ca}" }}
            match_typed_subject_alt_names:
{sans}"#,
            cert = tls.cert,
            key = tls.key,
            ca = tls.ca,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bootstrap(hosts: &[&str], tls: Option<XdsTls>) -> Bootstrap {
        Bootstrap {
            node_id: "envoy-1".into(),
            node_cluster: "edge".into(),
            xds: hosts.iter().map(|h| (h.to_string(), 18000)).collect(),
            protocol: Protocol::Delta,
            admin_address: "127.0.0.1".into(),
            admin_port: 9901,
            listen_address: None,
            tls,
        }
    }

    fn tls() -> XdsTls {
        XdsTls {
            cert: "/tls/tls.crt".into(),
            key: "/tls/tls.key".into(),
            ca: "/tls/ca.crt".into(),
        }
    }

    fn parse(yaml: &str) -> serde_json::Value {
        serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
    }

    #[test]
    fn plaintext_has_no_transport_socket() {
        let yaml = bootstrap(&["xds.example"], None).to_yaml();
        assert!(!yaml.contains("transport_socket"), "{yaml}");
        let value = parse(&yaml);
        assert!(
            value["static_resources"]["clusters"][0]
                .get("transport_socket")
                .is_none()
        );
    }

    #[test]
    fn tls_adds_an_upstream_tls_context_to_the_xds_cluster_only() {
        let plain = parse(&bootstrap(&["xds.example", "xds.example"], None).to_yaml());
        let mut with_tls =
            parse(&bootstrap(&["xds.example", "xds.example"], Some(tls())).to_yaml());
        let cluster = with_tls["static_resources"]["clusters"][0]
            .as_object_mut()
            .expect("the xDS cluster");
        let socket = cluster
            .remove("transport_socket")
            .expect("transport_socket");
        assert_eq!(plain, with_tls, "nothing else changes");

        assert_eq!(socket["name"], "envoy.transport_sockets.tls");
        let context = &socket["typed_config"];
        assert_eq!(
            context["@type"],
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
        );
        assert_eq!(context["sni"], "xds.example");
        let common = &context["common_tls_context"];
        assert_eq!(common["alpn_protocols"], serde_json::json!(["h2"]));
        let certificate = &common["tls_certificates"][0];
        assert_eq!(certificate["certificate_chain"]["filename"], "/tls/tls.crt");
        assert_eq!(certificate["private_key"]["filename"], "/tls/tls.key");
        let validation = &common["validation_context"];
        assert_eq!(validation["trusted_ca"]["filename"], "/tls/ca.crt");
        assert_eq!(
            validation["match_typed_subject_alt_names"],
            serde_json::json!([{ "san_type": "DNS", "matcher": { "exact": "xds.example" } }]),
            "each host once"
        );
    }

    #[test]
    fn an_ip_address_is_matched_as_one_and_never_sent_as_sni() {
        let value = parse(&bootstrap(&["127.0.0.1"], Some(tls())).to_yaml());
        let context = &value["static_resources"]["clusters"][0]["transport_socket"]["typed_config"];
        assert!(context.get("sni").is_none(), "{context}");
        assert_eq!(
            context["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"],
            serde_json::json!([{ "san_type": "IP_ADDRESS", "matcher": { "exact": "127.0.0.1" } }])
        );
    }
}
