use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::store::Writer;

use super::*;

#[test]
fn a_stored_object_keeps_everything_but_the_api_servers_bookkeeping() {
    let mut slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "web-abc",
            "annotations": {
                LAST_APPLIED: "{\"kind\":\"EndpointSlice\"}",
                "switchyard.dev/leaving": "2026-12-06T00:00:00Z",
            },
            "managedFields": [{ "manager": "kubectl", "operation": "Apply" }],
        },
        "addressType": "IPv4",
        "endpoints": [{ "addresses": ["198.18.0.1"] }],
    }))
    .expect("a slice");
    let mut expected = slice.clone();
    expected.metadata.managed_fields = None;
    expected
        .metadata
        .annotations
        .as_mut()
        .expect("annotations")
        .remove(LAST_APPLIED);
    forget_bookkeeping(&mut slice);
    assert_eq!(slice, expected);

    let mut applied_only = EndpointSlice::default();
    applied_only.metadata.annotations = Some([(LAST_APPLIED.to_owned(), "{}".to_owned())].into());
    forget_bookkeeping(&mut applied_only);
    assert_eq!(applied_only.metadata.annotations, None);
}

fn slice(name: &str) -> EndpointSlice {
    crate::k8s::fixtures::slice(name, "web")
}

fn labelled(name: &str, service: &str) -> EndpointSlice {
    crate::k8s::fixtures::slice(name, service)
}

#[test]
fn events_name_their_objects_and_a_relist_names_everything() {
    let mut touches = Touches::none();
    touches.note(&watcher::Event::Apply(slice("a")));
    touches.note(&watcher::Event::Delete(slice("b")));
    touches.note(&watcher::Event::Apply(slice("a")));
    assert!(!touches.all);
    let keys: Vec<ObjectKey> = touches.keys.iter().cloned().collect();
    assert_eq!(
        keys,
        [
            ("shop".to_string(), "a".to_string()),
            ("shop".to_string(), "b".to_string())
        ]
    );
    // A relist (after a watch expired, say) may drop objects without a Delete.
    let deleted: Vec<_> = touches.deleted.iter().map(key_of).collect();
    assert_eq!(deleted, [("shop".to_string(), "b".to_string())]);
    touches.note(&watcher::Event::<EndpointSlice>::Init);
    assert!(touches.all);
    // Nothing taken yet: everything.
    assert!(Touches::<EndpointSlice>::default().all);
}

#[test]
fn a_failed_watch_retries_within_a_second_and_starts_over_after_an_event() {
    use kube::runtime::utils::Backoff;
    let mut backoff = WatchBackoff::default();
    let waits: Vec<u64> = backoff
        .by_ref()
        .take(6)
        .map(|d| d.as_millis() as u64)
        .collect();
    assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
    backoff.reset();
    assert_eq!(backoff.next(), Some(Duration::from_millis(100)));
}

/// A store and its readers, events applied as a reflector applies them: the store
/// first, then the readers.
struct Fake {
    store: Store<EndpointSlice>,
    writer: Writer<EndpointSlice>,
    readers: Readers<EndpointSlice>,
}

impl Fake {
    fn new() -> Self {
        let (store, writer) = reflector::store();
        Self {
            store,
            writer,
            readers: Readers::default(),
        }
    }

    fn event(&mut self, event: watcher::Event<EndpointSlice>) {
        self.writer.apply_watcher_event(&event);
        self.readers.deliver(0, &self.store, &event);
    }

    fn view(&self, service: &'static str) -> Arc<ViewState<EndpointSlice>> {
        let state = Arc::new(ViewState {
            filter: Arc::new(move |s: &EndpointSlice| {
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(crate::k8s::to_model::SERVICE_NAME_LABEL))
                    .map(String::as_str)
                    == Some(service)
            }),
            maps: Mutex::new(vec![BTreeMap::new()]),
        });
        self.readers.add(Reader::View(Arc::downgrade(&state)));
        state.lock()[0] = state.matching(&self.store);
        state
    }
}

fn names(state: &ViewState<EndpointSlice>) -> Vec<String> {
    state.lock()[0].keys().map(|k| k.1.clone()).collect()
}

