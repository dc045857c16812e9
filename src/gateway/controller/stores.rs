//! The stores the Gateway API controller reads: its own watches of the Gateway API's
//! kinds, Namespaces and ConfigMaps, and the process's shared ones; and the echoes of its
//! own writes, which are no change.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tracing::info;

use super::super::api::backendtlspolicies::BackendTlsPolicy;
use super::super::api::gatewayclasses::GatewayClass;
use super::super::api::gateways::Gateway;
use super::super::api::grpcroutes::GrpcRoute;
use super::super::api::httproutes::HttpRoute;
use super::super::api::listenersets::ListenerSet;
use super::super::api::referencegrants::ReferenceGrant;
use super::super::api::tcproutes::TcpRoute;
use super::super::api::tlsroutes::TlsRoute;
use super::super::api::udproutes::UdpRoute;
use super::super::service::GATEWAY_LABEL;
use super::super::translate::client_validation::CA_KEY;
use super::super::translate::{KnownCaBundle, KnownSecret};
use super::services;
use super::status::{
    CLASS_STATUS, GATEWAY_STATUS, GRPC_ROUTE_STATUS, LISTENER_SET_STATUS, POLICY_STATUS,
    ROUTE_STATUS, TCP_ROUTE_STATUS, TLS_ROUTE_STATUS, UDP_ROUTE_STATUS,
};
use crate::api::ProxyConfig;
use crate::k8s::index::Watches;
use crate::k8s::status::{StatusKind, StatusWriter};
use crate::k8s::watched::{Filter, Watched};

/// Every store the translation reads: the Gateway API's kinds, Namespaces and ConfigMaps,
/// watched here; Services, TLS Secrets, ProxyConfigs and the fleet's EndpointSlices, the
/// process's own watches (see [`Watches`]).
pub(super) struct Stores {
    pub classes: Watched<GatewayClass>,
    pub gateways: Watched<Gateway>,
    pub routes: Watched<HttpRoute>,
    /// None when the GRPCRoute CRD (standard since v1.1) was not installed when the
    /// controller started.
    pub grpc_routes: Option<Watched<GrpcRoute>>,
    /// None when the TLSRoute CRD (standard since v1.5) was not installed when the
    /// controller started; the same for TCPRoute's (standard since v1.5).
    pub tls_routes: Option<Watched<TlsRoute>>,
    pub tcp_routes: Option<Watched<TcpRoute>>,
    pub udp_routes: Option<Watched<UdpRoute>>,
    pub grants: Watched<ReferenceGrant>,
    pub namespaces: Watched<Namespace>,
    /// For the CA certificates of client validation and backend TLS (`ca.crt`).
    pub config_maps: Watched<ConfigMap>,
    /// None when the BackendTLSPolicy CRD was not installed when the controller started.
    pub backend_tls_policies: Option<Watched<BackendTlsPolicy>>,
    /// None when the ListenerSet CRD (standard since v1.5) was not installed when the
    /// controller started.
    pub listener_sets: Option<Watched<ListenerSet>>,
    pub shared: Watches,
}

/// Tells the echo of this controller's own writes from a change.
pub(super) struct Echoes {
    /// The ProxyConfigs the engine wrote.
    pub proxy_configs: Filter<ProxyConfig>,
    /// The statuses.
    pub status: StatusWriter,
}

impl Echoes {
    /// A status of `kind` the status writer wrote, heard back.
    fn status<K: serde::Serialize>(&self, kind: &Arc<StatusKind>) -> Filter<K> {
        let (status, kind) = (self.status.clone(), kind.clone());
        Arc::new(move |object: &K| {
            serde_json::to_value(object).is_ok_and(|object| status.is_echo(&kind, &object))
        })
    }
}

