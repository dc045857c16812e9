use super::*;
use crate::gateway::translate::PortConfig;

/// A route's generation 1, served as it is.
const ONE: Generations = Generations {
    current: 1,
    served: 1,
};

fn stored(type_: &str, status: &str) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: "Seeded".to_owned(),
        message: String::new(),
        observed_generation: Some(1),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

#[test]
fn other_controllers_conditions_stay_as_they_are() {
    let old = [
        stored("Accepted", "False"),
        stored("example.com/Audited", "True"),
        stored("Programmed", "True"),
    ];
    let ours = [Cond::yes("Accepted", "Accepted", "fine")];
    let now = conditions(&ours, 2, &old);
    let types: Vec<&str> = now.iter().map(|c| c.type_.as_str()).collect();
    // Programmed is Switchyard's own: not written now, so gone; the foreign one stays.
    assert_eq!(types, ["Accepted", "example.com/Audited"]);
    assert_eq!(now[1], old[1]);
    assert_eq!(now[0].observed_generation, Some(2));
}

fn listener(name: &str, port: i32, usable: bool, conditions: Vec<Cond>) -> ListenerOutcome {
    ListenerOutcome {
        name: name.to_owned(),
        port,
        conditions,
        supported_kinds: vec!["HTTPRoute".to_owned()],
        attached_routes: 0,
        usable,
    }
}

/// The units of Gateway infra/edge listening on ports 80 and 8080, each port's own unit
/// by port.
fn port_units() -> (Vec<Unit>, BTreeMap<i32, String>) {
    let port = |port| PortConfig {
        port,
        protocol: "HTTP".to_owned(),
        certificates: Vec::new(),
        client_validation: None,
        virtual_hosts: Vec::new(),
    };
    let gateway = GatewayOutcome {
        namespace: "infra".to_owned(),
        name: "edge".to_owned(),
        generation: 1,
        conditions: Vec::new(),
        backend_client_certificate: None,
        listeners: Vec::new(),
        attached_listener_sets: 1,
        infrastructure: Default::default(),
        ports: vec![port(80), port(8080)],
    };
    let key = ("infra".to_owned(), "edge".to_owned());
    let fleet_ports = [(key, vec![(80, 20000), (8080, 20001)])].into();
    let units = crate::gateway::unit::units(&[gateway], &fleet_ports);
    let names = (units.iter())
        .filter(|u| u.hostname.is_none())
        .map(|u| (u.port, u.name.clone()))
        .collect();
    (units, names)
}

fn condition<'a>(status: &'a Value, type_: &str) -> (&'a str, &'a str) {
    let found = (status["conditions"].as_array().into_iter().flatten())
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} in {status}"));
    (
        found["status"].as_str().unwrap_or_default(),
        found["reason"].as_str().unwrap_or_default(),
    )
}

#[test]
fn a_listener_set_is_programmed_when_every_envoy_serves_its_valid_listeners() {
    let (units, names) = port_units();
    let key = ("infra".to_owned(), "edge".to_owned());
    let mut outcome = Outcome {
        states: [
            ((key.clone(), names[&80].clone()), UnitState::Served),
            (
                (key.clone(), names[&8080].clone()),
                UnitState::Waiting("ready 2/3".to_owned()),
            ),
        ]
        .into(),
        wake: None,
        asked: None,
    };
    let conflict = "HostnameConflict";
    let set = ListenerSetOutcome {
        namespace: "team".to_owned(),
        name: "api".to_owned(),
        generation: 3,
        gateway: key.clone(),
        conditions: vec![Cond::yes("Accepted", "ListenersNotValid", "one conflicts")],
        listeners: vec![
            listener("api", 8080, true, Vec::new()),
            listener(
                "taken",
                80,
                false,
                vec![Cond::yes(
                    "Conflicted",
                    conflict,
                    "the Gateway's comes first",
                )],
            ),
        ],
    };
    let programmed = |outcome: &Outcome| {
        let p = Programmed {
            units: &units,
            outcome,
        };
        listener_set_status(&set, None, &p)
    };
    let status = programmed(&outcome);
    assert_eq!(condition(&status, "Programmed"), ("False", "Pending"));
    // The listener in conflict is not programmed, for its conflict; it holds nothing back.
    let taken = &status["listeners"][1];
    assert_eq!(condition(taken, "Programmed"), ("False", conflict));
    let unit = (key, names[&8080].clone());
    outcome.states.insert(unit, UnitState::Served);
    let status = programmed(&outcome);
    assert_eq!(condition(&status, "Programmed"), ("True", "Programmed"));
    assert_eq!(status["conditions"][0]["observedGeneration"], 3);
}

#[test]
fn a_listener_set_not_accepted_is_not_programmed_for_the_same_reason() {
    let outcome = Outcome {
        states: Default::default(),
        wake: None,
        asked: None,
    };
    let programmed = Programmed {
        units: &[],
        outcome: &outcome,
    };
    for reason in ["NotAllowed", "ListenersNotValid", "ParentNotAccepted"] {
        let set = ListenerSetOutcome {
            namespace: "team".to_owned(),
            name: "api".to_owned(),
            generation: 1,
            gateway: ("infra".to_owned(), "edge".to_owned()),
            conditions: vec![Cond::no("Accepted", reason, "why")],
            listeners: Vec::new(),
        };
        let status = listener_set_status(&set, None, &programmed);
        assert_eq!(condition(&status, "Accepted"), ("False", reason));
        assert_eq!(condition(&status, "Programmed"), ("False", reason));
    }
}

fn parent(listener_set: Option<&str>, port: Option<i32>, accepted: bool) -> ParentOutcome {
    let accepted = if accepted {
        Cond::yes("Accepted", "Accepted", "attached")
    } else {
        Cond::no("Accepted", "NoMatchingParent", "no listener")
    };
    ParentOutcome {
        gateway_namespace: "infra".to_owned(),
        gateway: "edge".to_owned(),
        listener_set: listener_set.map(|s| ("infra".to_owned(), s.to_owned())),
        section_name: None,
        port,
        conditions: vec![accepted],
    }
}

#[test]
fn a_routes_status_read_back_is_written_again_unchanged() {
    // Parents that differ only by their kind (a Gateway and a ListenerSet of the same
    // name) or their port: each finds its own conditions again, so their
    // lastTransitionTimes stay and the status converges.
    let ours = [
        parent(None, Some(80), true),
        parent(None, Some(8080), false),
        parent(Some("edge"), None, false),
    ];
    let served = |p: &ParentOutcome| {
        if p.conditions[0].is_true() {
            Cond::yes(SERVED, "Served", "served")
        } else {
            Cond::no(SERVED, "NotAccepted", "not accepted")
        }
    };
    let mut first = route_status("me", &ours, &served, ONE, None).expect("a status");
    let kinds: Vec<&Value> = (first["parents"].as_array().into_iter().flatten())
        .map(|p| &p["parentRef"]["kind"])
        .collect();
    assert_eq!(kinds, ["Gateway", "Gateway", "ListenerSet"]);
    // As if written long ago: a condition that found another's gets a new time.
    for p in first["parents"].as_array_mut().into_iter().flatten() {
        for c in p["conditions"].as_array_mut().into_iter().flatten() {
            c["lastTransitionTime"] = json!("2020-01-01T00:00:00Z");
        }
    }
    let second = route_status("me", &ours, &served, ONE, Some(&first)).expect("a status");
    assert_eq!(first, second);
}
