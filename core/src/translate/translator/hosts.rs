//! Host claims and reservations: which virtual host serves which domain (the oldest
//! first, I9), and the names and domains that probes hold before any user's.

use super::*;

/// A user virtual host and what was derived from it.
pub(super) struct Host {
    pub(super) model: model::VirtualHost,
    /// Normalized hosts (see [`route::normalized_hosts`]).
    pub(super) hosts: Vec<String>,
    /// The same, as keys of the domain indexes: scoped by its route configuration, since
    /// a host is claimed once per route configuration.
    pub(super) domain_keys: Vec<DomainKey>,
    /// Why it cannot be served, conflicts with other virtual hosts aside.
    pub(super) errors: Vec<String>,
    pub(super) served: bool,
    /// The hosts it is served for: those of `hosts` that no virtual host ahead of it in
    /// the claim order holds.
    pub(super) served_hosts: Vec<String>,
}

/// The route configuration of a virtual host or version probe: its Gateway listener's, or
/// the shared one.
pub(super) fn route_config_of(listener: Option<&String>) -> &str {
    listener.map_or(ROUTE_CONFIG_NAME, String::as_str)
}

/// A domain as the indexes know it: within its route configuration (a Gateway listener's,
/// or the shared one), since a host is claimed once per route configuration.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct DomainKey {
    listener: Option<String>,
    domain: String,
}

pub(super) fn domain_key(listener: Option<&String>, domain: &str) -> DomainKey {
    DomainKey {
        listener: listener.cloned(),
        domain: domain.to_owned(),
    }
}

impl Translator {
    /// Re-reserves a version probe's name and domain. Returns its virtual host name and
    /// the domains whose holder may have changed.
    pub(super) fn reserve_version_probe(&mut self, id: &str) -> (String, Vec<DomainKey>) {
        let name = format!("{VERSION_PROBE_VHOST_PREFIX}{id}");
        let given = self.reserved_by_holder.remove(&name).unwrap_or_default();
        let mut domains: Vec<DomainKey> = given
            .into_iter()
            .filter(|d| self.reserved_domains.get(d) == Some(&name))
            .collect();
        for d in &domains {
            self.reserved_domains.remove(d);
        }
        self.reserved_names.remove(&name);
        self.selected_version_probes.remove(id);
        self.problems.remove(&Found::VersionProbe(id.to_owned()));

        if let Some(p) = self.version_probes.get(id).filter(|_| self.token_ok) {
            let mut problems = Vec::new();
            let listener = p.listener.as_ref();
            let trial_errors = route::validate_routes(&p.routes, &self.inputs());
            if let Some(l) = listener.filter(|l| !self.served_gateway_listeners.contains_key(*l)) {
                problems.push(Problem::new(
                    Subject::VersionProbe(id.to_owned()),
                    format!("Gateway listener {l:?} is not served"),
                ));
                self.problems
                    .insert(Found::VersionProbe(id.to_owned()), problems);
            } else if probe::select_version_probes(std::slice::from_ref(p), &mut problems)
                .is_empty()
            {
                self.problems
                    .insert(Found::VersionProbe(id.to_owned()), problems);
            } else if !trial_errors.is_empty() {
                // Routes on trial are served only as they would be live: a ProxyConfig
                // written by hand (or by another version) may name clusters it lacks.
                problems.extend(trial_errors.into_iter().map(|e| {
                    Problem::new(
                        Subject::VersionProbe(id.to_owned()),
                        format!("route on trial: {e}"),
                    )
                }));
                self.problems
                    .insert(Found::VersionProbe(id.to_owned()), problems);
            } else {
                let vhost = probe::version_probe_virtual_host(p, &self.listeners.probe_token);
                let keys: Vec<DomainKey> = vhost
                    .domains
                    .iter()
                    .map(|d| domain_key(listener, d))
                    .collect();
                for d in &keys {
                    self.reserved_domains.insert(d.clone(), vhost.name.clone());
                }
                self.reserved_by_holder
                    .insert(vhost.name.clone(), keys.clone());
                domains.extend(keys);
                self.reserved_names.insert(vhost.name);
                self.selected_version_probes.insert(id.to_owned());
            }
        }
        (name, domains)
    }

