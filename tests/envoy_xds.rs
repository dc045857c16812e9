//! The xDS server against real Envoy (SotW and delta), all on 127.0.0.x.

use std::time::Duration;

use std::sync::Arc;

use switchyard::xds::Protocol;
use switchyard_e2e::{
    Backend, Envoy, InProcessServer, StandaloneDir, Switchyard, changes_under_load, free_port,
    write_route,
};

/// The scratch folder of a standalone Switchyard and its Envoy's ports.
type Rig = StandaloneDir;

async fn get(url: &str, host: &str) -> Result<(u16, String), String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| e.to_string())?;
    let response = client
        .get(url)
        .header("host", host)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    Ok((status, response.text().await.unwrap_or_default()))
}

/// Polls until `url` answers 200 with `body`.
async fn wait_for_body(url: &str, host: &str, body: &str, within: Duration) {
    let started = std::time::Instant::now();
    let mut last = Err("no request yet".to_string());
    while started.elapsed() < within {
        last = get(url, host).await;
        if matches!(&last, Ok((200, b)) if b == body) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{url} did not answer {body:?} within {within:?}; last: {last:?}");
}

async fn serves_and_follows_changes(protocol: Protocol, ip: &str) {
    let rig = Rig::new();
    let blue = Backend::start("blue", ip).await;
    let green = Backend::start("green", ip).await;
    write_route(
        &rig.config,
        "web.test",
        rig.http_port,
        rig.probe_port,
        &[("blue", &blue)],
    );
    let switchyard = Switchyard::start_standalone(&rig.work, &rig.config, &[]);
    let envoy = Envoy::start(&rig.work, "envoy-1", ip, switchyard.xds_port, protocol);
    let url = format!("http://{ip}:{}/", rig.http_port);
    switchyard.wait_synced(1, Duration::from_secs(20)).await;
    wait_for_body(&url, "web.test", "blue", Duration::from_secs(5)).await;

    write_route(
        &rig.config,
        "web.test",
        rig.http_port,
        rig.probe_port,
        &[("green", &green)],
    );
    wait_for_body(&url, "web.test", "green", Duration::from_secs(10)).await;
    switchyard.wait_synced(1, Duration::from_secs(10)).await;
    let clusters = envoy.admin("/clusters?format=json").await;
    assert!(
        !clusters.contains("default/blue/"),
        "old cluster collected: {clusters}"
    );

    // `switchyard status` shows the Envoy in sync, like `istioctl proxy-status`.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args([
            "status",
            "--admin",
            &format!("127.0.0.1:{}", switchyard.admin_port),
        ])
        .output()
        .expect("switchyard status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("envoy-1") && text.contains("SYNCED"),
        "{text}"
    );

    // A host nobody routes is a 404, not someone else's backend.
    assert_eq!(get(&url, "other.test").await.map(|r| r.0), Ok(404));
}

#[tokio::test]
async fn sotw_envoy_serves_and_follows_changes() {
    serves_and_follows_changes(Protocol::Sotw, "127.0.0.11").await;
}

#[tokio::test]
async fn delta_envoy_serves_and_follows_changes() {
    serves_and_follows_changes(Protocol::Delta, "127.0.0.12").await;
}

