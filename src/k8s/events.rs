//! Events, recorded as `events.k8s.io/v1` objects by every front-end. kube's `Recorder`
//! folds every Event of the same reason about the same object within six minutes into the
//! first one, note and all: a second `EnvoysLagging` naming other Envoys, or another port
//! of the same Gateway, would show the first one's words with a higher count. Here an
//! Event counts as a repeat (its series count goes up, as `kubectl describe` shows) only
//! when its note is the same as well.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
pub use kube::runtime::events::{Event, EventType};

/// How long an Event may be repeated rather than recorded anew (as kube's and client-go's
/// recorders do).
const REPEAT_WITHIN: Duration = Duration::from_secs(6 * 60);

/// Records Events as Switchyard (`reportingController`), this Pod the instance.
pub struct EventRecorder {
    client: Client,
    instance: String,
    recent: Mutex<Recent>,
}

const CONTROLLER: &str = "switchyard";

impl EventRecorder {
    /// This Pod the instance (`POD_NAME`, where the chart sets it).
    pub fn new(client: &Client) -> EventRecorder {
        let instance = std::env::var("POD_NAME").unwrap_or_else(|_| CONTROLLER.to_owned());
        EventRecorder {
            client: client.clone(),
            instance,
            recent: Mutex::default(),
        }
    }

    /// Records `event` about `regarding`: a new Event, or, when the same one (reason,
    /// action, type and note) was recorded about it within six minutes, that one again.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let key = Key::of(event, regarding);
        let now = Timestamp::now();
        let repeat = (self.recent.lock())
            .unwrap_or_else(|p| p.into_inner())
            .repeat(&key, Instant::now());
        if let Some((name, count)) = repeat {
            let series = K8sEvent {
                series: Some(EventSeries {
                    count,
                    last_observed_time: MicroTime(now),
                }),
                ..Default::default()
            };
            let patched = events
                .patch(&name, &PatchParams::default(), &Patch::Merge(&series))
                .await;
            match patched {
                Ok(_) => return Ok(()),
                // Gone (its TTL ran out): recorded anew below.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(error) => return Err(error),
            }
        }
        let created = events
            .create(
                &PostParams::default(),
                &self.new_event(event, regarding, now),
            )
            .await?;
        let name = created.metadata.name.unwrap_or_default();
        (self.recent.lock())
            .unwrap_or_else(|p| p.into_inner())
            .recorded(key, name, Instant::now());
        Ok(())
    }

    fn new_event(&self, event: &Event, regarding: &ObjectReference, now: Timestamp) -> K8sEvent {
        let object = regarding.name.as_deref().unwrap_or(CONTROLLER);
        K8sEvent {
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!("{object}.{:x}", now.as_nanosecond())),
                ..Default::default()
            },
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            type_: Some(type_name(event.type_).to_owned()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            reporting_controller: Some(CONTROLLER.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        }
    }
}

fn type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// What makes two Events the same: the object (by kind, namespace, name and uid, not its
/// resourceVersion, which every status write moves) and everything the Event says.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    regarding: (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ),
    type_: &'static str,
    reason: String,
    action: String,
    note: Option<String>,
}

impl Key {
    fn of(event: &Event, regarding: &ObjectReference) -> Key {
        Key {
            regarding: (
                regarding.kind.clone(),
                regarding.namespace.clone(),
                regarding.name.clone(),
                regarding.uid.clone(),
            ),
            type_: type_name(event.type_),
            reason: event.reason.clone(),
            action: event.action.clone(),
            note: event.note.clone(),
        }
    }
}

/// The Events recorded within [`REPEAT_WITHIN`]: by key, the Event's name, how many times
/// it was recorded, and when last.
#[derive(Default)]
struct Recent(HashMap<Key, (String, i32, Instant)>);

impl Recent {
    /// The name of the Event `key` repeats and its count with this one, if it repeats one;
    /// forgets the Events older than [`REPEAT_WITHIN`].
    fn repeat(&mut self, key: &Key, now: Instant) -> Option<(String, i32)> {
        self.0
            .retain(|_, (_, _, last)| now.saturating_duration_since(*last) < REPEAT_WITHIN);
        let (name, count, last) = self.0.get_mut(key)?;
        *count += 1;
        *last = now;
        Some((name.clone(), *count))
    }

    fn recorded(&mut self, key: Key, name: String, now: Instant) {
        self.0.insert(key, (name, 1, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lagging(note: &str) -> Event {
        Event {
            type_: EventType::Warning,
            reason: "EnvoysLagging".into(),
            note: Some(note.into()),
            action: "Rollout".into(),
            secondary: None,
        }
    }

    #[test]
    fn only_the_same_words_about_the_same_object_repeat_an_event() {
        let gateway = |resource_version: &str| ObjectReference {
            kind: Some("Gateway".into()),
            namespace: Some("shop".into()),
            name: Some("edge".into()),
            uid: Some("1f".into()),
            resource_version: Some(resource_version.into()),
            ..Default::default()
        };
        let mut recent = Recent::default();
        let t0 = Instant::now();
        let port_80 = Key::of(&lagging("port 80: envoy-2"), &gateway("7"));
        assert_eq!(recent.repeat(&port_80, t0), None);
        recent.recorded(port_80.clone(), "edge.1".into(), t0);
        // Another port, or other Envoys: an Event of its own.
        let port_443 = Key::of(&lagging("port 443: envoy-2"), &gateway("7"));
        assert_eq!(recent.repeat(&port_443, t0), None);
        // The same words after a status write moved the object's resourceVersion: a repeat.
        let again = Key::of(&lagging("port 80: envoy-2"), &gateway("8"));
        let later = t0 + Duration::from_secs(60);
        assert_eq!(recent.repeat(&again, later), Some(("edge.1".into(), 2)));
        assert_eq!(recent.repeat(&again, later), Some(("edge.1".into(), 3)));
        // Six minutes after the last one, recorded anew.
        assert_eq!(recent.repeat(&again, later + REPEAT_WITHIN), None);
    }
}
