//! WebSocket upgrades on real Envoy: a rule with `websocket: true` lets the upgrade
//! through, and the connection then carries bytes both ways; a rule without it refuses the
//! upgrade (Envoy answers 403 itself, the backend never sees it). A rollout that moves the
//! route sends new WebSockets to the new backend and leaves open ones on the old: through
//! the drain period, and after the old cluster is collected, until the old backend goes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use switchyard::xds::Protocol;
use switchyard_e2e::rig::{HOST, Rig};
use switchyard_e2e::{Envoy, Switchyard, WebSocket, free_port};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

const IP: &str = "127.0.0.31";
/// Every read and write of the test is bounded by this.
const STEP: Duration = Duration::from_secs(5);

/// A backend that answers an upgrade request with 101 and then echoes what it gets, and
/// any other request with 200 "plain"; it counts the upgrade requests it sees.
async fn upgrade_backend(upgrades_seen: Arc<AtomicUsize>) -> u16 {
    let listener = TcpListener::bind((IP, 0)).await.expect("bind backend");
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(serve(socket, upgrades_seen.clone()));
        }
    });
    port
}

async fn serve(mut socket: TcpStream, upgrades_seen: Arc<AtomicUsize>) {
    loop {
        let Some(head) = read_head(&mut socket).await else {
            return;
        };
        if head.to_ascii_lowercase().contains("upgrade: websocket") {
            upgrades_seen.fetch_add(1, Ordering::SeqCst);
            let answer = "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\r\n";
            if socket.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
            let mut buf = [0u8; 1024];
            while let Ok(Ok(n @ 1..)) = timeout(STEP, socket.read(&mut buf)).await {
                if socket.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            return;
        }
        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nplain";
        if socket.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Reads up to the end of an HTTP head; None on close, error or timeout.
async fn read_head(socket: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match timeout(STEP, socket.read(&mut byte)).await {
            Ok(Ok(1)) => head.push(byte[0]),
            _ => return None,
        }
        if head.len() > 16 * 1024 {
            return None;
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// Sends an upgrade request for `path` through Envoy; the status line's code, and the
/// open connection.
async fn upgrade(http_port: u16, path: &str) -> (String, TcpStream) {
    let mut socket = timeout(STEP, TcpStream::connect((IP, http_port)))
        .await
        .expect("connect in time")
        .expect("connect to Envoy");
    let request = format!(
        "GET {path} HTTP/1.1\r\nhost: ws.test\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\
         sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    timeout(STEP, socket.write_all(request.as_bytes()))
        .await
        .expect("write in time")
        .expect("write");
    let head = read_head(&mut socket).await.expect("a response head");
    let code = head.split(' ').nth(1).unwrap_or_default().to_owned();
    (code, socket)
}

/// Envoy binds its listener shortly after it takes the snapshot.
async fn wait_listening(http_port: u16) {
    for _ in 0..200 {
        if TcpStream::connect((IP, http_port)).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("Envoy never listened on {IP}:{http_port}");
}

#[tokio::test]
async fn websocket_rules_let_upgrades_through_and_others_do_not() {
    let dir = tempfile::tempdir().expect("temp dir");
    let work = dir.path().to_path_buf();
    let config = work.join("config");
    std::fs::create_dir(&config).expect("config dir");
    let (http_port, probe_port) = (free_port(), free_port());
    let upgrades_seen = Arc::new(AtomicUsize::new(0));
    let backend = upgrade_backend(upgrades_seen.clone()).await;
    std::fs::write(
        config.join("routes.yaml"),
        format!(
            "listeners: {{ address: {IP}, httpPort: {http_port}, httpsPort: {https}, probePort: {probe_port} }}
routes:
  - name: ws
    spec:
      hosts: [ws.test]
      rules:
        - match: {{ pathPrefix: /ws }}
          websocket: true
          backends: [ {{ service: echo, port: {backend} }} ]
        - backends: [ {{ service: echo, port: {backend} }} ]
services:
  - name: echo
    endpoints: [ {{ address: {IP}, port: {backend} }} ]
",
            https = free_port(),
        ),
    )
    .expect("write config");
    let switchyard = Switchyard::start_standalone(&work, &config, &[]);
    let _envoy = Envoy::start(&work, "envoy-ws", IP, switchyard.xds_port, Protocol::Delta);
    switchyard.wait_synced(1, Duration::from_secs(20)).await;
    wait_listening(http_port).await;

    let (code, mut socket) = upgrade(http_port, "/ws/chat").await;
    assert_eq!(code, "101", "the websocket rule upgrades");
    for message in ["ping", "second message"] {
        timeout(STEP, socket.write_all(message.as_bytes()))
            .await
            .expect("write in time")
            .expect("write through the tunnel");
        let mut echoed = vec![0u8; message.len()];
        timeout(STEP, socket.read_exact(&mut echoed))
            .await
            .expect("echo in time")
            .expect("read through the tunnel");
        assert_eq!(echoed, message.as_bytes());
    }

    let (code, _) = upgrade(http_port, "/other").await;
    assert_eq!(code, "403", "a rule without websocket refuses the upgrade");
    assert_eq!(
        upgrades_seen.load(Ordering::SeqCst),
        1,
        "only the websocket rule's upgrade reached the backend"
    );
}

/// A TrafficRoute spec: `HOST` to `service`, WebSockets on, with a 4 s drain period.
fn websocket_route(service: &str) -> String {
    format!(
        "hosts: [\"{HOST}\"]\nrollout: {{ drainPeriod: 4s }}\nrules:\n- websocket: true\n  backends:\n  - {{ service: {service}, port: 80 }}\n"
    )
}

/// The clusters of Service `ws-0` the (only) Envoy of the rig still has.
async fn old_clusters(rig: &Rig) -> Vec<String> {
    let clusters = rig.envoys[0].admin("/clusters").await;
    let mut names: Vec<String> = clusters
        .lines()
        .filter_map(|l| l.split("::").next())
        .filter(|name| name.contains("/ws-0/"))
        .map(str::to_owned)
        .collect();
    names.dedup();
    names
}

async fn phase(rig: &Rig) -> String {
    let route = rig.route("web").await;
    route.status.and_then(|s| s.phase).unwrap_or_default()
}

#[tokio::test]
async fn a_rollout_leaves_open_websockets_on_the_old_backend_until_it_goes() {
    let mut rig = Rig::start(1).await;
    rig.add_backend("ws-0").await;
    rig.start_operator("switchyard-1", &[]);
    rig.apply_route("web", &websocket_route("ws-0")).await;
    rig.wait_ready("web", Duration::from_secs(60)).await;
    let target = rig.targets()[0].clone();
    let mut old = WebSocket::connect(&target, HOST)
        .await
        .expect("a WebSocket");
    assert_eq!(old.echo("before").await.as_deref(), Ok("ws-0: before"));

    rig.add_backend("ws-1").await;
    rig.apply_route("web", &websocket_route("ws-1")).await;
    rig.wait_ready("web", Duration::from_secs(30)).await;
    let switched = Instant::now();
    let mut new = WebSocket::connect(&target, HOST)
        .await
        .expect("a WebSocket");
    assert_eq!(
        new.echo("after").await.as_deref(),
        Ok("ws-1: after"),
        "a WebSocket opened after the switch goes to the new backend"
    );

    // Through the drain period the open WebSocket keeps its backend, and Envoy its cluster.
    assert!(
        !old_clusters(&rig).await.is_empty(),
        "the old cluster drains"
    );
    let mut exchanged = 0;
    while phase(&rig).await == "Draining" {
        assert!(
            switched.elapsed() < Duration::from_secs(30),
            "still draining after 30 s"
        );
        let message = format!("draining {exchanged}");
        assert_eq!(
            old.echo(&message).await,
            Ok(format!("ws-0: {message}")),
            "the open WebSocket, {:?} after the switch",
            switched.elapsed()
        );
        exchanged += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let collected = switched.elapsed();
    eprintln!(
        "{exchanged} messages on the old WebSocket during the drain; collected {collected:?} after the switch"
    );
    assert!(
        exchanged >= 10,
        "the drain period of 4 s held only {exchanged} messages"
    );

    // The old cluster is collected: Envoy no longer has it, but does not cut the
    // WebSocket it carries; that stays with the old backend.
    let mut clusters = old_clusters(&rig).await;
    for _ in 0..50 {
        if clusters.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        clusters = old_clusters(&rig).await;
    }
    assert!(
        clusters.is_empty(),
        "Envoy still has {clusters:?} 5 s after the collection"
    );
    for i in 0..10 {
        let message = format!("collected {i}");
        assert_eq!(
            old.echo(&message).await,
            Ok(format!("ws-0: {message}")),
            "the open WebSocket, after its cluster went"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The old Pods go: their WebSockets end, the client reconnects to the new backend.
    rig.stop_backend("ws-0");
    let ended = old.echo("gone").await;
    eprintln!("the old WebSocket once its backend stopped: {ended:?}");
    assert!(ended.is_err(), "answered by a stopped backend: {ended:?}");
    assert_eq!(
        new.echo("still").await.as_deref(),
        Ok("ws-1: still"),
        "the WebSocket on the new backend stays open"
    );
    let mut again = WebSocket::connect(&target, HOST)
        .await
        .expect("a WebSocket");
    assert_eq!(
        again.echo("reconnected").await.as_deref(),
        Ok("ws-1: reconnected")
    );
}
