//! GRPCRoutes: a gRPC call is an HTTP/2 request to `/{service}/{method}`, so a GRPCRoute's
//! rules are lowered as an HTTPRoute's are ([`http_route::lower_rules`]): its method and
//! header matches become path and header matches, and its filters and backendRefs are
//! HTTPRoute's own (the Gateway API declares them alike). Its backends speak HTTP/2.
//!
//! Precedence between its matches is the GRPCRoute's own: the longer service, then the
//! longer method, then more header matches.

use super::Inputs;
use super::attach::{Lowered, Route, Specificity, route_of};
use super::gateway::GRPC_ROUTE;
use super::http_route::{self, Matches, NO_DEFAULT_GATEWAYS, RuleOf};
use crate::gateway::api::grpcroutes::{
    GrpcRoute, GrpcRouteRules, GrpcRouteRulesMatches,
    GrpcRouteRulesMatchesHeadersType as HeaderType, GrpcRouteRulesMatchesMethodType as MethodType,
    GrpcRouteUseDefaultGateways,
};
use crate::gateway::api::httproutes::HttpRouteRules;
use switchyard_core::route::spec::RuleMatch;

/// The route as attachment reads it.
pub fn route(route: &GrpcRoute) -> Route<'_> {
    route_of!(route, GRPC_ROUTE)
}

/// The route's rules in HTTPRoute's fields ([`as_http_rule`]), or the first one that has
/// what Switchyard does not support.
pub fn as_http_rules(route: &GrpcRoute) -> Result<Vec<HttpRouteRules>, String> {
    (route.spec.rules.iter().flatten().enumerate())
        .map(|(ri, rule)| as_http_rule(rule, &format!("spec.rules[{ri}]")))
        .collect()
}

/// The route's rules (it is the `seniority`-th oldest; `rules`: [`as_http_rules`] of it) in
/// the vocabulary, or what it uses that Switchyard does not support.
pub fn lower(
    inputs: &Inputs<'_>,
    route: &GrpcRoute,
    rules: &Result<Vec<HttpRouteRules>, String>,
    seniority: usize,
) -> Result<Lowered, String> {
    if route.spec.use_default_gateways == Some(GrpcRouteUseDefaultGateways::All) {
        return Err(NO_DEFAULT_GATEWAYS.to_owned());
    }
    let rules = rules.as_ref().map_err(String::clone)?;
    let grpc_rules = route.spec.rules.as_deref().unwrap_or_default();
    let lower_matches = |ri: usize, at: &str| {
        let matches = grpc_rules.get(ri).and_then(|r| r.matches.as_deref());
        lower_matches(matches.unwrap_or_default(), at)
    };
    let of = RuleOf {
        kind: GRPC_ROUTE,
        namespace: route.metadata.namespace.as_deref().unwrap_or_default(),
        name: route.metadata.name.as_deref().unwrap_or_default(),
        seniority,
        backend_tls: true,
    };
    http_route::lower_rules(inputs, &of, rules, &lower_matches)
}

/// A GRPCRoute rule's name, filters and backendRefs in HTTPRoute's fields (its matches are
/// lowered on their own). The schema gives both kinds the same objects there. A session
/// is refused: Envoy would keep it with a cookie, which gRPC clients do not send back.
fn as_http_rule(rule: &GrpcRouteRules, at: &str) -> Result<HttpRouteRules, String> {
    if rule.session_persistence.is_some() {
        return Err(format!(
            "{at}.sessionPersistence: not supported on a GRPCRoute (Envoy keeps a session \
             with a cookie, which gRPC clients do not send back)"
        ));
    }
    let mut value = serde_json::to_value(rule).map_err(|e| format!("{at}: {e}"))?;
    if let Some(object) = value.as_object_mut() {
        object.remove("matches");
    }
    serde_json::from_value(value).map_err(|e| format!("{at}: not supported: {e}"))
}

/// A rule's matches in the vocabulary: one that matches every call when it has none.
fn lower_matches(matches: &[GrpcRouteRulesMatches], at: &str) -> Result<Matches, String> {
    if matches.is_empty() {
        return Ok(vec![lower_match(&GrpcRouteRulesMatches::default(), at)?]);
    }
    (matches.iter().enumerate())
        .map(|(mi, m)| lower_match(m, &format!("{at}.matches[{mi}]")))
        .collect()
}