    /// Takes a virtual host out of the indexes, once per apply, remembering whether it
    /// existed and was served, and which domains it held.
    pub(super) fn unindex_host(
        &mut self,
        name: &str,
        seed_domains: &mut BTreeSet<DomainKey>,
        before: &mut BTreeMap<String, Option<bool>>,
    ) {
        if before.contains_key(name) {
            return;
        }
        let Some(host) = self.hosts.get(name) else {
            before.insert(name.to_owned(), None);
            return;
        };
        before.insert(name.to_owned(), Some(host.served));
        for c in route::referenced_clusters(&host.model) {
            remove_from(&mut self.hosts_by_cluster, c, name);
        }
        if let Some(tls) = &host.model.tls {
            remove_from(&mut self.hosts_by_secret, &tls.secret, name);
        }
        for d in &host.domain_keys {
            remove_from(&mut self.hosts_by_domain, d, name);
            seed_domains.insert(d.clone());
        }
    }

    /// Validates a virtual host against the current inputs and indexes it.
    pub(super) fn index_host(&mut self, name: &str, seed_domains: &mut BTreeSet<DomainKey>) {
        let Some(host) = self.hosts.get(name) else {
            return;
        };
        let mut errors = route::validate_virtual_host(&host.model, &self.inputs());
        if let Some(l) = &host.model.listener {
            match self.served_gateway_listeners.get(l) {
                None => errors.push(format!("Gateway listener {l:?} is not served")),
                Some(gl) if !gl.protocol.is_http() => {
                    errors.extend(stream::check_virtual_host(gl, &host.model));
                }
                Some(gl) if gl.tls && host.model.tls.is_none() => errors.push(format!(
                    "Gateway listener {l:?} is HTTPS: the virtual host needs TLS"
                )),
                Some(gl) if !gl.tls && host.model.tls.is_some() => errors.push(format!(
                    "Gateway listener {l:?} is plain HTTP: the virtual host cannot have TLS"
                )),
                Some(_) => {}
            }
        }
        let hosts = route::normalized_hosts(&host.model);
        let domain_keys: Vec<DomainKey> = hosts
            .iter()
            .map(|d| domain_key(host.model.listener.as_ref(), d))
            .collect();
        let clusters: Vec<String> = route::referenced_clusters(&host.model)
            .map(str::to_owned)
            .collect();
        let secret = host.model.tls.as_ref().map(|t| t.secret.clone());
        for c in clusters {
            self.hosts_by_cluster
                .entry(c)
                .or_default()
                .insert(name.to_owned());
        }
        if let Some(s) = secret {
            self.hosts_by_secret
                .entry(s)
                .or_default()
                .insert(name.to_owned());
        }
        if errors.is_empty() {
            for d in &domain_keys {
                self.hosts_by_domain
                    .entry(d.clone())
                    .or_default()
                    .insert(name.to_owned());
                seed_domains.insert(d.clone());
            }
        }
        if let Some(host) = self.hosts.get_mut(name) {
            host.errors = errors;
            host.hosts = hosts;
            host.domain_keys = domain_keys;
        }
    }

    /// The dirty virtual hosts and every servable one that shares a domain with them or
    /// with a seed domain, directly or through others: the only ones whose hold on a host
    /// can change.
    pub(super) fn sharing_domains(
        &self,
        dirty: &BTreeSet<String>,
        seed_domains: &BTreeSet<DomainKey>,
    ) -> BTreeSet<String> {
        let mut affected: BTreeSet<String> = dirty.clone();
        let mut seen: HashSet<&DomainKey> = HashSet::new();
        let mut queue: Vec<&DomainKey> = seed_domains.iter().collect();
        while let Some(domain) = queue.pop() {
            if !seen.insert(domain) {
                continue;
            }
            for name in self.hosts_by_domain.get(domain).into_iter().flatten() {
                if affected.insert(name.clone())
                    && let Some(h) = self.hosts.get(name)
                {
                    queue.extend(&h.domain_keys);
                }
            }
        }
        affected
    }

