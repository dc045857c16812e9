//! The CRDs of `crds/` on a real API server: they apply cleanly (structural schema, CEL
//! cost limits), the API server rejects invalid TrafficRoutes with a message that says
//! why (I8), accepts valid ones, and keeps spec and status apart (I7).
//!
//! `cargo test -p switchyard-e2e --test crd_validation -- --nocapture` prints the table
//! of cases (object → expected message → actual); `docs/crd-validation.md` holds it, and the
//! test fails when that copy is stale (`UPDATE_DOCS=1` rewrites it).

use std::time::{Duration, Instant};

use serde_json::Value;
use switchyard_e2e::kube::{self as rig, KubeApi};

const WITHIN: Duration = Duration::from_secs(30);
const FIELD_MANAGER: &str = "crd-validation-test";
/// A valid Service port name that a container port could not have (those stop at 15).
const LONG_PORT_NAME: &str = "metrics-and-admin-http";

/// The smallest valid spec, which most cases bend one way.
const MINIMAL: &str = "{hosts: [web.example.com], rules: [{backends: [{service: web, port: 80}]}]}";

/// Every feature at once.
const FULL: &str = r#"
hosts: [shop.example.com, "*.shop.example.com"]
tls: {secretName: shop-tls, redirectHttp: true}
rules:
- name: api-canary
  match:
    pathPrefix: /api
    headers:
    - {name: x-canary, exact: "yes"}
    - {name: x-debug, present: true, invert: true}
  backends:
  - {service: api-v1, port: 8080, weight: 9000}
  - {service: api-v2, portName: http, weight: 1000}
  timeout: 15s
  idleTimeout: 1.5m
  retries: {attempts: 3, "on": [connect-failure, refused-stream, "5xx"], perTryTimeout: 500ms}
  rewritePrefix: /
  requestHeaders: {set: {x-route: shop}, add: {x-trace: "1"}, remove: [x-internal]}
  responseHeaders: {set: {cache-control: no-store}, remove: [server]}
- name: exact-health
  match: {pathExact: /healthz}
  backends: [{service: api-v1, port: 8080}]
- name: regex
  match: {pathRegex: "^/v[0-9]+/.*"}
  backends: [{service: api-v2, port: 8080, weight: 0}, {service: api-v1, port: 8080}]
- backends: [{service: web, portName: http}]
rollout: {drainPeriod: 30s, probeDeadline: 10m}
"#;

struct Case {
    /// What the table shows: the spec, or a short description of a generated one.
    object: String,
    /// The spec sent, as YAML.
    spec: String,
    /// A substring of the API server's message; `None`: the object must be accepted.
    expect: Option<&'static str>,
}

fn case(spec: &str, expect: &'static str) -> Case {
    Case {
        object: spec.to_string(),
        spec: spec.to_string(),
        expect: Some(expect),
    }
}

fn generated(object: &str, spec: String, expect: &'static str) -> Case {
    Case {
        object: object.to_string(),
        spec,
        expect: Some(expect),
    }
}

fn valid(object: &str, spec: &str) -> Case {
    Case {
        object: object.to_string(),
        spec: spec.to_string(),
        expect: None,
    }
}

/// A spec with one rule of these backends.
fn backends(list: &str) -> String {
    format!("{{hosts: [web.example.com], rules: [{{backends: [{list}]}}]}}")
}

/// A spec with one rule whose other fields are `fields` (and one backend).
fn rule(fields: &str) -> String {
    format!(
        "{{hosts: [web.example.com], rules: [{{backends: [{{service: web, port: 80}}], {fields}}}]}}"
    )
}

