//! Load balancing on real Envoy over a service of two endpoints: a rule's policy, session
//! affinity by cookie or header, health checks, outlier detection and circuit breakers;
//! and changing any of them under load drops nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use switchyard::xds::Protocol;
use switchyard_e2e::{Backend, Envoy, StandaloneDir, Switchyard, changes_under_load};

/// Envoy listens on the first; the two backends, one on each, share a port (the files'
/// services have a port, and endpoints of that port).
const IP: &str = "127.0.0.86";
const OTHER_IP: &str = "127.0.0.87";

struct Rig {
    dir: StandaloneDir,
    backends: [Backend; 2],
}

impl Rig {
    async fn new() -> Rig {
        Rig {
            dir: StandaloneDir::new(),
            backends: two_backends().await,
        }
    }

    /// web.test: `/sticky` with cookie affinity, `/user` with header affinity, and `/`
    /// with `options` (rule YAML lines indented by 6 spaces), all to the service `web`
    /// whose endpoints are the two backends.
    fn write_routes(&self, options: &str) {
        let port = self.backends[0].address.port();
        let yaml = format!(
            "listeners: {{ address: \"{IP}\", httpPort: {http}, probePort: {probe} }}\n\
             routes:\n- name: web\n  spec:\n    hosts: [web.test]\n    rules:\n\
             \x20   - name: sticky\n      match: {{ pathPrefix: /sticky }}\n      backends: [ {{ service: web, port: {port} }} ]\n\
             \x20     loadBalancer: {{ affinity: {{ cookie: {{ name: sticky, ttl: 1h, path: / }} }} }}\n\
             \x20   - name: user\n      match: {{ pathPrefix: /user }}\n      backends: [ {{ service: web, port: {port} }} ]\n\
             \x20     loadBalancer: {{ policy: maglev, affinity: {{ header: x-user }} }}\n\
             \x20   - name: rest\n      backends: [ {{ service: web, port: {port} }} ]\n{options}\
             services:\n- name: web\n  endpoints: [ {{ address: \"{IP}\", port: {port} }}, {{ address: \"{OTHER_IP}\", port: {port} }} ]\n",
            http = self.dir.http_port,
            probe = self.dir.probe_port,
        );
        self.dir.write("routes.yaml", &yaml);
    }

    fn url(&self, path: &str) -> String {
        format!("http://{IP}:{}{path}", self.dir.http_port)
    }

    async fn start(&self) -> (Switchyard, Envoy) {
        let switchyard = Switchyard::start_standalone(&self.dir.work, &self.dir.config, &[]);
        let envoy = Envoy::start(
            &self.dir.work,
            "envoy-lb",
            IP,
            switchyard.xds_port,
            Protocol::Delta,
        );
        switchyard.wait_synced(1, Duration::from_secs(20)).await;
        // Both endpoints answer before the test starts counting.
        let started = std::time::Instant::now();
        while seen(self, "/", 20, &[]).await.len() < 2 {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "both backends never answered\n--- switchyard ---\n{}\n--- envoy ---\n{}",
                switchyard.process.log_tail(),
                envoy.process.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (switchyard, envoy)
    }
}

/// Backend a on [`IP`], b on [`OTHER_IP`], on one port.
async fn two_backends() -> [Backend; 2] {
    let a = Backend::start("a", IP).await;
    let port = a.address.port();
    let other: std::net::SocketAddr = format!("{OTHER_IP}:{port}").parse().expect("address");
    [a, Backend::start_on("b", other).await]
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client")
}

/// The backends that answered `count` requests to `path` with these headers.
async fn seen(rig: &Rig, path: &str, count: usize, headers: &[(&str, &str)]) -> BTreeSet<String> {
    let mut backends = BTreeSet::new();
    for _ in 0..count {
        let mut request = client().get(rig.url(path)).header("host", "web.test");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Ok(answer) = request.send().await
            && answer.status() == 200
            && let Some(backend) = answer.headers().get("x-backend")
        {
            backends.insert(backend.to_str().unwrap_or("?").to_owned());
        }
    }
    backends
}

/// Round robin spreads a client's requests over both Pods; the cookie rule sets its
/// cookie on the first answer and sends every request carrying it to one Pod; the header
/// rule keeps each user on one Pod, and different users reach both.
#[tokio::test]
async fn affinity_keeps_a_client_on_one_backend() {
    let rig = Rig::new().await;
    rig.write_routes("");
    let (_switchyard, _envoy) = rig.start().await;

    assert_eq!(seen(&rig, "/", 10, &[]).await.len(), 2, "round robin");

    let first = client()
        .get(rig.url("/sticky/cart"))
        .header("host", "web.test")
        .send()
        .await
        .expect("answered");
    let set_cookie = first
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        set_cookie.starts_with("sticky=")
            && set_cookie.contains("Max-Age=3600")
            && set_cookie.contains("Path=/"),
        "{set_cookie:?}"
    );
    let cookie = set_cookie.split(';').next().unwrap_or_default().to_owned();
    let sticky = seen(&rig, "/sticky/cart", 20, &[("cookie", cookie.as_str())]).await;
    assert_eq!(sticky.len(), 1, "one backend for the cookie: {sticky:?}");

