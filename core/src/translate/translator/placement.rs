//! Entry placement and use counts: what a served virtual host or probe puts in the route
//! configurations, which clusters and secrets are used (and so served), and the snapshot
//! an apply ends with.

use super::*;

/// What a served virtual host uses.
#[derive(Clone, PartialEq)]
pub(super) struct Uses {
    pub(super) route_config: String,
    pub(super) clusters: BTreeSet<String>,
    pub(super) secret: Option<String>,
}

/// Route entries are keyed by (route configuration, name, kind): probe virtual hosts sort
/// before a user's of the same name, which is then refused anyway ("reserved for a probe").
pub(super) type EntryKey = (String, String, EntryKind);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum EntryKind {
    Probe,
    User,
}

/// A served virtual host's filter chain on a TCP or TLS Gateway listener, or its cluster on
/// a UDP one (`backends`: that one cluster).
#[derive(Clone, PartialEq)]
pub(super) struct StreamServed {
    pub(super) listener: String,
    pub(super) hosts: Vec<String>,
    pub(super) secret: Option<String>,
    pub(super) backends: Vec<(String, u32)>,
}

/// What one apply changed, gathered for the snapshot at its end.
#[derive(Default)]
pub(super) struct Output {
    pub(super) puts: Vec<Resource>,
    pub(super) removes: Vec<(&'static str, String)>,
    /// Clusters and secrets whose use count changed.
    pub(super) touched_clusters: BTreeSet<String>,
    pub(super) touched_secrets: BTreeSet<String>,
    /// Route configurations to re-assemble (or remove, once their listener is gone).
    pub(super) routes_changed: BTreeSet<String>,
    /// Virtual hosts added, changed or removed: each is a resource of its own when route
    /// configurations are also served in parts.
    pub(super) entries_changed: BTreeSet<EntryKey>,
    pub(super) listeners_changed: bool,
}

/// A served TLS virtual host's place on an HTTPS listener.
#[derive(Clone, PartialEq)]
pub(super) struct TlsServed {
    pub(super) listener: Option<String>,
    pub(super) hosts: Vec<String>,
    pub(super) secret: String,
    pub(super) listener_hostname: Option<String>,
}

impl Translator {
    /// Puts a virtual host that will be served into the route configuration.
    pub(super) fn serve(&mut self, name: &str, out: &mut Output) {
        let Some(host) = self.hosts.get(name) else {
            return;
        };
        let bytes =
            route::encode_virtual_host(route::virtual_host(&host.model, &host.served_hosts));
        let route_config = route_config_of(host.model.listener.as_ref()).to_owned();
        let mut clusters: BTreeSet<String> = route::referenced_clusters(&host.model)
            .map(str::to_owned)
            .collect();
        let mut blend = None;
        let stream = (host.model.listener.as_ref())
            .filter(|l| self.is_stream_listener(l))
            .map(|l| {
                let mut backends = stream::backends(&host.model);
                if self.is_udp_listener(l) {
                    // One cluster per session: a blend of several (a cluster of its own).
                    let target = datagram::target(&backends);
                    backends = vec![(target.cluster().to_owned(), 1)];
                    if let datagram::Target::Blend(b) = target {
                        clusters.insert(b.name.clone());
                        blend = Some(b);
                    }
                }
                StreamServed {
                    listener: l.clone(),
                    hosts: host.served_hosts.clone(),
                    secret: host.model.tls.as_ref().map(|t| t.secret.clone()),
                    backends,
                }
            });
        if let Some(b) = blend {
            self.blends.insert(b.name.clone(), b);
        }
        let uses = Uses {
            route_config: route_config.clone(),
            clusters,
            secret: host.model.tls.as_ref().map(|t| t.secret.clone()),
        };
        let tls = (host.model.tls.as_ref())
            .filter(|_| stream.is_none())
            .map(|t| TlsServed {
                listener: host.model.listener.clone(),
                hosts: host.served_hosts.clone(),
                secret: t.secret.clone(),
                listener_hostname: t.listener_hostname.clone(),
            });
        let moved_from = self
            .served_uses
            .get(name)
            .map(|u| u.route_config.clone())
            .filter(|old| *old != route_config);
        if let Some(old) = moved_from {
            self.set_entry((old, name.to_owned(), EntryKind::User), None, out);
        }
        self.set_entry(
            (route_config, name.to_owned(), EntryKind::User),
            Some(bytes),
            out,
        );
        self.set_uses(name, Some(uses), out);
        self.set_tls_host(name, tls, out);
        self.set_stream_host(name, stream, out);
    }

