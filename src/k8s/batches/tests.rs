use std::collections::BTreeMap;

use kube::runtime::reflector::{self, store::Writer};

use super::*;
use crate::api::ProxyConfigSpec;

fn spec(route: &str, generation: i64) -> ProxyConfigSpec {
    serde_json::from_value(serde_json::json!({
        "role": "live", "route": route, "generation": generation, "version": format!("v{generation}"),
        "virtualHost": { "hosts": [format!("{route}.test")], "rules": [] }, "clusters": [],
    }))
    .expect("spec")
}

fn own(name: &str, generation: i64) -> ProxyConfig {
    let mut pc = ProxyConfig::new(name, spec(name.trim_end_matches("-live"), generation));
    pc.metadata.namespace = Some("shop".into());
    pc.metadata.resource_version = Some(format!("own{generation}"));
    pc
}

fn batch(name: &str, members: &[(&str, i64)]) -> ProxyConfig {
    let mut pc = ProxyConfig::new(name, spec(name, 0));
    pc.metadata.namespace = Some("shop".into());
    pc.metadata.uid = Some(format!("uid-{name}"));
    pc.metadata.labels = Some([(BATCH_LABEL.to_owned(), "live".to_owned())].into());
    pc.spec.members = members
        .iter()
        .map(|(member, generation)| BatchMember {
            name: format!("{member}-live"),
            labels: [("switchyard.dev/route".to_owned(), member.to_string())].into(),
            owner: None,
            promoted_at: Some("2026-12-07T06:00:00Z".into()),
            spec: spec(member, *generation),
        })
        .collect();
    pc
}

/// A store fed through an expander, as `Watched` feeds one.
struct Fed {
    expander: Expander,
    view: BatchView,
    reader: Store<ProxyConfig>,
    writer: Writer<ProxyConfig>,
    /// Every event the store took.
    taken: Vec<String>,
}

impl Fed {
    fn new() -> Self {
        let view = BatchView::default();
        let (reader, writer) = reflector::store();
        Self {
            expander: view.expander(),
            view,
            reader,
            writer,
            taken: Vec::new(),
        }
    }

    fn feed(&mut self, event: Event<ProxyConfig>) {
        for event in self.expander.expand(event, &self.reader) {
            self.taken.push(match &event {
                Event::Apply(pc) => format!("apply {}", pc.name_any()),
                Event::Delete(pc) => format!("delete {}", pc.name_any()),
                Event::InitApply(pc) => format!("list {}", pc.name_any()),
                Event::Init => "init".into(),
                Event::InitDone => "done".into(),
            });
            self.writer.apply_watcher_event(&event);
        }
    }

    /// name → (generation, the batch it is shown from).
    fn stored(&self) -> BTreeMap<String, (i64, Option<String>)> {
        let state = self.reader.state();
        let entries = state.iter().map(|pc| {
            let from = batch_of(pc).map(str::to_owned);
            (pc.name_any(), (pc.spec.generation, from))
        });
        entries.collect()
    }

    fn take(&mut self) -> Vec<String> {
        std::mem::take(&mut self.taken)
    }
}

fn shown(entries: &[(&str, i64, Option<&str>)]) -> BTreeMap<String, (i64, Option<String>)> {
    let entries = entries.iter().map(|(name, generation, from)| {
        let from = from.map(str::to_owned);
        (name.to_string(), (*generation, from))
    });
    entries.collect()
}

fn listed(fed: &mut Fed, objects: &[ProxyConfig]) {
    fed.feed(Event::Init);
    for pc in objects {
        fed.feed(Event::InitApply(pc.clone()));
    }
    fed.feed(Event::InitDone);
}

#[test]
fn each_member_of_a_batch_is_stored_as_a_proxy_config_of_its_own() {
    let mut fed = Fed::new();
    listed(&mut fed, &[]);
    fed.take();
    fed.feed(Event::Apply(batch("b1", &[("web", 1), ("api", 1)])));
    assert_eq!(fed.take(), ["apply api-live", "apply web-live"]);
    let web = fed
        .reader
        .get(&ObjectRef::new("web-live").within("shop"))
        .expect("web-live stored");
    assert_eq!(web.namespace().as_deref(), Some("shop"));
    assert_eq!(web.labels()["switchyard.dev/route"], "web");
    assert_eq!(web.annotations()[PROMOTED_AT], "2026-12-07T06:00:00Z");
    assert_eq!(batch_of(&web), Some("b1"));
    assert_eq!(web.resource_version().as_deref(), Some("batch/b1/uid-b1"));
    assert_eq!(batch_of_version("batch/b1/uid-b1"), Some("b1"));
    assert_eq!(batch_of_version("12345"), None);
    assert!(!is_batch(&web));
    // The batch itself is in no reader's way.
    assert_eq!(fed.reader.state().len(), 2);

    // A rewrite that takes one member out touches no other.
    fed.feed(Event::Apply(batch("b1", &[("web", 1)])));
    assert_eq!(fed.take(), ["delete api-live"]);
    // The batch gone, its members are.
    fed.feed(Event::Delete(batch("b1", &[("web", 1)])));
    assert_eq!(fed.take(), ["delete web-live"]);
    assert!(fed.stored().is_empty());
}

