use super::*;

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
