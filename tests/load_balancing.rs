//! Load balancing on real Envoy: a rule's policy and session affinity by cookie or header
//! over a service of two endpoints; and changing the policy under load drops nothing.

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

    let mut users = BTreeSet::new();
    for user in [
        "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi",
    ] {
        let backends = seen(&rig, "/user", 5, &[("x-user", user)]).await;
        assert_eq!(backends.len(), 1, "{user} moved between {backends:?}");
        users.extend(backends);
    }
    assert_eq!(users.len(), 2, "the users are spread: {users:?}");
}

/// The catch-all rule's policy changed four times under load, affinity included: each is
/// a cluster of its own, brought up before the rule switches to it, and not one request
/// fails.
#[tokio::test]
async fn changing_the_policy_under_load_drops_nothing() {
    let rig = Rig::new().await;
    rig.write_routes("");
    let (switchyard, _envoy) = rig.start().await;
    let steps = [
        "      loadBalancer: { policy: leastRequest }\n",
        "      loadBalancer: { policy: ringHash, affinity: { sourceIP: true } }\n",
        "      loadBalancer: { policy: random }\n",
        "",
    ];
    let rig = &rig;
    let changes = steps.map(|options| move || rig.write_routes(options));
    let target = format!("http://{IP}:{}", rig.dir.http_port);
    let report = changes_under_load(&switchyard, 1, target, "web.test", changes).await;
    eprintln!(
        "policy changed {} times under load: {} requests, by status {:?}, by backend {:?}",
        steps.len(),
        report.sent,
        report.by_status,
        report.by_backend
    );
    assert!(report.sent > 500, "{report:?}");
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}