    /// Takes a virtual host out of its route configuration (if it was in).
    pub(super) fn unserve(&mut self, name: &str, out: &mut Output) {
        // It may have moved to another listener since it was served.
        let served_in = self.served_uses.get(name).map(|u| u.route_config.clone());
        if let Some(route_config) = served_in {
            self.set_entry((route_config, name.to_owned(), EntryKind::User), None, out);
        }
        self.set_uses(name, None, out);
        self.set_tls_host(name, None, out);
        self.set_stream_host(name, None, out);
    }

    pub(super) fn set_entry(&mut self, key: EntryKey, bytes: Option<Vec<u8>>, out: &mut Output) {
        let route_config = key.0.clone();
        let changed = match bytes {
            Some(bytes) => match self.route_entries.get(&key) {
                Some(current) if *current == bytes => false,
                _ => {
                    self.route_entries.insert(key.clone(), bytes);
                    true
                }
            },
            None => self.route_entries.remove(&key).is_some(),
        };
        if changed {
            out.routes_changed.insert(route_config);
            out.entries_changed.insert(key);
        }
    }

    pub(super) fn set_uses(&mut self, name: &str, uses: Option<Uses>, out: &mut Output) {
        if self.served_uses.get(name) == uses.as_ref() {
            return;
        }
        if let Some(old) = self.served_uses.remove(name) {
            for c in old.clusters {
                decrement(&mut self.cluster_uses, &c);
                out.touched_clusters.insert(c);
            }
            if let Some(s) = old.secret {
                decrement(&mut self.secret_uses, &s);
                out.touched_secrets.insert(s);
            }
        }
        if let Some(new) = uses {
            for c in &new.clusters {
                *self.cluster_uses.entry(c.clone()).or_default() += 1;
                out.touched_clusters.insert(c.clone());
            }
            if let Some(s) = &new.secret {
                *self.secret_uses.entry(s.clone()).or_default() += 1;
                out.touched_secrets.insert(s.clone());
            }
            self.served_uses.insert(name.to_owned(), new);
        }
    }

    pub(super) fn set_tls_host(&mut self, name: &str, tls: Option<TlsServed>, out: &mut Output) {
        if self.tls_hosts.get(name) == tls.as_ref() {
            return;
        }
        match tls {
            Some(tls) => self.tls_hosts.insert(name.to_owned(), tls),
            None => self.tls_hosts.remove(name),
        };
        out.listeners_changed = true;
    }

    pub(super) fn set_stream_host(
        &mut self,
        name: &str,
        stream: Option<StreamServed>,
        out: &mut Output,
    ) {
        if self.stream_hosts.get(name) == stream.as_ref() {
            return;
        }
        match stream {
            Some(stream) => self.stream_hosts.insert(name.to_owned(), stream),
            None => self.stream_hosts.remove(name),
        };
        out.listeners_changed = true;
    }

    /// A version probe's virtual host is served when the probe is valid and its virtual
    /// host (same id) is not left out: a probe must never report a version whose routes
    /// are not served.
    pub(super) fn place_version_probe(&mut self, id: &str, out: &mut Output) {
        self.problems.remove(&Found::LeftOut(id.to_owned()));
        let mut entry = None;
        let name = format!("{VERSION_PROBE_VHOST_PREFIX}{id}");
        // Out of the route configuration it was in: its listener may have changed.
        let held: Vec<EntryKey> = self
            .probe_entries
            .remove(id)
            .into_iter()
            .map(|rc| (rc, name.clone(), EntryKind::Probe))
            .collect();
        for key in held {
            self.set_entry(key, None, out);
        }
        let mut route_config = ROUTE_CONFIG_NAME.to_owned();
        if self.selected_version_probes.contains(id)
            && let Some(p) = self.version_probes.get(id)
        {
            route_config = route_config_of(p.listener.as_ref()).to_owned();
            if self.hosts.get(id).is_some_and(|h| !h.served) {
                self.problems.insert(
                    Found::LeftOut(id.to_owned()),
                    vec![Problem::new(
                        Subject::VersionProbe(id.to_owned()),
                        "left out with its virtual host",
                    )],
                );
            } else {
                entry = Some(route::encode_virtual_host(
                    probe::version_probe_virtual_host(p, &self.listeners.probe_token),
                ));
            }
        }
        let mut trial_clusters: Vec<String> = Vec::new();
        if entry.is_some() {
            self.probe_entries
                .insert(id.to_owned(), route_config.clone());
            if let Some(p) = self.version_probes.get(id) {
                trial_clusters = route::routed_clusters(&p.routes)
                    .map(str::to_owned)
                    .collect();
                trial_clusters.sort();
                trial_clusters.dedup();
            }
        }
        self.set_probe_cluster_uses(id, trial_clusters, out);
        self.set_entry((route_config, name, EntryKind::Probe), entry, out);
    }

