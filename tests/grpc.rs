//! gRPC through real Envoy to real gRPC servers (tonic's health service over h2c): unary
//! calls and server streams pass, a client's deadline (`grpc-timeout`) shortens the rule's
//! timeout but never lengthens it, Envoy's own answers carry a gRPC status, and moving a
//! gRPC route to another server under load fails no call.

use std::time::{Duration, Instant};

use switchyard::xds::Protocol;
use switchyard_e2e::{Backend, Envoy, StandaloneDir, Switchyard};
use tokio::time::timeout;
use tonic::transport::{Channel, Endpoint};
use tonic_health::ServingStatus;
use tonic_health::pb::health_check_response::ServingStatus as WireStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::HealthReporter;

const IP: &str = "127.0.0.41";
/// Every call of the test that should answer at once is bounded by this.
const STEP: Duration = Duration::from_secs(5);

/// A gRPC server (the standard health service) on `IP`, with `service` registered as
/// serving; its port and its reporter, to change what it reports.
async fn grpc_server(service: &str) -> (u16, HealthReporter) {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(service, ServingStatus::Serving)
        .await;
    let incoming = tonic::transport::server::TcpIncoming::bind(format!("{IP}:0").parse().unwrap())
        .expect("bind gRPC server");
    let port = incoming.local_addr().expect("gRPC server address").port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(incoming),
    );
    (port, reporter)
}

/// The standalone configuration: `grpc.test` (no timeout) and `short.grpc.test` (a 1 s
/// timeout) to the server at `port`, `down.grpc.test` to a service without endpoints, and
/// `slow.grpc.test` (a 2 s timeout) to an HTTP backend at `slow` that takes 3 s.
fn config(dir: &StandaloneDir, port: u16, slow: u16) -> String {
    format!(
        "listeners: {{ address: {IP}, httpPort: {http}, httpsPort: {https}, probePort: {probe} }}
routes:
  - name: grpc
    spec:
      hosts: [grpc.test]
      rules:
        - backends: [ {{ service: health, port: {port} }} ]
  - name: short
    spec:
      hosts: [short.grpc.test]
      rules:
        - timeout: 1s
          backends: [ {{ service: health, port: {port} }} ]
  - name: down
    spec:
      hosts: [down.grpc.test]
      rules:
        - backends: [ {{ service: nowhere, port: {port} }} ]
  - name: slow
    spec:
      hosts: [slow.grpc.test]
      rules:
        - timeout: 2s
          backends: [ {{ service: slow, port: {slow} }} ]
services:
  - name: health
    http2: true
    endpoints: [ {{ address: {IP}, port: {port} }} ]
  - name: nowhere
    http2: true
    endpoints: []
  - name: slow
    endpoints: [ {{ address: {IP}, port: {slow} }} ]
",
        http = dir.http_port,
        https = dir.http_port + 1,
        probe = dir.probe_port,
    )
}

struct GrpcRig {
    dir: StandaloneDir,
    switchyard: Switchyard,
    _envoy: Envoy,
    slow: Backend,
}

impl GrpcRig {
    async fn start(port: u16) -> GrpcRig {
        let dir = StandaloneDir::new();
        let slow = Backend::start("slow", IP).await;
        slow.slow_down(Duration::from_secs(3));
        dir.write("routes.yaml", &config(&dir, port, slow.address.port()));
        let switchyard = Switchyard::start_standalone(&dir.work, &dir.config, &[]);
        let envoy = Envoy::start(
            &dir.work,
            "envoy-grpc",
            IP,
            switchyard.xds_port,
            Protocol::Delta,
        );
        switchyard.wait_synced(1, Duration::from_secs(20)).await;
        let rig = GrpcRig {
            dir,
            switchyard,
            _envoy: envoy,
            slow,
        };
        rig.wait_serving().await;
        rig
    }

    /// A gRPC client through Envoy for `host` (the authority Envoy routes on).
    fn client(&self, host: &str) -> HealthClient<Channel> {
        let channel = Endpoint::from_shared(format!("http://{IP}:{}", self.dir.http_port))
            .expect("Envoy's address")
            .origin(format!("http://{host}").parse().expect("an authority"))
            .connect_timeout(STEP)
            .connect_lazy();
        HealthClient::new(channel)
    }

