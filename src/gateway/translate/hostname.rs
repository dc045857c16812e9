//! Hostnames as the Gateway API matches them: a listener's hostname against a route's.
//! A wildcard (`*.example.com`) stands for one or more labels in front of its suffix.

/// How strongly a route claims a hostname it serves, from the route's own hostname (not
/// the intersection with the listener's): a name over a wildcard, then the longer one.
/// A route without hostnames claims least. Of the routes serving one hostname, the
/// rules of the strongest claimant come first (GatewayRouteHostnameIntersectionPrecedence).
pub type Claim = (bool, usize);

/// A hostname a route serves through a listener, with the route's claim on it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Served {
    pub hostname: String,
    pub claim: Claim,
}

/// The hostnames a route serves through a listener: each of the route's hostnames that
/// the listener's admits, the more specific of the two when one is a wildcard covering the
/// other. No listener hostname admits every route hostname; a route without hostnames
/// takes the listener's (or, when neither has one, every host: `*`). Two route hostnames
/// narrowed to one name give it once, with the stronger claim.
pub fn intersect(listener: Option<&str>, route: &[String]) -> Vec<Served> {
    let route: Vec<String> = route.iter().map(|h| h.to_ascii_lowercase()).collect();
    let listener = listener.map(str::to_ascii_lowercase);
    let unclaimed = |hostname: String| Served {
        hostname,
        claim: (false, 0),
    };
    match (listener, route.is_empty()) {
        (None, true) => vec![unclaimed("*".to_owned())],
        (Some(l), true) => vec![unclaimed(l)],
        (None, false) => route
            .iter()
            .map(|r| Served {
                hostname: r.clone(),
                claim: claim(r),
            })
            .collect(),
        (Some(l), false) => {
            let mut out: Vec<Served> = (route.iter())
                .filter_map(|r| {
                    Some(Served {
                        hostname: more_specific(&l, r)?,
                        claim: claim(r),
                    })
                })
                .collect();
            // Strongest claim first, so that dedup keeps it.
            out.sort_by(|a, b| a.hostname.cmp(&b.hostname).then(b.claim.cmp(&a.claim)));
            out.dedup_by(|a, b| a.hostname == b.hostname);
            out
        }
    }
}

fn claim(route_hostname: &str) -> Claim {
    (!route_hostname.starts_with("*."), route_hostname.len())
}

/// Whether a listener with hostname `listener` (None: every host) admits every name
/// `hostname` stands for.
pub fn admits(listener: Option<&str>, hostname: &str) -> bool {
    match listener {
        None => true,
        Some(l) => l.eq_ignore_ascii_case(hostname) || covers(&l.to_ascii_lowercase(), hostname),
    }
}

/// How specific a listener hostname is: a name over a wildcard, the longer wildcard over
/// the shorter, any over none.
pub fn listener_rank(listener: Option<&str>) -> (bool, bool, usize) {
    match listener {
        None => (false, false, 0),
        Some(l) => (true, !l.starts_with("*."), l.len()),
    }
}

/// Whether two hostnames a listener serves (`*`: every host) have a name in common.
pub fn overlap(a: &str, b: &str) -> bool {
    a == "*" || b == "*" || more_specific(a, b).is_some()
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

    fn names(served: Vec<Served>) -> Vec<String> {
        served.into_iter().map(|s| s.hostname).collect()
    }

    #[test]
    fn hostnames_overlap_when_a_name_is_in_both() {
        assert!(overlap("*", "a.example.com"));
        assert!(overlap("a.example.com", "a.example.com"));
        assert!(overlap("*.example.com", "a.example.com"));
        assert!(overlap("*.com", "*.example.com"));
        assert!(!overlap("a.example.com", "b.example.com"));
        assert!(!overlap("*.example.com", "example.com"));
    }

    #[test]
    fn neither_side_naming_a_host_serves_every_host() {
        assert_eq!(names(intersect(None, &[])), ["*"]);
        assert_eq!(
            names(intersect(Some("a.example.com"), &[])),
            ["a.example.com"]
        );
        assert_eq!(
            names(intersect(None, &hosts(&["B.example.com"]))),
            ["b.example.com"]
        );
    }

    #[test]
    fn a_wildcard_yields_to_the_more_specific_side() {
        let route = hosts(&["very.specific.com", "*.wildcard.io", "foo.wildcard.io"]);
        assert_eq!(
            names(intersect(Some("*.wildcard.io"), &route)),
            ["*.wildcard.io", "foo.wildcard.io"]
        );
        assert_eq!(
            names(intersect(
                Some("bar.wildcard.io"),
                &hosts(&["*.wildcard.io"])
            )),
            ["bar.wildcard.io"]
        );
        assert_eq!(
            names(intersect(Some("*.io"), &hosts(&["*.wildcard.io"]))),
            ["*.wildcard.io"]
        );
    }

    #[test]
    fn a_wildcard_needs_a_label_in_front_of_its_suffix() {
        assert!(names(intersect(Some("*.example.com"), &hosts(&["example.com"]))).is_empty());
        assert!(
            names(intersect(
                Some("*.example.com"),
                &hosts(&["badexample.com"])
            ))
            .is_empty()
        );
        assert!(names(intersect(Some("a.example.com"), &hosts(&["b.example.com"]))).is_empty());
        assert_eq!(
            names(intersect(
                Some("*.example.com"),
                &hosts(&["a.b.example.com"])
            )),
            ["a.b.example.com"]
        );
    }

    #[test]
    fn a_name_narrowed_from_several_route_hostnames_keeps_the_strongest_claim() {
        let route = hosts(&["*.example.com", "*.foo.example.com", "abc.foo.example.com"]);
        assert_eq!(
            intersect(Some("abc.foo.example.com"), &route),
            [Served {
                hostname: "abc.foo.example.com".into(),
                claim: (true, 19),
            }]
        );
        let narrowed = intersect(Some("abc.example.com"), &hosts(&["*.example.com"]));
        let own = intersect(Some("abc.example.com"), &hosts(&["abc.example.com"]));
        assert!(own[0].claim > narrowed[0].claim);
        let shorter = intersect(Some("*.example.com"), &hosts(&["*.com"]));
        let longer = intersect(Some("*.example.com"), &hosts(&["*.example.com"]));
        assert_eq!(shorter[0].hostname, longer[0].hostname);
        assert!(longer[0].claim > shorter[0].claim);
        assert!(shorter[0].claim > intersect(Some("*.example.com"), &[])[0].claim);
    }

    #[test]
    fn a_listener_admits_what_its_hostname_covers() {
        assert!(admits(None, "*"));
        assert!(admits(Some("*.example.com"), "*.foo.example.com"));
        assert!(admits(Some("*.example.com"), "*.example.com"));
        assert!(admits(Some("*.Example.com"), "a.example.com"));
        assert!(!admits(Some("*.foo.example.com"), "*.example.com"));
        assert!(!admits(Some("abc.example.com"), "*.example.com"));
        assert!(!admits(Some("a.example.com"), "*"));
        assert!(listener_rank(Some("a.example.com")) > listener_rank(Some("*.foo.example.com")));
        assert!(listener_rank(Some("*.foo.example.com")) > listener_rank(Some("*.example.com")));
        assert!(listener_rank(Some("*.example.com")) > listener_rank(None));
    }
}