    /// The clusters a version probe's routes on trial use: served while it is.
    pub(super) fn set_probe_cluster_uses(
        &mut self,
        id: &str,
        clusters: Vec<String>,
        out: &mut Output,
    ) {
        let old = self.probe_cluster_uses.remove(id).unwrap_or_default();
        if old == clusters {
            if !clusters.is_empty() {
                self.probe_cluster_uses.insert(id.to_owned(), clusters);
            }
            return;
        }
        for c in old {
            decrement(&mut self.cluster_uses, &c);
            out.touched_clusters.insert(c);
        }
        for c in &clusters {
            *self.cluster_uses.entry(c.clone()).or_default() += 1;
            out.touched_clusters.insert(c.clone());
        }
        if !clusters.is_empty() {
            self.probe_cluster_uses.insert(id.to_owned(), clusters);
        }
    }

    /// Endpoint probes are few: all of them are selected again when any of their inputs
    /// changed.
    pub(super) fn select_endpoint_probes(&mut self, out: &mut Output) {
        for c in std::mem::take(&mut self.endpoint_probe_clusters) {
            decrement(&mut self.cluster_uses, &c);
            out.touched_clusters.insert(c);
        }
        let mut problems = Vec::new();
        let selected: Vec<(String, Vec<String>)> = if self.token_ok {
            let probes: Vec<model::EndpointProbe> =
                self.endpoint_probes.values().cloned().collect();
            probe::select_endpoint_probes(&probes, &self.inputs(), &mut problems)
                .into_iter()
                .map(|p| (p.id.clone(), p.clusters.keys().cloned().collect()))
                .collect()
        } else {
            Vec::new()
        };
        self.problems.insert(Found::EndpointProbes, problems);
        self.selected_endpoint_probes = selected.iter().map(|(id, _)| id.clone()).collect();
        for (_, clusters) in selected {
            for c in clusters {
                *self.cluster_uses.entry(c.clone()).or_default() += 1;
                out.touched_clusters.insert(c.clone());
                self.endpoint_probe_clusters.push(c);
            }
        }
    }

    /// CDS and EDS: a cluster is served while something served uses it.
    pub(super) fn place_clusters(&mut self, names: &BTreeSet<String>, out: &mut Output) {
        let mut used = Vec::new();
        let mut blends = BTreeSet::new();
        for name in names {
            if self.blends.contains_key(name) {
                blends.insert(name.clone());
                continue;
            }
            self.problems.remove(&Found::Cluster(name.clone()));
            let served = (self.clusters.get(name)).filter(|_| self.cluster_uses.contains_key(name));
            // The secret a served cluster presents to its backends is served with it.
            let presents = served.and_then(|c| c.settings.tls.as_ref()?.client_certificate.clone());
            if let Some(old) = self.cluster_secrets.remove(name) {
                decrement(&mut self.secret_uses, &old);
                out.touched_secrets.insert(old);
            }
            if let Some(secret) = presents {
                *self.secret_uses.entry(secret.clone()).or_default() += 1;
                out.touched_secrets.insert(secret.clone());
                self.cluster_secrets.insert(name.clone(), secret);
            }
            match served {
                Some(c) => used.push(c),
                None => {
                    out.removes.push((CLUSTER, name.clone()));
                    out.removes.push((ENDPOINT, name.clone()));
                }
            }
        }
        for built in build_clusters(&used) {
            if !built.problems.is_empty() {
                let name = &built.cds.name;
                self.problems.insert(
                    Found::Cluster(name.clone()),
                    built
                        .problems
                        .into_iter()
                        .map(|e| Problem::new(Subject::Cluster(name.clone()), e))
                        .collect(),
                );
            }
            out.puts.push(built.cds);
            out.puts.push(built.eds);
        }
        // A blend is made again when one of its clusters changed.
        blends.extend(
            (self.blends.values())
                .filter(|b| b.clusters().any(|c| names.contains(c)))
                .map(|b| b.name.clone()),
        );
        self.place_blends(&blends, out);
    }

