//! The three systems, each installed on the node from its own release as a user would:
//! Switchyard from this repo's chart, Envoy Gateway from the Helm charts its Go module
//! ships, Contour from the gateway provisioner's manifests its module ships (all built by
//! `e2e/provision.sh --only envoy-gateway,contour`, their images made by `e2e/images.sh`).
//! Every one runs the same Envoy binary (the `envoy` image). The Gateway API CRDs are the
//! v1.7.0 experimental channel's for all three: Contour reads TLSRoute and TCPRoute at
//! v1alpha2, which only that channel serves; neither peer's own bundle (Envoy Gateway's
//! v1.6.1, Contour's v1.3.0) is applied, since it would take the node's CRDs back.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::kube::cache_bin_dir;
use crate::node::{Node, image};

/// A system under comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum System {
    Switchyard,
    EnvoyGateway,
    Contour,
}

impl System {
    pub const ALL: [System; 3] = [System::Switchyard, System::EnvoyGateway, System::Contour];

    pub fn name(self) -> &'static str {
        match self {
            System::Switchyard => "Switchyard",
            System::EnvoyGateway => "Envoy Gateway",
            System::Contour => "Contour",
        }
    }

    /// Its short name: flags, JSON, namespaces.
    pub fn key(self) -> &'static str {
        match self {
            System::Switchyard => "switchyard",
            System::EnvoyGateway => "envoy-gateway",
            System::Contour => "contour",
        }
    }

    pub fn version(self) -> String {
        match self {
            System::Switchyard => format!("{} (this tree)", env!("CARGO_PKG_VERSION")),
            System::EnvoyGateway => release_version("envoy-gateway"),
            System::Contour => release_version("contour"),
        }
    }

    /// The namespace of its Gateway, route and backends.
    pub fn namespace(self) -> String {
        format!("cmp-{}", self.key())
    }

    /// The GatewayClass controllerName it answers to.
    fn controller_name(self) -> &'static str {
        match self {
            System::Switchyard => "switchyard.dev/gateway-controller",
            System::EnvoyGateway => "gateway.envoyproxy.io/gatewayclass-controller",
            System::Contour => "projectcontour.io/gateway-controller",
        }
    }

    /// The route condition that says a change is done, in the system's own words: what a
    /// user (or a GitOps tool) would wait for.
    pub fn done_condition(self) -> &'static str {
        match self {
            System::Switchyard => "switchyard.dev/Served",
            System::EnvoyGateway | System::Contour => "Accepted",
        }
    }

    /// The images the node must hold for it.
    pub fn images(self) -> &'static [&'static str] {
        match self {
            System::Switchyard => &[],
            System::EnvoyGateway => &["envoy-gateway"],
            System::Contour => &["contour"],
        }
    }

    /// Installs it, as its release is installed; returns once its control plane runs.
    pub async fn install(self, node: &Node) {
        for name in self.images() {
            node.import_image(name).await;
        }
        match self {
            System::Switchyard => install_switchyard(node).await,
            System::EnvoyGateway => install_envoy_gateway(node).await,
            System::Contour => install_contour(node).await,
        }
    }

    /// Its GatewayClass (with what it takes for a node without a load balancer), and
    /// Gateway `edge` with one HTTP listener on port 80, in [`System::namespace`].
    pub fn gateway_yaml(self) -> String {
        let (class, namespace, controller) =
            (self.namespace(), self.namespace(), self.controller_name());
        let parameters = match self {
            // The provisioner's Envoy Service is a LoadBalancer unless told otherwise.
            System::Contour => format!(
                r#"
  parametersRef: {{ group: projectcontour.io, kind: ContourDeployment, name: cmp, namespace: {namespace} }}
---
apiVersion: projectcontour.io/v1alpha1
kind: ContourDeployment
metadata: {{ name: cmp, namespace: {namespace} }}
spec:
  envoy:
    networkPublishing: {{ type: ClusterIPService }}"#
            ),
            _ => String::new(),
        };
        format!(
            r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{ name: {class} }}
spec:
  controllerName: {controller}{parameters}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{ name: edge, namespace: {namespace} }}