#[test]
fn a_view_holds_what_its_filter_passes_through_applies_deletes_and_relists() {
    let mut fake = Fake::new();
    fake.event(watcher::Event::Apply(labelled("fleet-1", "fleet")));
    fake.event(watcher::Event::Apply(labelled("web-1", "web")));
    // Made after events: filled from the store.
    let view = fake.view("fleet");
    assert_eq!(names(&view), ["fleet-1"]);
    fake.event(watcher::Event::Apply(labelled("fleet-2", "fleet")));
    fake.event(watcher::Event::Apply(labelled("web-2", "web")));
    assert_eq!(names(&view), ["fleet-1", "fleet-2"]);
    // A slice relabelled away leaves the view.
    fake.event(watcher::Event::Apply(labelled("fleet-2", "web")));
    assert_eq!(names(&view), ["fleet-1"]);
    fake.event(watcher::Event::Delete(labelled("fleet-1", "fleet")));
    assert!(names(&view).is_empty());
    // A relist: the old list stands until it is complete, then the new one whole.
    fake.event(watcher::Event::Apply(labelled("fleet-3", "fleet")));
    fake.event(watcher::Event::Init);
    fake.event(watcher::Event::InitApply(labelled("fleet-4", "fleet")));
    assert_eq!(names(&view), ["fleet-3"]);
    fake.event(watcher::Event::InitDone);
    assert_eq!(names(&view), ["fleet-4"]);
}

#[tokio::test]
async fn counters_hear_what_their_filter_passes_and_streams_every_object_named() {
    let mut fake = Fake::new();
    let all = Arc::new(watch::channel(0).0);
    let fleet = Arc::new(watch::channel(0).0);
    fake.readers.add(Reader::Counter {
        changes: Arc::downgrade(&all),
        filter: None,
        echo: None,
    });
    fake.readers.add(Reader::Counter {
        changes: Arc::downgrade(&fleet),
        filter: Some(Arc::new(|s: &EndpointSlice| {
            s.metadata.name.as_deref() == Some("f")
        })),
        echo: None,
    });
    let (sender, mut objects) = mpsc::unbounded_channel();
    fake.readers.add(Reader::Objects(sender));
    fake.event(watcher::Event::Apply(slice("f")));
    fake.event(watcher::Event::Apply(slice("w")));
    fake.event(watcher::Event::Delete(slice("w")));
    assert_eq!((*all.borrow(), *fleet.borrow()), (3, 1));
    // A relist may drop anything: every counter hears it.
    fake.event(watcher::Event::Init);
    assert_eq!((*all.borrow(), *fleet.borrow()), (4, 2));
    let mut named = Vec::new();
    while let Ok(object) = objects.try_recv() {
        named.push(object.metadata.name.clone().unwrap_or_default());
    }
    assert_eq!(named, ["f", "w", "w"]);
    // Readers gone are forgotten.
    drop(all);
    drop(objects);
    fake.event(watcher::Event::Apply(slice("f")));
    assert_eq!(fake.readers.lock().len(), 1);
}

#[tokio::test]
async fn a_counter_does_not_hear_the_echo_of_its_own_writes_but_hears_every_deletion() {
    let mut fake = Fake::new();
    let changes = Arc::new(watch::channel(0).0);
    fake.readers.add(Reader::Counter {
        changes: Arc::downgrade(&changes),
        filter: None,
        echo: Some(Arc::new(|s: &EndpointSlice| {
            s.metadata.name.as_deref() == Some("own")
        })),
    });
    fake.event(watcher::Event::Apply(slice("own")));
    assert_eq!(*changes.borrow(), 0);
    fake.event(watcher::Event::Apply(slice("other")));
    assert_eq!(*changes.borrow(), 1);
    // Gone, whoever deleted it; a relist may drop anything.
    fake.event(watcher::Event::Delete(slice("own")));
    fake.event(watcher::Event::Init);
    fake.event(watcher::Event::InitApply(slice("own")));
    assert_eq!(*changes.borrow(), 4);
}
