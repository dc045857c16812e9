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
        format!(
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
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: switchyard-xds
      endpoints:
      - lb_endpoints:
{endpoints}"#,
            node_id = self.node_id,
            node_cluster = self.node_cluster,
            admin_address = self.admin_address,
            admin_port = self.admin_port,
        )
    }
}
