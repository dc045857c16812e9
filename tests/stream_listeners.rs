//! TCP, TLS and UDP Gateway listeners on real Envoy: connections forwarded whole (TCP; TLS
//! passed through by server name, or decrypted first), and each listener's version probes
//! answered on its probe port by the listener itself, so a probe that reads a version is
//! proof that new connections are forwarded by it; a connection opened before a move stays
//! on its backend until Envoy's drain time ends, then is closed. UDP: datagrams to the
//! port's one backend, or by weight to several (a blend), and the version answered by the
//! TCP listener sent with the UDP one.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard::model;
use switchyard::xds::{Ordering, Protocol};
use switchyard_e2e::{
    Backend, Envoy, HttpConnection, InProcessServer, StandaloneDir, free_port, https_get,
    pem_fingerprint,
};

const IP: &str = "127.0.0.51";
const TLS: &str = "apps/gw/443/tls";
const TCP: &str = "apps/gw/5432/tcp";
const UDP: &str = "apps/gw/53/udp";
const TOKEN: &str = "t";

fn cluster_of(backend: &Backend) -> model::Cluster {
    cluster_at(&backend.name, backend.address, Default::default())
}

/// The cluster of Service `name` whose one endpoint is `address`.
fn cluster_at(name: &str, address: SocketAddr, settings: model::ClusterSettings) -> model::Cluster {
    let service = model::ServiceRef {
        namespace: "apps".into(),
        name: name.into(),
        port: address.port(),
    };
    model::Cluster {
        name: model::cluster_name(&service, &settings),
        service,
        settings,
        endpoints: vec![model::Endpoint {
            address: address.ip().to_string(),
            port: address.port(),
            condition: model::EndpointCondition::READY,
            zone: None,
            leaving: false,
        }],
    }
}

fn forwarding(cluster: &str) -> model::Route {
    model::Route {
        name: "all".into(),
        path: model::PathMatch::Prefix("/".into()),
        headers: Vec::new(),
        method: None,
        query: Vec::new(),
        action: model::RouteAction::Forward(model::Forward {
            backends: vec![model::WeightedCluster {
                cluster: cluster.into(),
                weight: 1,
                request_headers: Default::default(),
            }],
            ..Default::default()
        }),
        request_headers: Default::default(),
        response_headers: Default::default(),
    }
}

fn vhost(name: &str, listener: &str, host: &str, cluster: &str) -> model::VirtualHost {
    model::VirtualHost {
        name: name.into(),
        listener: Some(listener.into()),
        hosts: vec![host.into()],
        tls: None,
        routes: vec![forwarding(cluster)],
        leaving: false,
        created: None,
    }
}

fn probe(id: &str, listener: &str, version: &str) -> model::VersionProbe {
    model::VersionProbe {
        id: id.into(),
        version: version.into(),
        listener: Some(listener.into()),
        ..Default::default()
    }
}

struct Ports {
    tls: u16,
    tls_probe: u16,
    tcp: u16,
    tcp_probe: u16,
}

fn listener(
    name: &str,
    port: u16,
    probe_port: u16,
    protocol: model::ListenerProtocol,
) -> model::GatewayListener {
    model::GatewayListener {
        name: name.into(),
        port,
        probe_port,
        tls: false,
        default_secret: None,
        client_validation: None,
        protocol,
    }
}

/// The shared listeners on free ports of [`IP`].
fn listener_settings() -> model::ListenerSettings {
    model::ListenerSettings {
        address: IP.into(),
        http_port: free_port(),
        https_port: free_port(),
        probe_port: free_port(),
        probe_token: TOKEN.into(),
        ..Default::default()
    }
}

/// The version a listener's probe port answers for `id`, if any.
async fn version_answered(probe_port: u16, id: &str) -> Option<String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .ok()?;
    let answer = client
        .get(format!("http://{IP}:{probe_port}/"))
        .header("host", model::version_probe_host(id, TOKEN))
        .send()
        .await
        .ok()?;
    (answer.status() == 200)
        .then(|| {
            answer
                .headers()
                .get("x-switchyard-version")?
                .to_str()
                .ok()
                .map(str::to_owned)
        })
        .flatten()
}

