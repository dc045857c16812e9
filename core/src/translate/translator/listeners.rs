//! The listeners: the shared HTTP, HTTPS and probe listeners' settings, the Gateway
//! listeners (one port each, no conflicts), and their rebuild when TLS hosts, endpoint
//! probes, or a TCP or TLS listener's served virtual hosts and version probes change.

use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;

use super::*;

impl Translator {
    pub(super) fn set_listeners(&mut self, settings: model::ListenerSettings) {
        self.listeners = settings;
        match validate::header_value(&self.listeners.probe_token) {
            Ok(()) => {
                self.token_ok = true;
                self.problems.remove(&Found::Listeners);
            }
            Err(e) => {
                self.token_ok = false;
                self.problems.insert(
                    Found::Listeners,
                    vec![Problem::new(
                        Subject::Listeners,
                        format!(
                            "probe token is not a valid header value ({e}); no probe is served"
                        ),
                    )],
                );
            }
        }
    }

    /// Takes the Gateway listeners in: a name defined twice with different contents is
    /// left out; of those asking for one port, the first by name is served. Every one left
    /// out is reported. Returns the names whose served
    /// definition changed (added, gone or different).
    pub(super) fn set_gateway_listeners(
        &mut self,
        listeners: Vec<model::GatewayListener>,
        out: &mut Output,
    ) -> BTreeSet<String> {
        let mut sorted = listeners.clone();
        sorted.sort();
        sorted.dedup();
        self.gateway_listeners = listeners;
        let shared = &self.listeners;
        let mut ports: BTreeMap<u16, String> = [
            (shared.http_port, HTTP_LISTENER),
            (shared.https_port, HTTPS_LISTENER),
            (shared.probe_port, PROBE_LISTENER),
        ]
        .into_iter()
        .map(|(p, n)| (p, format!("the shared {n} listener")))
        .collect();
        let mut definitions: HashMap<&str, usize> = HashMap::new();
        for l in &sorted {
            *definitions.entry(l.name.as_str()).or_default() += 1;
        }
        let twice: HashSet<String> = definitions
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(name, _)| name.to_owned())
            .collect();
        let mut served: BTreeMap<String, model::GatewayListener> = BTreeMap::new();
        let mut problems = Vec::new();
        for l in sorted {
            let problem = if l.name.is_empty() || l.name == ROUTE_CONFIG_NAME {
                Some(format!("the name {:?} is not allowed", l.name))
            } else if twice.contains(&l.name) {
                Some("defined twice with different contents".to_owned())
            } else if l.port == 0 || l.probe_port == 0 || l.port == l.probe_port {
                Some("needs two different ports, neither 0".to_owned())
            } else {
                let holder = ports.get(&l.port).or_else(|| ports.get(&l.probe_port));
                holder.map(|h| format!("a port of it is taken by {h}"))
            };
            match problem {
                Some(message) => {
                    problems.push(Problem::new(
                        Subject::GatewayListener(l.name.clone()),
                        message,
                    ));
                }
                None => {
                    let holder = format!("Gateway listener {:?}", l.name);
                    ports.insert(l.port, holder.clone());
                    ports.insert(l.probe_port, holder);
                    served.insert(l.name.clone(), l);
                }
            }
        }
        self.problems.insert(Found::GatewayListeners, problems);
        let mut changed = BTreeSet::new();
        for name in self.served_gateway_listeners.keys().chain(served.keys()) {
            if self.served_gateway_listeners.get(name) != served.get(name) {
                changed.insert(name.clone());
            }
        }
        // Their default secrets are used while they are served.
        let defaults: Vec<String> = served
            .values()
            .filter_map(|l| l.default_secret.clone())
            .collect();
        for s in std::mem::replace(&mut self.gateway_secret_uses, defaults.clone()) {
            decrement(&mut self.secret_uses, &s);
            out.touched_secrets.insert(s);
        }
        for s in defaults {
            *self.secret_uses.entry(s.clone()).or_default() += 1;
            out.touched_secrets.insert(s);
        }
        let catch_all = probe::catch_all_virtual_host();
        for name in &changed {
            // Served over RDS or inline (its protocol may have changed): every virtual host
            // of its route configuration is sent again, or taken back.
            let entries: Vec<EntryKey> = self.entries_in(name).map(|(k, _)| k.clone()).collect();
            out.entries_changed.extend(entries);
            // A probe host not installed answers 404 there too, never a user's backend.
            let entry = served.contains_key(name).then(|| catch_all.encode_to_vec());
            let key = (name.clone(), catch_all.name.clone(), EntryKind::Probe);
            self.set_entry(key, entry, out);
            out.routes_changed.insert(name.clone());
        }
        self.served_gateway_listeners = served;
        changed
    }

    pub(super) fn place_listeners(&mut self, out: &mut Output) {
        let tls_hosts_of = |listener: Option<&String>| -> Vec<listener::TlsHost<'_>> {
            self.tls_hosts
                .iter()
                .filter(|(_, t)| t.listener.as_ref() == listener)
                .map(|(name, t)| listener::TlsHost {
                    virtual_host: name,
                    hosts: &t.hosts,
                    secret: &t.secret,
                    listener_hostname: t.listener_hostname.as_deref(),
                })
                .collect()
        };
        let probes: Vec<&model::EndpointProbe> = self
            .selected_endpoint_probes
            .iter()
            .filter_map(|id| self.endpoint_probes.get(id))
            .collect();
        let mut listeners = listener::listeners(&self.listeners, &tls_hosts_of(None), &probes);
        for (name, gateway) in &self.served_gateway_listeners {
            if gateway.protocol == model::ListenerProtocol::Udp {
                listeners.extend(self.udp_listeners(name, gateway));
                continue;
            }
            if !gateway.protocol.is_http() {
                listeners.push(self.stream_listener(name, gateway));
                continue;
            }
            // Its default chain only with a secret that can serve.
            let default_secret = gateway.default_secret.as_deref().filter(|s| {
                self.secrets
                    .get(*s)
                    .is_some_and(|s| secret::validate(s).is_ok())
            });
            listeners.extend(listener::gateway_listeners(
                &self.listeners,
                gateway,
                &tls_hosts_of(Some(name)),
                default_secret,
            ));
        }
        let names: BTreeSet<&str> = listeners.iter().map(|l| l.name.as_str()).collect();
        for old in self
            .snapshot
            .resources(LISTENER)
            .into_iter()
            .flat_map(|rs| rs.keys())
        {
            if !names.contains(old.as_str()) {
                out.removes.push((LISTENER, old.clone()));
            }
        }
        for l in &listeners {
            out.puts.push(Resource::new(l.name.clone(), proto::pack(l)));
        }
    }

    /// A TCP or TLS Gateway listener: its served virtual hosts' chains, and its route
    /// configuration inline.
    fn stream_listener(&self, name: &str, gateway: &model::GatewayListener) -> Listener {
        let hosts: Vec<stream::StreamHost<'_>> = self
            .stream_hosts
            .iter()
            .filter(|(_, s)| s.listener == name)
            .map(|(vhost, s)| stream::StreamHost {
                virtual_host: vhost,
                hosts: &s.hosts,
                secret: s.secret.as_deref(),
                backends: &s.backends,
            })
            .collect();
        stream::stream_listener(&self.listeners, gateway, &hosts, self.probe_routes(name))
    }

    /// A UDP Gateway listener, and the TCP listener answering its version probes.
    /// Without a served virtual host the port has no UDP listener: a datagram there is
    /// refused (ICMP port unreachable, which a connected client reads as an error at once)
    /// rather than dropped unseen.
    fn udp_listeners(&self, name: &str, gateway: &model::GatewayListener) -> Vec<Listener> {
        let served = (self.stream_hosts.iter())
            .find(|(_, s)| s.listener == name)
            .and_then(|(vhost, s)| Some((vhost.as_str(), s.backends.first()?.0.as_str())));
        let udp = served.map(|served| datagram::udp_listener(&self.listeners, gateway, served));
        let probes = datagram::probe_listener(&self.listeners, gateway, self.probe_routes(name));
        udp.into_iter().chain([probes]).collect()
    }

    /// The version probes of a TCP, TLS or UDP listener's route configuration. Its probe
    /// port answers them alone: the user virtual hosts of its route configuration are its
    /// filter chains (or its one cluster), and an HTTP request there must not reach a
    /// backend.
    fn probe_routes(&self, name: &str) -> RouteConfiguration {
        let probes =
            route::route_configuration(name, self.entries_of(name, Some(EntryKind::Probe)));
        let routes = RouteConfiguration::decode(probes.value.as_slice());
        debug_assert!(routes.is_ok(), "encoded from valid parts a moment ago");
        routes.unwrap_or_default()
    }
}