    /// CDS and EDS of blends: served while a served UDP virtual host uses them.
    fn place_blends(&mut self, names: &BTreeSet<String>, out: &mut Output) {
        for name in names {
            if !self.cluster_uses.contains_key(name) {
                self.blends.remove(name);
                out.removes.push((CLUSTER, name.clone()));
                out.removes.push((ENDPOINT, name.clone()));
                continue;
            }
            let Some(blend) = self.blends.get(name) else {
                continue;
            };
            let clusters = &self.clusters;
            let assignment = datagram::blend_load_assignment(blend, |c| clusters.get(c));
            out.puts.push(Resource::new(
                name.clone(),
                proto::pack(&datagram::blend_cluster(blend)),
            ));
            out.puts
                .push(Resource::new(name.clone(), proto::pack(&assignment)));
        }
    }

    /// SDS: a secret is served while a served TLS virtual host, Gateway listener or
    /// cluster uses it.
    pub(super) fn place_secrets(&mut self, names: &BTreeSet<String>, out: &mut Output) {
        for name in names {
            let used = self.secret_uses.contains_key(name);
            // A listener's default secret is used whether or not it can serve; only one
            // that can is sent (and only then does the listener name it).
            let servable = |s: &&model::TlsSecret| secret::validate(s).is_ok();
            match self.secrets.get(name).filter(|_| used).filter(servable) {
                Some(s) => out
                    .puts
                    .push(Resource::new(name.clone(), proto::pack(&secret::secret(s)))),
                None => out.removes.push((SECRET, name.clone())),
            }
        }
    }

    /// Writes what changed into the snapshot; a route configuration is re-assembled from
    /// its encoded virtual hosts when any of them changed, and removed with its listener.
    pub(super) fn finish(&mut self, mut out: Output) {
        let in_parts = self.listeners.virtual_host_discovery;
        for name in std::mem::take(&mut out.routes_changed) {
            if !self.serves_route_config(&name) {
                out.removes.push((ROUTE, vhds::parts_name(&name)));
                out.removes.push((ROUTE, name));
                continue;
            }
            let body = self.route_configuration(&name);
            if in_parts {
                let parts = vhds::parts_name(&name);
                out.puts.push(Resource::new(
                    parts.clone(),
                    route::parts_configuration(&parts),
                ));
            } else {
                out.removes.push((ROUTE, vhds::parts_name(&name)));
            }
            out.puts.push(Resource::new(name, body));
        }
        for key in std::mem::take(&mut out.entries_changed) {
            let (route_config, vhost, _) = &key;
            match self.route_entries.get(&key) {
                Some(bytes) if in_parts && self.serves_route_config(route_config) => out
                    .puts
                    .push(vhds::virtual_host(route_config, vhost, bytes)),
                _ => out
                    .removes
                    .push((VIRTUAL_HOST, vhds::virtual_host_name(route_config, vhost))),
            }
        }
        self.snapshot
            .update(out.removes, out.puts.into_iter().map(Arc::new));
    }

    /// Whether a route configuration is served over RDS: the shared one, and those of the
    /// HTTP(S) Gateway listeners (a TCP or TLS listener holds its own inline).
    pub(super) fn serves_route_config(&self, name: &str) -> bool {
        name == ROUTE_CONFIG_NAME
            || (self.served_gateway_listeners.get(name)).is_some_and(|l| l.protocol.is_http())
    }

    /// A served TCP, TLS or UDP Gateway listener.
    pub(super) fn is_stream_listener(&self, name: &str) -> bool {
        (self.served_gateway_listeners.get(name)).is_some_and(|l| !l.protocol.is_http())
    }

    /// A served UDP Gateway listener.
    pub(super) fn is_udp_listener(&self, name: &str) -> bool {
        (self.served_gateway_listeners.get(name))
            .is_some_and(|l| l.protocol == model::ListenerProtocol::Udp)
    }

    /// A route configuration as its encoded virtual hosts give it.
    pub(super) fn route_configuration(&self, name: &str) -> envoy_types::pb::google::protobuf::Any {
        route::route_configuration(name, self.entries_of(name, None))
    }

    /// The encoded virtual hosts of a route configuration, in order; of one kind only, or
    /// all.
    pub(super) fn entries_of<'a>(
        &'a self,
        name: &'a str,
        kind: Option<EntryKind>,
    ) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.entries_in(name)
            .filter(move |((_, _, k), _)| kind.is_none_or(|kind| *k == kind))
            .map(|(_, bytes)| bytes.as_slice())
    }

    /// The entries of a route configuration, by key, in order.
    pub(super) fn entries_in<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = (&'a EntryKey, &'a Vec<u8>)> + 'a {
        let first = (name.to_owned(), String::new(), EntryKind::Probe);
        (self.route_entries.range(first..)).take_while(move |((rc, _, _), _)| rc == name)
    }
}