async fn wait_for_version(probe_port: u16, id: &str, version: &str) -> Duration {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        if version_answered(probe_port, id).await.as_deref() == Some(version) {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{id} never answered version {version} on port {probe_port}");
}

/// One plain HTTP GET over a new connection: the body.
async fn plain_get(address: SocketAddr) -> Result<String, String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| e.to_string())?;
    let answer = client
        .get(format!("http://{address}/"))
        .header("host", "db.example.com")
        .send()
        .await
        .map_err(|e| e.to_string())?;
    answer.text().await.map_err(|e| e.to_string())
}

#[tokio::test]
async fn tcp_and_tls_ports_forward_connections_and_prove_their_version_on_real_envoy() {
    let work = StandaloneDir::new();
    let backend_cert =
        switchyard::certgen::generate(&["abc.example.com".to_owned()], 1).expect("certgen");
    let gateway_cert =
        switchyard::certgen::generate(&["tls.example.com".to_owned()], 1).expect("certgen");
    let secure = Backend::start_tls(
        "secure",
        IP,
        (&backend_cert.server.cert_pem, &backend_cert.server.key_pem),
        None,
    )
    .await;
    let plain = Backend::start("plain", IP).await;
    let other = Backend::start("other", IP).await;
    let clusters = [cluster_of(&secure), cluster_of(&plain), cluster_of(&other)];
    let ports = Ports {
        tls: free_port(),
        tls_probe: free_port(),
        tcp: free_port(),
        tcp_probe: free_port(),
    };
    let mut terminate = vhost("apps/terminate", TLS, "tls.example.com", &clusters[1].name);
    terminate.tls = Some(model::VirtualHostTls {
        secret: "apps/gateway-cert".into(),
        redirect_http: false,
        listener_hostname: None,
    });
    let mut config = model::Config {
        listeners: listener_settings(),
        gateway_listeners: vec![
            listener(
                TLS,
                ports.tls,
                ports.tls_probe,
                model::ListenerProtocol::Tls,
            ),
            listener(
                TCP,
                ports.tcp,
                ports.tcp_probe,
                model::ListenerProtocol::Tcp,
            ),
        ],
        virtual_hosts: vec![
            vhost(
                "apps/passthrough",
                TLS,
                "abc.example.com",
                &clusters[0].name,
            ),
            terminate,
            vhost("apps/db", TCP, "*", &clusters[1].name),
        ],
        clusters: clusters.to_vec(),
        secrets: vec![model::TlsSecret {
            name: "apps/gateway-cert".into(),
            certificate_chain: gateway_cert.server.cert_pem.clone(),
            private_key: gateway_cert.server.key_pem.clone(),
        }],
        endpoint_probes: Vec::new(),
        version_probes: vec![
            probe("apps/passthrough", TLS, "p1"),
            probe("apps/terminate", TLS, "t1"),
            probe("apps/db", TCP, "d1"),
        ],
    };
    let translation = switchyard::translate::translate(&config);
    assert_eq!(translation.problems, [], "{:#?}", translation.problems);
    let server = InProcessServer::start(Ordering::MakeBeforeBreak).await;
    server.desired.publish(Arc::new(translation.snapshot));
    server.desired.open();
    let envoy = Envoy::start(&work.work, "envoy-stream", IP, server.port, Protocol::Delta);
    for (port, id, version) in [
        (ports.tls_probe, "apps/passthrough", "p1"),
        (ports.tls_probe, "apps/terminate", "t1"),
        (ports.tcp_probe, "apps/db", "d1"),
    ] {
        wait_for_version(port, id, version).await;
    }

    let tls_address: SocketAddr = format!("{IP}:{}", ports.tls).parse().expect("an address");
    // Passed through: the backend's own certificate, its answer.
    let (certificate, answer) = https_get(tls_address, "abc.example.com", "/")
        .await
        .expect("passed through");
    assert_eq!(certificate, pem_fingerprint(&backend_cert.server.cert_pem));
    assert_eq!(answer.body, "secure");
    // Decrypted by Envoy with the listener's certificate, then sent on as it is.
    let (certificate, answer) = https_get(tls_address, "tls.example.com", "/")
        .await
        .expect("terminated");
    assert_eq!(certificate, pem_fingerprint(&gateway_cert.server.cert_pem));
    assert_eq!(answer.body, "plain");
    // A name no route has: the connection is closed.
    let refused = https_get(tls_address, "nobody.example.com", "/").await;
    assert!(refused.is_err(), "{refused:?}");
    // TCP: every connection to the route's backend.
    let tcp_address: SocketAddr = format!("{IP}:{}", ports.tcp).parse().expect("an address");
    assert_eq!(plain_get(tcp_address).await.as_deref(), Ok("plain"));

    // A connection opened before the move.
    let mut kept = HttpConnection::connect(tcp_address)
        .await
        .expect("a connection");
    assert_eq!(
        kept.answer("db.example.com", "/").await,
        Ok((200, "plain".into()))
    );

    // The TCP route moves. Once the probe port answers the new version, every new
    // connection goes to the new backend: the answer and the forwarding are one resource.
    config.virtual_hosts[2].routes = vec![forwarding(&clusters[2].name)];
    config.version_probes[2].version = "d2".into();
    let translation = switchyard::translate::translate(&config);
    assert_eq!(translation.problems, []);
    server.desired.publish(Arc::new(translation.snapshot));
    let took = wait_for_version(ports.tcp_probe, "apps/db", "d2").await;
    for _ in 0..20 {
        assert_eq!(plain_get(tcp_address).await.as_deref(), Ok("other"));
    }
    // The connection opened before stays on its backend while its filter chain drains,
    // then Envoy closes it (these Envoys drain for 1 s; the chart's, envoy.drainSeconds).
    assert_eq!(
        kept.answer("db.example.com", "/").await,
        Ok((200, "plain".into()))
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = kept.answer("db.example.com", "/").await;
    assert!(after.is_err() || kept.is_closed(), "{after:?}");
    // The other chains were left as they were.
    assert_eq!(
        version_answered(ports.tls_probe, "apps/passthrough")
            .await
            .as_deref(),
        Some("p1")
    );
    println!("TCP move: version answered {took:?} after the change");

    // A share of backends the front-end could not use: Envoy takes the listener (the
    // version is answered), and that share of the connections is closed.
    let mut route = forwarding(&clusters[2].name);
    if let model::RouteAction::Forward(f) = &mut route.action {
        f.unavailable_weight = 1;
    }
    config.virtual_hosts[2].routes = vec![route];
    config.version_probes[2].version = "d3".into();
    let translation = switchyard::translate::translate(&config);
    assert_eq!(translation.problems, []);
    server.desired.publish(Arc::new(translation.snapshot));
    wait_for_version(ports.tcp_probe, "apps/db", "d3").await;
    let mut answered = 0;
    let mut closed = 0;
    for _ in 0..40 {
        match plain_get(tcp_address).await {
            Ok(body) => {
                assert_eq!(body, "other");
                answered += 1;
            }
            Err(_) => closed += 1,
        }
    }
    assert!(
        answered > 0 && closed > 0,
        "{answered} answered, {closed} closed"
    );
    drop(envoy);
}

/// A UDP backend answering every datagram with its name.
async fn udp_echo(name: &'static str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let socket = tokio::net::UdpSocket::bind(format!("{IP}:0"))
        .await
        .expect("a UDP socket");
    let address = socket.local_addr().expect("an address");
    let task = tokio::spawn(async move {
        let mut buffer = [0u8; 1500];
        while let Ok((_, from)) = socket.recv_from(&mut buffer).await {
            let _ = socket.send_to(name.as_bytes(), from).await;
        }
    });
    (address, task)
}

fn udp_cluster(name: &str, address: SocketAddr) -> model::Cluster {
    let udp = model::ClusterSettings {
        udp: true,
        ..Default::default()
    };
    cluster_at(name, address, udp)
}

/// A port no UDP socket of this address has.
fn free_udp_port() -> u16 {
    let socket = std::net::UdpSocket::bind(format!("{IP}:0")).expect("a UDP socket");
    socket.local_addr().expect("an address").port()
}

/// A new socket sending to the UDP listener on `port`: a session of its own at the Envoy.
async fn udp_session(port: u16) -> tokio::net::UdpSocket {
    let socket = tokio::net::UdpSocket::bind(format!("{IP}:0"))
        .await
        .expect("a UDP socket");
    socket
        .connect(format!("{IP}:{port}"))
        .await
        .expect("connected");
    socket
}

/// One datagram from a new socket (a session of its own): the answer, if one came.
async fn udp_ask(port: u16) -> Option<String> {
    let socket = tokio::net::UdpSocket::bind(format!("{IP}:0")).await.ok()?;
    socket.connect(format!("{IP}:{port}")).await.ok()?;
    socket.send(b"ping").await.ok()?;
    let mut buffer = [0u8; 1500];
    let n = tokio::time::timeout(Duration::from_millis(500), socket.recv(&mut buffer))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&buffer[..n]).into_owned())
}