    /// Envoy binds its listener shortly after it takes the snapshot.
    async fn wait_serving(&self) {
        for _ in 0..100 {
            if check(&mut self.client("grpc.test"), "").await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no gRPC call went through Envoy in 10 s");
    }
}

async fn check(client: &mut HealthClient<Channel>, service: &str) -> Result<i32, tonic::Status> {
    let request = HealthCheckRequest {
        service: service.to_owned(),
    };
    match timeout(STEP, client.check(request)).await {
        Ok(answer) => Ok(answer?.into_inner().status),
        Err(_) => Err(tonic::Status::deadline_exceeded(
            "no answer within the test's step",
        )),
    }
}

/// Opens a Watch of `service` with `deadline` as the call's `grpc-timeout`, reads its
/// first message, then waits up to `bound` for the stream to end: the status it ended
/// with and when, counted from the call, or None if it outlived `bound`.
async fn watch_until_end(
    client: &mut HealthClient<Channel>,
    service: &str,
    deadline: Duration,
    bound: Duration,
) -> Option<(tonic::Status, Duration)> {
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: service.to_owned(),
    });
    request.set_timeout(deadline);
    let started = Instant::now();
    let mut stream = timeout(STEP, client.watch(request))
        .await
        .expect("the watch answers in time")
        .expect("the watch opens")
        .into_inner();
    let first = timeout(STEP, stream.message())
        .await
        .expect("a first message in time")
        .expect("a first message");
    assert_eq!(first.map(|m| m.status), Some(WireStatus::Serving as i32));
    loop {
        match timeout(bound.saturating_sub(started.elapsed()), stream.message()).await {
            Err(_) => return None,
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) => return Some((tonic::Status::ok(""), started.elapsed())),
            Ok(Err(status)) => return Some((status, started.elapsed())),
        }
    }
}

#[tokio::test]
async fn unary_calls_and_server_streams_pass_through_envoy() {
    let (port, reporter) = grpc_server("blue").await;
    let rig = GrpcRig::start(port).await;
    let mut client = rig.client("grpc.test");

    assert_eq!(
        check(&mut client, "blue").await.expect("a unary call"),
        WireStatus::Serving as i32
    );
    let unknown = check(&mut client, "red")
        .await
        .expect_err("an unknown service");
    assert_eq!(
        unknown.code(),
        tonic::Code::NotFound,
        "the server's own status passes through: {unknown:?}"
    );

    // A server stream: the first status at once, the next when it changes.
    let mut stream = timeout(
        STEP,
        client.watch(HealthCheckRequest {
            service: "blue".into(),
        }),
    )
    .await
    .expect("the watch answers in time")
    .expect("the watch opens")
    .into_inner();
    let status = |m: Option<HealthCheckResponse>| m.map(|m| m.status);
    let first = timeout(STEP, stream.message()).await.expect("in time");
    assert_eq!(
        status(first.expect("a message")),
        Some(WireStatus::Serving as i32)
    );
    reporter
        .set_service_status("blue", ServingStatus::NotServing)
        .await;
    let next = timeout(STEP, stream.message()).await.expect("in time");
    assert_eq!(
        status(next.expect("a message")),
        Some(WireStatus::NotServing as i32),
        "a change reaches the open stream through Envoy"
    );
}

#[tokio::test]
async fn a_grpc_deadline_shortens_the_rule_timeout_and_never_lengthens_it() {
    let (port, _reporter) = grpc_server("blue").await;
    let rig = GrpcRig::start(port).await;

    // No rule timeout (Envoy's 15 s): the client's 500 ms deadline ends the stream.
    let ended = watch_until_end(
        &mut rig.client("grpc.test"),
        "blue",
        Duration::from_millis(500),
        Duration::from_secs(8),
    )
    .await;
    let (status, after) = ended.expect("a stream with a 500 ms deadline ends within 8 s");
    eprintln!("500 ms deadline: ended after {after:?} with {status:?}");
    assert!(after >= Duration::from_millis(450), "ended after {after:?}");
    assert_ne!(status.code(), tonic::Code::Ok, "ended by the deadline");

    // A 1 s rule timeout: a client asking for 30 s still gets 1 s.
    let ended = watch_until_end(
        &mut rig.client("short.grpc.test"),
        "blue",
        Duration::from_secs(30),
        Duration::from_secs(8),
    )
    .await;
    let (status, after) = ended.expect("a 30 s deadline does not outlast a 1 s rule timeout");
    eprintln!("30 s deadline, 1 s timeout: ended after {after:?} with {status:?}");
    assert!(after >= Duration::from_millis(950), "ended after {after:?}");
    assert_ne!(status.code(), tonic::Code::Ok, "ended by the timeout");

    // Without a deadline, a stream is held to the rule timeout alone.
    let ended = watch_until_end(
        &mut rig.client("grpc.test"),
        "blue",
        Duration::from_secs(60),
        Duration::from_secs(3),
    )
    .await;
    assert!(
        ended.is_none(),
        "a stream with a 60 s deadline and no rule timeout is open after 3 s: {ended:?}"
    );
}

