//! The TrafficRoutes, indexed by what other objects' events and the admission check look
//! up: the hosts each route asks for, and the Services it names. At 10k routes, scanning
//! every route for each Service or ProxyConfig event (and each admission check) was most
//! of the leader's work while a mass of routes rolled out.
//!
//! The index is fed by the controller's own watch, after its store: a route found in the
//! store but not yet here is one whose own event is on its way to reconcile it anyway.

use std::collections::{BTreeSet, HashMap};
use std::sync::RwLock;

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::api::TrafficRoute;

/// A route: (namespace, name).
pub(super) type RouteKey = (String, String);

#[derive(Default)]
pub(crate) struct RouteIndex {
    inner: RwLock<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Host, lowercased → the routes asking for it.
    by_host: HashMap<String, BTreeSet<RouteKey>>,
    /// (namespace, Service) → the routes naming it.
    by_service: HashMap<RouteKey, BTreeSet<RouteKey>>,
    /// What each route was indexed under, to take it out again.
    entries: HashMap<RouteKey, Entry>,
    /// The routes listed since the last (re)list began.
    listing: Option<BTreeSet<RouteKey>>,
}

#[derive(Clone, Default, PartialEq)]
struct Entry {
    hosts: Vec<String>,
    services: Vec<RouteKey>,
}

impl Entry {
    fn of(route: &TrafficRoute) -> Self {
        let namespace = route.namespace().unwrap_or_default();
        let mut hosts: Vec<String> = route
            .spec
            .route
            .hosts
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        hosts.sort_unstable();
        hosts.dedup();
        let mut services: Vec<RouteKey> = route
            .spec
            .route
            .rules
            .iter()
            .flat_map(|r| &r.backends)
            .map(|b| (namespace.clone(), b.service.clone()))
            .collect();
        services.sort_unstable();
        services.dedup();
        Self { hosts, services }
    }
}

fn key_of(route: &TrafficRoute) -> RouteKey {
    (route.namespace().unwrap_or_default(), route.name_any())
}

impl RouteIndex {
    /// Follows one event of the routes' watch.
    pub(super) fn apply(&self, event: &watcher::Event<TrafficRoute>) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        match event {
            watcher::Event::Apply(route) => inner.put(key_of(route), Entry::of(route)),
            watcher::Event::Delete(route) => inner.remove(&key_of(route)),
            watcher::Event::Init => inner.listing = Some(BTreeSet::new()),
            watcher::Event::InitApply(route) => {
                let key = key_of(route);
                if let Some(listed) = &mut inner.listing {
                    listed.insert(key.clone());
                }
                inner.put(key, Entry::of(route));
            }
            // Routes deleted while the watch was down are not listed again.
            watcher::Event::InitDone => {
                let Some(listed) = inner.listing.take() else {
                    return;
                };
                let gone: Vec<RouteKey> = inner
                    .entries
                    .keys()
                    .filter(|k| !listed.contains(*k))
                    .cloned()
                    .collect();
                for key in gone {
                    inner.remove(&key);
                }
            }
        }
    }

    /// The routes asking for any of `hosts` (compared without case).
    pub(super) fn asking_for(&self, hosts: &[String]) -> BTreeSet<RouteKey> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        hosts
            .iter()
            .filter_map(|h| inner.by_host.get(&h.to_ascii_lowercase()))
            .flatten()
            .cloned()
            .collect()
    }

    /// The routes naming the Service `namespace/name` as a backend.
    pub(super) fn naming(&self, namespace: &str, name: &str) -> Vec<RouteKey> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .by_service
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|routes| routes.iter().cloned().collect())
            .unwrap_or_default()
    }
}

impl Inner {
    fn put(&mut self, key: RouteKey, entry: Entry) {
        if self.entries.get(&key) == Some(&entry) {
            return;
        }
        self.remove(&key);
        for host in &entry.hosts {
            self.by_host
                .entry(host.clone())
                .or_default()
                .insert(key.clone());
        }
        for service in &entry.services {
            self.by_service
                .entry(service.clone())
                .or_default()
                .insert(key.clone());
        }
        self.entries.insert(key, entry);
    }

    fn remove(&mut self, key: &RouteKey) {
        let Some(entry) = self.entries.remove(key) else {
            return;
        };
        for host in &entry.hosts {
            take_out(&mut self.by_host, host, key);
        }
        for service in &entry.services {
            take_out(&mut self.by_service, service, key);
        }
    }
}

fn take_out<K: std::hash::Hash + Eq>(
    index: &mut HashMap<K, BTreeSet<RouteKey>>,
    at: &K,
    key: &RouteKey,
) {
    if let Some(routes) = index.get_mut(at) {
        routes.remove(key);
        if routes.is_empty() {
            index.remove(at);
        }
    }
}

/// A route key as the controller's trigger streams want it.
pub(super) fn object_ref((namespace, name): &RouteKey) -> ObjectRef<TrafficRoute> {
    ObjectRef::new(name).within(namespace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::fixtures::traffic_route;

    fn keys(list: &[(&str, &str)]) -> BTreeSet<RouteKey> {
        list.iter()
            .map(|(ns, n)| ((*ns).to_owned(), (*n).to_owned()))
            .collect()
    }

    #[test]
    fn routes_are_found_by_host_and_by_service_and_leave_with_their_spec() {
        let index = RouteIndex::default();
        let a = traffic_route("apps", "a", &["Shop.example.com"], "web");
        let b = traffic_route("apps", "b", &["shop.example.com", "api.example.com"], "api");
        index.apply(&watcher::Event::Apply(a.clone()));
        index.apply(&watcher::Event::Apply(b.clone()));
        let shop = ["SHOP.example.com".to_owned()];
        assert_eq!(
            index.asking_for(&shop),
            keys(&[("apps", "a"), ("apps", "b")])
        );
        assert_eq!(
            index.naming("apps", "web"),
            vec![("apps".into(), "a".into())]
        );
        assert!(index.naming("other", "web").is_empty());

        // a moves to another host and Service: found there alone.
        let a2 = traffic_route("apps", "a", &["new.example.com"], "web-v2");
        index.apply(&watcher::Event::Apply(a2));
        assert_eq!(index.asking_for(&shop), keys(&[("apps", "b")]));
        assert!(index.naming("apps", "web").is_empty());
        assert_eq!(index.naming("apps", "web-v2").len(), 1);

        index.apply(&watcher::Event::Delete(b));
        assert!(index.asking_for(&shop).is_empty());
        assert!(index.naming("apps", "api").is_empty());
    }

    #[test]
    fn a_relist_drops_the_routes_deleted_meanwhile() {
        let index = RouteIndex::default();
        let a = traffic_route("apps", "a", &["a.example.com"], "web");
        let b = traffic_route("apps", "b", &["b.example.com"], "web");
        index.apply(&watcher::Event::Apply(a.clone()));
        index.apply(&watcher::Event::Apply(b));
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(a));
        index.apply(&watcher::Event::InitDone);
        assert_eq!(
            index.naming("apps", "web"),
            vec![("apps".into(), "a".into())]
        );
        assert!(index.asking_for(&["b.example.com".into()]).is_empty());
    }
}