#[test]
fn a_units_own_proxy_config_stands_for_its_name_and_the_member_is_hidden() {
    let mut fed = Fed::new();
    listed(&mut fed, &[]);
    fed.feed(Event::Apply(batch("b1", &[("web", 1), ("api", 1)])));
    assert_eq!(fed.view.hidden(), [(("shop".into(), "b1".into()), vec![])]);
    // A later generation written as the unit's own object takes over.
    fed.take();
    fed.feed(Event::Apply(own("web-live", 2)));
    assert_eq!(fed.take(), ["apply web-live"]);
    let expected = [("api-live", 1, Some("b1")), ("web-live", 2, None)];
    assert_eq!(fed.stored(), shown(&expected));
    assert_eq!(
        fed.view.hidden(),
        [(("shop".into(), "b1".into()), vec!["web-live".to_owned()])]
    );
    // Taking the hidden member out of its batch changes nothing stored.
    fed.feed(Event::Apply(batch("b1", &[("api", 1)])));
    assert_eq!(fed.take(), Vec::<String>::new());
    assert_eq!(fed.stored(), shown(&expected));
    assert_eq!(fed.view.hidden(), [(("shop".into(), "b1".into()), vec![])]);

    // A member still in its batch when the own object goes stands for the name again.
    let mut fed = Fed::new();
    listed(&mut fed, &[batch("b1", &[("web", 1)]), own("web-live", 2)]);
    assert_eq!(fed.stored(), shown(&[("web-live", 2, None)]));
    fed.take();
    fed.feed(Event::Delete(own("web-live", 2)));
    assert_eq!(fed.take(), ["delete web-live", "apply web-live"]);
    assert_eq!(fed.stored(), shown(&[("web-live", 1, Some("b1"))]));
}

#[test]
fn of_two_batches_holding_one_name_the_first_by_name_stands_for_it_in_any_order() {
    let (b1, b2) = (batch("b1", &[("web", 1)]), batch("b2", &[("web", 1)]));
    let mut first = Fed::new();
    listed(&mut first, &[]);
    first.feed(Event::Apply(b2.clone()));
    first.feed(Event::Apply(b1.clone()));
    let mut second = Fed::new();
    listed(&mut second, &[]);
    second.feed(Event::Apply(b1.clone()));
    second.feed(Event::Apply(b2.clone()));
    let mut relisted = Fed::new();
    listed(&mut relisted, &[b2.clone(), b1.clone()]);
    for fed in [&first, &second, &relisted] {
        assert_eq!(fed.stored(), shown(&[("web-live", 1, Some("b1"))]));
        let hidden = fed.view.hidden();
        assert_eq!(
            hidden[1],
            (("shop".into(), "b2".into()), vec!["web-live".into()])
        );
    }
    // The first taken out, the other stands for it.
    first.take();
    first.feed(Event::Apply(batch("b1", &[])));
    assert_eq!(first.take(), ["apply web-live"]);
    assert_eq!(first.stored(), shown(&[("web-live", 1, Some("b2"))]));
}

#[test]
fn a_relist_stores_what_the_events_stored() {
    let objects = [
        batch("b1", &[("web", 1), ("api", 1), ("shop", 1)]),
        own("api-live", 3),
        own("cart-live", 1),
    ];
    let mut by_events = Fed::new();
    listed(&mut by_events, &[]);
    for pc in &objects {
        by_events.feed(Event::Apply(pc.clone()));
    }
    let mut by_list = Fed::new();
    listed(&mut by_list, &objects);
    let expected = [
        ("api-live", 3, None),
        ("cart-live", 1, None),
        ("shop-live", 1, Some("b1")),
        ("web-live", 1, Some("b1")),
    ];
    assert_eq!(by_events.stored(), shown(&expected));
    assert_eq!(by_list.stored(), shown(&expected));
    assert_eq!(by_events.view.hidden(), by_list.view.hidden());
    // A relist that no longer has the batch drops its members.
    listed(&mut by_list, &[own("api-live", 3)]);
    assert_eq!(by_list.stored(), shown(&[("api-live", 3, None)]));
    assert!(by_list.view.hidden().is_empty());
}

#[test]
fn of_two_batches_holding_one_name_the_member_of_the_highest_generation_stands_for_it() {
    let (older, newer) = (batch("b1", &[("web", 1)]), batch("b2", &[("web", 2)]));
    let mut by_events = Fed::new();
    listed(&mut by_events, &[]);
    by_events.feed(Event::Apply(newer.clone()));
    by_events.feed(Event::Apply(older.clone()));
    let mut by_list = Fed::new();
    listed(&mut by_list, &[older, newer]);
    for fed in [&by_events, &by_list] {
        assert_eq!(fed.stored(), shown(&[("web-live", 2, Some("b2"))]));
        assert_eq!(
            fed.view.holding(&("shop".into(), "web-live".into())),
            ["b2", "b1"]
        );
    }
}