    /// Decides which affected virtual hosts are served, and for which hosts: in claim
    /// order (see [`claim_order`]), each gets the hosts that no one before it holds, and
    /// is served if it gets any. Returns the names whose "left out" state changed.
    pub(super) fn claim(
        &mut self,
        affected: &BTreeSet<String>,
        before: &BTreeMap<String, Option<bool>>,
        dirty: &BTreeSet<String>,
        out: &mut Output,
    ) -> Vec<String> {
        let mut drop_changed = Vec::new();
        let mut claimed: HashMap<&DomainKey, &str> = HashMap::new();
        let mut decisions: Vec<(&str, Vec<&String>, Vec<String>)> = Vec::new();
        let mut order: Vec<(&String, &Host)> = affected
            .iter()
            .filter_map(|name| Some((name, self.hosts.get(name)?)))
            .collect();
        order.sort_by(claim_order);
        for (name, host) in order {
            let mut errors = host.errors.clone();
            let mut won: Vec<&String> = Vec::new();
            if errors.is_empty() && self.reserved_names.contains(name) {
                errors.push(format!(
                    "virtual host name {name:?} is reserved for a probe"
                ));
            }
            if errors.is_empty() {
                for (h, k) in host.hosts.iter().zip(&host.domain_keys) {
                    let holder = self
                        .reserved_domains
                        .get(k)
                        .map(String::as_str)
                        .or_else(|| claimed.get(k).copied());
                    match holder {
                        Some(holder) => errors.push(format!(
                            "host {h:?} is already served by virtual host {holder:?}"
                        )),
                        None => {
                            won.push(h);
                            claimed.insert(k, name);
                        }
                    }
                }
            }
            decisions.push((name, won, errors));
        }
        let decisions: Vec<(String, Vec<String>, Vec<String>)> = decisions
            .into_iter()
            .map(|(n, w, e)| (n.to_owned(), w.into_iter().cloned().collect(), e))
            .collect();
        let decided: HashSet<&String> = decisions.iter().map(|(n, _, _)| n).collect();
        // Removed virtual hosts: out of the route configuration, no problem left.
        for (name, was) in before {
            if !decided.contains(name) && !self.hosts.contains_key(name) {
                self.problems.remove(&Found::Host(name.clone()));
                self.unserve(name, out);
                if *was == Some(false) {
                    drop_changed.push(name.clone());
                }
            }
        }
        for (name, won, errors) in decisions {
            let was = match before.get(&name) {
                Some(was) => *was,
                None => self.hosts.get(&name).map(|h| h.served),
            };
            let served = !won.is_empty();
            if served {
                // Hosts lost to virtual hosts ahead of it are reported; the rest serve.
                if errors.is_empty() {
                    self.problems.remove(&Found::Host(name.clone()));
                } else {
                    self.problems.insert(
                        Found::Host(name.clone()),
                        errors.into_iter().map(|e| Problem::new(&name, e)).collect(),
                    );
                }
                let hosts_changed = self.hosts.get(&name).is_some_and(|h| h.served_hosts != won);
                if let Some(h) = self.hosts.get_mut(&name) {
                    h.served_hosts = won;
                }
                if dirty.contains(&name) || was != Some(true) || hosts_changed {
                    self.serve(&name, out);
                }
            } else {
                self.problems.insert(
                    Found::Host(name.clone()),
                    errors.into_iter().map(|e| Problem::new(&name, e)).collect(),
                );
                self.unserve(&name, out);
            }
            if let Some(h) = self.hosts.get_mut(&name) {
                h.served = served;
            }
            let (left_out_before, left_out_now) = (was == Some(false), !served);
            if left_out_before != left_out_now {
                drop_changed.push(name);
            }
        }
        drop_changed
    }
}

/// The order in which virtual hosts claim their hosts: a leaving one after every other,
/// then the oldest first (its route's creation; unknown counts as newest), then by name.
fn claim_order(a: &(&String, &Host), b: &(&String, &Host)) -> std::cmp::Ordering {
    let rank = |(name, host): &(&String, &Host)| {
        let m = &host.model;
        (m.leaving, m.created.is_none(), m.created, (*name).clone())
    };
    rank(a).cmp(&rank(b))
}