impl Stores {
    /// Starts the Gateway API's watches (in the process's scope) and has every store the
    /// translation reads bump `changes`, but for the `echoes` of this controller's writes.
    pub async fn start(
        client: &Client,
        shared: &Watches,
        fleet_service: &(String, String),
        changes: &Arc<watch::Sender<u64>>,
        echoes: &Echoes,
    ) -> Self {
        let all = watcher::Config::default;
        let backend_tls_policies = crd_installed(client, BACKEND_TLS_POLICY_CRD)
            .await
            .then(|| Watched::start(shared.scope.apis(client), all()));
        let listener_sets = crd_installed(client, LISTENER_SET_CRD)
            .await
            .then(|| Watched::start(shared.scope.apis(client), all()));
        let grpc_routes = crd_installed(client, GRPC_ROUTE_CRD)
            .await
            .then(|| Watched::start(shared.scope.apis(client), all()));
        let tls_routes = crd_installed(client, TLS_ROUTE_CRD)
            .await
            .then(|| Watched::start(shared.scope.apis(client), all()));
        let tcp_routes = crd_installed(client, TCP_ROUTE_CRD)
            .await
            .then(|| Watched::start(shared.scope.apis(client), all()));
        let udp_routes = crd_installed(client, UDP_ROUTE_CRD)
            .await
            .then(|| Watched::start(shared.scope.apis(client), all()));
        let stores = Self {
            classes: Watched::start(vec![Api::all(client.clone())], all()),
            gateways: Watched::start(shared.scope.apis(client), all()),
            routes: Watched::start(shared.scope.apis(client), all()),
            grpc_routes,
            tls_routes,
            tcp_routes,
            udp_routes,
            grants: Watched::start(shared.scope.apis(client), all()),
            namespaces: Watched::start(vec![Api::all(client.clone())], all()),
            config_maps: Watched::start(shared.scope.apis(client), all()),
            backend_tls_policies,
            listener_sets,
            shared: shared.clone(),
        };
        (stores.classes).notify_unless_echo(changes, None, echoes.status(&CLASS_STATUS));
        (stores.gateways).notify_unless_echo(changes, None, echoes.status(&GATEWAY_STATUS));
        (stores.routes).notify_unless_echo(changes, None, echoes.status(&ROUTE_STATUS));
        if let Some(routes) = &stores.grpc_routes {
            routes.notify_unless_echo(changes, None, echoes.status(&GRPC_ROUTE_STATUS));
        }
        if let Some(routes) = &stores.tls_routes {
            routes.notify_unless_echo(changes, None, echoes.status(&TLS_ROUTE_STATUS));
        }
        if let Some(routes) = &stores.tcp_routes {
            routes.notify_unless_echo(changes, None, echoes.status(&TCP_ROUTE_STATUS));
        }
        if let Some(routes) = &stores.udp_routes {
            routes.notify_unless_echo(changes, None, echoes.status(&UDP_ROUTE_STATUS));
        }
        stores.grants.notify(changes);
        stores.namespaces.notify(changes);
        stores.config_maps.notify(changes);
        if let Some(policies) = &stores.backend_tls_policies {
            policies.notify_unless_echo(changes, None, echoes.status(&POLICY_STATUS));
        }
        if let Some(sets) = &stores.listener_sets {
            sets.notify_unless_echo(changes, None, echoes.status(&LISTENER_SET_STATUS));
        }
        let services = services::read_by_translation(
            fleet_service,
            services::Named {
                routes: &stores.routes,
                grpc_routes: stores.grpc_routes.as_ref(),
                tls_routes: stores.tls_routes.as_ref(),
                tcp_routes: stores.tcp_routes.as_ref(),
                udp_routes: stores.udp_routes.as_ref(),
            },
        );
        shared.services.notify_if(changes, services);
        shared.tls_secrets.notify(changes);
        shared.fleet.notify(changes);
        // The Gateways' own: a TrafficRoute's rollout is no business of this controller.
        shared.proxy_configs.notify_unless_echo(
            changes,
            Some(Arc::new(|pc: &ProxyConfig| {
                pc.labels().contains_key(GATEWAY_LABEL)
            })),
            echoes.proxy_configs.clone(),
        );
        stores
    }

    pub async fn ready(&self) -> bool {
        self.classes.ready().await
            && self.gateways.ready().await
            && self.routes.ready().await
            && self.grants.ready().await
            && self.namespaces.ready().await
            && self.config_maps.ready().await
            && match &self.backend_tls_policies {
                Some(policies) => policies.ready().await,
                None => true,
            }
            && match &self.listener_sets {
                Some(sets) => sets.ready().await,
                None => true,
            }
            && match &self.grpc_routes {
                Some(routes) => routes.ready().await,
                None => true,
            }
            && match &self.tls_routes {
                Some(routes) => routes.ready().await,
                None => true,
            }
            && match &self.tcp_routes {
                Some(routes) => routes.ready().await,
                None => true,
            }
            && match &self.udp_routes {
                Some(routes) => routes.ready().await,
                None => true,
            }
            && self.shared.ready().await
    }
}

