//! Gateway API durations (`1h2m3s4ms`) in the route vocabulary's form (`3723004ms`): one
//! number of at most six digits and its unit, as the vocabulary's checks and lowering
//! parse them.

/// A Gateway API duration (`1h2m3s4ms`: up to four numbers, each with a unit of h, m, s
/// or ms) in milliseconds.
pub fn gateway_duration_ms(text: &str) -> Option<u64> {
    let mut total: u64 = 0;
    let mut rest = text;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let number: u64 = rest.get(..digits)?.parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (1, 2)
        } else {
            match rest.as_bytes().first()? {
                b'h' => (3_600_000, 1),
                b'm' => (60_000, 1),
                b's' => (1_000, 1),
                _ => return None,
            }
        };
        rest = &rest[len..];
        total = total.checked_add(number.checked_mul(unit)?)?;
        parts += 1;
    }
    (parts > 0).then_some(total)
}

/// Milliseconds in the vocabulary's form: one number of at most six digits, in the
/// largest unit that keeps it exact.
pub fn vocabulary_duration(millis: u64) -> Option<String> {
    if millis == 0 {
        return Some("0s".to_owned());
    }
    let units = [(3_600_000, "h"), (60_000, "m"), (1_000, "s"), (1, "ms")];
    let (size, unit) = units
        .into_iter()
        .find(|(size, _)| millis.is_multiple_of(*size))
        .unwrap_or((1, "ms"));
    let number = millis / size;
    (number < 1_000_000).then(|| format!("{number}{unit}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_durations_add_up_their_parts() {
        assert_eq!(gateway_duration_ms("500ms"), Some(500));
        assert_eq!(gateway_duration_ms("1h2m3s4ms"), Some(3_723_004));
        assert_eq!(gateway_duration_ms("0s"), Some(0));
        assert_eq!(gateway_duration_ms(""), None);
        assert_eq!(gateway_duration_ms("1d"), None);
        assert_eq!(gateway_duration_ms("s"), None);
    }

    #[test]
    fn durations_take_the_largest_exact_unit() {
        assert_eq!(vocabulary_duration(90_000).as_deref(), Some("90s"));
        assert_eq!(vocabulary_duration(3_600_000).as_deref(), Some("1h"));
        assert_eq!(vocabulary_duration(1_500).as_deref(), Some("1500ms"));
        assert_eq!(vocabulary_duration(0).as_deref(), Some("0s"));
        assert_eq!(vocabulary_duration(1_000_000_001), None);
    }
}
