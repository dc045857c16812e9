//! Endpoints of a deleted Service, and the live configuration of a deleted route, kept for
//! a while.
//!
//! Deleting a Service deletes its EndpointSlices at once, but not its Pods: they terminate
//! on their own schedule, and usually keep running. A rename in one sync (route repointed,
//! old Service deleted) would otherwise leave the live route on a cluster without
//! endpoints until the switch completes, answering 503 "no healthy upstream". So when the
//! last slice of a Service goes, its slices stay in the model, as they last were, for
//! the longest drain period of the live routes using it (at least `hold`, at most a minute
//! or `hold`), or until a slice of that Service appears again. They are marked leaving: their
//! endpoints keep what is live on them serving, but never count as ready for a switch to
//! them (I3), since a route moved onto a deleted Service would have nowhere to go once the
//! hold ends. A slice deleted while its
//! Service keeps others (the EndpointSlice controller moving endpoints between slices) is
//! gone at once: the Service's endpoints are still what its slices say.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use tokio::time::Instant;

use super::model_cache::{ObjectKey, key_of};
use super::to_model::{LEAVING, service_of};
use crate::api::{ProxyConfig, ProxyConfigRole};

/// Deleted objects kept, each until its time: the bookkeeping both holders share.
struct Held<K> {
    /// Key → when it is released, and the object as it last was.
    objects: BTreeMap<ObjectKey, (Instant, Arc<K>)>,
}

impl<K: kube::Resource> Held<K> {
    fn new() -> Self {
        Self {
            objects: BTreeMap::new(),
        }
    }

    fn insert(&mut self, object: K, until: Instant) {
        self.objects
            .insert(key_of(&object), (until, Arc::new(object)));
    }

    /// Keeps what `keep` says and what is not due; returns the keys let go.
    fn release(&mut self, now: Instant, keep: impl Fn(&ObjectKey, &K) -> bool) -> Vec<ObjectKey> {
        let mut released = Vec::new();
        self.objects.retain(|key, (until, object)| {
            let kept = *until > now && keep(key, object);
            if !kept {
                released.push(key.clone());
            }
            kept
        });
        released
    }

    fn get(&self, key: &ObjectKey) -> Option<Arc<K>> {
        self.objects.get(key).map(|(_, object)| object.clone())
    }

    /// `present` (what exists), and the held ones that no present object replaces: what a
    /// full build takes.
    fn with_held(&self, mut present: Vec<Arc<K>>) -> Vec<Arc<K>> {
        if self.objects.is_empty() {
            return present;
        }
        let keys: BTreeSet<ObjectKey> = present.iter().map(|o| key_of(o.as_ref())).collect();
        present.extend(
            self.objects
                .iter()
                .filter(|(key, _)| !keys.contains(*key))
                .map(|(_, (_, object))| object.clone()),
        );
        present
    }

    fn next_release(&self) -> Option<Instant> {
        self.objects.values().map(|(until, _)| *until).min()
    }
}

pub struct Departed {
    hold: Duration,
    held: Held<EndpointSlice>,
}

impl Departed {
    pub fn new(hold: Duration) -> Self {
        Self {
            hold,
            held: Held::new(),
        }
    }

    /// Takes note of the slices deleted since the last build and releases what is due:
    /// held slices of Services that have a slice again, and those whose time is up.
    /// `present` lists the slices that exist now; `drain_of` gives the longest drain
    /// period of the live routes using a Service, if any says one: its slices are held
    /// that long, at least the operator's hold and at most [`MAX_HOLD`] (or the hold).
    /// Returns the keys whose view changed beyond what the watch already named (the
    /// released ones).
    pub fn update(
        &mut self,
        deleted: Vec<EndpointSlice>,
        present: impl FnOnce() -> Vec<Arc<EndpointSlice>>,
        drain_of: impl Fn(&(String, String)) -> Option<Duration>,
        now: Instant,
    ) -> Vec<ObjectKey> {
        if deleted.is_empty() && self.held.objects.is_empty() {
            return Vec::new();
        }
        let present = present();
        let live_services: BTreeSet<_> = present.iter().filter_map(|s| service_of(s)).collect();
        for slice in deleted {
            let Some(service) = service_of(&slice).filter(|s| !live_services.contains(s)) else {
                continue;
            };
            if !self.hold.is_zero() {
                let hold = held_for(drain_of(&service), self.hold);
                self.held.insert(leaving_copy(slice), now + hold);
            }
        }
        self.held.release(now, |_, slice| {
            service_of(slice).is_none_or(|s| !live_services.contains(&s))
        })
    }