#[tokio::test]
async fn envoy_answers_grpc_requests_with_a_grpc_status() {
    let (port, _reporter) = grpc_server("blue").await;
    let rig = GrpcRig::start(port).await;

    // No endpoint: Envoy's 503 "no healthy upstream" as gRPC UNAVAILABLE (14).
    let down = check(&mut rig.client("down.grpc.test"), "")
        .await
        .expect_err("a route without endpoints");
    assert_eq!(down.code(), tonic::Code::Unavailable, "{down:?}");
    assert_eq!(down.message(), "no healthy upstream");

    // No route for the host: Envoy's 404 as gRPC UNIMPLEMENTED (12).
    let unrouted = check(&mut rig.client("unknown.test"), "")
        .await
        .expect_err("a host no route serves");
    assert_eq!(unrouted.code(), tonic::Code::Unimplemented, "{unrouted:?}");

    // A unary call past its deadline: Envoy answers it, before the backend does, with a
    // gRPC status. (A raw HTTP/2 request: tonic's client would time out on its own.)
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .resolve(
            "slow.grpc.test",
            format!("{IP}:0").parse().expect("an address"),
        )
        .build()
        .expect("an HTTP/2 client");
    let started = Instant::now();
    let answer = client
        .post(format!(
            "http://slow.grpc.test:{}/grpc.health.v1.Health/Check",
            rig.dir.http_port
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "300m")
        .body(vec![0u8; 5])
        .timeout(STEP)
        .send()
        .await
        .expect("an answer from Envoy");
    let took = started.elapsed();
    let header = |name: &str| {
        answer
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    eprintln!(
        "unary call past a 300 ms deadline: {} after {took:?}, grpc-status {}, grpc-message {:?}",
        answer.status(),
        header("grpc-status"),
        header("grpc-message")
    );
    // At the deadline (Envoy's timer may fire a millisecond or two before ours), not at
    // the rule's 2 s timeout.
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(1500),
        "answered after {took:?}"
    );
    assert_eq!(
        answer.status(),
        200,
        "gRPC carries its status in grpc-status"
    );
    assert_eq!(header("grpc-status"), "14", "UNAVAILABLE");
    assert_eq!(header("grpc-message"), "upstream request timeout");

    // The rule's timeout still holds for a request that is not gRPC.
    let started = Instant::now();
    let plain = reqwest::Client::new()
        .get(format!("http://{IP}:{}/", rig.dir.http_port))
        .header("host", "slow.grpc.test")
        .timeout(STEP)
        .send()
        .await
        .expect("an answer from Envoy");
    let took = started.elapsed();
    eprintln!(
        "plain request, 2 s rule timeout: {} after {took:?}",
        plain.status()
    );
    assert_eq!(plain.status(), 504);
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_millis(2900),
        "answered after {took:?}"
    );
}

#[tokio::test]
async fn moving_a_grpc_route_to_another_server_fails_no_call() {
    let (blue, _blue) = grpc_server("blue").await;
    let (green, _green) = grpc_server("green").await;
    let rig = GrpcRig::start(blue).await;
    let mut client = rig.client("grpc.test");
    assert!(check(&mut client, "blue").await.is_ok());

    // Unary calls, one every 10 ms on one HTTP/2 connection, at most 1500 of them.
    let load = {
        let mut client = client.clone();
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0usize, Vec::new());
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            for _ in 0..1500 {
                tick.tick().await;
                match check(&mut client, "").await {
                    Ok(_) => ok += 1,
                    Err(status) => failed.push(status),
                }
            }
            (ok, failed)
        })
    };
    for to in [green, blue, green] {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let before = rig.switchyard.desired_version().await;
        let config = config(&rig.dir, to, rig.slow.address.port());
        rig.dir.write("routes.yaml", &config);
        rig.switchyard
            .wait_for_new_version(before.as_deref(), Duration::from_secs(10))
            .await;
        rig.switchyard.wait_synced(1, Duration::from_secs(10)).await;
    }
    let (ok, failed) = load.await.expect("the load task");
    eprintln!(
        "gRPC calls across 3 moves: {ok} OK, {} failed",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "calls failed: {:?}",
        &failed[..failed.len().min(5)]
    );
    let last = check(&mut client, "green").await;
    assert_eq!(
        last.expect("the route ends on the green server"),
        WireStatus::Serving as i32
    );
}