#[tokio::test]
async fn startup_gate_holds_envoy_until_the_first_full_snapshot() {
    let rig = Rig::new();
    let ip = "127.0.0.13";
    let blue = Backend::start("blue", ip).await;
    // An unparsable configuration: nothing may be served.
    std::fs::write(rig.config.join("routes.yaml"), "routes: [ {name: web\n").expect("write");
    let switchyard = Switchyard::start_standalone(&rig.work, &rig.config, &[]);
    let _envoy = Envoy::start(
        &rig.work,
        "envoy-gate",
        ip,
        switchyard.xds_port,
        Protocol::Delta,
    );
    let started = std::time::Instant::now();
    loop {
        let nodes = switchyard.nodes().await;
        if nodes["nodes"].as_array().is_some_and(|n| n.len() == 1) {
            assert!(nodes["desired_version"].is_null(), "{nodes:#}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "Envoy never connected: {nodes:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready = reqwest::get(switchyard.admin_url("/readyz"))
        .await
        .expect("readyz")
        .status();
    assert_eq!(ready.as_u16(), 503);
    let url = format!("http://{ip}:{}/", rig.http_port);
    assert!(
        get(&url, "web.test").await.is_err(),
        "no listener before the gate opens"
    );

    write_route(
        &rig.config,
        "web.test",
        rig.http_port,
        rig.probe_port,
        &[("blue", &blue)],
    );
    wait_for_body(&url, "web.test", "blue", Duration::from_secs(10)).await;
    let ready = reqwest::get(switchyard.admin_url("/readyz"))
        .await
        .expect("readyz")
        .status();
    assert_eq!(ready.as_u16(), 200);
}

#[tokio::test]
async fn nack_is_surfaced_and_envoy_keeps_its_last_good_config() {
    use switchyard::model;
    use switchyard::xds::{Ordering, Resource, Snapshot};

    let rig = Rig::new();
    let ip = "127.0.0.14";
    let blue = Backend::start("blue", ip).await;
    let server = InProcessServer::start(Ordering::MakeBeforeBreak).await;
    let service = model::ServiceRef {
        namespace: "default".into(),
        name: "blue".into(),
        port: blue.address.port(),
    };
    let cluster = model::cluster_name(&service, &model::ClusterSettings::default());
    let config = model::Config {
        listeners: model::ListenerSettings {
            address: ip.into(),
            http_port: rig.http_port,
            probe_port: rig.probe_port,
            probe_token: "t".into(),
            ..Default::default()
        },
        virtual_hosts: vec![model::VirtualHost {
            listener: None,
            leaving: false,
            created: None,
            name: "default/web".into(),
            hosts: vec!["web.test".into()],
            tls: None,
            routes: vec![model::Route {
                name: "all".into(),
                path: model::PathMatch::Prefix("/".into()),
                headers: vec![],
                method: None,
                query: Vec::new(),
                action: model::RouteAction::Forward(model::Forward {
                    backends: vec![model::WeightedCluster {
                        cluster: cluster.clone(),
                        weight: 1,
                        request_headers: model::HeaderEdits::default(),
                    }],
                    ..Default::default()
                }),
                request_headers: Default::default(),
                response_headers: Default::default(),
            }],
        }],
        clusters: vec![model::Cluster {
            name: cluster,
            service,
            settings: Default::default(),
            endpoints: vec![model::Endpoint {
                address: ip.into(),
                port: blue.address.port(),
                condition: model::EndpointCondition::READY,
                zone: None,
                leaving: false,
            }],
        }],
        ..Default::default()
    };
    let good = switchyard::translate::translate(&config).snapshot;
    server.desired.publish(Arc::new(good.clone()));
    server.desired.open();
    let _envoy = Envoy::start(&rig.work, "envoy-nack", ip, server.port, Protocol::Sotw);
    let url = format!("http://{ip}:{}/", rig.http_port);
    wait_for_body(&url, "web.test", "blue", Duration::from_secs(20)).await;

    // A cluster Envoy must reject (a negative connect timeout), next to the good ones.
    let broken = envoy_types::pb::envoy::config::cluster::v3::Cluster {
        name: "broken".into(),
        connect_timeout: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: -1,
            nanos: 0,
        }),
        ..Default::default()
    };
    let mut resources: Vec<Resource> = good
        .types()
        .flat_map(|(_, rs)| rs.values().map(|r| Resource::clone(r)))
        .collect();
    resources.push(Resource::new("broken", envoy_types::util::pack_any(broken)));
    server.desired.publish(Arc::new(Snapshot::new(resources)));

    let started = std::time::Instant::now();
    let nack = loop {
        let nodes = server.nodes.list();
        if let Some(nack) = nodes
            .first()
            .and_then(|n| n.status.types.get("Cluster"))
            .and_then(|t| t.last_nack.clone())
        {
            assert!(nodes[0].status.blocked_by_nack);
            break nack;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no NACK surfaced: {nodes:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        nack.error.contains("broken") || !nack.error.is_empty(),
        "{nack:?}"
    );
    let metrics = server.metrics_text();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("switchyard_xds_nacks_total{type=\"Cluster\"} ")
                && !l.ends_with(" 0")
        ),
        "{metrics}"
    );
    // Envoy still serves the last good configuration, and has no "broken" cluster.
    for _ in 0..20 {
        assert_eq!(get(&url, "web.test").await, Ok((200, "blue".to_string())));
    }
    // A good snapshot again: the node converges.
    server.desired.publish(Arc::new(good));
    let started = std::time::Instant::now();
    while !server
        .nodes
        .list()
        .first()
        .is_some_and(|n| n.status.synced && !n.status.blocked_by_nack)
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:#?}",
            server.nodes.list()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_restarted_envoy_gets_the_full_state() {
    let rig = Rig::new();
    let ip = "127.0.0.15";
    let blue = Backend::start("blue", ip).await;
    write_route(
        &rig.config,
        "web.test",
        rig.http_port,
        rig.probe_port,
        &[("blue", &blue)],
    );
    let switchyard = Switchyard::start_standalone(&rig.work, &rig.config, &[]);
    let url = format!("http://{ip}:{}/", rig.http_port);
    let mut envoy = Envoy::start(
        &rig.work,
        "envoy-restart",
        ip,
        switchyard.xds_port,
        Protocol::Delta,
    );
    wait_for_body(&url, "web.test", "blue", Duration::from_secs(20)).await;
    envoy.process.kill();
    drop(envoy);
    let _envoy = Envoy::start(
        &rig.work,
        "envoy-restart",
        ip,
        switchyard.xds_port,
        Protocol::Delta,
    );
    wait_for_body(&url, "web.test", "blue", Duration::from_secs(20)).await;
    switchyard.wait_synced(1, Duration::from_secs(10)).await;
}

/// `switchyard bootstrap` makes a bootstrap a real Envoy starts from, connects with and
/// serves (JSON here; the YAML it is read back from is the one the rig uses).
#[tokio::test]
async fn an_envoy_started_from_switchyard_bootstrap_serves() {
    let rig = Rig::new();
    let ip = "127.0.0.16";
    let blue = Backend::start("blue", ip).await;
    write_route(
        &rig.config,
        "web.test",
        rig.http_port,
        rig.probe_port,
        &[("blue", &blue)],
    );
    let switchyard = Switchyard::start_standalone(&rig.work, &rig.config, &[]);
    let xds = format!("127.0.0.1:{}", switchyard.xds_port);
    let _envoy = Envoy::start_with_bootstrap(
        &rig.work,
        "envoy-cli",
        ip,
        &[switchyard.xds_port],
        Protocol::Sotw,
        |b| {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
                .args(["bootstrap", "--node-id", &b.node_id, "--xds", &xds])
                .args(["--protocol", "sotw", "--admin-port", "0", "--json"])
                .args(["--listen-address", ip])
                .output()
                .expect("switchyard bootstrap");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).expect("UTF-8")
        },
    );
    switchyard.wait_synced(1, Duration::from_secs(20)).await;
    let url = format!("http://{ip}:{}/", rig.http_port);
    wait_for_body(&url, "web.test", "blue", Duration::from_secs(5)).await;
    let nodes = switchyard.nodes().await;
    assert_eq!(nodes["nodes"][0]["node_id"], "envoy-cli", "{nodes:#}");
    assert_eq!(nodes["nodes"][0]["status"]["protocol"], "Sotw", "{nodes:#}");

    // Bad input is refused with a reason.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["bootstrap", "--xds", "xds.example"])
        .output()
        .expect("switchyard bootstrap");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("expected HOST:PORT"), "{stderr}");
}

/// Standalone mode: a route's certificate files renewed in place (written, then renamed
/// over the old ones) are served over SDS on new connections within a poll or two, under
/// HTTPS load through a real Envoy, three times: nothing fails, not even on connections
/// kept alive across a change.
#[tokio::test]
async fn standalone_certificate_files_renewed_under_https_load_drop_nothing() {
    use switchyard_e2e::rig::Rig as KubeRig;
    use switchyard_e2e::{HttpsLoad, https_get, pem_fingerprint};

    let ip = "127.0.0.76";
    let backend = Backend::start("web", ip).await;
    let rig = Rig::new();
    let https_port = free_port();
    let write_files = |cert: &str, key: &str| {
        for (name, text) in [("web.crt", cert), ("web.key", key)] {
            let tmp = rig.config.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, text).expect("write");
            std::fs::rename(&tmp, rig.config.join(name)).expect("rename");
        }
    };
    let (cert, key) = KubeRig::new_certificate("web.test");
    write_files(&cert, &key);
    let yaml = format!(
        "listeners: {{ httpPort: {}, httpsPort: {https_port}, probePort: {} }}\n\
         routes:\n- name: web\n  spec:\n    hosts: [web.test]\n    tls: {{ secretName: web-cert, redirectHttp: false }}\n    rules:\n    - backends: [ {{ service: web, port: {port} }} ]\n\
         services:\n- name: web\n  endpoints: [ {{ address: \"{ip}\", port: {port} }} ]\n\
         secrets:\n- {{ name: web-cert, certFile: web.crt, keyFile: web.key }}\n",
        rig.http_port,
        rig.probe_port,
        port = backend.address.port(),
    );
    std::fs::write(rig.config.join("routes.yaml"), yaml).expect("write config");
    let switchyard = Switchyard::start_standalone(&rig.work, &rig.config, &[]);
    let _envoy = Envoy::start(
        &rig.work,
        "envoy-tls",
        ip,
        switchyard.xds_port,
        Protocol::Delta,
    );
    let target: std::net::SocketAddr = format!("{ip}:{https_port}").parse().expect("address");
    let serves = |fingerprint: String| async move {
        let started = std::time::Instant::now();
        loop {
            if let Ok((seen, answer)) = https_get(target, "web.test", "/").await
                && seen == fingerprint
                && answer.status == 200
            {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "certificate {fingerprint} never served"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    serves(pem_fingerprint(&cert)).await;
    let load = HttpsLoad::start(vec![target], "web.test", 100, Duration::from_secs(120));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut took = Vec::new();
    for _ in 0..3 {
        let (cert, key) = KubeRig::new_certificate("web.test");
        write_files(&cert, &key);
        took.push(serves(pem_fingerprint(&cert)).await);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let report = load.finish().await;
    eprintln!(
        "certificate files renewed 3 times: served after {took:?}; {} requests, by status {:?}, {} certificates seen",
        report.requests.sent,
        report.requests.by_status,
        report.certificates.len()
    );
    assert!(report.requests.sent > 0);
    assert_eq!(
        report.requests.non_2xx(),
        0,
        "{:?}",
        report.requests.failures
    );
    assert!(
        report.certificates.len() >= 4,
        "every certificate was served"
    );
}

/// The route file of the access log tests: web.test to `backend`, with more listener
/// settings (YAML flow mapping entries, e.g. `accessLog: { format: text }`; empty: none).
fn access_log_route(rig: &Rig, backend: &Backend, listener_fields: &str) {
    let log = if listener_fields.is_empty() {
        String::new()
    } else {
        format!(", {listener_fields}")
    };
    let yaml = format!(
        "listeners: {{ httpPort: {}, probePort: {}{log} }}\n\
         routes:\n- name: web\n  spec:\n    hosts: [web.test]\n    rules:\n    - name: all\n      backends: [ {{ service: web, port: {port} }} ]\n\
         services:\n- name: web\n  endpoints: [ {{ address: \"{ip}\", port: {port} }} ]\n",
        rig.http_port,
        rig.probe_port,
        ip = backend.address.ip(),
        port = backend.address.port(),
    );
    rig.write("routes.yaml", &yaml);
}

/// A backend on `ip`, the access log route to it (default log), Switchyard and an Envoy.
async fn access_log_rig(ip: &str, protocol: Protocol) -> (Rig, Backend, Switchyard, Envoy) {
    let backend = Backend::start("web", ip).await;
    let rig = Rig::new();
    access_log_route(&rig, &backend, "");
    let switchyard = Switchyard::start_standalone(&rig.work, &rig.config, &[]);
    let envoy = Envoy::start(&rig.work, "envoy-log", ip, switchyard.xds_port, protocol);
    (rig, backend, switchyard, envoy)
}

/// Envoy's JSON access log lines (stdout is in its process log) for requests to `path`.
fn access_log_lines(envoy: &Envoy, path: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(&envoy.process.log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["path"] == path)
        .collect()
}

/// By default every request through a public listener is logged to Envoy's stdout as one
/// JSON object with the fields operators look for; the prober's requests are not.
#[tokio::test]
async fn requests_are_logged_as_json_by_default() {
    let ip = "127.0.0.77";
    let (rig, backend, _switchyard, envoy) = access_log_rig(ip, Protocol::Delta).await;
    let url = format!("http://{ip}:{}/logged", rig.http_port);
    wait_for_body(&url, "web.test", "web", Duration::from_secs(20)).await;
    let started = std::time::Instant::now();
    let line = loop {
        // Envoy flushes its access log about every second.
        if let Some(line) = access_log_lines(&envoy, "/logged").pop() {
            break line;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no access log line:\n{}",
            envoy.process.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("access log line: {line}");
    assert_eq!(line["method"], "GET");
    assert_eq!(line["authority"], "web.test");
    assert_eq!(line["status"], 200);
    assert_eq!(line["response_flags"], "-");
    assert_eq!(line["route_name"], "all");
    assert!(
        line["upstream_cluster"]
            .as_str()
            .is_some_and(|c| c.starts_with("default/web/")),
        "{line}"
    );
    assert_eq!(line["upstream_host"], backend.address.to_string());
    for field in [
        "start_time",
        "request_id",
        "duration_ms",
        "protocol",
        "bytes_sent",
    ] {
        assert!(
            !line[field].is_null() && line[field] != "-",
            "{field}: {line}"
        );
    }
    // A 404 says why in its flags.
    let missing = format!("http://{ip}:{}/x", rig.http_port);
    let _ = reqwest::Client::new()
        .get(&missing)
        .header("host", "nobody.test")
        .send()
        .await;
    let started = std::time::Instant::now();
    while !access_log_lines(&envoy, "/x")
        .iter()
        .any(|l| l["status"] == 404 && l["response_flags"] == "NR")
    {
        assert!(started.elapsed() < Duration::from_secs(10), "no NR line");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The access log's format changed three times under load (json → text → off → json): a
/// listener change Envoy takes without dropping a request.
#[tokio::test]
async fn changing_the_access_log_under_load_drops_nothing() {
    let ip = "127.0.0.78";
    let (rig, backend, switchyard, _envoy) = access_log_rig(ip, Protocol::Sotw).await;
    let url = format!("http://{ip}:{}/", rig.http_port);
    wait_for_body(&url, "web.test", "web", Duration::from_secs(20)).await;
    let (rig, backend) = (&rig, &backend);
    let changes = [
        "{ format: text }",
        "{ format: off }",
        "{ format: json, samplePercent: 50 }",
    ]
    .map(|log| move || access_log_route(rig, backend, &format!("accessLog: {log}")));
    let target = format!("http://{ip}:{}", rig.http_port);
    let report = changes_under_load(&switchyard, 1, target, "web.test", changes).await;
    eprintln!(
        "access log changed 3 times under load: {} requests, by status {:?}",
        report.sent, report.by_status
    );
    assert!(report.sent > 0);
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}

/// What a request with `x-forwarded-for: 203.0.113.7` is logged as coming from, sent
/// directly or after a PROXY protocol v1 header naming 198.51.100.9:5555.
async fn logged_client(rig: &Rig, envoy: &Envoy, ip: &str, path: &str, proxy: bool) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect((ip, rig.http_port))
        .await
        .expect("connect to Envoy");
    let header = if proxy {
        format!("PROXY TCP4 198.51.100.9 {ip} 5555 {}\r\n", rig.http_port)
    } else {
        String::new()
    };
    let request = format!(
        "{header}GET {path} HTTP/1.1\r\nhost: web.test\r\nx-forwarded-for: 203.0.113.7\r\nconnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .expect("write the request");
    let mut answer = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut answer)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
    let started = std::time::Instant::now();
    loop {
        if let Some(line) = access_log_lines(envoy, path).pop() {
            let address = line["downstream_remote_address"].as_str().unwrap_or("-");
            return address.to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no access log line for {path}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// By default the client is the connection's peer, whatever X-Forwarded-For says; with
/// one trusted hop, the address its last proxy appended; with the PROXY protocol, what
/// the header names, and a connection without one is served with its own address.
#[tokio::test]
async fn the_client_address_comes_from_the_proxies_trusted() {
    let ip = "127.0.0.79";
    let (rig, backend, switchyard, envoy) = access_log_rig(ip, Protocol::Delta).await;
    let url = format!("http://{ip}:{}/", rig.http_port);
    wait_for_body(&url, "web.test", "web", Duration::from_secs(20)).await;
    let client = logged_client(&rig, &envoy, ip, "/direct", false).await;
    assert!(client.starts_with("127.0.0.1:"), "untrusted XFF: {client}");

    // (listener settings, None: unchanged; a PROXY header sent; the client logged)
    let cases = [
        (
            Some("clientIp: { xffTrustedHops: 1 }"),
            false,
            "203.0.113.7:0",
        ),
        (
            Some("clientIp: { proxyProtocol: true }"),
            true,
            "198.51.100.9:5555",
        ),
        (None, false, "127.0.0.1:"),
    ];
    for (i, (fields, proxy, expected)) in cases.into_iter().enumerate() {
        if let Some(fields) = fields {
            let before = switchyard.desired_version().await;
            access_log_route(&rig, &backend, fields);
            switchyard
                .wait_for_new_version(before.as_deref(), Duration::from_secs(10))
                .await;
            switchyard.wait_synced(1, Duration::from_secs(10)).await;
        }
        let client = logged_client(&rig, &envoy, ip, &format!("/case-{i}"), proxy).await;
        assert!(
            client.starts_with(expected),
            "case {i} {fields:?} (PROXY header: {proxy}): {client}"
        );
    }
}

/// Trusted hops and the PROXY protocol turned on and off under plain-HTTP load: listener
/// changes, and not one request fails (connections without a PROXY header are served).
#[tokio::test]
async fn changing_the_client_address_settings_under_load_drops_nothing() {
    let ip = "127.0.0.80";
    let (rig, backend, switchyard, _envoy) = access_log_rig(ip, Protocol::Delta).await;
    let url = format!("http://{ip}:{}/", rig.http_port);
    wait_for_body(&url, "web.test", "web", Duration::from_secs(20)).await;
    let (rig, backend) = (&rig, &backend);
    let steps = [
        "clientIp: { xffTrustedHops: 1 }",
        "clientIp: { xffTrustedHops: 2, proxyProtocol: true }",
        "clientIp: { proxyProtocol: false }",
    ];
    let changes = steps.map(|fields| move || access_log_route(rig, backend, fields));
    let target = format!("http://{ip}:{}", rig.http_port);
    let report = changes_under_load(&switchyard, 1, target, "web.test", changes).await;
    eprintln!(
        "client address settings changed {} times under load: {} requests, by status {:?}",
        steps.len(),
        report.sent,
        report.by_status
    );
    assert!(report.sent > 0);
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}
