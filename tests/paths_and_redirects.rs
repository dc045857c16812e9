//! Path segment prefixes, method and query parameter matches, and redirects on real
//! Envoy, through standalone files: `pathSegmentPrefix: /docs` takes `/docs` and
//! `/docs/...` but not `/docsx`; a rule asking for POST and query parameters takes only
//! requests with all of them; a redirect replaces what it names (scheme, host, port, the
//! whole path or the matched prefix) with the status it gives (302 unless told); a rule
//! that rewrites the whole path or the Host forwards what it says, query kept.

use std::time::Duration;

use switchyard::xds::Protocol;
use switchyard_e2e::{Backend, Envoy, Switchyard, free_port};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const IP: &str = "127.0.0.32";
const HOST: &str = "www.paths.test";

/// A backend that answers every request with the path and Host it received:
/// `<path> <host>`.
async fn echo_backend() -> u16 {
    let listener = TcpListener::bind((IP, 0)).await.expect("bind echo backend");
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match tokio::time::timeout(Duration::from_secs(5), socket.read(&mut byte)).await
                    {
                        Ok(Ok(1)) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
                let host = head
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("host: ")
                            .or_else(|| l.strip_prefix("Host: "))
                    })
                    .unwrap_or_default()
                    .to_owned();
                let body = format!("{path} {host}");
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    port
}

/// A client that shows redirects instead of following them.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(5))
        .build()
        .expect("an HTTP client")
}

/// Status, Location header and body of GET `path` through Envoy.
async fn get(port: u16, path: &str) -> (u16, String, String) {
    request(reqwest::Method::GET, port, path).await
}

async fn request(method: reqwest::Method, port: u16, path: &str) -> (u16, String, String) {
    let response = client()
        .request(method, format!("http://{IP}:{port}{path}"))
        .header("host", HOST)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = response.status().as_u16();
    let location = response
        .headers()
        .get("location")
        .and_then(|l| l.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.text().await.unwrap_or_default();
    (status, location, body)
}

#[tokio::test]
async fn segment_prefixes_match_whole_segments_and_redirects_replace_what_they_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let work = dir.path().to_path_buf();
    let config = work.join("config");
    std::fs::create_dir(&config).expect("config dir");
    let docs = Backend::start("docs", IP).await;
    let other = Backend::start("other", IP).await;
    let echo = echo_backend().await;
    let (http_port, probe_port) = (free_port(), free_port());
    std::fs::write(
        config.join("routes.yaml"),
        format!(
            "listeners: {{ address: {IP}, httpPort: {http_port}, httpsPort: {https}, probePort: {probe_port} }}
routes:
  - name: site
    spec:
      hosts: [{HOST}]
      rules:
        - name: docs
          match: {{ pathSegmentPrefix: /docs/ }}
          backends: [ {{ service: docs, port: {docs_port} }} ]
        - name: old
          match: {{ pathSegmentPrefix: /old }}
          redirect: {{ scheme: https, hostname: new.paths.test, prefix: /new, statusCode: 301 }}
        - name: moved
          match: {{ pathExact: /moved }}
          redirect: {{ port: 8443, path: /here }}
        - name: legacy
          match: {{ pathSegmentPrefix: /legacy }}
          rewritePath: /index.html
          rewriteHost: legacy.internal
          backends: [ {{ service: echo, port: {echo} }} ]
        - name: v1
          match: {{ pathSegmentPrefix: /v1 }}
          rewritePrefix: /api/v1
          backends: [ {{ service: echo, port: {echo} }} ]
        - name: strip
          match: {{ pathSegmentPrefix: /strip.me }}
          rewritePrefix: /
          backends: [ {{ service: echo, port: {echo} }} ]
        - name: search
          match:
            pathExact: /search
            method: POST
            queryParams: [ {{ name: q, present: true }}, {{ name: page, regex: '^[0-9]+$' }} ]
          backends: [ {{ service: docs, port: {docs_port} }} ]
        - backends: [ {{ service: other, port: {other_port} }} ]
services:
  - name: docs
    endpoints: [ {{ address: {IP}, port: {docs_port} }} ]
  - name: other
    endpoints: [ {{ address: {IP}, port: {other_port} }} ]
  - name: echo
    endpoints: [ {{ address: {IP}, port: {echo} }} ]
",
            https = free_port(),
            docs_port = docs.address.port(),
            other_port = other.address.port(),
        ),
    )
    .expect("write config");
    let switchyard = Switchyard::start_standalone(&work, &config, &[]);
    let _envoy = Envoy::start(
        &work,
        "envoy-paths",
        IP,
        switchyard.xds_port,
        Protocol::Delta,
    );
    switchyard.wait_synced(1, Duration::from_secs(20)).await;
    // Envoy binds its listener shortly after it takes the snapshot.
    let mut first = None;
    for _ in 0..200 {
        if let Ok(r) = client()
            .get(format!("http://{IP}:{http_port}/"))
            .header("host", HOST)
            .send()
            .await
        {
            first = Some(r.status().as_u16());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(first, Some(200), "Envoy serves the route");

    for (path, body) in [
        ("/docs", "docs"),
        ("/docs/", "docs"),
        ("/docs/guide", "docs"),
        ("/docsx", "other"),
        ("/documents", "other"),
    ] {
        let (status, _, got) = get(http_port, path).await;
        assert_eq!((status, got.as_str()), (200, body), "GET {path}");
    }

    let (status, location, _) = get(http_port, "/old/page?x=1").await;
    assert_eq!(status, 301);
    assert_eq!(location, "https://new.paths.test/new/page?x=1");
    let (status, _, got) = get(http_port, "/older").await;
    assert_eq!(
        (status, got.as_str()),
        (200, "other"),
        "/older is not under /old"
    );

    let (status, _, got) = get(http_port, "/legacy/some/page?x=1").await;
    assert_eq!(
        (status, got.as_str()),
        (200, "/index.html?x=1 legacy.internal"),
        "the whole path and the Host replaced, the query kept"
    );
    let (status, _, got) = get(http_port, "/v1/users").await;
    assert_eq!(
        (status, got.as_str()),
        (200, format!("/api/v1/users {HOST}").as_str()),
        "the prefix replaced, the Host kept"
    );
    // A prefix rewritten to one ending in "/" takes the slashes after the segments along
    // (never "//x"); the "." of the prefix is no wildcard.
    for (path, rewritten) in [
        ("/strip.me/three", "/three"),
        ("/strip.me//three?q=1", "/three?q=1"),
        ("/strip.me", "/"),
    ] {
        let (status, _, got) = get(http_port, path).await;
        assert_eq!(
            (status, got),
            (200, format!("{rewritten} {HOST}")),
            "GET {path}"
        );
    }
    let (_, _, got) = get(http_port, "/stripXme/three").await;
    assert_eq!(got, "other", "/stripXme is not /strip.me");

    let post = reqwest::Method::POST;
    for (method, path, body) in [
        (post.clone(), "/search?q=envoy&page=2", "docs"),
        (post.clone(), "/search?page=2&q=", "docs"),
        (reqwest::Method::GET, "/search?q=envoy&page=2", "other"),
        (post.clone(), "/search?q=envoy&page=two", "other"),
        (post, "/search?page=2", "other"),
    ] {
        let (status, _, got) = request(method.clone(), http_port, path).await;
        assert_eq!((status, got.as_str()), (200, body), "{method} {path}");
    }

    let (status, location, _) = get(http_port, "/moved").await;
    assert_eq!(status, 302, "302 unless told");
    assert_eq!(location, format!("http://{HOST}:8443/here"));
}