    /// The held slice named `key`, if any.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<EndpointSlice>> {
        self.held.get(key)
    }

    /// `present`, and the held slices of Services that have none of them (a slice created
    /// since the last [`Departed::update`] replaces those of its Service).
    pub fn with_held(&self, mut present: Vec<Arc<EndpointSlice>>) -> Vec<Arc<EndpointSlice>> {
        let live: BTreeSet<_> = present.iter().filter_map(|s| service_of(s)).collect();
        let keys: BTreeSet<ObjectKey> = present.iter().map(|s| key_of(s.as_ref())).collect();
        let held = (self.held.objects.iter())
            .filter(|(key, (_, slice))| {
                !keys.contains(*key) && service_of(slice).is_none_or(|s| !live.contains(&s))
            })
            .map(|(_, (_, slice))| slice.clone());
        present.extend(held);
        present
    }

    /// When the next held slice is due, if any.
    pub fn next_release(&self) -> Option<Instant> {
        self.held.next_release()
    }
}

/// The longest a Service's endpoints are held for the drain periods of its routes: a
/// minute, or `hold` if longer. (A drain of hours would keep a gone Pod's address in the
/// fleet for hours, where another Pod may have it by then.)
const MAX_HOLD: Duration = Duration::from_secs(60);

/// How long the endpoints of a deleted Service are held: the longest drain period of the
/// live routes using it (`drain`), at least `hold` and at most [`MAX_HOLD`] (or `hold`).
fn held_for(drain: Option<Duration>, hold: Duration) -> Duration {
    drain.unwrap_or_default().clamp(hold, hold.max(MAX_HOLD))
}

/// Each Service (namespace, name) that live ProxyConfigs use, with the longest drain
/// period they give (those that give none are left out).
pub fn drains_by_service(configs: &[Arc<ProxyConfig>]) -> HashMap<(String, String), Duration> {
    let mut drains: HashMap<(String, String), Duration> = HashMap::new();
    for pc in configs
        .iter()
        .filter(|pc| pc.spec.role == ProxyConfigRole::Live)
    {
        let drain = pc.spec.drain_period.as_deref();
        let Some(drain) = drain.and_then(|d| switchyard_core::duration::parse(d).ok()) else {
            continue;
        };
        let own = pc.namespace().unwrap_or_default();
        for c in &pc.spec.clusters {
            let namespace = c.namespace.clone().unwrap_or_else(|| own.clone());
            let longest = drains.entry((namespace, c.service.clone())).or_default();
            *longest = (*longest).max(drain);
        }
    }
    drains
}

/// Live ProxyConfigs of deleted routes, kept for a while as leaving: a route deleted while
/// another takes its hosts over (in the same sync, or the other way round), or deleted and
/// created again under its name, must not leave its hosts without a virtual host in
/// between. A held one yields each host to any other claimant (the translator's leaving
/// virtual hosts), and goes when its time is up or when a ProxyConfig of its name exists
/// again.
pub struct DepartedConfigs {
    hold: Duration,
    held: Held<ProxyConfig>,
}

impl DepartedConfigs {
    pub fn new(hold: Duration) -> Self {
        Self {
            hold,
            held: Held::new(),
        }
    }

    /// Takes note of the ProxyConfigs deleted since the last build and releases what is
    /// due; `exists` says whether one of that key exists now. Returns the released keys.
    pub fn update(
        &mut self,
        deleted: Vec<ProxyConfig>,
        exists: impl Fn(&ObjectKey) -> bool,
        now: Instant,
    ) -> Vec<ObjectKey> {
        for pc in deleted {
            let leaving = pc.spec.role == ProxyConfigRole::Live
                && !pc.annotations().contains_key(LEAVING)
                && !self.hold.is_zero();
            if leaving {
                self.held.insert(leaving_copy(pc), now + self.hold);
            }
        }
        self.held.release(now, |key, _| !exists(key))
    }

