//! The checks of a spec, in full and in the order resolution runs them.

use super::{Checked, Checks, Draft, SpecError, rule as check_rule, spec as check_spec};
use crate::route::spec::{
    Affinity, AffinityCookie, Backend, CircuitBreaker, Cors, HeaderMatch, HealthCheck,
    LoadBalancer, OutlierDetection, RateLimit, Redirect, Retries, RouteRule, RouteSpec, RouteTls,
    RuleMatch, RuleOptions,
};

/// The spec's checks and every rule's, as resolution runs them.
fn check(root: &str, spec: &RouteSpec) -> Result<Checked<()>, SpecError> {
    check_spec(root, spec, |at, r| {
        check_rule(at, Checks::Spec, &Draft::of(r))
    })
}

fn spec(rules: Vec<RouteRule>) -> RouteSpec {
    RouteSpec {
        hosts: vec!["Shop.Example.com".into(), "*.shop.example.com".into()],
        tls: None,
        rules,
    }
}

fn backend(port: i32) -> Backend {
    Backend {
        service: "web".into(),
        port: Some(port),
        ..Backend::default()
    }
}

fn rule() -> RouteRule {
    RouteRule {
        backends: vec![backend(80)],
        ..RouteRule::default()
    }
}

fn error_of(spec: &RouteSpec) -> String {
    check("", spec)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

#[test]
fn a_valid_spec_gives_lower_cased_hosts_and_every_rule_a_name() {
    let named = RouteRule {
        name: Some("api".into()),
        ..rule()
    };
    let checked = check("spec", &spec(vec![named, rule()])).expect("valid");
    assert_eq!(checked.hosts, ["shop.example.com", "*.shop.example.com"]);
    let names: Vec<&str> = checked.rules.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["api", "rule-1"]);
}

#[test]
fn paths_start_at_the_root_the_front_end_gives() {
    let mut bad = spec(vec![rule()]);
    bad.rules[0].options.timeout = Some("5x".into());
    let at = |root| check(root, &bad).expect_err("invalid").at;
    assert_eq!(at("spec"), "spec.rules[0].timeout");
    assert_eq!(at(""), "rules[0].timeout");
}