/// One match as a path and header match (the Gateway API's table, GEP-1016): an exact
/// service and method is the path `/{service}/{method}`, a service alone the prefix
/// `/{service}/`, a method alone any service's; a regular expression matches each part
/// it gives, any service or method it does not.
fn lower_match(m: &GrpcRouteRulesMatches, at: &str) -> Result<(RuleMatch, Specificity), String> {
    let mut out = RuleMatch::default();
    let method = m.method.as_ref();
    let service_name = method.and_then(|m| m.service.as_deref());
    let method_name = method.and_then(|m| m.method.as_deref());
    let exact = method.is_some_and(|m| m.r#type.as_ref().is_none_or(|t| *t == MethodType::Exact));
    if exact {
        match (service_name, method_name) {
            (Some(s), Some(m)) => out.path_exact = Some(format!("/{s}/{m}")),
            (Some(s), None) => out.path_prefix = Some(format!("/{s}/")),
            (None, Some(m)) => out.path_regex = Some(format!("/[^/]+/{}", literal(m))),
            (None, None) => return Err(format!("{at}.method: names neither service nor method")),
        }
    } else {
        // Each part whole (`a|b` is either service, not `/a` or `b/...`); an empty one is
        // any, as the spec says.
        let part = |p: Option<&str>| match p {
            None | Some("") => "[^/]+".to_owned(),
            Some(p) => format!("(?:{p})"),
        };
        let (service_given, method_given) = (
            service_name.filter(|s| !s.is_empty()),
            method_name.filter(|m| !m.is_empty()),
        );
        match (service_given, method_given) {
            (None, None) => out.path_prefix = Some("/".to_owned()),
            (s, m) => out.path_regex = Some(format!("/{}/{}", part(s), part(m))),
        }
    }
    out.headers = (m.headers.iter().flatten())
        .map(|h| header_match!(h, HeaderType))
        .collect();
    let specificity = Specificity::Grpc(
        exact,
        service_name.map_or(0, str::len),
        method_name.map_or(0, str::len),
        out.headers.len(),
    );
    Ok((out, specificity))
}

/// `text` as an RE2 expression matching itself.
fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::api::grpcroutes::{
        GrpcRouteRulesMatchesHeaders, GrpcRouteRulesMatchesMethod,
    };

    fn method(
        kind: MethodType,
        service: Option<&str>,
        method: Option<&str>,
    ) -> GrpcRouteRulesMatches {
        GrpcRouteRulesMatches {
            method: Some(GrpcRouteRulesMatchesMethod {
                r#type: Some(kind),
                service: service.map(str::to_owned),
                method: method.map(str::to_owned),
            }),
            headers: None,
        }
    }

    fn path(m: &GrpcRouteRulesMatches) -> (Option<String>, Option<String>, Option<String>) {
        let (out, _) = lower_match(m, "m").expect("lowered");
        (out.path_exact, out.path_prefix, out.path_regex)
    }

    #[test]
    fn an_exact_method_match_is_its_path() {
        let s = Some("pkg.Echo");
        let m = Some("Say");
        assert_eq!(
            path(&method(MethodType::Exact, s, m)),
            (Some("/pkg.Echo/Say".into()), None, None)
        );
        assert_eq!(
            path(&method(MethodType::Exact, s, None)),
            (None, Some("/pkg.Echo/".into()), None)
        );
        assert_eq!(
            path(&method(MethodType::Exact, None, m)),
            (None, None, Some("/[^/]+/Say".into()))
        );
        assert!(lower_match(&method(MethodType::Exact, None, None), "m").is_err());
    }

    #[test]
    fn a_regular_expression_matches_any_part_it_does_not_give() {
        let re = MethodType::RegularExpression;
        assert_eq!(
            path(&method(re.clone(), Some("pkg\\..*"), Some("S.*"))),
            (None, None, Some("/(?:pkg\\..*)/(?:S.*)".into()))
        );
        assert_eq!(
            path(&method(re.clone(), Some("a|b"), None)),
            (None, None, Some("/(?:a|b)/[^/]+".into()))
        );
        assert_eq!(
            path(&method(re.clone(), Some(""), Some("Say"))),
            (None, None, Some("/[^/]+/(?:Say)".into()))
        );
        assert_eq!(
            path(&method(re, None, None)),
            (None, Some("/".into()), None)
        );
    }

    #[test]
    fn no_match_matches_every_call() {
        let matches = lower_matches(&[], "m").expect("lowered");
        assert_eq!(matches.len(), 1);
        assert_eq!(matches[0].0.path_prefix.as_deref(), Some("/"));
        assert_eq!(matches[0].1, Specificity::Grpc(false, 0, 0, 0));
    }

    #[test]
    fn the_longer_service_then_method_then_more_headers_come_first() {
        let specificity = |m: GrpcRouteRulesMatches| lower_match(&m, "m").expect("lowered").1;
        let exact = MethodType::Exact;
        let long = specificity(method(exact.clone(), Some("pkg.Echo"), None));
        let short = specificity(method(exact.clone(), Some("pkg.E"), Some("LongMethod")));
        assert!(long > short);
        let mut with_header = method(exact.clone(), Some("pkg.Echo"), None);
        with_header.headers = Some(vec![GrpcRouteRulesMatchesHeaders {
            name: "version".into(),
            r#type: None,
            value: "one".into(),
        }]);
        assert!(specificity(with_header) > long);
        assert!(long < specificity(method(exact.clone(), Some("pkg.Echo"), Some("Say"))));
        // An exact match before a regular expression, however long.
        let re = MethodType::RegularExpression;
        assert!(long > specificity(method(re, Some("pkg\\.v[0-9]+\\.Echo"), None)));
    }
}