    pub fn get(&self, key: &ObjectKey) -> Option<Arc<ProxyConfig>> {
        self.held.get(key)
    }

    /// `present`, and the held ones no present ProxyConfig replaces.
    pub fn with_held(&self, present: Vec<Arc<ProxyConfig>>) -> Vec<Arc<ProxyConfig>> {
        self.held.with_held(present)
    }

    pub fn next_release(&self) -> Option<Instant> {
        self.held.next_release()
    }
}

/// A deleted object as the model sees it while held: marked leaving, under a
/// resourceVersion of its own, so that builders see it changed.
fn leaving_copy<K: kube::Resource>(mut object: K) -> K {
    object
        .annotations_mut()
        .insert(LEAVING.to_string(), "true".to_string());
    let version = object.resource_version().unwrap_or_default();
    object.meta_mut().resource_version = Some(format!("{version}-leaving"));
    object
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::fixtures::slice;

    fn key(name: &str) -> ObjectKey {
        ("shop".into(), name.into())
    }

    /// No live route uses the Service: the operator's hold applies.
    fn no_route(_: &(String, String)) -> Option<Duration> {
        None
    }

    #[test]
    fn a_service_used_by_live_routes_is_held_for_their_longest_drain_period() {
        let mut departed = Departed::new(Duration::from_secs(10));
        let start = Instant::now();
        let drain_of =
            |service: &(String, String)| (service.1 == "old").then_some(Duration::from_secs(30));
        departed.update(vec![slice("old-1", "old")], Vec::new, drain_of, start);
        departed.update(vec![slice("other-1", "other")], Vec::new, drain_of, start);
        assert_eq!(
            departed.next_release(),
            Some(start + Duration::from_secs(10))
        );
        let later = start + Duration::from_secs(20);
        assert_eq!(
            departed.update(vec![], Vec::new, drain_of, later),
            [key("other-1")]
        );
        assert!(departed.get(&key("old-1")).is_some());
        // A route that drains at once still gets the operator's hold; one that drains for
        // hours, a minute.
        assert_eq!(
            held_for(Some(Duration::ZERO), Duration::from_secs(10)),
            Duration::from_secs(10)
        );
        assert_eq!(
            held_for(None, Duration::from_secs(10)),
            Duration::from_secs(10)
        );
        let hours = Some(Duration::from_secs(7200));
        assert_eq!(held_for(hours, Duration::from_secs(10)), MAX_HOLD);
        assert_eq!(
            held_for(hours, Duration::from_secs(600)),
            Duration::from_secs(600)
        );
    }

    #[test]
    fn the_drain_of_a_service_is_the_longest_of_the_live_routes_using_it() {
        let uses = |route: &str, service: &str, drain: Option<&str>| {
            let mut pc = live(route);
            pc.spec.clusters = vec![crate::k8s::fixtures::cluster(service)];
            pc.spec.drain_period = drain.map(str::to_owned);
            Arc::new(pc)
        };
        let mut probe = uses("c", "old", Some("90s"));
        Arc::make_mut(&mut probe).spec.role = ProxyConfigRole::Probe;
        let configs = [
            uses("a", "old", Some("30s")),
            uses("b", "old", Some("1500ms")),
            probe,
            uses("d", "new", Some("60s")),
            uses("e", "old", None),
        ];
        let drains = drains_by_service(&configs);
        let old = ("shop".to_owned(), "old".to_owned());
        assert_eq!(drains.get(&old), Some(&Duration::from_secs(30)));
        let elsewhere = ("other".to_owned(), "old".to_owned());
        assert_eq!(drains.get(&elsewhere), None);
        assert_eq!(drains.len(), 2);
    }

    #[test]
    fn a_held_slice_gives_way_to_a_slice_of_its_service_created_since() {
        let mut departed = Departed::new(Duration::from_secs(10));
        departed.update(
            vec![slice("old-1", "old")],
            Vec::new,
            no_route,
            Instant::now(),
        );
        let recreated = Arc::new(slice("old-2", "old"));
        let all = departed.with_held(vec![recreated]);
        let keys: Vec<ObjectKey> = all.iter().map(|s| key_of(s.as_ref())).collect();
        assert_eq!(keys, [key("old-2")]);
    }

    #[test]
    fn the_last_slice_of_a_service_is_held_until_its_time_is_up() {
        let mut departed = Departed::new(Duration::from_secs(10));
        let start = Instant::now();
        let released = departed.update(vec![slice("old-1", "old")], Vec::new, no_route, start);
        assert!(released.is_empty());
        let held = departed.get(&key("old-1")).expect("held");
        assert!(held.annotations().contains_key(LEAVING));
        assert_eq!(
            departed.next_release(),
            Some(start + Duration::from_secs(10))
        );

        let later = start + Duration::from_secs(9);
        assert!(
            departed
                .update(vec![], Vec::new, no_route, later)
                .is_empty()
        );
        // A full build takes it with the slices that exist.
        let other = Arc::new(slice("web-1", "web"));
        let all = departed.with_held(vec![other]);
        let keys: Vec<ObjectKey> = all.iter().map(|s| key_of(s.as_ref())).collect();
        assert_eq!(keys, [key("web-1"), key("old-1")]);

        let due = start + Duration::from_secs(10);
        assert_eq!(
            departed.update(vec![], Vec::new, no_route, due),
            [key("old-1")]
        );
        assert!(departed.get(&key("old-1")).is_none());
        assert_eq!(departed.next_release(), None);
    }

    #[test]
    fn a_slice_deleted_while_its_service_keeps_others_goes_at_once() {
        let mut departed = Departed::new(Duration::from_secs(10));
        let other = Arc::new(slice("web-2", "web"));
        departed.update(
            vec![slice("web-1", "web")],
            || vec![other],
            no_route,
            Instant::now(),
        );
        assert!(departed.get(&key("web-1")).is_none());
    }

    #[test]
    fn a_service_that_has_a_slice_again_releases_the_held_ones() {
        let mut departed = Departed::new(Duration::from_secs(10));
        let start = Instant::now();
        departed.update(vec![slice("old-1", "old")], Vec::new, no_route, start);
        let recreated = Arc::new(slice("old-2", "old"));
        let released = departed.update(vec![], || vec![recreated], no_route, start);
        assert_eq!(released, [key("old-1")]);
    }

    fn live(name: &str) -> ProxyConfig {
        let spec: crate::api::ProxyConfigSpec = serde_json::from_value(serde_json::json!({
            "role": "live", "route": name, "generation": 1, "version": "v1",
            "virtualHost": { "hosts": ["a.test"], "rules": [] }, "clusters": [],
        }))
        .expect("spec");
        let mut pc = ProxyConfig::new(&format!("{name}-live"), spec);
        pc.metadata.namespace = Some("shop".into());
        pc.metadata.resource_version = Some("7".into());
        pc
    }

    #[test]
    fn a_deleted_live_config_is_held_as_leaving_until_replaced_or_due() {
        let mut departed = DepartedConfigs::new(Duration::from_secs(10));
        let start = Instant::now();
        assert!(
            departed
                .update(vec![live("web")], |_| false, start)
                .is_empty()
        );
        let held = departed.get(&key("web-live")).expect("held");
        assert!(held.annotations().contains_key(LEAVING));
        assert_eq!(held.resource_version().as_deref(), Some("7-leaving"));
        // Created again under its name: released at once.
        assert_eq!(
            departed.update(vec![], |k| *k == key("web-live"), start),
            [key("web-live")]
        );
        // Otherwise it goes when its time is up.
        departed.update(vec![live("api")], |_| false, start);
        let due = start + Duration::from_secs(10);
        assert_eq!(departed.update(vec![], |_| false, due), [key("api-live")]);
        assert_eq!(departed.next_release(), None);
    }

    #[test]
    fn a_zero_hold_holds_nothing() {
        let mut departed = Departed::new(Duration::ZERO);
        departed.update(
            vec![slice("old-1", "old")],
            Vec::new,
            no_route,
            Instant::now(),
        );
        assert!(departed.get(&key("old-1")).is_none());
    }
}
