//! Route configurations served in parts (VHDS) to real delta Envoys, next to a SotW Envoy
//! that takes them whole, all on 127.0.0.x.

use std::time::Duration;

use switchyard::xds::Protocol;
use switchyard_e2e::{Backend, Envoy, Load, StandaloneDir, Switchyard};

/// Routes `h0.test` … `h{n-1}.test`, each to `blue` or, for those in `green`, to `green`.
fn write_routes(
    rig: &StandaloneDir,
    n: usize,
    green: &[usize],
    parts: bool,
    backends: &[&Backend],
) {
    let mut yaml = format!(
        "listeners: {{ httpPort: {}, probePort: {}, virtualHostDiscovery: {parts} }}\nroutes:\n",
        rig.http_port, rig.probe_port
    );
    for i in 0..n {
        let (service, backend) = if green.contains(&i) {
            ("green", backends[1])
        } else {
            ("blue", backends[0])
        };
        let port = backend.address.port();
        yaml.push_str(&format!(
            "- name: r{i}\n  spec:\n    hosts: [h{i}.test]\n    rules:\n    - backends: [ {{ service: {service}, port: {port} }} ]\n"
        ));
    }
    yaml.push_str("services:\n");
    for (name, backend) in ["blue", "green"].iter().zip(backends) {
        yaml.push_str(&format!(
            "- name: {name}\n  endpoints: [ {{ address: \"{}\", port: {} }} ]\n",
            backend.address.ip(),
            backend.address.port()
        ));
    }
    rig.write("routes.yaml", &yaml);
}

async fn body(url: &str, host: &str) -> Option<String> {
    let response = reqwest::Client::new()
        .get(url)
        .header("host", host)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.text().await.ok()
}

async fn wait_for_body(url: &str, host: &str, expected: &str) {
    let started = std::time::Instant::now();
    while body(url, host).await.as_deref() != Some(expected) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{url} ({host}) never answered {expected}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A standalone Switchyard serving `n` routes in parts to a delta and a SotW Envoy, both
/// synced; backends blue and green.
struct Served {
    rig: StandaloneDir,
    blue: Backend,
    green: Backend,
    switchyard: Switchyard,
    delta: Envoy,
    sotw: Envoy,
}

async fn serve(n: usize, delta_ip: &str, sotw_ip: &str) -> Served {
    let blue = Backend::start("blue", delta_ip).await;
    let green = Backend::start("green", delta_ip).await;
    let rig = StandaloneDir::new();
    write_routes(&rig, n, &[], true, &[&blue, &green]);
    let switchyard = Switchyard::start_standalone(&rig.work, &rig.config, &[]);
    let start =
        |name, ip, protocol| Envoy::start(&rig.work, name, ip, switchyard.xds_port, protocol);
    let delta = start("envoy-delta", delta_ip, Protocol::Delta);
    let sotw = start("envoy-sotw", sotw_ip, Protocol::Sotw);
    switchyard.wait_synced(2, Duration::from_secs(20)).await;
    Served {
        rig,
        blue,
        green,
        switchyard,
        delta,
        sotw,
    }
}

/// A delta Envoy takes the route configuration in parts and a SotW Envoy whole; both move
/// a route between Services, and the delta one is sent that route's virtual host alone.
#[tokio::test]
async fn a_delta_envoy_takes_virtual_hosts_one_by_one_and_a_sotw_envoy_takes_them_whole() {
    let (delta_ip, sotw_ip) = ("127.0.0.121", "127.0.0.122");
    let Served {
        rig,
        blue,
        green,
        switchyard,
        delta,
        sotw: _sotw,
    } = serve(20, delta_ip, sotw_ip).await;
    let delta_url = format!("http://{delta_ip}:{}/", rig.http_port);
    let sotw_url = format!("http://{sotw_ip}:{}/", rig.http_port);
    for i in [0, 7, 19] {
        wait_for_body(&delta_url, &format!("h{i}.test"), "blue").await;
        wait_for_body(&sotw_url, &format!("h{i}.test"), "blue").await;
    }
    let routes = delta
        .admin("/config_dump?resource=dynamic_route_configs")
        .await;
    assert!(routes.contains("switchyard+vhds"), "{routes}");
    let stats = delta.admin("/stats?filter=vhds").await;
    assert!(stats.contains("config_reload"), "{stats}");

    write_routes(&rig, 20, &[7], true, &[&blue, &green]);
    wait_for_body(&delta_url, "h7.test", "green").await;
    wait_for_body(&sotw_url, "h7.test", "green").await;
    assert_eq!(body(&delta_url, "h6.test").await.as_deref(), Some("blue"));
    switchyard.wait_synced(2, Duration::from_secs(10)).await;
}

/// Routes moved between Services, and VHDS turned off and on again, under load on a delta
/// and a SotW Envoy: every request answered 2xx.
#[tokio::test]
async fn routes_served_in_parts_move_and_the_setting_changes_under_load_without_a_drop() {
    let (delta_ip, sotw_ip) = ("127.0.0.123", "127.0.0.124");
    let Served {
        rig,
        blue,
        green,
        switchyard,
        delta,
        sotw: _sotw,
    } = serve(10, delta_ip, sotw_ip).await;
    let targets: Vec<String> = [delta_ip, sotw_ip]
        .iter()
        .map(|ip| format!("http://{ip}:{}", rig.http_port))
        .collect();
    for target in &targets {
        wait_for_body(&format!("{target}/"), "h3.test", "blue").await;
    }
    let load = Load::start(targets, "h3.test", 200, Duration::from_secs(120));
    let steps: [(&[usize], bool); 5] = [
        (&[3], true),
        (&[], true),
        (&[3], false),
        (&[], true),
        (&[3, 4], true),
    ];
    for (green_routes, parts) in steps {
        let before = switchyard.desired_version().await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        write_routes(&rig, 10, green_routes, parts, &[&blue, &green]);
        switchyard
            .wait_for_new_version(before.as_deref(), Duration::from_secs(10))
            .await;
        switchyard.wait_synced(2, Duration::from_secs(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let report = load.finish().await;
    eprintln!(
        "5 changes under load on a delta and a SotW Envoy: {} requests, by status {:?}",
        report.sent, report.by_status
    );
    assert!(report.sent > 0);
    if report.non_2xx() > 0 {
        eprintln!(
            "--- delta Envoy ---\n{}\n--- switchyard ---\n{}",
            delta.process.log_tail(),
            switchyard.process.log_tail()
        );
    }
    assert_eq!(report.non_2xx(), 0, "{:?}", report.failures);
}
