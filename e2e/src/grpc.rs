//! gRPC for the tests, with tonic and no generated code: a backend serving
//! `switchyard.test.Echo` (a unary call answering with the backend's name, a server stream
//! of such answers), a client, and a bounded load of unary calls and long-lived streams.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::{NamedService, ServerStreamingService, UnaryService};

use crate::load::{Turns, WORKERS};
use crate::traffic_runtime;

/// The service's name, and its methods' paths.
pub const SERVICE: &str = "switchyard.test.Echo";
pub const UNARY: &str = "/switchyard.test.Echo/Unary";
pub const STREAM: &str = "/switchyard.test.Echo/Stream";

#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoRequest {
    /// Stream: how many answers, and how far apart.
    #[prost(uint32, tag = "1")]
    pub count: u32,
    #[prost(uint32, tag = "2")]
    pub interval_ms: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoReply {
    /// The backend that answered.
    #[prost(string, tag = "1")]
    pub backend: String,
}

/// A gRPC server on `address` answering with its name, until dropped.
pub struct GrpcBackend {
    pub name: String,
    pub address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl GrpcBackend {
    pub async fn start(name: &str, ip: &str) -> GrpcBackend {
        let ip: std::net::IpAddr = ip.parse().expect("a backend IP");
        let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0))
            .await
            .expect("bind a gRPC backend");
        let address = listener.local_addr().expect("its address");
        let service = Echo {
            name: Arc::from(name),
        };
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let task = traffic_runtime().spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await;
        });
        GrpcBackend {
            name: name.to_owned(),
            address,
            task,
        }
    }
}

impl Drop for GrpcBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `switchyard.test.Echo`, routed by path as generated code would.
#[derive(Clone)]
struct Echo {
    name: Arc<str>,
}

impl NamedService for Echo {
    const NAME: &'static str = SERVICE;
}

type Body = tonic::body::Body;

impl Service<http::Request<Body>> for Echo {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let name = self.name.clone();
        let codec = tonic_prost::ProstCodec::<EchoReply, EchoRequest>::default;
        match request.uri().path() {
            UNARY => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(codec());
                Ok(grpc.unary(Unary(name), request).await)
            }),
            STREAM => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(codec());
                Ok(grpc.server_streaming(Stream(name), request).await)
            }),
            _ => Box::pin(
                async move { Ok(tonic::Status::unimplemented("no such method").into_http()) },
            ),
        }
    }
}

struct Unary(Arc<str>);

impl UnaryService<EchoRequest> for Unary {
    type Response = EchoReply;
    type Future = BoxFuture<tonic::Response<EchoReply>, tonic::Status>;

    fn call(&mut self, _: tonic::Request<EchoRequest>) -> Self::Future {
        let backend = self.0.to_string();
        Box::pin(async move { Ok(tonic::Response::new(EchoReply { backend })) })
    }
}

struct Stream(Arc<str>);

type Replies = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<EchoReply, tonic::Status>> + Send + 'static>,
>;

impl ServerStreamingService<EchoRequest> for Stream {
    type Response = EchoReply;
    type ResponseStream = Replies;
    type Future = BoxFuture<tonic::Response<Replies>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<EchoRequest>) -> Self::Future {
        let backend = self.0.to_string();
        let EchoRequest { count, interval_ms } = request.into_inner();
        let interval = Duration::from_millis(u64::from(interval_ms));
        let replies = futures::stream::unfold(0, move |sent| {
            let backend = backend.clone();
            async move {
                if sent >= count {
                    return None;
                }
                if sent > 0 {
                    tokio::time::sleep(interval).await;
                }
                Some((Ok(EchoReply { backend }), sent + 1))
            }
        });
        Box::pin(async move { Ok(tonic::Response::new(Box::pin(replies) as Replies)) })
    }
}

/// A client of `switchyard.test.Echo` through `target` (a base URL, http://ip:port),
/// with `authority` as the calls' :authority; calls time out after 2 s.
pub fn client(target: &str, authority: &str) -> tonic::client::Grpc<tonic::transport::Channel> {
    let origin: http::Uri = format!("http://{authority}").parse().expect("an authority");
    let channel = tonic::transport::Endpoint::from_shared(target.to_owned())
        .expect("a target URL")
        .origin(origin)
        .timeout(Duration::from_secs(2))
        .connect_lazy();
    tonic::client::Grpc::new(channel)
}

/// One unary call: the backend that answered, or the status it failed with.
pub async fn unary(
    client: &mut tonic::client::Grpc<tonic::transport::Channel>,
) -> Result<String, tonic::Status> {
    client
        .ready()
        .await
        .map_err(|e| tonic::Status::unavailable(crate::load::error_chain(&e)))?;
    let codec = tonic_prost::ProstCodec::<EchoRequest, EchoReply>::default();
    let path = http::uri::PathAndQuery::from_static(UNARY);
    let request = tonic::Request::new(EchoRequest::default());
    let reply = client.unary(request, path, codec).await?;
    Ok(reply.into_inner().backend)
}

