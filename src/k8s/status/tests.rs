use super::*;
use crate::api::{TrafficRoute, TrafficRouteStatus};

fn status(accepted: bool, phase: &str) -> TrafficRouteStatus {
    let t = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).expect("time"));
    TrafficRouteStatus {
        phase: Some(phase.into()),
        conditions: vec![condition(&[], "Accepted", accepted, "x", "", 1, &t)],
        ..Default::default()
    }
}

fn key(name: &str) -> Key {
    ("TrafficRoute".into(), "shop".into(), name.into())
}

fn json(status: &TrafficRouteStatus) -> Value {
    serde_json::to_value(status).expect("a status")
}

fn routes() -> Arc<StatusKind> {
    Arc::new(StatusKind::namespaced::<TrafficRoute>(
        Write::Apply,
        &["Accepted", "Ready"],
    ))
}

/// The status `status` for the route `name`, which showed `shown` when read.
fn update(
    name: &str,
    status: TrafficRouteStatus,
    shown: Option<&TrafficRouteStatus>,
) -> StatusUpdate {
    StatusUpdate {
        kind: routes(),
        namespace: "shop".into(),
        name: name.into(),
        status: json(&status),
        shown: shown.map(json),
        read: Some("1".into()),
    }
}

fn phase(wanted: &Wanted) -> String {
    parsed(wanted)["phase"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn parsed(wanted: &Wanted) -> Value {
    serde_json::from_str(&wanted.status).expect("the text of a status")
}

#[test]
fn rollouts_are_written_before_rejections_each_in_arrival_order() {
    let mut pending = Pending::default();
    pending.put(update("bad-1", status(false, "Rejected"), None));
    pending.put(update("z-web", status(true, "Staging"), None));
    pending.put(update("bad-2", status(false, "Rejected"), None));
    pending.put(update("a-api", status(true, "Ready"), None));
    // The newest status replaces the one waiting, in its place.
    pending.put(update("z-web", status(true, "Ready"), None));
    // A rejected route waiting with an urgent status stays urgent.
    pending.put(update("a-api", status(false, "Rejected"), None));
    let order: Vec<(String, String)> = std::iter::from_fn(|| pending.pop())
        .map(|(k, w)| (k.2, phase(&w)))
        .collect();
    let expected = [
        ("z-web", "Ready"),
        ("a-api", "Rejected"),
        ("bad-1", "Rejected"),
        ("bad-2", "Rejected"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(k, p)| (k.to_string(), p.to_string()))
        .collect();
    assert_eq!(order, expected);
}

#[test]
fn a_route_has_one_write_in_flight_at_most() {
    let mut pending = Pending::default();
    pending.put(update("web", status(true, "Staging"), None));
    let (web, _) = pending.pop().expect("web's first status");
    pending.in_flight.insert(web.clone(), Value::Null);
    // A newer status of web waits for the write in flight; another route's does not.
    pending.put(update("web", status(true, "Ready"), None));
    pending.put(update("api", status(true, "Staging"), None));
    assert_eq!(pending.pop().map(|(k, _)| k.2), Some("api".to_string()));
    assert!(pending.pop().is_none());
    pending.in_flight.remove(&web);
    let next = pending.pop().map(|(k, w)| (k.2, phase(&w)));
    assert_eq!(next, Some(("web".to_string(), "Ready".to_string())));
}

#[test]
fn an_echo_is_what_our_own_write_left_with_the_spec_as_it_was() {
    let mut pending = Pending::default();
    let kind = routes();
    let object = |version: &str, generation: i64, status: &TrafficRouteStatus| {
        json!({
            "metadata": {
                "namespace": "shop", "name": "web",
                "resourceVersion": version, "generation": generation,
            },
            "status": json(status),
        })
    };
    // Observed generation 1.
    let staging = status(true, "Staging");
    pending.put(update("web", staging.clone(), None));
    let (web, wanted) = pending.pop().expect("a status");
    assert!(!pending.is_echo(&kind, &object("2", 1, &staging)));
    // In flight: the watch may bring it back before the answer does...
    pending.in_flight.insert(web.clone(), parsed(&wanted));
    assert!(pending.is_echo(&kind, &object("2", 1, &staging)));
    // ...but a newer spec, or another status, is a change.
    assert!(!pending.is_echo(&kind, &object("3", 2, &staging)));
    assert!(!pending.is_echo(&kind, &object("3", 1, &status(true, "Ready"))));
    // Answered: the resourceVersion it left, and only that, is ours.
    pending.in_flight.remove(&web);
    pending.wrote(web, wanted, Some(("1".into(), "2".into())));
    assert!(pending.is_echo(&kind, &object("2", 1, &staging)));
    assert!(!pending.is_echo(&kind, &object("4", 1, &staging)));
}

#[test]
fn a_status_the_route_shows_is_not_written_again() {
    let mut pending = Pending::default();
    let ready = status(true, "Ready");
    // A new leader's first pass over a route that already shows its status.
    pending.put(update("web", ready.clone(), Some(&ready)));
    assert!(pending.pop().is_none());
    // What the route shows lags behind a write of ours: then it is no proof.
    let staging = json(&status(false, "Staging"));
    let last = LastWrite {
        summary: routes().summary_of(&staging),
        transitions: Box::default(),
        at: Timestamp::now(),
    };
    pending.written.insert(key("web"), last);
    pending.put(update("web", ready.clone(), Some(&ready)));
    assert_eq!(pending.pop().map(|(_, w)| parsed(&w)), Some(json(&ready)));
    // A status waiting is dropped once the route shows the one wanted now.
    pending.written.clear();
    pending.put(update("web", status(true, "Draining"), Some(&ready)));
    pending.put(update("web", ready.clone(), Some(&ready)));
    assert!(pending.pop().is_none());
}

#[test]
fn details_wait_behind_progress() {
    let mut pending = Pending::default();
    let draining = status(true, "Draining");
    let mut done = draining.clone();
    done.phase = Some("Ready".into());
    // A drain ending changes no condition: a detail.
    pending.put(update("drained", done, Some(&draining)));
    // A new generation of another route: progress.
    let mut next = status(true, "Staging");
    next.observed_generation = Some(2);
    pending.put(update("changed", next, Some(&draining)));
    let order: Vec<String> = std::iter::from_fn(|| pending.pop())
        .map(|(k, _)| k.2)
        .collect();
    assert_eq!(order, ["changed", "drained"]);
}

#[test]
fn a_rejected_route_that_recovers_moves_to_the_urgent_queue() {
    let mut pending = Pending::default();
    pending.put(update("bad", status(false, "Rejected"), None));
    pending.put(update("other", status(false, "Rejected"), None));
    pending.put(update("bad", status(true, "Staging"), None));
    assert_eq!(pending.pop().map(|(k, _)| k.2), Some("bad".to_string()));
    assert_eq!(pending.pop().map(|(k, _)| k.2), Some("other".to_string()));
    assert!(pending.pop().is_none());
}

#[test]
fn a_write_is_conditional_on_the_read_or_on_what_our_own_writes_left_of_it() {
    let mut pending = Pending::default();
    pending.put(update("web", status(true, "Staging"), None));
    let (web, first) = pending.pop().expect("a status");
    assert_eq!(first.read.as_deref(), Some("1"));
    // Written: the object went from 1 to 2, then 2 to 3 by a second write of ours.
    pending.wrote(web.clone(), first, Some(("1".into(), "2".into())));
    pending.put(update("web", status(true, "Verifying"), None));
    let (_, second) = pending.pop().expect("a status");
    // Decided on 1 (the store had not seen our write): ours is no change, 2 it is.
    assert_eq!(second.read.as_deref(), Some("2"));
    pending.wrote(web.clone(), second, Some(("2".into(), "3".into())));
    pending.put(update("web", status(true, "Ready"), None));
    assert_eq!(
        pending.pop().and_then(|(_, w)| w.read).as_deref(),
        Some("3")
    );
    // Read after someone else's change (5): conditional on that.
    let mut later = update("web", status(true, "Draining"), None);
    later.read = Some("5".into());
    pending.put(later);
    assert_eq!(
        pending.pop().and_then(|(_, w)| w.read).as_deref(),
        Some("5")
    );
}

#[test]
fn a_gateways_listener_programmed_is_progress_its_message_a_detail() {
    let gateways = StatusKind {
        resource: ApiResource::erase::<TrafficRoute>(&()),
        namespaced: true,
        write: Write::Merge,
        progress: &["Accepted", "Programmed"],
    };
    let gateway = |programmed: &str, message: &str| {
        serde_json::json!({
            "conditions": [{ "type": "Accepted", "status": "True", "reason": "Accepted" }],
            "listeners": [{ "name": "http", "conditions": [
                { "type": "Programmed", "status": programmed, "reason": "R", "message": message },
            ]}],
        })
    };
    let progress = |before: &Value, now: &Value| {
        gateways.is_progress(
            Some(&gateways.summary_of(before)),
            &gateways.summary_of(now),
        )
    };
    let pending = gateway("False", "waiting");
    assert!(progress(&pending, &gateway("True", "waiting")));
    assert!(!progress(&pending, &gateway("False", "still waiting")));
    // A merge leaves other writers' fields: the object shows a status it holds.
    let mut held = gateway("True", "");
    held["addresses"] = serde_json::json!([{ "value": "198.18.0.1" }]);
    assert!(gateways.shows(&held, &gateway("True", "")));
    assert!(!gateways.shows(&held, &gateway("False", "")));
}

#[test]
fn transition_time_changes_only_with_the_status() {
    let t0 = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).expect("time"));
    let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(2_000).expect("time"));
    let first = condition(&[], "Ready", false, "Staging", "", 1, &t0);
    assert_eq!(first.last_transition_time, t0);
    let same = condition(
        std::slice::from_ref(&first),
        "Ready",
        false,
        "VerifyingLive",
        "",
        1,
        &t1,
    );
    assert_eq!(
        same.last_transition_time, t0,
        "reason changed, status did not"
    );
    let flipped = condition(&[same], "Ready", true, "Ready", "", 1, &t1);
    assert_eq!(flipped.last_transition_time, t1);
}