fn cases() -> Vec<Case> {
    let hosts17: Vec<String> = (0..17).map(|i| format!("h{i}.example.com")).collect();
    let backends9: Vec<String> = (0..9)
        .map(|i| format!("{{service: web{i}, port: 80}}"))
        .collect();
    let headers33: Vec<String> = (0..33).map(|i| format!("x-h{i}: v")).collect();
    let rules33: Vec<String> = (0..33)
        .map(|i| format!("{{name: r{i}, backends: [{{service: web, port: 80}}]}}"))
        .collect();
    vec![
        // --- hosts
        case(
            "{hosts: [], rules: [{backends: [{service: web, port: 80}]}]}",
            "spec.hosts in body should have at least 1 items",
        ),
        case(
            "{hosts: [a.example.com, b.example.com, a.example.com], rules: [{backends: [{service: web, port: 80}]}]}",
            "spec.hosts: Invalid value: hosts must be unique: a.example.com is repeated",
        ),
        case(
            "{hosts: [Web.Example.com], rules: [{backends: [{service: web, port: 80}]}]}",
            "spec.hosts[0] in body should match",
        ),
        case(
            "{hosts: [web_1.example.com], rules: [{backends: [{service: web, port: 80}]}]}",
            "spec.hosts[0] in body should match",
        ),
        case(
            "{hosts: [\"example.com:8080\"], rules: [{backends: [{service: web, port: 80}]}]}",
            "spec.hosts[0] in body should match",
        ),
        case(
            "{hosts: [\"*\"], rules: [{backends: [{service: web, port: 80}]}]}",
            "spec.hosts[0] in body should match",
        ),
        generated(
            "hosts: [h0.example.com … h16.example.com] (17 hosts)",
            format!(
                "{{hosts: [{}], rules: [{{backends: [{{service: web, port: 80}}]}}]}}",
                hosts17.join(", ")
            ),
            "spec.hosts: Too many: 17: must have at most 16 items",
        ),
        // --- rules
        case(
            "{hosts: [web.example.com], rules: []}",
            "spec.rules in body should have at least 1 items",
        ),
        generated(
            "rules: [r0 … r32] (33 rules)",
            format!(
                "{{hosts: [web.example.com], rules: [{}]}}",
                rules33.join(", ")
            ),
            "spec.rules: Too many: 33: must have at most 32 items",
        ),
        case(
            "{hosts: [web.example.com], rules: [{name: api, backends: [{service: a, port: 80}]}, {name: api, backends: [{service: b, port: 80}]}]}",
            "spec.rules: Invalid value: rule names must be unique",
        ),
        case(
            "{hosts: [web.example.com], rules: [{name: rule-1, backends: [{service: a, port: 80}]}, {backends: [{service: b, port: 80}]}]}",
            "spec.rules[0].name: Invalid value: \"rule-1\": names of the form rule-<number> are reserved for unnamed rules",
        ),
        case(
            "{hosts: [web.example.com], rules: [{name: rule-0, backends: [{service: a, port: 80}]}]}",
            "names of the form rule-<number> are reserved for unnamed rules",
        ),
        case(
            "{hosts: [web.example.com], rules: [{name: Api, backends: [{service: a, port: 80}]}]}",
            "spec.rules[0].name in body should match",
        ),
        case(
            "{hosts: [web.example.com], rules: [{name: api}]}",
            "spec.rules[0]: Invalid value: a rule needs backends, or a redirect (redirect or redirectHttps) without backends",
        ),
        case(
            "{hosts: [web.example.com], rules: [{backends: [], redirectHttps: false}]}",
            "spec.rules[0]: Invalid value: a rule needs backends, or a redirect (redirect or redirectHttps) without backends",
        ),
        case(
            "{hosts: [web.example.com], rules: [{redirectHttps: true, backends: [{service: web, port: 80}]}]}",
            "spec.rules[0]: Invalid value: a rule with redirectHttps must not have backends",
        ),
        // --- redirects
        case(
            &rule("redirect: {scheme: https}"),
            "spec.rules[0]: Invalid value: a rule with redirect must not have backends",
        ),
        case(
            "{hosts: [web.example.com], rules: [{redirect: {scheme: https}, redirectHttps: true}]}",
            "spec.rules[0]: Invalid value: give at most one of redirect, redirectHttps",
        ),
        case(
            "{hosts: [web.example.com], rules: [{redirect: {prefix: /new}}]}",
            "spec.rules[0]: Invalid value: redirect.prefix replaces the prefix the rule matches: it needs match.pathPrefix or match.pathSegmentPrefix",
        ),
        case(
            "{hosts: [web.example.com], rules: [{match: {pathPrefix: /old}, redirect: {path: /a, prefix: /b}}]}",
            "spec.rules[0].redirect: Invalid value: give at most one of path, prefix",
        ),
        case(
            "{hosts: [web.example.com], rules: [{redirect: {statusCode: 304}}]}",
            "spec.rules[0].redirect.statusCode: Invalid value: 304: a redirect's status code is 301, 302, 303, 307 or 308",
        ),
        case(
            "{hosts: [web.example.com], rules: [{redirect: {scheme: ftp}}]}",
            "spec.rules[0].redirect.scheme in body should match '^https?$'",
        ),
        case(
            "{hosts: [web.example.com], rules: [{redirect: {port: 0}}]}",
            "spec.rules[0].redirect.port in body should be greater than or equal to 1",
        ),
        // --- backends
        generated(
            "backends: [web0 … web8] (9 backends)",
            backends(&backends9.join(", ")),
            "spec.rules[0].backends: Too many: 9: must have at most 8 items",
        ),
        case(
            &backends("{service: a, port: 80, weight: 0}, {service: b, port: 80, weight: 0}"),
            "spec.rules[0]: Invalid value: backend weights must not all be zero",
        ),
        case(
            &backends("{service: a, port: 80, weight: -1}"),
            "spec.rules[0].backends[0].weight in body should be greater than or equal to 0",
        ),
        case(
            &backends("{service: a, port: 80, weight: 10001}"),
            "spec.rules[0].backends[0].weight in body should be less than or equal to 10000",
        ),
        case(
            &backends("{service: a, port: 80, portName: http}"),
            "spec.rules[0].backends[0]: Invalid value: give exactly one of port, portName",
        ),
        case(
            &backends("{service: a}"),
            "spec.rules[0].backends[0]: Invalid value: give exactly one of port, portName",
        ),
        case(
            &backends("{service: a, port: 0}"),
            "spec.rules[0].backends[0].port in body should be greater than or equal to 1",
        ),
        case(
            &backends("{service: a, port: 70000}"),
            "spec.rules[0].backends[0].port in body should be less than or equal to 65535",
        ),
        case(
            &backends("{service: My-Svc, port: 80}"),
            "spec.rules[0].backends[0].service in body should match",
        ),
        generated(
            "backends: [{service: a, portName: <64 characters>}]",
            backends(&format!("{{service: a, portName: {}}}", "p".repeat(64))),
            "spec.rules[0].backends[0].portName: Too long: may not be more than 63 bytes",
        ),
        case(
            &backends("{service: a, portName: HTTP}"),
            "spec.rules[0].backends[0].portName in body should match",
        ),
        // --- matches
        case(
            &rule("match: {pathPrefix: api}"),
            "spec.rules[0].match.pathPrefix in body should match '^/'",
        ),
        case(
            &rule("match: {pathExact: healthz}"),
            "spec.rules[0].match.pathExact in body should match '^/'",
        ),
        case(
            &rule("match: {method: get}"),
            "spec.rules[0].match.method in body should match '^[A-Z]+$'",
        ),
        case(
            &rule("match: {queryParams: [{name: q}]}"),
            "spec.rules[0].match.queryParams[0]: Invalid value: give exactly one of exact, regex, present",
        ),
        case(
            &rule("match: {queryParams: [{name: \"a=b\", exact: c}]}"),
            "spec.rules[0].match.queryParams[0].name in body should match",
        ),
        case(
            &rule("match: {pathSegmentPrefix: api}"),
            "spec.rules[0].match.pathSegmentPrefix in body should match '^/'",
        ),
        case(
            &rule("match: {pathPrefix: /api, pathSegmentPrefix: /api}"),
            "spec.rules[0].match: Invalid value: give at most one of pathPrefix, pathSegmentPrefix, pathExact, pathRegex",
        ),
        case(
            &rule("match: {pathPrefix: /api, pathExact: /api}"),
            "spec.rules[0].match: Invalid value: give at most one of pathPrefix, pathSegmentPrefix, pathExact, pathRegex",
        ),
        case(
            &rule("match: {headers: [{name: x-canary}]}"),
            "spec.rules[0].match.headers[0]: Invalid value: give exactly one of exact, prefix, regex, present",
        ),
        case(
            &rule("match: {headers: [{name: x-canary, exact: a, prefix: b}]}"),
            "spec.rules[0].match.headers[0]: Invalid value: give exactly one of exact, prefix, regex, present",
        ),
        case(
            &rule("match: {headers: [{name: \"x canary\", exact: a}]}"),
            "spec.rules[0].match.headers[0].name in body should match",
        ),
        // --- timeouts, retries, rewrite
        case(
            &rule("timeout: 5x"),
            "spec.rules[0].timeout in body should match",
        ),
        case(
            &rule("idleTimeout: \"10\""),
            "spec.rules[0].idleTimeout in body should match",
        ),
        case(
            &rule("retries: {attempts: 101}"),
            "spec.rules[0].retries.attempts in body should be less than or equal to 100",
        ),
        case(
            &rule("retries: {attempts: 2, perTryTimeout: 1d}"),
            "spec.rules[0].retries.perTryTimeout in body should match",
        ),
        case(
            &rule("retries: {attempts: 2, \"on\": [\"5xx,reset\"]}"),
            "spec.rules[0].retries.on[0] in body should match",
        ),
        case(
            &rule("retries: {attempts: 2, \"on\": [\"503\"]}"),
            "spec.rules[0].retries.on[0] in body should match",
        ),
        case(
            &rule("retries: {attempts: 2, statusCodes: [200]}"),
            "spec.rules[0].retries.statusCodes[0] in body should be greater than or equal to 400",
        ),
        case(
            &rule("match: {headers: [{name: x-canary, regex: \"\"}]}"),
            "spec.rules[0].match.headers[0].regex in body should be at least 1 chars long",
        ),
        case(
            &rule("requestHeaders: {remove: [\"x: y\"]}"),
            "spec.rules[0].requestHeaders.remove[0] in body should match",
        ),
        // --- CORS, rate limit, body limit
        case(
            &rule("cors: {allowOrigins: [app.example.com]}"),
            "spec.rules[0].cors.allowOrigins[0] in body should match",
        ),
        case(
            &rule("cors: {allowOrigins: []}"),
            "spec.rules[0].cors.allowOrigins in body should have at least 1 items",
        ),
        case(
            &rule("cors: {allowOrigins: [\"*\"], allowMethods: [get]}"),
            "spec.rules[0].cors.allowMethods[0] in body should match",
        ),
        case(
            &rule("cors: {allowOrigins: [\"*\"], maxAge: 1d}"),
            "spec.rules[0].cors.maxAge in body should match",
        ),
        case(
            &rule("rateLimit: {requests: 10, unit: day}"),
            "spec.rules[0].rateLimit.unit in body should match",
        ),
        case(
            &rule("rateLimit: {requests: 0, unit: second}"),
            "spec.rules[0].rateLimit.requests in body should be greater than or equal to 1",
        ),
        case(
            &rule("loadBalancer: {policy: weighted}"),
            "spec.rules[0].loadBalancer.policy in body should match",
        ),
        case(
            &rule("loadBalancer: {policy: random, affinity: {header: x-user}}"),
            "affinity needs the policy ringHash or maglev",
        ),
        case(
            &rule("loadBalancer: {affinity: {header: x-user, sourceIP: true}}"),
            "give exactly one of cookie, header, sourceIP",
        ),
        case(
            &rule("loadBalancer: {affinity: {cookie: {name: s, ttl: 1d}}}"),
            "spec.rules[0].loadBalancer.affinity.cookie.ttl in body should match",
        ),
        case(
            &rule("maxRequestBodyBytes: 0"),
            "spec.rules[0].maxRequestBodyBytes in body should be greater than or equal to 1",
        ),
        generated(
            "responseHeaders: {set: {x-h0: v … x-h32: v}} (33 headers)",
            rule(&format!(
                "responseHeaders: {{set: {{{}}}}}",
                headers33.join(", ")
            )),
            "spec.rules[0].responseHeaders.set: Too many: 33: must have at most 32 items",
        ),
        case(
            &rule("responseHeaders: {set: {\"bad header\": x}}"),
            "spec.rules[0].responseHeaders.set: Invalid value: header names must be RFC 9110 tokens",
        ),
        case(
            &rule("requestHeaders: {add: {\":authority\": x}}"),
            "spec.rules[0].requestHeaders.add: Invalid value: header names must be RFC 9110 tokens",
        ),
        generated(
            "requestHeaders: {set: {<257 characters>: x}}",
            rule(&format!(
                "requestHeaders: {{set: {{{}: x}}}}",
                "x".repeat(257)
            )),
            "header names must be RFC 9110 tokens",
        ),
        case(
            &rule("requestHeaders: {set: {Host: evil.example.com}}"),
            "spec.rules[0].requestHeaders.set: Invalid value: the host header cannot be edited",
        ),
        case(
            &rule("requestHeaders: {remove: [host]}"),
            "spec.rules[0].requestHeaders.remove: Invalid value: the host header cannot be edited",
        ),
        case(
            &rule("responseHeaders: {set: {x-a: \"a\\r\\nb\"}}"),
            "spec.rules[0].responseHeaders.set.x-a in body should match",
        ),
        generated(
            "responseHeaders: {add: {x-a: <4097 characters>}}",
            rule(&format!(
                "responseHeaders: {{add: {{x-a: {}}}}}",
                "v".repeat(4097)
            )),
            "spec.rules[0].responseHeaders.add.x-a: Too long: may not be more than 4096 bytes",
        ),
        case(
            &rule("match: {headers: [{name: x-canary, exact: \"a\\nb\"}]}"),
            "spec.rules[0].match.headers[0].exact in body should match",
        ),
        case(
            &rule("timeout: 99999999999999h"),
            "spec.rules[0].timeout in body should match",
        ),
        case(
            &rule("idleTimeout: 87660000h"),
            "spec.rules[0].idleTimeout in body should match",
        ),
        case(
            &rule("retries: {attempts: 1, perTryTimeout: 1.0000000001s}"),
            "spec.rules[0].retries.perTryTimeout in body should match",
        ),
        case(
            &rule("rewritePrefix: v2/"),
            "spec.rules[0].rewritePrefix in body should match '^/'",
        ),
        case(
            &rule("rewritePrefix: /v2, rewritePath: /index.html"),
            "spec.rules[0]: Invalid value: give at most one of rewritePrefix, rewritePath",
        ),
        case(
            &rule("rewriteHost: \"Bad_Host\""),
            "spec.rules[0].rewriteHost in body should match",
        ),
        // --- tls, rollout
        case(
            "{hosts: [web.example.com], tls: {secretName: \"\"}, rules: [{backends: [{service: web, port: 80}]}]}",
            "spec.tls.secretName in body should be at least 1 chars long",
        ),
        case(
            "{hosts: [web.example.com], tls: {secretName: My_Cert}, rules: [{backends: [{service: web, port: 80}]}]}",
            "spec.tls.secretName in body should match",
        ),
        case(
            "{hosts: [web.example.com], rules: [{backends: [{service: web, port: 80}]}], rollout: {drainPeriod: 5x}}",
            "spec.rollout.drainPeriod in body should match",
        ),
        // --- valid
        valid("minimal", MINIMAL),
        valid(
            "full-featured (TLS, canary weights, header match, retries, rewrite, header edits, rollout)",
            FULL,
        ),
        valid(
            "CORS, a rate limit and a body limit",
            &rule(
                "cors: {allowOrigins: [\"https://*.example.com\", \"*\"], allowMethods: [GET, \"*\"], allowHeaders: [x-token], exposeHeaders: [x-request-id], maxAge: 10m, allowCredentials: true}, rateLimit: {requests: 100, unit: minute, burst: 20}, maxRequestBodyBytes: 1048576",
            ),
        ),
        valid(
            "redirect-only rule, then a catch-all",
            "{hosts: [web.example.com], tls: {secretName: web-tls}, rules: [{name: to-https, match: {pathPrefix: /}, redirectHttps: true}, {backends: [{service: web, port: 80}]}]}",
        ),
        valid(
            "redirects by segment prefix and by exact path, then a catch-all",
            "{hosts: [web.example.com], rules: [{name: old, match: {pathSegmentPrefix: /old}, redirect: {scheme: https, hostname: new.example.com, port: 8443, prefix: /new, statusCode: 301}}, {name: moved, match: {pathExact: /moved}, redirect: {path: /here}}, {backends: [{service: web, port: 80}]}]}",
        ),
        valid(
            "the whole path and the Host rewritten",
            &rule("rewritePath: /index.html, rewriteHost: legacy.internal"),
        ),
        valid(
            "a method and query parameters",
            &rule(
                "match: {pathExact: /search, method: POST, queryParams: [{name: q, present: true}, {name: page, regex: '^[0-9]+$'}, {name: lang, exact: en}]}",
            ),
        ),
        valid(
            "canary at 0% next to 100%",
            &backends(
                "{service: stable, port: 80, weight: 10000}, {service: canary, port: 80, weight: 0}",
            ),
        ),
        valid(
            "names like rule-1 are reserved, rule-one and rules-1 are not",
            "{hosts: [web.example.com], rules: [{name: rule-one, backends: [{service: a, port: 80}]}, {name: rules-1, backends: [{service: b, port: 80}]}]}",
        ),
        valid(
            "explicit nulls for optional fields (as templates render them)",
            "{hosts: [web.example.com], tls: null, rollout: null, rules: [{name: null, match: {pathPrefix: /, pathExact: null, headers: [{name: x-a, exact: b, prefix: null, present: null}]}, redirectHttps: null, timeout: null, backends: [{service: web, port: 80, portName: null, weight: null}]}]}",
        ),
        valid(
            "a Service port name longer than 15 characters (Service ports are DNS labels)",
            &backends(&format!("{{service: web, portName: {LONG_PORT_NAME}}}")),
        ),
        valid(
            "header edits with token names, long timeouts at the limit (999999h)",
            &rule(
                "timeout: 999999h, idleTimeout: 0.5s, requestHeaders: {set: {X-Tenant_1.a: \"a b %\"}, add: {\"x-a!#$%&'*+^`|~\": v}, remove: [x-internal]}",
            ),
        ),
        valid(
            "16 hosts, 8 backends (the limits)",
            &format!(
                "{{hosts: [{}], rules: [{{backends: [{}]}}]}}",
                hosts17[..16].join(", "),
                backends9[..8].join(", ")
            ),
        ),
    ]
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).trim().to_string()
}