#[test]
fn each_rule_of_the_schema_is_checked_again() {
    let cases: Vec<(&str, RouteSpec)> = vec![
        ("hosts: a route needs at least one host", {
            let mut s = spec(vec![rule()]);
            s.hosts.clear();
            s
        }),
        ("repeats hosts[0]", {
            let mut s = spec(vec![rule()]);
            s.hosts.push("SHOP.example.com".into());
            s
        }),
        ("tls.secretName: must not be empty", {
            let mut s = spec(vec![rule()]);
            s.tls = Some(RouteTls::default());
            s
        }),
        ("rules: a route needs at least one rule", spec(vec![])),
        (
            "rules[1]: the rule name \"rule-1\" is already used by rules[0]",
            spec(vec![
                RouteRule {
                    name: Some("rule-1".into()),
                    ..rule()
                },
                rule(),
            ]),
        ),
        (
            "rules[0]: a rule with redirectHttps has no backends",
            spec(vec![RouteRule {
                redirect_https: Some(true),
                ..rule()
            }]),
        ),
        (
            "rules[0]: a rule with redirect has no backends",
            spec(vec![RouteRule {
                redirect: Some(Redirect::default()),
                ..rule()
            }]),
        ),
        (
            "rules[0]: give at most one of redirect, redirectHttps",
            spec(vec![RouteRule {
                redirect: Some(Redirect::default()),
                redirect_https: Some(true),
                backends: vec![],
                ..rule()
            }]),
        ),
        (
            "rules[0].redirect.prefix: replaces the prefix the rule matches",
            spec(vec![RouteRule {
                redirect: Some(Redirect {
                    prefix: Some("/new".into()),
                    ..Redirect::default()
                }),
                backends: vec![],
                ..rule()
            }]),
        ),
        (
            "rules[0].redirect.statusCode: a redirect's status code is",
            spec(vec![RouteRule {
                redirect: Some(Redirect {
                    status_code: Some(304),
                    ..Redirect::default()
                }),
                backends: vec![],
                ..rule()
            }]),
        ),
        (
            "rules[0]: give at most one of rewritePrefix, rewritePath",
            spec(vec![RouteRule {
                options: RuleOptions {
                    rewrite_prefix: Some("/v2".into()),
                    rewrite_path: Some("/index.html".into()),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].match.method: \"get\" is not an HTTP method in capitals",
            spec(vec![RouteRule {
                matches: Some(RuleMatch {
                    method: Some("get".into()),
                    ..RuleMatch::default()
                }),
                ..rule()
            }]),
        ),
        (
            "rules[0].match.queryParams[0] (\"q\"): give exactly one of exact, regex, present",
            spec(vec![RouteRule {
                matches: Some(RuleMatch {
                    query_params: vec![crate::route::spec::QueryParamMatch {
                        name: "q".into(),
                        ..Default::default()
                    }],
                    ..RuleMatch::default()
                }),
                ..rule()
            }]),
        ),
        (
            "rules[0].match.pathSegmentPrefix: \"api\" does not start with",
            spec(vec![RouteRule {
                matches: Some(RuleMatch {
                    path_segment_prefix: Some("api".into()),
                    ..RuleMatch::default()
                }),
                ..rule()
            }]),
        ),
        (
            "rules[0].backends[0].port: 0 is not within 1..65535",
            spec(vec![RouteRule {
                backends: vec![backend(0)],
                ..rule()
            }]),
        ),
        (
            "rules[0].backends: the weights are all zero",
            spec(vec![RouteRule {
                backends: vec![Backend {
                    weight: Some(0),
                    ..backend(80)
                }],
                ..rule()
            }]),
        ),
        (
            "rules[0].match.headers[0] (\"x\"): give exactly one of",
            spec(vec![RouteRule {
                matches: Some(RuleMatch {
                    headers: vec![HeaderMatch {
                        name: "x".into(),
                        ..HeaderMatch::default()
                    }],
                    ..RuleMatch::default()
                }),
                ..rule()
            }]),
        ),
        (
            "rules[0].retries.attempts: 101 is not within 0..100",
            spec(vec![RouteRule {
                options: RuleOptions {
                    retries: Some(Box::new(Retries {
                        attempts: 101,
                        ..Retries::default()
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].retries.statusCodes[1]: 200 is not within 400..599",
            spec(vec![RouteRule {
                options: RuleOptions {
                    retries: Some(Box::new(Retries {
                        attempts: 2,
                        status_codes: vec![503, 200],
                        ..Retries::default()
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].retries.on[1]: \"503\" is not a retry condition",
            spec(vec![RouteRule {
                options: RuleOptions {
                    retries: Some(Box::new(Retries {
                        attempts: 2,
                        on: vec!["5xx".into(), "503".into()],
                        ..Retries::default()
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].retries.backoff: must be more than 0s",
            spec(vec![RouteRule {
                options: RuleOptions {
                    retries: Some(Box::new(Retries {
                        attempts: 2,
                        backoff: Some("0ms".into()),
                        ..Retries::default()
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].cors.allowOrigins: name at least one origin",
            spec(vec![RouteRule {
                options: RuleOptions {
                    cors: Some(Box::new(Cors::default())),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].cors.allowOrigins[0]: \"app.example.com\" is not",
            spec(vec![RouteRule {
                options: RuleOptions {
                    cors: Some(Box::new(Cors {
                        allow_origins: vec!["app.example.com".into()],
                        ..Cors::default()
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].cors.allowMethods[0]: \"get\" is not an HTTP method",
            spec(vec![RouteRule {
                options: RuleOptions {
                    cors: Some(Box::new(Cors {
                        allow_origins: vec!["*".into()],
                        allow_methods: vec!["get".into()],
                        ..Cors::default()
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].cors.maxAge",
            spec(vec![RouteRule {
                options: RuleOptions {
                    cors: Some(Box::new(Cors {
                        allow_origins: vec!["*".into()],
                        max_age: Some("ten minutes".into()),
                        ..Cors::default()
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].rateLimit.unit: \"day\" is not second, minute or hour",
            spec(vec![RouteRule {
                options: RuleOptions {
                    rate_limit: Some(Box::new(RateLimit {
                        requests: 1,
                        unit: "day".into(),
                        burst: None,
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].rateLimit.requests: 0 is not within 1..1000000",
            spec(vec![RouteRule {
                options: RuleOptions {
                    rate_limit: Some(Box::new(RateLimit {
                        requests: 0,
                        unit: "second".into(),
                        burst: None,
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].loadBalancer.policy: \"weighted\" is not one of",
            spec(vec![RouteRule {
                options: RuleOptions {
                    load_balancer: Some(Box::new(LoadBalancer {
                        policy: Some("weighted".into()),
                        affinity: None,
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].loadBalancer.affinity: affinity needs the policy ringHash or maglev",
            spec(vec![RouteRule {
                options: RuleOptions {
                    load_balancer: Some(Box::new(LoadBalancer {
                        policy: Some("leastRequest".into()),
                        affinity: Some(Affinity {
                            source_ip: Some(true),
                            ..Affinity::default()
                        }),
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].loadBalancer.affinity: give exactly one of cookie, header, sourceIP",
            spec(vec![RouteRule {
                options: RuleOptions {
                    load_balancer: Some(Box::new(LoadBalancer {
                        policy: None,
                        affinity: Some(Affinity::default()),
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].circuitBreaker.maxRequests: 0 is not within 1..1000000",
            spec(vec![RouteRule {
                options: RuleOptions {
                    circuit_breaker: Some(Box::new(CircuitBreaker {
                        max_requests: Some(0),
                        ..CircuitBreaker::default()
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].outlierDetection.interval: must be more than 0s",
            spec(vec![RouteRule {
                options: RuleOptions {
                    outlier_detection: Some(Box::new(OutlierDetection {
                        interval: Some("0s".into()),
                        ..OutlierDetection::default()
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].outlierDetection.maxEjectionPercent: 101 is not within 0..100",
            spec(vec![RouteRule {
                options: RuleOptions {
                    outlier_detection: Some(Box::new(OutlierDetection {
                        max_ejection_percent: Some(101),
                        ..OutlierDetection::default()
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].healthCheck.path: \"healthz\" is not a path (\"/...\", no spaces)",
            spec(vec![RouteRule {
                options: RuleOptions {
                    health_check: Some(Box::new(HealthCheck {
                        path: "healthz".into(),
                        ..HealthCheck::default()
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].healthCheck.host: \"Web Server\" is not a host name",
            spec(vec![RouteRule {
                options: RuleOptions {
                    health_check: Some(Box::new(HealthCheck {
                        path: "/healthz".into(),
                        host: Some("Web Server".into()),
                        ..HealthCheck::default()
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].healthCheck.timeout: duration \"soon\" does not start with a number",
            spec(vec![RouteRule {
                options: RuleOptions {
                    health_check: Some(Box::new(HealthCheck {
                        path: "/healthz".into(),
                        timeout: Some("soon".into()),
                        ..HealthCheck::default()
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].loadBalancer.affinity.cookie.path: \"/a; b\" is not a cookie path",
            spec(vec![RouteRule {
                options: RuleOptions {
                    load_balancer: Some(Box::new(LoadBalancer {
                        policy: None,
                        affinity: Some(Affinity {
                            cookie: Some(AffinityCookie {
                                name: "s".into(),
                                ttl: None,
                                path: Some("/a; b".into()),
                            }),
                            ..Affinity::default()
                        }),
                    })),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
        (
            "rules[0].maxRequestBodyBytes: 0 is not within 1..1073741824",
            spec(vec![RouteRule {
                options: RuleOptions {
                    max_request_body_bytes: Some(0),
                    ..rule().options
                },
                ..rule()
            }]),
        ),
    ];
    for (expected, spec) in cases {
        let message = error_of(&spec);
        assert!(
            message.contains(expected),
            "{message:?} should contain {expected:?}"
        );
    }
}

#[test]
fn a_lowered_rule_is_checked_only_where_the_vocabulary_admits_less() {
    let lowered = |options: RuleOptions, matches: Option<RuleMatch>| {
        let draft = Draft {
            matches,
            options,
            ..Draft::default()
        };
        check_rule("", Checks::Lowered, &draft).map_err(|e| e.to_string())
    };
    // What another API's schema bounds itself is not checked again.
    let admitted = [
        RuleOptions {
            retries: Some(Box::new(Retries {
                attempts: 2,
                status_codes: vec![503; 40],
                ..Retries::default()
            })),
            ..RuleOptions::default()
        },
        RuleOptions {
            rewrite_path: Some("index.html".into()),
            ..RuleOptions::default()
        },
        RuleOptions {
            cors: Some(Box::new(Cors {
                allow_origins: vec!["*".into()],
                max_age: Some("2000000s".into()),
                ..Cors::default()
            })),
            ..RuleOptions::default()
        },
    ];
    for options in admitted {
        assert_eq!(lowered(options, None), Ok(()));
    }
    let empty_regex = RuleMatch {
        path_regex: Some(String::new()),
        ..RuleMatch::default()
    };
    assert_eq!(lowered(RuleOptions::default(), Some(empty_regex)), Ok(()));
    // Where the vocabulary admits less, the paths are the vocabulary's, under the root.
    let refused = [
        (
            RuleOptions {
                retries: Some(Box::new(Retries {
                    attempts: 101,
                    ..Retries::default()
                })),
                ..RuleOptions::default()
            },
            "retries.attempts: 101 is not within 0..100",
        ),
        (
            RuleOptions {
                load_balancer: Some(Box::new(LoadBalancer {
                    policy: Some("ringHash".into()),
                    affinity: Some(Affinity {
                        cookie: Some(AffinityCookie {
                            name: "a b".into(),
                            ttl: None,
                            path: None,
                        }),
                        ..Affinity::default()
                    }),
                })),
                ..RuleOptions::default()
            },
            "loadBalancer.affinity.cookie.name: \"a b\" is not a cookie name",
        ),
    ];
    for (options, expected) in refused {
        assert_eq!(lowered(options, None), Err(expected.to_owned()));
    }
}
