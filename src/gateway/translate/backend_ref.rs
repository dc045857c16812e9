//! A route's references to Services — its backendRefs and its mirrors' — as
//! clusters of the vocabulary. A reference that cannot be used is left out, and the first
//! one of a route becomes its ResolvedRefs condition; a rule whose backends are all left
//! out answers 500, a mirror left out copies nothing.

use k8s_openapi::api::core::v1::Service;

use super::backend_tls::{self, BackendTls};
use super::gateway::UDP_ROUTE;
use super::reference_grant::{self, Side};
use super::{Cond, GROUP, Inputs};
use crate::gateway::api::httproutes::{
    HttpRouteRules, HttpRouteRulesBackendRefs,
    HttpRouteRulesBackendRefsFiltersType as BackendFilterType,
    HttpRouteRulesBackendRefsFiltersUrlRewrite,
    HttpRouteRulesBackendRefsFiltersUrlRewritePathType as BackendRewritePathType,
    HttpRouteRulesFiltersRequestMirror, HttpRouteRulesFiltersType as FilterType,
};
use crate::k8s::services::{Protocol, service_cluster};
use switchyard_core::route::spec::Backend;
use switchyard_core::route::{ResolveError, ResolvedBackend, ResolvedCluster, ResolvedMirror};

/// The route that refers to backends: its kind (what a ReferenceGrant names) and namespace,
/// and whether the BackendTLSPolicies of its backends apply (not to a connection passed
/// through whole: it carries the client's own TLS, or none the Gateway may add).
pub struct Referrer<'a> {
    pub kind: &'static str,
    pub namespace: &'a str,
    pub backend_tls: bool,
}

/// A reference to a backend, as a backendRef and a mirror's backendRef both give it.
struct Reference<'a> {
    group: Option<&'a str>,
    kind: Option<&'a str>,
    name: &'a str,
    namespace: Option<&'a str>,
    port: Option<i32>,
}

/// The [`Reference`] of a backendRef or a mirror's: generated types of their own, with
/// the same fields.
macro_rules! reference {
    ($b:expr) => {
        Reference {
            group: $b.group.as_deref(),
            kind: $b.kind.as_deref(),
            name: &$b.name,
            namespace: $b.namespace.as_deref(),
            port: $b.port,
        }
    };
}

impl<'a> Reference<'a> {
    fn backend(b: &'a HttpRouteRulesBackendRefs) -> Self {
        reference!(b)
    }

    fn mirror(m: &'a HttpRouteRulesFiltersRequestMirror) -> Self {
        reference!(m.backend_ref)
    }
}

/// The rule's mirrors that can be used (the RequestMirror filters, each with its share of
/// the requests); the first problem with one becomes the route's ResolvedRefs condition
/// if it has none yet.
pub fn mirrors(
    inputs: &Inputs<'_>,
    referrer: &Referrer<'_>,
    rule: &HttpRouteRules,
    at: &str,
    first_problem: &mut Option<Cond>,
) -> Result<Vec<ResolvedMirror>, String> {
    let mut usable = Vec::new();
    for (fi, filter) in rule.filters.iter().flatten().enumerate() {
        let Some(mirror) = filter.request_mirror.as_ref() else {
            continue;
        };
        if filter.r#type != FilterType::RequestMirror {
            continue;
        }
        let at = format!("{at}.filters[{fi}].requestMirror");
        let per_million = share(mirror).map_err(|e| format!("{at}: {e}"))?;
        match backend_cluster(inputs, referrer, &Reference::mirror(mirror)) {
            Ok(None) => {}
            Ok(Some(cluster)) => usable.push(ResolvedMirror {
                cluster,
                per_million,
            }),
            Err((reason, message)) => {
                first_problem.get_or_insert_with(|| {
                    Cond::no(
                        "ResolvedRefs",
                        reason,
                        format!("{at}.backendRef: {message}"),
                    )
                });
            }
        }
    }
    Ok(usable)
}

