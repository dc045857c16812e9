use super::*;
use crate::gateway::translate::ParentOutcome;

fn route(generation: i64) -> HttpRoute {
    let mut route: HttpRoute = serde_json::from_value(serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": { "namespace": "shop", "name": "web", "generation": generation },
        "spec": {},
    }))
    .expect("an HTTPRoute");
    route.metadata.generation = Some(generation);
    route
}

/// The outcome of route shop/web with one parent: accepted, and ResolvedRefs as given.
fn outcome(generation: i64, resolved_refs: Cond) -> RouteOutcome {
    RouteOutcome {
        namespace: "shop".into(),
        name: "web".into(),
        generation,
        parents: vec![ParentOutcome {
            gateway_namespace: "gw".into(),
            gateway: "edge".into(),
            listener_set: None,
            section_name: None,
            port: None,
            conditions: vec![Cond::yes("Accepted", "Accepted", ""), resolved_refs],
        }],
    }
}

fn resolved() -> Cond {
    Cond::yes("ResolvedRefs", "ResolvedRefs", "")
}

fn missing(reason: &'static str) -> Cond {
    Cond::no("ResolvedRefs", reason, "not there")
}

const PERIOD: Duration = Duration::from_secs(5);

/// One review of route shop/web: the generation lowered, and whether it waits.
fn review(
    grace: &mut Grace<HttpRoute>,
    r: &HttpRoute,
    o: &RouteOutcome,
    now: Instant,
) -> (i64, Option<Waiting>) {
    let mut waiting = WaitingRoutes::new();
    let lowered = grace.review(
        std::slice::from_ref(r),
        std::slice::from_ref(o),
        PERIOD,
        now,
        &mut waiting,
    );
    let generation = lowered.map_or(r.metadata.generation, |l| l[0].metadata.generation);
    let waits = waiting.remove(&(HTTP_ROUTE, "shop/web".to_owned()));
    (generation.unwrap_or(0), waits)
}

#[test]
fn a_change_that_lacks_an_object_serves_the_last_resolved_generation_for_the_period() {
    let mut grace = Grace::new(HTTP_ROUTE);
    let start = Instant::now();
    assert_eq!(
        review(&mut grace, &route(1), &outcome(1, resolved()), start),
        (1, None)
    );

    // Generation 2 names a Service in another namespace before its ReferenceGrant is there.
    let two = outcome(2, missing("RefNotPermitted"));
    let (lowered, waits) = review(&mut grace, &route(2), &two, start);
    assert_eq!(lowered, 1);
    let waits = waits.expect("waits");
    assert_eq!((waits.kept_generation, waits.until), (1, start + PERIOD));
    // Still within the period: the same deadline, not a new one.
    let later = start + Duration::from_secs(4);
    let (lowered, waits) = review(&mut grace, &route(2), &two, later);
    assert_eq!((lowered, waits.map(|w| w.until)), (1, Some(start + PERIOD)));
    // A generation after it, still waiting, gets a period of its own.
    let three = outcome(3, missing("BackendNotFound"));
    let (lowered, waits) = review(&mut grace, &route(3), &three, later);
    assert_eq!((lowered, waits.map(|w| w.until)), (1, Some(later + PERIOD)));
    // What was missing came: generation 3 resolves and is served.
    let now = later + Duration::from_secs(1);
    assert_eq!(
        review(&mut grace, &route(3), &outcome(3, resolved()), now),
        (3, None)
    );

    // Over: generation 4 is served as it is, with its 500s, and nothing earlier comes back
    // for the generations after it.
    let four = outcome(4, missing("BackendNotFound"));
    assert_eq!(review(&mut grace, &route(4), &four, now).0, 3);
    assert_eq!(
        review(&mut grace, &route(4), &four, now + PERIOD),
        (4, None)
    );
    let five = outcome(5, missing("BackendNotFound"));
    assert_eq!(
        review(&mut grace, &route(5), &five, now + PERIOD),
        (5, None)
    );
}

#[test]
fn a_route_never_resolved_or_wrong_in_itself_does_not_wait() {
    let mut grace = Grace::new(HTTP_ROUTE);
    let now = Instant::now();
    // Never served: 500 at once.
    let first = outcome(1, missing("BackendNotFound"));
    assert_eq!(review(&mut grace, &route(1), &first, now), (1, None));
    // Served, then changed to what no other object can mend.
    assert_eq!(
        review(&mut grace, &route(2), &outcome(2, resolved()), now),
        (2, None)
    );
    let invalid = outcome(3, missing("InvalidKind"));
    assert_eq!(review(&mut grace, &route(3), &invalid, now), (3, None));
    // A route gone is forgotten: created again, it is new.
    let mut waiting = WaitingRoutes::new();
    assert!(grace.review(&[], &[], PERIOD, now, &mut waiting).is_none());
    let (lowered, waits) = review(
        &mut grace,
        &route(4),
        &outcome(4, missing("RefNotPermitted")),
        now,
    );
    assert_eq!((lowered, waits), (4, None));
}

#[test]
fn a_waiting_route_is_served_at_its_kept_generation_and_says_why() {
    let waiting = Waiting {
        kept_generation: 1,
        until: Instant::now(),
        period: PERIOD,
    };
    let served = Cond::yes(
        "switchyard.dev/Served",
        "Served",
        "every Envoy serves this generation",
    );
    let told = served_while_waiting(served, &waiting, 2);
    assert!(told.is_true());
    assert_eq!(
        told.message,
        "every Envoy serves generation 1; generation 2 waits, at most 5s, for the objects its \
         backendRefs name (see ResolvedRefs)"
    );
}

#[test]
fn a_change_of_parents_or_a_route_created_again_does_not_wait() {
    let mut grace = Grace::new(HTTP_ROUTE);
    let now = Instant::now();
    assert_eq!(
        review(&mut grace, &route(1), &outcome(1, resolved()), now),
        (1, None)
    );
    // Generation 2 moves to another Gateway, and names a Service not there yet.
    let mut moved = outcome(2, missing("BackendNotFound"));
    moved.parents[0].gateway = "other".into();
    assert_eq!(review(&mut grace, &route(2), &moved, now), (2, None));

    // Deleted and created again under its name between two passes: a new object.
    assert_eq!(
        review(&mut grace, &route(3), &outcome(3, resolved()), now),
        (3, None)
    );
    let mut again = route(4);
    again.metadata.uid = Some("another".into());
    let waits = outcome(4, missing("RefNotPermitted"));
    assert_eq!(review(&mut grace, &again, &waits, now), (4, None));
}