fn route_yaml(namespace: &str, name: &str, spec: &str) -> String {
    let spec = spec.trim();
    let spec = if spec.starts_with('{') {
        spec.to_string()
    } else {
        // Block YAML: indent under `spec:`.
        format!(
            "\n{}",
            spec.lines()
                .map(|l| format!("  {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        )
    };
    format!(
        "apiVersion: switchyard.dev/v1alpha1\nkind: TrafficRoute\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec: {spec}\n"
    )
}

/// Applies `crds/` (server-side, as the docs tell users to), waits until both CRDs are
/// Established and TrafficRoutes are served in `namespace`.
async fn install_crds(api: &KubeApi, namespace: &str) {
    let warnings = api.install_crds().await;
    // Warnings (e.g. about a rule's cost) are printed to stderr even when it succeeds.
    assert!(warnings.is_empty(), "apply crds/ warned: {warnings}");
    // Established can come a moment before the resource is served.
    let started = Instant::now();
    loop {
        let out = api
            .kubectl_input(
                ["create", "--dry-run=server", "-o", "name", "-f", "-"],
                &route_yaml(namespace, "served", MINIMAL),
            )
            .await;
        if out.status.success() {
            break;
        }
        assert!(
            started.elapsed() < WITHIN,
            "TrafficRoutes not served: {}",
            stderr(&out)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The interesting part of kubectl's error: after `is invalid: `, on one line.
fn message(stderr: &str) -> String {
    let text = stderr
        .split_once(" is invalid: ")
        .map_or(stderr, |(_, rest)| rest);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn cell(text: &str) -> String {
    format!(
        "`{}`",
        text.replace('|', "\\|")
            .replace('`', "'")
            .replace('\n', " ")
    )
}

fn get_json(out: &str) -> Value {
    serde_json::from_str(out).expect("kubectl -o json prints JSON")
}

/// Every example of docs/crd-reference.md is a TrafficRoute the API server accepts.
#[tokio::test]
async fn the_reference_examples_are_accepted() {
    let api = KubeApi::shared().await;
    let client = api.client().await;
    let ns = rig::unique_name("crdexamples");
    rig::create_namespace(&client, &ns).await;
    install_crds(&api, &ns).await;
    for (title, yaml) in switchyard::api::reference::EXAMPLES {
        let yaml = yaml.replace("namespace: shop", &format!("namespace: {ns}"));
        let out = api
            .kubectl_input(
                ["create", "--dry-run=server", "-o", "name", "-f", "-"],
                &yaml,
            )
            .await;
        assert!(
            out.status.success(),
            "the {title} example is refused: {}",
            stderr(&out)
        );
    }
    rig::delete_namespace(&client, &ns).await;
}

#[tokio::test]
async fn the_api_server_rejects_invalid_traffic_routes() {
    let api = KubeApi::shared().await;
    let client = api.client().await;
    let ns = rig::unique_name("crdval");
    rig::create_namespace(&client, &ns).await;
    install_crds(&api, &ns).await;

    // The API server's own rule for Service port names, which backends[].portName refers
    // to: a DNS label, so longer than a container port's 15 characters.
    let service = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: {ns}\nspec:\n  ports:\n  - {{name: {LONG_PORT_NAME}, port: 80}}\n"
    );
    let out = api.kubectl_input(["create", "-f", "-"], &service).await;
    assert!(out.status.success(), "{}", stderr(&out));

    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for (index, case) in cases().into_iter().enumerate() {
        let name = format!("case-{index}");
        let yaml = route_yaml(&ns, &name, &case.spec);
        // Invalid ones with a server-side dry run, so nothing is left behind even when the
        // API server wrongly accepts one; valid ones for real, and read back.
        let args: &[&str] = match case.expect {
            Some(_) => &["create", "--dry-run=server", "-o", "name", "-f", "-"],
            None => &["create", "-o", "name", "-f", "-"],
        };
        let out = api.kubectl_input(args, &yaml).await;
        let actual = if out.status.success() {
            "accepted".to_string()
        } else {
            message(&stderr(&out))
        };
        let ok = match case.expect {
            Some(expect) => !out.status.success() && actual.contains(expect),
            None => {
                out.status.success() && {
                    let got = get_json(
                        &api.kubectl_ok(["get", "trafficroute", &name, "-n", &ns, "-o", "json"])
                            .await,
                    );
                    got["spec"]["hosts"].is_array() && got["status"].is_null()
                }
            }
        };
        if !ok {
            failures.push(format!(
                "{name}: {}\n  expected: {}\n  actual:   {actual}\n---\n{yaml}",
                case.object,
                case.expect.unwrap_or("accepted")
            ));
        }
        rows.push(format!(
            "| {} | {} | {} | {} |",
            cell(&case.object),
            case.expect.map_or_else(|| "accepted".to_string(), cell),
            if actual == "accepted" {
                actual
            } else {
                cell(&actual)
            },
            if ok { "✓" } else { "✗" }
        ));
    }

    let table = format!(
        "| object (spec) | expected | actual (API server) | |\n| --- | --- | --- | --- |\n{}\n",
        rows.join("\n")
    );
    println!("\n{table}");
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
    check_doc_table(&table);
    rig::delete_namespace(&client, &ns).await;
}

/// docs/crd-validation.md holds the table this test prints: it must be the current one.
fn check_doc_table(table: &str) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/crd-validation.md");
    let doc = std::fs::read_to_string(path).expect("docs/crd-validation.md");
    let start = doc
        .find("| object (spec) |")
        .expect("the doc has the table");
    let len = doc[start..]
        .split_inclusive('\n')
        .take_while(|line| line.starts_with('|'))
        .map(str::len)
        .sum::<usize>();
    let current = &doc[start..start + len];
    if current == table {
        return;
    }
    if std::env::var_os("UPDATE_DOCS").is_some() {
        let updated = format!("{}{table}{}", &doc[..start], &doc[start + len..]);
        std::fs::write(path, updated).expect("write docs/crd-validation.md");
        return;
    }
    panic!(
        "docs/crd-validation.md is stale; regenerate it with\n  UPDATE_DOCS=1 cargo test -p switchyard-e2e --test crd_validation"
    );
}

#[tokio::test]
async fn status_written_through_the_main_resource_is_ignored() {
    let api = KubeApi::shared().await;
    let client = api.client().await;
    let ns = rig::unique_name("crdstatus");
    rig::create_namespace(&client, &ns).await;
    install_crds(&api, &ns).await;
    let get = || async {
        get_json(
            &api.kubectl_ok(["get", "trafficroute", "web", "-n", &ns, "-o", "json"])
                .await,
        )
    };
    let status = "status: {observedGeneration: 99, phase: Ready}\n";

    // A user's apply that carries a status: the spec is stored, the status is dropped.
    let applied = format!("{}{status}", route_yaml(&ns, "web", MINIMAL));
    let out = api
        .kubectl_input(
            [
                "apply",
                "--server-side",
                &format!("--field-manager={FIELD_MANAGER}"),
                "-f",
                "-",
            ],
            &applied,
        )
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let route = get().await;
    assert_eq!(route["metadata"]["generation"], 1, "{route:#}");
    assert_eq!(route["spec"]["hosts"][0], "web.example.com", "{route:#}");
    assert!(route["status"].is_null(), "{route:#}");

    // The status subresource writes status (and only status: the spec in it is ignored),
    // without a new generation.
    api.kubectl_ok([
        "patch",
        "trafficroute",
        "web",
        "-n",
        &ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"observedGeneration":1,"phase":"Ready"},"spec":{"hosts":["evil.example.com"]}}"#,
    ])
    .await;
    let route = get().await;
    assert_eq!(route["status"]["observedGeneration"], 1, "{route:#}");
    assert_eq!(route["status"]["phase"], "Ready", "{route:#}");
    assert_eq!(route["spec"]["hosts"][0], "web.example.com", "{route:#}");
    assert_eq!(route["metadata"]["generation"], 1, "{route:#}");

    // A spec change through the main resource, again with a status: a new generation,
    // the status the subresource wrote stays.
    let changed = route_yaml(
        &ns,
        "web",
        "{hosts: [www.example.com], rules: [{backends: [{service: web, port: 80}]}]}",
    );
    let out = api
        .kubectl_input(
            [
                "apply",
                "--server-side",
                &format!("--field-manager={FIELD_MANAGER}"),
                "-f",
                "-",
            ],
            &format!("{changed}{status}"),
        )
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let route = get().await;
    assert_eq!(route["metadata"]["generation"], 2, "{route:#}");
    assert_eq!(route["spec"]["hosts"][0], "www.example.com", "{route:#}");
    assert_eq!(route["status"]["observedGeneration"], 1, "{route:#}");
    assert_eq!(route["status"]["phase"], "Ready", "{route:#}");
    println!(
        "spec/status split: status via the main resource ignored, spec via /status ignored, \
         generation 1 → 2 on a spec change only"
    );

    rig::delete_namespace(&client, &ns).await;
}

/// ProxyConfigs are written by Switchyard only, but they go through the same API server:
/// one as large as a TrafficRoute can make it (32 rules, each with a header match, 8
/// backends) must be accepted, or a valid route could never go live.
#[tokio::test]
async fn the_largest_proxy_config_a_route_can_produce_is_accepted() {
    let api = KubeApi::shared().await;
    let client = api.client().await;
    let ns = rig::unique_name("crdpxc");
    rig::create_namespace(&client, &ns).await;
    install_crds(&api, &ns).await;

    let backends: Vec<String> = (0..8)
        .map(|i| {
            format!(
                "{{cluster: {{service: web{i}, port: 8080, portName: http, http2: false, lbPolicy: maglev}}, weight: 1}}"
            )
        })
        .collect();
    let rules: Vec<String> = (0..32)
        .map(|i| {
            format!(
                "{{name: r{i}, match: {{pathPrefix: /r{i}, headers: [{{name: x-r, exact: \"{i}\"}}]}}, backends: [{}], redirectHttps: false, retries: {{attempts: 2, \"on\": [5xx]}}, cors: {{allowOrigins: [\"https://*.example.com\"], allowMethods: [GET]}}, rateLimit: {{requests: 10, unit: second}}, maxRequestBodyBytes: 1024, loadBalancer: {{policy: maglev, affinity: {{cookie: {{name: session, ttl: 1h, path: /}}}}}}}}",
                backends.join(", ")
            )
        })
        .collect();
    let clusters: Vec<String> = (0..8)
        .map(|i| format!("{{service: web{i}, port: 8080, portName: http, lbPolicy: maglev}}"))
        .collect();
    let hosts: Vec<String> = (0..16).map(|i| format!("h{i}.example.com")).collect();
    let live = format!(
        "apiVersion: switchyard.dev/v1alpha1\nkind: ProxyConfig\nmetadata:\n  name: web-live\n  namespace: {ns}\nspec: {{role: live, route: web, generation: 1, version: abc, virtualHost: {{hosts: [{}], tls: {{secretName: web-tls, redirectHttp: true}}, rules: [{}]}}, clusters: [{}]}}\n",
        hosts.join(", "),
        rules.join(", "),
        clusters.join(", ")
    );
    let out = api.kubectl_input(["create", "-f", "-"], &live).await;
    assert!(out.status.success(), "{}", stderr(&out));

    let bad_role = format!(
        "apiVersion: switchyard.dev/v1alpha1\nkind: ProxyConfig\nmetadata:\n  name: web-other\n  namespace: {ns}\nspec: {{role: other, route: web, generation: 1, version: abc}}\n"
    );
    let out = api
        .kubectl_input(["create", "--dry-run=server", "-f", "-"], &bad_role)
        .await;
    assert!(!out.status.success(), "role: other was accepted");
    assert!(
        stderr(&out).contains("spec.role: Unsupported value: \"other\""),
        "{}",
        stderr(&out)
    );
    rig::delete_namespace(&client, &ns).await;
}

#[tokio::test]
async fn kubectl_explain_describes_both_kinds() {
    let api = KubeApi::shared().await;
    let client = api.client().await;
    let ns = rig::unique_name("crdexplain");
    rig::create_namespace(&client, &ns).await;
    install_crds(&api, &ns).await;
    for (what, says) in [
        ("trafficroutes", "A route a user writes"),
        ("trafficroutes.spec", "What the route serves"),
        ("proxyconfigs", "written only by Switchyard"),
        (
            "proxyconfigs.spec",
            "One role of a route's resolved configuration",
        ),
    ] {
        // Discovery may lag just after the CRDs are established: bounded retries. The
        // text is compared with its line breaks flattened.
        let mut out = String::new();
        let mut flat = String::new();
        for _ in 0..50 {
            out =
                String::from_utf8_lossy(&api.kubectl(["explain", what]).await.stdout).into_owned();
            flat = out.split_whitespace().collect::<Vec<_>>().join(" ");
            if flat.contains(says) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(flat.contains(says), "kubectl explain {what}:\n{out}");
        assert!(
            !flat.contains("Auto-generated"),
            "kubectl explain {what}:\n{out}"
        );
    }
}