/// The share of requests a mirror copies, in a million (None: every request), from its
/// `percent` or its `fraction`.
fn share(mirror: &HttpRouteRulesFiltersRequestMirror) -> Result<Option<i32>, String> {
    const MILLION: i64 = 1_000_000;
    let (numerator, denominator) = match (&mirror.percent, &mirror.fraction) {
        (Some(percent), _) => (i64::from(*percent), 100),
        (None, Some(f)) => (
            i64::from(f.numerator),
            i64::from(f.denominator.unwrap_or(100)),
        ),
        (None, None) => return Ok(None),
    };
    if denominator <= 0 || !(0..=denominator).contains(&numerator) {
        return Err(format!(
            "{numerator}/{denominator} is not a share of the requests"
        ));
    }
    // Within 0..=MILLION, as numerator <= denominator.
    Ok(Some(
        i32::try_from(numerator * MILLION / denominator).unwrap_or(i32::MAX),
    ))
}

/// What a rule's backendRefs give it.
#[derive(Debug, Default)]
pub struct Backends {
    pub usable: Vec<ResolvedBackend>,
    /// The weight of those that cannot be used (answered with 500).
    pub unavailable: i32,
    /// The URLRewrite of the rule's only backendRef, which the rule takes.
    pub rewrite: Option<UrlRewrite>,
}

/// A URLRewrite in the vocabulary's words.
#[derive(Debug, Default, PartialEq)]
pub struct UrlRewrite {
    pub host: Option<String>,
    pub path: Option<String>,
    pub prefix: Option<String>,
}

/// The rule's backends; the first problem with a backendRef of the route becomes its
/// ResolvedRefs condition. A backendRef's RequestHeaderModifier edits the requests sent to
/// it alone; its URLRewrite is taken when it is the rule's only backendRef (Envoy rewrites
/// a request before it picks a backend, so one backend's own rewrite among several cannot
/// be served); any other filter on a backendRef refuses the route.
pub fn backends(
    inputs: &Inputs<'_>,
    referrer: &Referrer<'_>,
    rule: &HttpRouteRules,
    at: &str,
    first_problem: &mut Option<Cond>,
) -> Result<Backends, String> {
    let mut out = Backends::default();
    let refs = rule.backend_refs.as_deref().unwrap_or_default();
    for (bi, backend) in refs.iter().enumerate() {
        let at = format!("{at}.backendRefs[{bi}]");
        let mut request_headers = None;
        for (fi, filter) in backend.filters.iter().flatten().enumerate() {
            let at = format!("{at}.filters[{fi}]");
            match filter.r#type {
                BackendFilterType::RequestHeaderModifier => {
                    request_headers = Some(header_edits!(&filter.request_header_modifier));
                }
                BackendFilterType::UrlRewrite if refs.len() == 1 => {
                    out.rewrite = filter.url_rewrite.as_ref().map(url_rewrite);
                }
                BackendFilterType::UrlRewrite => {
                    return Err(format!(
                        "{at}: a URLRewrite on one of several backendRefs is not supported \
                         (Envoy rewrites a request before it picks its backend): put it on \
                         the rule, or the backend in a rule of its own"
                    ));
                }
                ref other => {
                    return Err(format!(
                        "{at}: filter {other:?} on a backendRef is not supported"
                    ));
                }
            }
        }
        let weight = backend.weight.unwrap_or(1);
        if weight == 0 {
            continue;
        }
        match backend_cluster(inputs, referrer, &Reference::backend(backend)) {
            // Its BackendTLSPolicy's status says why: the route's references resolved.
            Ok(None) => out.unavailable += weight,
            Ok(Some(cluster)) => out.usable.push(ResolvedBackend {
                cluster,
                weight,
                request_headers,
            }),
            Err((reason, message)) => {
                out.unavailable += weight;
                first_problem.get_or_insert_with(|| {
                    Cond::no("ResolvedRefs", reason, format!("{at}: {message}"))
                });
            }
        }
    }
    if out.usable.is_empty() && out.unavailable == 0 {
        // No backendRefs at all: the Gateway API answers 500.
        out.unavailable = 1;
    }
    Ok(out)
}

