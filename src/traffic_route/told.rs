//! The last Event this replica recorded about each route, until the route's status says
//! the same. A pass tells an Event when its route's `Ready` changes, judged against the
//! status it read; that status trails the passes by the status writer's QPS, so every pass
//! before it caught up told the same Event again (a 2000-route cold start patched Events
//! 3602 times in 35 s, each an API round trip inside a pass). An entry goes as soon as a
//! status read says what was told, or a pass finds the route in another state than the one
//! told (so that coming back to it is told again); entries of routes gone are swept once
//! they could be many.

use std::collections::HashMap;
use std::sync::Mutex;

/// Route (namespace, name) → what was told last.
#[derive(Default)]
pub struct Told(Mutex<HashMap<(String, String), Tale>>);

/// An Event told about one route, and the state it told of.
#[derive(Clone, Debug, PartialEq)]
pub struct Tale {
    /// The route object's uid: a route deleted and made again is another route.
    pub uid: String,
    pub generation: i64,
    /// The reason of its `Ready` condition when told.
    pub ready_reason: String,
    /// The Event's reason and note.
    pub reason: String,
    pub note: String,
}

impl Told {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Tale>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `tale` is what was told last about `route`.
    pub fn already(&self, route: &(String, String), tale: &Tale) -> bool {
        self.lock().get(route) == Some(tale)
    }

    /// `tale` was recorded about `route`. `exists` says whether a route is still there:
    /// entries of routes gone are swept when the entries outnumber `routes` twice.
    pub fn told(
        &self,
        route: (String, String),
        tale: Tale,
        routes: usize,
        exists: impl Fn(&(String, String)) -> bool,
    ) {
        let mut told = self.lock();
        if told.len() >= 2 * routes + 64 {
            told.retain(|route, _| exists(route));
        }
        told.insert(route, tale);
    }

    /// A pass found `route` at `generation` with `ready_reason`: what was told of another
    /// state no longer holds back telling this one's Event, nor that one's when it comes
    /// back.
    pub fn now(&self, route: &(String, String), generation: i64, ready_reason: &str) {
        let mut told = self.lock();
        if told
            .get(route)
            .is_some_and(|t| t.generation != generation || t.ready_reason != ready_reason)
        {
            told.remove(route);
        }
    }

    /// `route`'s status, as read, says what was told: it decides again from here.
    pub fn caught_up(&self, route: &(String, String)) {
        self.lock().remove(route);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tale(uid: &str, generation: i64, reason: &str, note: &str) -> Tale {
        Tale {
            uid: uid.to_owned(),
            generation,
            ready_reason: reason.to_owned(),
            reason: reason.to_owned(),
            note: note.to_owned(),
        }
    }

    #[test]
    fn an_event_is_told_once_until_the_status_catches_up_and_again_after_another() {
        let told = Told::default();
        let route = ("shop".to_owned(), "web".to_owned());
        let ready = tale("u1", 3, "Ready", "served");
        assert!(!told.already(&route, &ready));
        told.told(route.clone(), ready.clone(), 1, |_| true);
        assert!(told.already(&route, &ready));
        // Another generation, reason, note or route object is another Event.
        assert!(!told.already(&route, &tale("u1", 4, "Ready", "served")));
        assert!(!told.already(&route, &tale("u1", 3, "EnvoyRejected", "served")));
        assert!(!told.already(&route, &tale("u1", 3, "Ready", "other words")));
        assert!(!told.already(&route, &tale("u2", 3, "Ready", "served")));
        // Ready, then waiting without an Event, then Ready again: told again.
        told.now(&route, 3, "Waiting");
        assert!(!told.already(&route, &ready));
        told.told(route.clone(), ready.clone(), 1, |_| true);
        told.now(&route, 3, "Ready");
        assert!(told.already(&route, &ready), "the same state");
        told.caught_up(&route);
        assert!(told.lock().is_empty());
    }

    #[test]
    fn entries_of_routes_gone_are_swept() {
        let told = Told::default();
        for i in 0..70 {
            let route = ("shop".to_owned(), format!("r{i}"));
            told.told(route, tale("u", 1, "Ready", "served"), 1, |r| r.1 == "r69");
        }
        assert!(told.lock().len() <= 66, "{}", told.lock().len());
    }
}