#[test]
fn a_status_written_is_remembered_by_its_summary_alone() {
    let mut pending = Pending::default();
    let ready = status(true, "Ready");
    pending.put(update("web", ready.clone(), None));
    let (web, wanted) = pending.pop().expect("web's status");
    pending.wrote(web.clone(), wanted, Some(("1".into(), "2".into())));
    assert_eq!(
        pending.written.get(&web).map(|w| w.summary),
        Some(routes().summary_of(&json(&ready)))
    );
    // The store has not seen the write yet: the same status again is not written twice.
    pending.put(update("web", ready.clone(), None));
    assert!(pending.pop().is_none());
    // Another message is a detail.
    let mut detail = ready.clone();
    detail.conditions[0].message = "every Envoy serves it".into();
    pending.put(update("web", detail, None));
    assert!(pending.later.statuses.contains_key(&web));
    // A progress condition added is progress.
    let mut served = ready.clone();
    let t = served.conditions[0].last_transition_time.clone();
    served
        .conditions
        .push(condition(&[], "Ready", true, "x", "", 1, &t));
    pending.put(update("web", served, None));
    assert!(pending.urgent.statuses.contains_key(&web));
}

#[test]
fn a_status_decided_on_a_read_before_our_last_write_keeps_that_writes_transition_times() {
    let at = |second: i64| Time(Timestamp::from_second(second).expect("time"));
    let accepted = |previous: &[Condition], status: bool, now: i64| TrafficRouteStatus {
        conditions: vec![condition(
            previous,
            "Accepted",
            status,
            "x",
            "",
            1,
            &at(now),
        )],
        ..Default::default()
    };
    let time = |wanted: &Wanted| parsed(wanted)["conditions"][0]["lastTransitionTime"].clone();
    let mut pending = Pending::default();
    // Written at 1000 on read 1, which showed no status: the object is at 2.
    pending.put(update("web", accepted(&[], true, 1_000), None));
    let (web, first) = pending.pop().expect("a status");
    pending.wrote(web.clone(), first, Some(("1".into(), "2".into())));
    // The store still shows 1: a pass at 2000 sees no condition, and makes one new.
    pending.put(update("web", accepted(&[], true, 2_000), None));
    // The write of 1000 holds: Accepted has been True since then.
    assert!(
        pending.pop().is_none(),
        "the same status as the one written"
    );
    // The store shows 2 now; the route became Accepted False since (at 3000).
    let mut second = update("web", accepted(&[], false, 3_000), None);
    second.read = Some("2".into());
    pending.put(second);
    let (_, second) = pending.pop().expect("a status");
    pending.wrote(web.clone(), second, Some(("2".into(), "3".into())));
    // A pass on the read of 2 (True since 1000) decides True: a change after the False,
    // whose own time (1000, kept from its read) is older than the write: new now.
    let before = Timestamp::now();
    let mut again = update(
        "web",
        accepted(&accepted(&[], true, 1_000).conditions, true, 4_000),
        None,
    );
    again.read = Some("2".into());
    pending.put(again);
    let (_, again) = pending.pop().expect("a status");
    assert_eq!(again.read.as_deref(), Some("3"));
    let new: Time = serde_json::from_value(time(&again)).expect("a time");
    assert!(new.0.as_second() >= before.as_second(), "{}", again.status);
    // A change the pass made after the write keeps the pass's time.
    let later = Timestamp::now().as_second() + 60;
    let mut decided = update("web", accepted(&[], true, later), None);
    decided.read = Some("2".into());
    pending.put(decided);
    let (_, decided) = pending.pop().expect("a status");
    assert_eq!(time(&decided), json!(at(later)));
    // Decided on the object as our writes left it: the times are the front-end's.
    pending.wrote(web.clone(), again.clone(), Some(("3".into(), "4".into())));
    let mut current = update("web", accepted(&[], false, 5_000), None);
    current.read = Some("4".into());
    pending.put(current);
    let (_, current) = pending.pop().expect("a status");
    assert_eq!(time(&current), json!(at(5_000)));
}