fn url_rewrite(r: &HttpRouteRulesBackendRefsFiltersUrlRewrite) -> UrlRewrite {
    let path = r.path.as_ref();
    let of = |t: BackendRewritePathType| path.filter(|p| p.r#type == t);
    UrlRewrite {
        host: r.hostname.clone(),
        path: of(BackendRewritePathType::ReplaceFullPath).and_then(|p| p.replace_full_path.clone()),
        prefix: of(BackendRewritePathType::ReplacePrefixMatch)
            .and_then(|p| p.replace_prefix_match.clone()),
    }
}

/// The cluster of a backendRef, with the TLS its BackendTLSPolicy asks for; None when that
/// policy cannot be used (sending plain text instead would leak what it protects); or the
/// ResolvedRefs reason and message saying why the reference does not resolve.
fn backend_cluster(
    inputs: &Inputs<'_>,
    referrer: &Referrer<'_>,
    backend: &Reference<'_>,
) -> Result<Option<ResolvedCluster>, (&'static str, String)> {
    let namespace = referrer.namespace;
    let group = backend.group.unwrap_or("");
    let kind = backend.kind.unwrap_or("Service");
    if !group.is_empty() || kind != "Service" {
        return Err(("InvalidKind", format!("{group}/{kind} is not a Service")));
    }
    let target_ns = backend.namespace.unwrap_or(namespace);
    let from = Side {
        group: GROUP,
        kind: referrer.kind,
        namespace,
    };
    let to = Side {
        group: "",
        kind: "Service",
        namespace: target_ns,
    };
    if !reference_grant::permits(inputs.grants, from, to, backend.name) {
        return Err((
            "RefNotPermitted",
            format!(
                "no ReferenceGrant in namespace {target_ns} lets this route use Service {:?}",
                backend.name
            ),
        ));
    }
    let Some(port) = backend.port else {
        return Err((
            "BackendNotFound",
            "a Service backendRef needs a port".to_owned(),
        ));
    };
    let services: Vec<&Service> = inputs
        .services
        .iter()
        .filter(|s| s.metadata.namespace.as_deref() == Some(target_ns))
        .collect();
    let wanted = Backend {
        service: backend.name.to_owned(),
        port: Some(port),
        ..Backend::default()
    };
    let protocol = match referrer.kind {
        UDP_ROUTE => Protocol::Udp,
        _ => Protocol::Tcp,
    };
    let mut cluster =
        service_cluster(target_ns, &services, &wanted, protocol).map_err(|e| match e {
            ResolveError::UnsupportedBackend { .. } => ("UnsupportedProtocol", e.to_string()),
            ResolveError::ServiceNotFound { service } => (
                "BackendNotFound",
                format!("Service {target_ns}/{service} does not exist"),
            ),
            other => ("BackendNotFound", other.to_string()),
        })?;
    if target_ns != namespace {
        cluster.namespace = Some(target_ns.to_owned());
    }
    cluster.udp = protocol == Protocol::Udp;
    if !referrer.backend_tls {
        return Ok(Some(cluster));
    }
    match backend_tls::for_backend(inputs, target_ns, backend.name, &cluster.port_name) {
        BackendTls::None => {}
        BackendTls::Tls(tls) => cluster.tls = Some(Box::new(tls)),
        BackendTls::Unusable => return Ok(None),
    }
    Ok(Some(cluster))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::api::httproutes::{
        HttpRouteRulesFiltersRequestMirrorBackendRef, HttpRouteRulesFiltersRequestMirrorFraction,
    };

    fn mirror(
        percent: Option<i32>,
        fraction: Option<(i32, Option<i32>)>,
    ) -> HttpRouteRulesFiltersRequestMirror {
        HttpRouteRulesFiltersRequestMirror {
            backend_ref: HttpRouteRulesFiltersRequestMirrorBackendRef::default(),
            percent,
            fraction: fraction.map(|(numerator, denominator)| {
                HttpRouteRulesFiltersRequestMirrorFraction {
                    numerator,
                    denominator,
                }
            }),
        }
    }

    #[test]
    fn a_mirrors_share_is_in_a_million() {
        assert_eq!(share(&mirror(None, None)), Ok(None));
        assert_eq!(share(&mirror(Some(20), None)), Ok(Some(200_000)));
        assert_eq!(share(&mirror(Some(100), None)), Ok(Some(1_000_000)));
        assert_eq!(share(&mirror(None, Some((1, Some(3))))), Ok(Some(333_333)));
        // The denominator defaults to 100.
        assert_eq!(share(&mirror(None, Some((35, None)))), Ok(Some(350_000)));
        assert!(share(&mirror(None, Some((1, Some(0))))).is_err());
        assert!(share(&mirror(None, Some((4, Some(3))))).is_err());
        assert!(share(&mirror(Some(101), None)).is_err());
    }
}
