//! Hostnames as the Gateway API matches them: a listener's hostname against a route's.
//! A wildcard (`*.example.com`) stands for one or more labels in front of its suffix.

/// The hostnames a route serves through a listener: each of the route's hostnames that
/// the listener's admits, the more specific of the two when one is a wildcard covering the
/// other. No listener hostname admits every route hostname; a route without hostnames
/// takes the listener's (or, when neither has one, every host: `*`).
pub fn intersect(listener: Option<&str>, route: &[String]) -> Vec<String> {
    let route: Vec<String> = route.iter().map(|h| h.to_ascii_lowercase()).collect();
    let listener = listener.map(str::to_ascii_lowercase);
    match (listener, route.is_empty()) {
        (None, true) => vec!["*".to_owned()],
        (Some(l), true) => vec![l],
        (None, false) => route,
        (Some(l), false) => {
            let mut out: Vec<String> = route.iter().filter_map(|r| more_specific(&l, r)).collect();
            out.sort();
            out.dedup();
            out
        }
    }
}

/// Of two hostnames that match each other, the more specific; `None` when they do not.
fn more_specific(listener: &str, route: &str) -> Option<String> {
    if listener == route {
        return Some(route.to_owned());
    }
    if covers(listener, route) {
        return Some(route.to_owned());
    }
    if covers(route, listener) {
        return Some(listener.to_owned());
    }
    None
}

/// Whether the wildcard `pattern` covers `host` (itself a name or a narrower wildcard).
fn covers(pattern: &str, host: &str) -> bool {
    let Some(suffix) = pattern.strip_prefix("*.") else {
        return false;
    };
    let host = host.strip_prefix("*.").unwrap_or(host);
    host.len() > suffix.len()
        && host.ends_with(suffix)
        && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &[&str]) -> Vec<String> {
        list.iter().map(|h| h.to_string()).collect()
    }

    #[test]
    fn neither_side_naming_a_host_serves_every_host() {
        assert_eq!(intersect(None, &[]), ["*"]);
        assert_eq!(intersect(Some("a.example.com"), &[]), ["a.example.com"]);
        assert_eq!(
            intersect(None, &hosts(&["B.example.com"])),
            ["b.example.com"]
        );
    }

    #[test]
    fn a_wildcard_yields_to_the_more_specific_side() {
        let route = hosts(&["very.specific.com", "*.wildcard.io", "foo.wildcard.io"]);
        assert_eq!(
            intersect(Some("*.wildcard.io"), &route),
            ["*.wildcard.io", "foo.wildcard.io"]
        );
        assert_eq!(
            intersect(Some("bar.wildcard.io"), &hosts(&["*.wildcard.io"])),
            ["bar.wildcard.io"]
        );
        assert_eq!(
            intersect(Some("*.io"), &hosts(&["*.wildcard.io"])),
            ["*.wildcard.io"]
        );
    }

    #[test]
    fn a_wildcard_needs_a_label_in_front_of_its_suffix() {
        assert!(intersect(Some("*.example.com"), &hosts(&["example.com"])).is_empty());
        assert!(intersect(Some("*.example.com"), &hosts(&["badexample.com"])).is_empty());
        assert!(intersect(Some("a.example.com"), &hosts(&["b.example.com"])).is_empty());
        assert_eq!(
            intersect(Some("*.example.com"), &hosts(&["a.b.example.com"])),
            ["a.b.example.com"]
        );
    }
}