#[test]
fn a_route_parents_conditions_keep_their_own_times_when_another_parent_goes() {
    let kind = Arc::new(StatusKind::namespaced::<TrafficRoute>(
        Write::Merge,
        &["Accepted"],
    ));
    let parent = |gateway: &str, controller: &str, time: &str| {
        json!({
            "parentRef": { "name": gateway },
            "controllerName": controller,
            "conditions": [{
                "type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                "lastTransitionTime": time,
            }],
        })
    };
    let route = |parents: Vec<Value>, read: &str| StatusUpdate {
        kind: kind.clone(),
        namespace: "shop".into(),
        name: "web".into(),
        status: json!({ "parents": parents }),
        shown: None,
        read: Some(read.into()),
    };
    let (a, b) = ("1970-01-01T00:16:40Z", "1970-01-01T00:33:20Z");
    let mut pending = Pending::default();
    // Written: two parents, and another controller's on Gateway b.
    pending.put(route(
        vec![
            parent("b", "other.example/gateway", a),
            parent("a", "switchyard", a),
            parent("b", "switchyard", b),
        ],
        "1",
    ));
    let (web, first) = pending.pop().expect("a status");
    pending.wrote(web, first, Some(("1".into(), "2".into())));
    // Gateway a gone, decided on read 1 (no status there: every time new).
    let now = "2999-01-01T00:00:00Z";
    pending.put(route(
        vec![
            parent("b", "other.example/gateway", a),
            parent("b", "switchyard", now),
        ],
        "1",
    ));
    let (_, wanted) = pending.pop().expect("a status");
    let times: Vec<Value> = (parsed(&wanted)["parents"]
        .as_array()
        .expect("parents")
        .iter())
    .map(|p| p["conditions"][0]["lastTransitionTime"].clone())
    .collect();
    assert_eq!(times, [json!(a), json!(b)]);
}