spec:
  gatewayClassName: {class}
  listeners: [ {{ name: http, port: 80, protocol: HTTP }} ]
"#
        )
    }

    /// `http://<address>:80` of Gateway `edge`, once the system gives one: the Gateway's
    /// status address (Switchyard, Envoy Gateway), or the ClusterIP of the Envoy Service
    /// the provisioner made for it (Contour gives a Gateway an address only from a load
    /// balancer).
    pub async fn gateway_url(self, node: &Node, within: Duration) -> String {
        let namespace = self.namespace();
        let started = std::time::Instant::now();
        while started.elapsed() < within {
            let address = match self {
                System::Contour => {
                    node.get(&namespace, "service/envoy-edge", "{.spec.clusterIP}")
                        .await
                }
                _ => {
                    let programmed = node
                        .get(
                            &namespace,
                            "gateway/edge",
                            "{.status.conditions[?(@.type==\"Programmed\")].status}",
                        )
                        .await;
                    let address = node
                        .get(&namespace, "gateway/edge", "{.status.addresses[0].value}")
                        .await;
                    if programmed == "True" {
                        address
                    } else {
                        String::new()
                    }
                }
            };
            if !address.is_empty() {
                return format!("http://{address}:80");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!(
            "{}: gateway edge got no address within {within:?}\n{}",
            self.name(),
            node.diagnostics().await
        );
    }
}

impl System {
    /// The Pods of its control plane, the processes that read the routes and serve Envoy
    /// its configuration over xDS: (namespace, label selector). Switchyard: every operator
    /// replica (each serves xDS); Envoy Gateway: its `envoy-gateway` Deployment; Contour:
    /// the Contour Deployment its provisioner made for Gateway `edge` (`contour-edge`),
    /// not the provisioner, which reads Gateways only.
    pub fn control_plane(self) -> (String, &'static str) {
        match self {
            System::Switchyard => (
                crate::node::SWITCHYARD_NAMESPACE.to_owned(),
                crate::node::OPERATOR_SELECTOR,
            ),
            System::EnvoyGateway => (
                "envoy-gateway-system".to_owned(),
                "control-plane=envoy-gateway",
            ),
            System::Contour => (self.namespace(), "app=contour-edge"),
        }
    }

    /// How many Envoy Pods (of the `envoy` image) run for it, ready or not.
    pub async fn envoy_pods(self, node: &Node) -> usize {
        let namespace = match self {
            System::Switchyard => crate::node::SWITCHYARD_NAMESPACE.to_owned(),
            System::EnvoyGateway => "envoy-gateway-system".to_owned(),
            System::Contour => self.namespace(),
        };
        let images = node
            .get(
                &namespace,
                "pods",
                "{range .items[*]}{.spec.containers[*].image}{\"\\n\"}{end}",
            )
            .await;
        let envoy = image("envoy");
        images
            .lines()
            .filter(|line| line.split_whitespace().any(|i| i == envoy))
            .count()
    }
}

/// Switchyard only: how many Envoys are connected to the leader and to the other
/// replicas, from the replicas' report Leases (src/k8s/fleet_report.rs). Each replica
/// serves xDS, and an Envoy connects to whichever the Service picks: the leader hears
/// only its own Envoys' answers at once, so a run's latencies depend on where they went.
pub async fn switchyard_envoys_by_replica(node: &Node) -> String {
    let leases = node
        .get(
            crate::node::SWITCHYARD_NAMESPACE,
            "leases",
            "{range .items[*]}{.metadata.name}{\"\\t\"}{.spec.holderIdentity}{\"\\t\"}{.metadata.labels.switchyard\\.dev/replica-of}{\"\\t\"}{.metadata.annotations.switchyard\\.dev/envoy-report}{\"\\n\"}{end}",
        )
        .await;
    // (name, holder, the election it reports to, report) of every Lease; the output is
    // trimmed, so the last line's empty fields may be gone.
    let leases: Vec<Vec<&str>> = (leases.lines())
        .map(|line| {
            let mut fields: Vec<&str> = line.splitn(4, '\t').collect();
            fields.resize(4, "");
            fields
        })
        .collect();
    let mut parts = Vec::new();
    for report in leases.iter().filter(|l| !l[2].is_empty()) {
        // The election's Lease is the one the reports name.
        let leader = (leases.iter()).find(|l| l[0] == report[2]).map(|l| l[1]);
        let role = match leader == Some(report[1]) {
            true => "leader",
            false => "other",
        };
        let envoys = serde_json::from_str::<serde_json::Value>(report[3])
            .ok()
            .and_then(|r| r.get("envoys")?.as_array().map(Vec::len))
            .map_or("unknown".to_owned(), |n| n.to_string());
        parts.push(format!("{role} {}: {envoys}", report[1]));
    }
    parts.sort();
    if parts.is_empty() {
        return "no replica report".to_owned();
    }
    parts.join(", ")
}

/// The Gateway API CRDs every system reads: v1.7.0's experimental channel, as
/// e2e/provision.sh downloaded them.
pub async fn install_gateway_api(node: &Node) {
    let crds = std::fs::canonicalize(crate::kube::tool("gateway-api-experimental"))
        .expect("the Gateway API CRDs, experimental channel");
    let crds = crds.to_string_lossy();
    (node.api())
        .kubectl_ok(["apply", "--server-side", "-f", &crds])
        .await;
    crds_established(node).await;
}

/// Once every CRD the API server has is established.
async fn crds_established(node: &Node) {
    let wait = [
        "wait",
        "--for",
        "condition=Established",
        "crd",
        "--all",
        "--timeout",
        "60s",
    ];
    node.api().kubectl_ok(wait).await;
}

/// Where e2e/provision.sh put a peer's release files (`<name>-release`, a link to
/// `<name>-<version>/release`).
fn release(name: &str) -> PathBuf {
    let link = cache_bin_dir().join(format!("{name}-release"));
    std::fs::canonicalize(&link).unwrap_or_else(|_| {
        panic!(
            "{} is missing: run e2e/provision.sh --only envoy-gateway,contour",
            link.display()
        )
    })
}

async fn install_switchyard(node: &Node) {
    node.install_switchyard(&["--set", "gatewayAPI.enabled=true"])
        .await;
}

/// Envoy Gateway's own CRDs from its CRD chart (not its Gateway API bundle), then its
/// chart, packaged as its release packages it (`values.yaml` from `values.tmpl.yaml`),
/// with local images and a ClusterIP Envoy Service.
async fn install_envoy_gateway(node: &Node) {
    let charts = release("envoy-gateway").join("charts");
    let version = release_version("envoy-gateway");
    let crds = node
        .helm_ok(&[
            "template",
            "eg-crds",
            &path(&charts.join("gateway-crds-helm")),
            "--set",
            "crds.envoyGateway.enabled=true",
        ])
        .await;
    let out = node
        .api()
        .kubectl_input(["apply", "--server-side", "-f", "-"], &crds)
        .await;
    assert!(
        out.status.success(),
        "Envoy Gateway's CRDs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    crds_established(node).await;
    let chart = package_envoy_gateway(node, &charts, &version).await;
    let values = [
        "crds.enabled=false".to_owned(),
        format!(
            "global.images.envoyGateway.image={}",
            image("envoy-gateway")
        ),
        "global.images.envoyGateway.pullPolicy=Never".to_owned(),
        format!("global.images.envoyProxy.image={}", image("envoy")),
        "config.envoyGateway.envoyProxy.provider.type=Kubernetes".to_owned(),
        "config.envoyGateway.envoyProxy.provider.kubernetes.envoyService.type=ClusterIP".to_owned(),
    ];
    let mut args = vec![
        "install",
        "eg",
        chart.as_str(),
        "-n",
        "envoy-gateway-system",
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
    ];
    for value in &values {
        args.extend(["--set", value.as_str()]);
    }
    node.helm_ok(&args).await;
}

/// The chart as Envoy Gateway's release makes it: `values.yaml` written from the template
/// with its image, then `helm package` at the release's version.
async fn package_envoy_gateway(node: &Node, charts: &Path, version: &str) -> String {
    let work = node.dir.join("envoy-gateway-chart");
    let chart = work.join("gateway-helm");
    let _ = std::fs::remove_dir_all(&work);
    copy_dir(&charts.join("gateway-helm"), &chart);
    let template = std::fs::read_to_string(chart.join("values.tmpl.yaml"))
        .expect("Envoy Gateway's values.tmpl.yaml");
    let values = template
        .replace(
            "${GatewayImage}",
            &format!("docker.io/envoyproxy/gateway:{version}"),
        )
        .replace("${GatewayImagePullPolicy}", "IfNotPresent");
    std::fs::write(chart.join("values.yaml"), values).expect("write values.yaml");
    node.helm_ok(&[
        "package",
        &path(&chart),
        "--version",
        version,
        "--app-version",
        version,
        "-d",
        &path(&work),
    ])
    .await;
    path(&work.join(format!("gateway-helm-{version}.tgz")))
}

/// Contour's CRDs and its gateway provisioner, from the manifests its release ships
/// (`examples/contour/01-crds.yaml`, `examples/gateway-provisioner/`), with the local
/// images: the provisioner's own, and the Contour and Envoy images it gives what it
/// provisions for each Gateway (its `--contour-image` and `--envoy-image` flags).
async fn install_contour(node: &Node) {
    let examples = release("contour").join("examples");
    let mut manifests =
        std::fs::read_to_string(examples.join("contour/01-crds.yaml")).expect("Contour's CRDs");
    let mut files: Vec<PathBuf> = std::fs::read_dir(examples.join("gateway-provisioner"))
        .expect("Contour's gateway provisioner")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    for file in files {
        manifests.push_str("\n---\n");
        manifests.push_str(&std::fs::read_to_string(&file).expect("a provisioner manifest"));
    }
    let version = release_version("contour");
    let release_image = format!("ghcr.io/projectcontour/contour:{version}");
    assert!(
        manifests.contains(&release_image) && manifests.contains("- --enable-leader-election"),
        "Contour's provisioner manifests are not as expected"
    );
    let flags = format!(
        "- --enable-leader-election\n        - --contour-image={}\n        - --envoy-image={}",
        image("contour"),
        image("envoy")
    );
    let manifests = manifests
        .replace(&release_image, &image("contour"))
        .replace("imagePullPolicy: IfNotPresent", "imagePullPolicy: Never")
        .replace("- --enable-leader-election", &flags);
    let out = node
        .api()
        .kubectl_input(["apply", "--server-side", "-f", "-"], &manifests)
        .await;
    assert!(
        out.status.success(),
        "Contour's manifests: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    node.wait_rollout(
        "projectcontour",
        "deployment/contour-gateway-provisioner",
        Duration::from_secs(180),
    )
    .await;
}

/// The version of the peer e2e/provision.sh built (its folder is `<name>-<version>`).
fn release_version(name: &str) -> String {
    let folder = release(name)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let folder = folder.file_name().map(|f| f.to_string_lossy().into_owned());
    let prefix = format!("{name}-");
    folder
        .and_then(|f| f.strip_prefix(&prefix).map(str::to_owned))
        .unwrap_or_else(|| panic!("{name}: no version in the name of its release folder"))
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create a folder");
    for entry in std::fs::read_dir(from).expect("read a folder").flatten() {
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        if source.is_dir() {
            copy_dir(&source, &target);
        } else {
            std::fs::copy(&source, &target).expect("copy a file");
        }
    }
}