/// One server stream of `count` answers `interval` apart: the backend that sent them all,
/// or why it failed (a status, too few answers, answers from two backends).
pub async fn stream(
    client: &mut tonic::client::Grpc<tonic::transport::Channel>,
    count: u32,
    interval: Duration,
) -> Result<String, String> {
    client
        .ready()
        .await
        .map_err(|e| crate::load::error_chain(&e))?;
    let codec = tonic_prost::ProstCodec::<EchoRequest, EchoReply>::default();
    let path = http::uri::PathAndQuery::from_static(STREAM);
    let request = tonic::Request::new(EchoRequest {
        count,
        interval_ms: u32::try_from(interval.as_millis()).unwrap_or(u32::MAX),
    });
    let mut replies = (client.server_streaming(request, path, codec).await)
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    let mut backends = Vec::new();
    loop {
        match replies.message().await {
            Ok(Some(reply)) => backends.push(reply.backend),
            Ok(None) => break,
            Err(s) => {
                return Err(format!(
                    "{:?} after {} answers: {}",
                    s.code(),
                    backends.len(),
                    s.message()
                ));
            }
        }
    }
    let received = backends.len();
    backends.dedup();
    match backends.as_slice() {
        [one] if received == count as usize => Ok(one.clone()),
        [_] | [] => Err(format!("{received} answers of {count}")),
        several => Err(format!("answers from {several:?}")),
    }
}

/// What a gRPC load saw: calls and streams, each answered by a backend or failed.
#[derive(Clone, Debug, Default)]
pub struct GrpcReport {
    pub calls: usize,
    pub streams: usize,
    pub by_backend: BTreeMap<String, usize>,
    /// When (since the load started), through which target, and why.
    pub failures: Vec<(Duration, String, String)>,
}

/// A bounded gRPC load through `targets`: `rate` unary calls a second, and `streams`
/// server streams open at all times (each of `count` answers `interval` apart, then
/// opened again), for at most `duration`.
pub struct GrpcLoad {
    stop: Arc<std::sync::atomic::AtomicBool>,
    report: Arc<Mutex<GrpcReport>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The shape of a load's streams: how many are open at once, and each one's answers.
#[derive(Clone, Copy)]
pub struct Streams {
    pub open: usize,
    pub count: u32,
    pub interval: Duration,
}

impl GrpcLoad {
    pub fn start(
        targets: Vec<String>,
        authority: &str,
        rate: u32,
        streams: Streams,
        duration: Duration,
    ) -> GrpcLoad {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let report = Arc::new(Mutex::new(GrpcReport::default()));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..WORKERS {
            let mut turns = Turns::new(w, rate, started, duration, stop.clone());
            let report = report.clone();
            let mut clients: Vec<_> = (targets.iter())
                .map(|t| (t.clone(), client(t, authority)))
                .collect();
            tasks.push(traffic_runtime().spawn(async move {
                while let Some(i) = turns.next().await {
                    let n = clients.len();
                    let (target, client) = &mut clients[i % n];
                    let result = unary(client)
                        .await
                        .map_err(|s| format!("unary {:?}: {}", s.code(), s.message()));
                    record(&report, started, target, result, false);
                }
            }));
        }
        for s in 0..streams.open {
            let report = report.clone();
            let stop = stop.clone();
            let target = targets[s % targets.len()].clone();
            let mut client = client(&target, authority);
            tasks.push(traffic_runtime().spawn(async move {
                let each = streams.interval * streams.count;
                while !stop.load(std::sync::atomic::Ordering::Relaxed)
                    && started.elapsed() + each < duration
                {
                    let result = stream(&mut client, streams.count, streams.interval).await;
                    record(&report, started, &target, result, true);
                }
            }));
        }
        GrpcLoad {
            stop,
            report,
            tasks,
        }
    }

    /// Stops the load (streams open end first) and gives what it saw.
    pub async fn finish(self) -> GrpcReport {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for task in self.tasks {
            let _ = task.await;
        }
        let report = self.report.lock().unwrap_or_else(|p| p.into_inner());
        report.clone()
    }
}

fn record(
    report: &Mutex<GrpcReport>,
    started: Instant,
    target: &str,
    result: Result<String, String>,
    stream: bool,
) {
    let mut report = report.lock().unwrap_or_else(|p| p.into_inner());
    if stream {
        report.streams += 1;
    } else {
        report.calls += 1;
    }
    match result {
        Ok(backend) => *report.by_backend.entry(backend).or_default() += 1,
        Err(why) => (report.failures).push((started.elapsed(), target.to_owned(), why)),
    }
}