    // Users until both Pods have some: which Pod a user hashes to depends on the Pods'
    // ports, new every run, so eight fixed users all landed on one Pod now and then (a
    // chance of 2^-7 on an even ring). Sixty-four make it 2^-63.
    let mut users = BTreeSet::new();
    for i in 0..64 {
        let user = format!("user-{i}");
        let backends = seen(&rig, "/user", 5, &[("x-user", user.as_str())]).await;
        assert_eq!(backends.len(), 1, "{user} moved between {backends:?}");
        users.extend(backends);
        if users.len() == 2 {
            break;
        }
    }
    assert_eq!(users.len(), 2, "the users are spread: {users:?}");
}

/// The catch-all rule's policy changed four times under load, affinity included: each is
/// a cluster of its own, brought up before the rule switches to it, and not one request
/// fails.
#[tokio::test]
async fn changing_the_policy_under_load_drops_nothing() {
    changes_under_load_drop_nothing(
        "policy",
        [
            "      loadBalancer: { policy: leastRequest }\n",
            "      loadBalancer: { policy: ringHash, affinity: { sourceIP: true } }\n",
            "      loadBalancer: { policy: random }\n",
            "",
        ],
        500,
    )
    .await;
}

/// The catch-all rule's options set to each of `steps` in turn under load (more than
/// `at_least` requests): not one request fails.
async fn changes_under_load_drop_nothing<const N: usize>(
    what: &str,
    steps: [&'static str; N],
    at_least: usize,
) {
    let rig = Rig::new().await;
    rig.write_routes("");
    let (switchyard, _envoy) = rig.start().await;
    let rig = &rig;
    let changes = steps.map(|options| move || rig.write_routes(options));
    let target = format!("http://{IP}:{}", rig.dir.http_port);
    let report = changes_under_load(&switchyard, 1, target, "web.test", changes).await;
    eprintln!(
        "{what} changed {N} times under load: {} requests, by status {:?}, by backend {:?}",
        report.sent, report.by_status, report.by_backend
    );
    assert!(report.sent > at_least, "{report:?}");
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}

/// Requests to `path` until the backends that answer `count` in a row are `expected`,
/// for at most `within`.
async fn wait_for_backends(rig: &Rig, path: &str, expected: &[&str], within: Duration) {
    let expected: BTreeSet<String> = expected.iter().map(|b| b.to_string()).collect();
    let started = std::time::Instant::now();
    loop {
        let backends = seen(rig, path, 10, &[]).await;
        if backends == expected {
            return;
        }
        assert!(
            started.elapsed() < within,
            "{path}: answered by {backends:?}, not {expected:?}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Active health checks: every Envoy asks each Pod for /healthz; a Pod whose checks fail
/// gets no traffic, and gets it again once it passes.
#[tokio::test]
async fn a_backend_failing_health_checks_gets_no_traffic_until_it_passes() {
    let rig = Rig::new().await;
    rig.write_routes(
        "      healthCheck: { path: /healthz, interval: 200ms, timeout: 1s, unhealthyThreshold: 2, healthyThreshold: 1 }\n",
    );
    let (_switchyard, _envoy) = rig.start().await;
    let [a, b] = &rig.backends;
    assert!(b.health_checks_seen() > 0, "Envoy checks the backends");

    b.set_unhealthy(true);
    wait_for_backends(&rig, "/", &["a"], Duration::from_secs(10)).await;
    assert_eq!(
        seen(&rig, "/", 40, &[]).await,
        BTreeSet::from(["a".to_owned()])
    );
    // Only the rule with the health check leaves b out.
    assert_eq!(seen(&rig, "/sticky", 20, &[]).await.len(), 2);

    b.set_unhealthy(false);
    wait_for_backends(&rig, "/", &["a", "b"], Duration::from_secs(10)).await;
    assert!(a.health_checks_seen() > 2);
}

/// Outlier detection: a Pod that answers 3 errors in a row is ejected, and the other
/// takes every request.
#[tokio::test]
async fn a_backend_answering_errors_in_a_row_is_ejected() {
    let rig = Rig::new().await;
    rig.write_routes(
        "      outlierDetection: { consecutive5xx: 3, baseEjectionTime: 60s, maxEjectionPercent: 50 }\n",
    );
    let (_switchyard, _envoy) = rig.start().await;
    let b = &rig.backends[1];
    b.fail_next(3, 500);
    // Round robin: b gets about half of these, its first three fail.
    seen(&rig, "/", 20, &[]).await;
    assert_eq!(
        seen(&rig, "/", 40, &[]).await,
        BTreeSet::from(["a".to_owned()])
    );
    // A rule without outlier detection still uses both.
    assert_eq!(seen(&rig, "/sticky", 20, &[]).await.len(), 2);
}

/// A circuit breaker of one request in flight: of six sent at once to slow backends, one
/// is forwarded and five are answered 503 by Envoy at once, marked overloaded.
#[tokio::test]
async fn requests_over_the_circuit_breaker_are_refused_at_once() {
    let rig = Rig::new().await;
    rig.write_routes("      circuitBreaker: { maxRequests: 1 }\n");
    let (_switchyard, _envoy) = rig.start().await;
    for backend in &rig.backends {
        backend.slow_down(Duration::from_secs(1));
    }
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let request = client().get(rig.url("/")).header("host", "web.test");
        requests.spawn(async move {
            let started = std::time::Instant::now();
            let answer = request.send().await.expect("answered");
            let overloaded = answer.headers().get("x-envoy-overloaded").is_some();
            (answer.status().as_u16(), overloaded, started.elapsed())
        });
    }
    let mut forwarded = 0;
    let mut refused = 0;
    while let Some(result) = requests.join_next().await {
        let (status, overloaded, took) = result.expect("request task");
        match (status, overloaded) {
            (200, false) => forwarded += 1,
            (503, true) => {
                refused += 1;
                assert!(
                    took < Duration::from_millis(900),
                    "refused at once: {took:?}"
                );
            }
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!((forwarded, refused), (1, 5));
}

/// Health checks, outlier detection and circuit breakers put on, changed and taken off
/// under load: each setting is a cluster of its own, and not one request fails.
#[tokio::test]
async fn changing_backend_health_settings_under_load_drops_nothing() {
    changes_under_load_drop_nothing(
        "backend health settings",
        [
            "      circuitBreaker: { maxConnections: 100, maxRequests: 500 }\n",
            "      outlierDetection: { consecutive5xx: 5 }\n      circuitBreaker: { maxRequests: 1000 }\n",
            "      healthCheck: { path: /healthz, interval: 500ms }\n",
            "      healthCheck: { path: /healthz, interval: 1s, unhealthyThreshold: 2 }\n      outlierDetection: { consecutive5xx: 3 }\n",
            "",
        ],
        600,
    )
    .await;
}