pub(super) fn owned<K>(watched: &Watched<K>) -> Vec<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    watched.state().iter().map(|k| (**k).clone()).collect()
}

/// A TLS Secret, and whether its certificate chain and key are PEM the fleet can serve
/// (the same check the fleet makes before it serves them).
pub fn known(secret: &Secret) -> KnownSecret {
    KnownSecret {
        namespace: secret.metadata.namespace.clone().unwrap_or_default(),
        name: secret.metadata.name.clone().unwrap_or_default(),
        valid_tls: secret.type_.as_deref() == Some("kubernetes.io/tls")
            && crate::k8s::tls_secrets::tls_data(secret).is_ok(),
    }
}

/// The CRD of BackendTLSPolicy: in the standard channel since v1.4, but a cluster may
/// have installed the Gateway API without it.
const BACKEND_TLS_POLICY_CRD: &str = "backendtlspolicies.gateway.networking.k8s.io";

/// The CRD of ListenerSet: in the standard channel since v1.5.
const LISTENER_SET_CRD: &str = "listenersets.gateway.networking.k8s.io";

/// The CRD of GRPCRoute: in the standard channel since v1.1.
const GRPC_ROUTE_CRD: &str = "grpcroutes.gateway.networking.k8s.io";

/// The CRDs of TLSRoute and TCPRoute: in the standard channel since v1.5.
const TLS_ROUTE_CRD: &str = "tlsroutes.gateway.networking.k8s.io";
const TCP_ROUTE_CRD: &str = "tcproutes.gateway.networking.k8s.io";
const UDP_ROUTE_CRD: &str = "udproutes.gateway.networking.k8s.io";

/// Whether the CRD `name` is installed (an error reading it counts as not: its kind is
/// then not watched, and says so).
async fn crd_installed(client: &Client, name: &str) -> bool {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds.get_opt(name).await {
        Ok(Some(crd)) if serves(&crd, VERSION) => true,
        Ok(Some(_)) => {
            // An older release's (TLSRoute and TCPRoute served v1alpha2 only before
            // v1.5): a watch of v1 would never list, and hold every other kind back.
            info!(
                crd = name,
                "does not serve {VERSION}: its kind is not served (install the CRDs of \
                 Gateway API v1.7, then restart the operator)"
            );
            false
        }
        Ok(None) => {
            info!(
                crd = name,
                "not installed: its kind is not served (restart the operator once it is)"
            );
            false
        }
        Err(error) => {
            info!(crd = name, %error, "cannot read the CRD: its kind is not served");
            false
        }
    }
}

/// The version of the Gateway API's kinds that the generated types read.
const VERSION: &str = "v1";

/// Whether `crd` serves `version`.
fn serves(crd: &CustomResourceDefinition, version: &str) -> bool {
    (crd.spec.versions.iter()).any(|v| v.name == version && v.served)
}

/// A ConfigMap as a CA certificate reference: its `ca.crt`.
pub fn known_ca(config_map: &ConfigMap) -> KnownCaBundle {
    KnownCaBundle {
        namespace: config_map.metadata.namespace.clone().unwrap_or_default(),
        name: config_map.metadata.name.clone().unwrap_or_default(),
        ca_crt: (config_map.data.as_ref()).and_then(|d| d.get(CA_KEY).cloned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crd_of_an_older_release_without_v1_is_not_served() {
        let crd = |versions: serde_json::Value| -> CustomResourceDefinition {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "tcproutes.gateway.networking.k8s.io"},
                "spec": {
                    "group": "gateway.networking.k8s.io",
                    "names": {"kind": "TCPRoute", "plural": "tcproutes"},
                    "scope": "Namespaced",
                    "versions": versions,
                },
            }))
            .expect("a CRD")
        };
        let old = crd(serde_json::json!([{"name": "v1alpha2", "served": true, "storage": true}]));
        assert!(!serves(&old, VERSION));
        let unserved = crd(serde_json::json!([
            {"name": "v1", "served": false, "storage": false},
            {"name": "v1alpha2", "served": true, "storage": true},
        ]));
        assert!(!serves(&unserved, VERSION));
        let current = crd(serde_json::json!([
            {"name": "v1", "served": true, "storage": true},
            {"name": "v1alpha2", "served": false, "storage": false},
        ]));
        assert!(serves(&current, VERSION));
    }
}