#[tokio::test]
async fn a_udp_port_forwards_datagrams_and_proves_its_version_on_real_envoy() {
    let work = StandaloneDir::new();
    let (a, _a) = udp_echo("udp-a").await;
    let (b, _b) = udp_echo("udp-b").await;
    let clusters = [udp_cluster("udp-a", a), udp_cluster("udp-b", b)];
    let (port, probe_port) = (free_udp_port(), free_port());
    let mut dns = vhost("apps/dns", UDP, "*", &clusters[0].name);
    let mut config = model::Config {
        listeners: listener_settings(),
        gateway_listeners: vec![listener(
            UDP,
            port,
            probe_port,
            model::ListenerProtocol::Udp,
        )],
        virtual_hosts: vec![dns.clone()],
        clusters: clusters.to_vec(),
        secrets: Vec::new(),
        endpoint_probes: Vec::new(),
        version_probes: vec![probe("apps/dns", UDP, "u1")],
    };
    let translation = switchyard::translate::translate(&config);
    assert_eq!(translation.problems, [], "{:#?}", translation.problems);
    let server = InProcessServer::start(Ordering::MakeBeforeBreak).await;
    server.desired.publish(Arc::new(translation.snapshot));
    server.desired.open();
    let envoy = Envoy::start(&work.work, "envoy-udp", IP, server.port, Protocol::Delta);
    wait_for_version(probe_port, "apps/dns", "u1").await;
    assert_eq!(udp_ask(port).await.as_deref(), Some("udp-a"));

    // A session open across the move: one client socket asking every 5 ms.
    let session = udp_session(port).await;
    let asking = tokio::spawn(async move {
        let mut answers: Vec<Option<String>> = Vec::new();
        let mut buffer = [0u8; 1500];
        for _ in 0..300 {
            if session.send(b"ping").await.is_err() {
                answers.push(None);
                continue;
            }
            let answer =
                tokio::time::timeout(Duration::from_millis(200), session.recv(&mut buffer))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .map(|n| String::from_utf8_lossy(&buffer[..n]).into_owned());
            answers.push(answer);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        answers
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The route moves. Once the probe listener answers the new version, every new session
    // goes to the new backend.
    dns.routes = vec![forwarding(&clusters[1].name)];
    config.virtual_hosts = vec![dns.clone()];
    config.version_probes[0].version = "u2".into();
    let translation = switchyard::translate::translate(&config);
    assert_eq!(translation.problems, []);
    server.desired.publish(Arc::new(translation.snapshot));
    let took = wait_for_version(probe_port, "apps/dns", "u2").await;
    for _ in 0..20 {
        assert_eq!(udp_ask(port).await.as_deref(), Some("udp-b"));
    }
    let answers = asking.await.expect("the session's task");
    let unanswered = answers.iter().filter(|a| a.is_none()).count();
    let moved = answers.iter().position(|a| a.as_deref() == Some("udp-b"));
    println!(
        "UDP move: version answered {took:?} after the change; the open session: {} datagrams, {unanswered} unanswered, first on the new backend at {moved:?}",
        answers.len()
    );
    // Envoy replaced the listener: the open session went to the new backend with it, and
    // stayed there.
    let moved = moved.expect("the open session moved to the new backend");
    assert!(
        answers[moved..].iter().flatten().all(|a| a == "udp-b"),
        "{answers:?}"
    );

    // A session sending back to back, each datagram once the one before was answered (or
    // lost), across eight more moves: Envoy replaces the listener and the session with it
    // each time, and the datagram on its way at that instant can lose its answer. At most
    // that one per move.
    let session = udp_session(port).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let asking = tokio::spawn({
        let stop = stop.clone();
        async move {
            let (mut sent, mut lost) = (0usize, 0usize);
            let mut buffer = [0u8; 1500];
            let give_up = Instant::now() + Duration::from_secs(20);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < give_up {
                sent += 1;
                let _ = session.send(b"ping").await;
                let answered =
                    tokio::time::timeout(Duration::from_millis(100), session.recv(&mut buffer));
                if !matches!(answered.await, Ok(Ok(_))) {
                    lost += 1;
                }
            }
            (sent, lost)
        }
    });
    let moves = 8;
    for m in 0..moves {
        dns.routes = vec![forwarding(&clusters[m % 2].name)];
        config.virtual_hosts = vec![dns.clone()];
        config.version_probes[0].version = format!("b{m}");
        let translation = switchyard::translate::translate(&config);
        server.desired.publish(Arc::new(translation.snapshot));
        wait_for_version(probe_port, "apps/dns", &format!("b{m}")).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (sent, lost) = asking.await.expect("the session's task");
    println!("UDP session back to back across {moves} moves: {sent} datagrams, {lost} unanswered");
    assert!(
        sent > 1000 && lost <= moves,
        "{sent} sent, {lost} unanswered"
    );

    // More sessions open at once than Envoy's default cap of connections per cluster
    // (1024): each one opened after the one before was answered, and kept open.
    let mut sessions = Vec::new();
    let mut unanswered = 0;
    for _ in 0..1100 {
        let socket = udp_session(port).await;
        socket.send(b"ping").await.expect("sent");
        let mut buffer = [0u8; 1500];
        let answer = tokio::time::timeout(Duration::from_millis(500), socket.recv(&mut buffer));
        if !matches!(answer.await, Ok(Ok(_))) {
            unanswered += 1;
        }
        sessions.push(socket);
    }
    assert_eq!(unanswered, 0, "of {} sessions open at once", sessions.len());
    drop(sessions);

    // Several backends by weight: a blend of their endpoints; a share of backends the
    // front-end could not use is dropped.
    let mut route = forwarding(&clusters[0].name);
    if let model::RouteAction::Forward(f) = &mut route.action {
        f.backends[0].weight = 3;
        f.backends.push(model::WeightedCluster {
            cluster: clusters[1].name.clone(),
            weight: 1,
            request_headers: Default::default(),
        });
        f.unavailable_weight = 1;
    }
    dns.routes = vec![route];
    config.virtual_hosts = vec![dns];
    config.version_probes[0].version = "u3".into();
    let translation = switchyard::translate::translate(&config);
    assert_eq!(translation.problems, []);
    server.desired.publish(Arc::new(translation.snapshot));
    wait_for_version(probe_port, "apps/dns", "u3").await;
    let (mut to_a, mut to_b, mut dropped) = (0, 0, 0);
    for _ in 0..100 {
        match udp_ask(port).await.as_deref() {
            Some("udp-a") => to_a += 1,
            Some("udp-b") => to_b += 1,
            Some(other) => panic!("answered by {other}"),
            None => dropped += 1,
        }
    }
    println!("UDP blend 3:1:1 → {to_a} to a, {to_b} to b, {dropped} dropped");
    assert!(
        to_a > to_b && to_b > 0 && dropped > 0,
        "{to_a} to a, {to_b} to b, {dropped} dropped"
    );
    drop(envoy);
}
