//! A real one-node Kubernetes for end-to-end tests: containerd, etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, kubelet, kube-proxy and CoreDNS, all in a
//! network namespace of its own with no route out (see [`netns`]). The binaries come from
//! `e2e/provision.sh`, the images from `e2e/images.sh` (imported into the node's own
//! containerd; nothing is pulled).
//!
//! ```no_run
//! # async fn demo() {
//! use switchyard_e2e::node::Node;
//! // First thing in a #[tokio::test]: the test's thread moves into the node's namespace,
//! // so its clients and every process it starts are there too.
//! let node = Node::start().await;
//! node.api().kubectl_ok(["get", "nodes"]).await;
//! # }
//! ```
//!
//! Everything lives under `/tmp/sy-node-<pid>-<n>/`; dropping the [`Node`] (a panic
//! included) kills the processes and containers, detaches the mounts, removes the
//! cgroups, the namespace and the folder. A node left by a killed test run is cleared by
//! the next [`Node::start`]. `SWITCHYARD_E2E_KEEP=1` copies the logs aside first.

pub mod netns;
mod teardown;
pub mod workloads;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::Process;
use crate::kube::{ApiServerOptions, KubeApi, tool};
use netns::{DNS_SERVICE_IP, NODE_IP, NetworkNamespace, POD_SUBNET, SERVICE_RANGE};

/// The node's name (its `kubernetes.io/hostname`).
pub const NODE_NAME: &str = "switchyard-node";
/// Every image the node imports, tagged `localhost/NAME:rig` by `e2e/images.sh`.
pub const IMAGES: [&str; 5] = ["pause", "switchyard", "envoy", "backend", "coredns"];
/// The reference of one of [`IMAGES`].
pub fn image(name: &str) -> String {
    format!("localhost/{name}:rig")
}

/// The release name and namespace of the README's `helm install`.
pub const RELEASE: &str = "switchyard";
pub const SWITCHYARD_NAMESPACE: &str = "switchyard-system";
const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/switchyard");
/// The chart's labels of its Envoy and operator Pods.
pub const ENVOY_SELECTOR: &str = "app.kubernetes.io/component=envoy";
pub const OPERATOR_SELECTOR: &str = "app.kubernetes.io/component=operator";

/// The values a local node needs, and nothing else: the images made here, never pulled,
/// and a ClusterIP for the Envoy Service (no load-balancer controller would ever give a
/// LoadBalancer an address, so `helm --wait` would not end).
pub fn local_values() -> Vec<String> {
    [
        "image.repository=localhost/switchyard",
        "image.tag=rig",
        "image.pullPolicy=Never",
        "envoy.image.repository=localhost/envoy",
        "envoy.image.tag=rig",
        "envoy.image.pullPolicy=Never",
        "envoy.service.type=ClusterIP",
    ]
    .into_iter()
    .flat_map(|v| ["--set".to_string(), v.to_string()])
    .collect()
}

const NODE_READY_WITHIN: Duration = Duration::from_secs(90);
const COMMAND_WITHIN: Duration = Duration::from_secs(300);
const FOLDER_PREFIX: &str = "sy-node-";

/// A running node. Dropping it tears everything down.
pub struct Node {
    /// `sy-node-<pid>-<n>`: the folder's, the namespace's and the cgroup root's name.
    pub id: String,
    pub dir: PathBuf,
    pub netns: NetworkNamespace,
    /// From nothing running to the node Ready and CoreDNS answering.
    pub started_in: Duration,
    api: Option<KubeApi>,
    /// containerd, kube-controller-manager, kube-scheduler, kube-proxy, kubelet.
    processes: Vec<Process>,
    /// Held while the node runs: one node at a time per test process.
    _turn: std::sync::MutexGuard<'static, ()>,
}

/// One node at a time in a test process: two nodes and their load on a 2-core machine
/// would measure each other.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn images_dir() -> PathBuf {
    crate::kube::cache_bin_dir()
        .parent()
        .map(|p| p.join("images"))
        .unwrap_or_else(|| PathBuf::from("images"))
}

impl Node {
    /// Starts a node and waits (bounded) until it is Ready and CoreDNS serves. Moves the
    /// calling thread into the node's network namespace first: call it before anything
    /// else in the test (before the first request, client or spawned process).
    pub async fn start() -> Node {
        // A test that panicked while holding it left nothing behind (its Node dropped).
        let turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
        clear_leftovers();
        let started = Instant::now();
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let id = format!(
            "{FOLDER_PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(&id);
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["logs", "cni/net.d", "cni/ipam", "pod-logs", "kubelet"] {
            std::fs::create_dir_all(dir.join(sub)).expect("create the node folder");
        }
        std::fs::write(dir.join("owner.pid"), std::process::id().to_string())
            .expect("write owner.pid");
        let netns = NetworkNamespace::create(&id)
            .unwrap_or_else(|e| panic!("cannot make the node's network namespace: {e}"));
        let mut node = Node {
            id,
            dir,
            netns,
            started_in: Duration::ZERO,
            api: None,
            processes: Vec::new(),
            _turn: turn,
        };
        node.netns
            .enter_current_thread()
            .unwrap_or_else(|e| panic!("cannot enter the node's network namespace: {e}"));

        node.start_containerd().await;
        node.import_images().await;
        let api = KubeApi::start_with(&node.dir.join("logs"), &node.apiserver_options()).await;
        node.api = Some(api);
        node.start_control_plane();
        node.start_kubelet();
        node.start_kube_proxy();
        node.wait_ready().await;
        node.start_dns().await;
        node.started_in = started.elapsed();
        eprintln!("node {} ready in {:.1?}", node.id, node.started_in);
        node
    }

    /// Resident memory in MiB: (the node's processes — etcd, the control plane,
    /// containerd, kubelet, kube-proxy —, its containers, from their cgroups).
    pub fn memory_mib(&self) -> (f64, f64) {
        let own: f64 = self
            .processes
            .iter()
            .chain(self.api.iter().flat_map(KubeApi::local_processes))
            .filter_map(|p| p.memory_mib())
            .map(|(rss, _)| rss)
            .sum();
        let pods = std::fs::read_to_string(
            Path::new("/sys/fs/cgroup/memory")
                .join(&self.id)
                .join("memory.usage_in_bytes"),
        )
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0.0, |bytes| bytes / (1024.0 * 1024.0));
        (own, pods)
    }

    /// SIGKILLs the processes of a Pod's containers (not its sandbox), as a crash or the
    /// OOM killer would: no SIGTERM, no preStop. The kubelet then restarts them. Returns
    /// how many processes it killed.
    pub async fn kill_containers(&self, namespace: &str, pod: &str) -> usize {
        let uid = self
            .get(namespace, &format!("pod/{pod}"), "{.metadata.uid}")
            .await;
        assert!(!uid.is_empty(), "no Pod {namespace}/{pod}");
        teardown::kill_pod_processes(&self.id, &uid)
    }

    /// The node's API server (admin kubeconfig, kubectl).
    pub fn api(&self) -> &KubeApi {
        self.api.as_ref().expect("the node's apiserver")
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{name}.log"))
    }

    fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd/containerd.sock")
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.api().kubeconfig
    }

    fn apiserver_options(&self) -> ApiServerOptions {
        ApiServerOptions {
            address: NODE_IP.parse().expect("the node address"),
            port: Some(6443),
            extra_args: vec![
                format!("--service-cluster-ip-range={SERVICE_RANGE}"),
                "--allow-privileged=true".to_string(),
                // Else it looks the node's name up in the machine's resolver: a DNS
                // query that would try to leave.
                "--kubelet-preferred-address-types=InternalIP".to_string(),
            ],
        }
    }

    async fn start_containerd(&mut self) {
        let root = self.dir.join("containerd");
        let config = format!(
            r#"version = 2
root = "{root}/root"
state = "{root}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{root}/containerd.sock"

[ttrpc]
  address = "{root}/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # The machine lacks CAP_SYS_RESOURCE: without this every sandbox fails to start.
  restrict_oom_score_adj = true
  # Pods' network namespaces under the state folder, not /run/netns.
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{root}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}/net.d"
"#,
            root = root.display(),
            pause = image("pause"),
            cni = self.dir.join("cni").display(),
        );
        std::fs::create_dir_all(&root).expect("containerd folder");
        std::fs::write(self.dir.join("containerd.toml"), config).expect("containerd config");
        std::fs::write(
            self.dir.join("cni/net.d/10-switchyard.conflist"),
            cni_config(&self.dir.join("cni/ipam")),
        )
        .expect("CNI config");
        let mut command = Command::new("containerd");
        command
            .arg("--config")
            .arg(self.dir.join("containerd.toml"));
        self.processes.push(Process::spawn(
            "containerd",
            &mut command,
            self.log("containerd"),
        ));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.ctr(&["version"]).await;
            if out.status.success() {
                break;
            }
            self.check(deadline, "containerd does not answer");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn ctr(&self, args: &[&str]) -> Output {
        let mut command = tokio::process::Command::new("ctr");
        command
            .arg("--address")
            .arg(self.containerd_socket())
            .args(["--namespace", "k8s.io"])
            .args(args);
        run_bounded(command).await
    }

    async fn import_images(&self) {
        for name in IMAGES {
            self.import_image(name).await;
        }
    }

    /// Imports `$CACHE/images/NAME.tar` (made by `e2e/images.sh`) into the node's
    /// containerd, under the reference the archive gives.
    pub async fn import_image(&self, name: &str) {
        let file = images_dir().join(format!("{name}.tar"));
        assert!(
            file.exists(),
            "no image {}: run e2e/images.sh (after e2e/provision.sh)",
            file.display()
        );
        let path = file.to_string_lossy().into_owned();
        let out = self
            .ctr(&["images", "import", "--platform", "linux/amd64", &path])
            .await;
        assert!(
            out.status.success(),
            "ctr images import {path} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn start_control_plane(&mut self) {
        let kubeconfig = self.kubeconfig().to_path_buf();
        let api_dir = self
            .api()
            .local_dir()
            .expect("a local apiserver")
            .to_path_buf();
        let mut command = Command::new(tool("kube-controller-manager"));
        command
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--service-account-private-key-file")
            .arg(api_dir.join("sa.key"))
            .arg("--root-ca-file")
            .arg(api_dir.join("certs/apiserver.crt"))
            .args([
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--use-service-account-credentials=false",
            ]);
        let process = Process::spawn(
            "kube-controller-manager",
            &mut command,
            self.log("kube-controller-manager"),
        );
        self.processes.push(process);
        let mut command = Command::new(tool("kube-scheduler"));
        command
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--leader-elect=false", "--bind-address=127.0.0.1"]);
        let process = Process::spawn("kube-scheduler", &mut command, self.log("kube-scheduler"));
        self.processes.push(process);
    }

    fn start_kubelet(&mut self) {
        let resolv = self.dir.join("resolv.conf");
        std::fs::write(&resolv, format!("nameserver {DNS_SERVICE_IP}\n")).expect("resolv.conf");
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1 and containerd 1.6 (no CRI RuntimeConfig): cgroupfs.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{id}
failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
address: {NODE_IP}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
clusterDNS: [{DNS_SERVICE_IP}]
clusterDomain: cluster.local
resolvConf: {resolv}
podLogsDir: {pod_logs}
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization:
  mode: AlwaysAllow
# A shared test machine: never evict, never collect the local images. The node's disk is
# the host's, shared with builds that can leave it 99 % full: a percentage (1 % is 2.5 GB
# here) evicted the Envoy Pods in the middle of a test while gigabytes were still free.
evictionHard: {{memory.available: "1Mi", nodefs.available: "64Mi", imagefs.available: "64Mi", nodefs.inodesFree: "1000"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
oomScoreAdj: 0
shutdownGracePeriod: 0s
"#,
            id = self.id,
            socket = self.containerd_socket().display(),
            resolv = resolv.display(),
            pod_logs = self.dir.join("pod-logs").display(),
        );
        let config_path = self.dir.join("kubelet.yaml");
        std::fs::write(&config_path, config).expect("kubelet config");
        create_cgroup_root(&self.id);
        let mut command = Command::new(tool("kubelet"));
        command
            .arg("--config")
            .arg(&config_path)
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .arg("--root-dir")
            .arg(self.dir.join("kubelet"))
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg(format!("--node-ip={NODE_IP}"));
        let process = Process::spawn("kubelet", &mut command, self.log("kubelet"));
        self.processes.push(process);
    }

    fn start_kube_proxy(&mut self) {
        let mut command = Command::new(tool("kube-proxy"));
        command
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args([
                "--proxy-mode=iptables",
                // A Service's rules written as soon as it is seen, not batched a second
                // apart: a Gateway's Service is new when a test first sends to it, and a
                // UDP datagram sent before its rules exist is lost unseen (a TCP
                // connection would retry its SYN).
                "--iptables-min-sync-period=0s",
                // No writes to the machine-wide conntrack settings.
                "--conntrack-max-per-core=0",
                "--oom-score-adj=0",
                "--metrics-bind-address=127.0.0.1:10249",
                "--healthz-bind-address=127.0.0.1:10256",
            ])
            .arg(format!("--cluster-cidr={POD_SUBNET}"))
            .arg(format!("--hostname-override={NODE_NAME}"));
        let process = Process::spawn("kube-proxy", &mut command, self.log("kube-proxy"));
        self.processes.push(process);
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + NODE_READY_WITHIN;
        loop {
            let out = self
                .api()
                .kubectl([
                    "get",
                    "node",
                    NODE_NAME,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ])
                .await;
            if String::from_utf8_lossy(&out.stdout).trim() == "True" {
                return;
            }
            self.check(deadline, "the node is not Ready");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn start_dns(&self) {
        let manifest = include_str!("../../testdata/node/coredns.yaml")
            .replace("DNS_SERVICE_IP", DNS_SERVICE_IP);
        let out = self
            .api()
            .kubectl_input(["apply", "-f", "-"], &manifest)
            .await;
        assert!(
            out.status.success(),
            "applying CoreDNS failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.wait_rollout("kube-system", "deployment/coredns", Duration::from_secs(60))
            .await;
    }

    /// `kubectl rollout status` of a Deployment or DaemonSet, with the node's logs when it
    /// does not get there.
    pub async fn wait_rollout(&self, namespace: &str, what: &str, within: Duration) {
        let timeout = format!("--timeout={}s", within.as_secs());
        let out = self
            .api()
            .kubectl(["rollout", "status", "-n", namespace, what, &timeout])
            .await;
        if !out.status.success() {
            panic!(
                "{what} in {namespace} did not roll out within {within:?}: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.diagnostics().await
            );
        }
    }

    /// Runs helm against the node, with its own folders for helm's cache and settings.
    pub async fn helm(&self, args: &[&str]) -> Output {
        let mut command = tokio::process::Command::new(tool("helm"));
        command
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .env("HELM_CACHE_HOME", self.dir.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir.join("helm/config"))
            .env("HELM_DATA_HOME", self.dir.join("helm/data"))
            .args(args);
        run_bounded(command).await
    }

    /// Like [`Node::helm`]; panics with helm's output and the node's state on failure.
    pub async fn helm_ok(&self, args: &[&str]) -> String {
        let out = self.helm(args).await;
        if !out.status.success() {
            panic!(
                "helm {args:?} failed ({}): {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr),
                self.diagnostics().await
            );
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What a failing test prints: Pods, recent events, and the tails of every log.
    pub async fn diagnostics(&self) -> String {
        let mut out = String::new();
        for args in [
            vec!["get", "pods", "-A", "-o", "wide"],
            vec!["get", "events", "-A", "--sort-by=.lastTimestamp"],
        ] {
            let o = self.api().kubectl(&args).await;
            out.push_str(&format!(
                "--- kubectl {} ---\n{}{}\n",
                args.join(" "),
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        out.push_str(&self.log_tails());
        out
    }

    /// The last lines of every process's log and of every container's.
    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        for process in &self.processes {
            out.push_str(&format!(
                "--- {} ({}) ---\n{}\n",
                process.name,
                process.log.display(),
                process.log_tail()
            ));
        }
        for file in files_under(&self.dir.join("pod-logs")) {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- {} ---\n{}\n",
                file.display(),
                lines[lines.len().saturating_sub(20)..].join("\n")
            ));
        }
        out
    }

    /// Panics with the logs past `deadline`, or when a process of the node has exited.
    fn check(&self, deadline: Instant, what: &str) {
        let now = Instant::now();
        if now < deadline {
            return;
        }
        panic!(
            "node {}: {what} within its time\n{}",
            self.id,
            self.log_tails()
        );
    }

    /// Installs Switchyard as the README says: the CRDs with `kubectl apply
    /// --server-side`, then `helm install switchyard charts/switchyard -n
    /// switchyard-system --create-namespace --wait` with [`local_values`] and `extra`
    /// (`--set` pairs and the like). Returns how long helm took.
    pub async fn install_switchyard(&self, extra: &[&str]) -> Duration {
        let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/");
        self.api()
            .kubectl_ok(["apply", "--server-side", "-f", crds])
            .await;
        let mut args = vec![
            "install",
            RELEASE,
            CHART,
            "-n",
            SWITCHYARD_NAMESPACE,
            "--create-namespace",
            "--wait",
            "--timeout",
            "3m",
        ];
        let values = local_values();
        args.extend(values.iter().map(String::as_str));
        args.extend(extra);
        let started = Instant::now();
        self.helm_ok(&args).await;
        started.elapsed()
    }

    /// [`Node::install_switchyard`] with the Gateway API on, its CRDs from the chart.
    pub async fn install_switchyard_with_gateway_api(&self) -> Duration {
        self.install_switchyard(&[
            "--set",
            "gatewayAPI.enabled=true",
            "--set",
            "gatewayAPI.installCRDs=true",
        ])
        .await
    }

    /// `http://<ClusterIP of the public Envoy Service>:80`.
    pub async fn envoy_service_url(&self) -> String {
        let ip = self
            .get(
                SWITCHYARD_NAMESPACE,
                &format!("service/{RELEASE}-envoy"),
                "{.spec.clusterIP}",
            )
            .await;
        assert!(!ip.is_empty(), "no ClusterIP for the Envoy Service");
        format!("http://{ip}:80")
    }

    /// Names and addresses of the Pods with this label selector that are Ready.
    pub async fn ready_pods(&self, namespace: &str, selector: &str) -> Vec<(String, String)> {
        let out = self
            .api()
            .kubectl_ok([
                "get",
                "pods",
                "-n",
                namespace,
                "-l",
                selector,
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.status.podIP} {.metadata.deletionTimestamp} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            ])
            .await;
        out.lines()
            .filter_map(|line| {
                let words: Vec<&str> = line.split_whitespace().collect();
                match words[..] {
                    [name, ip, "True"] => Some((name.to_string(), ip.to_string())),
                    _ => None,
                }
            })
            .collect()
    }

    /// The Envoy Pods that are Ready: (name, `http://<Pod IP>:8080`).
    pub async fn envoy_pods(&self) -> Vec<(String, String)> {
        self.ready_pods(SWITCHYARD_NAMESPACE, ENVOY_SELECTOR)
            .await
            .into_iter()
            .map(|(name, ip)| (name, format!("http://{ip}:8080")))
            .collect()
    }

    /// Applies YAML (server-side, as a user's `kubectl apply --server-side`); panics with
    /// kubectl's words when refused.
    pub async fn apply(&self, yaml: &str) {
        let out = self
            .api()
            .kubectl_input(
                [
                    "apply",
                    "--server-side",
                    "--field-manager",
                    "node-test",
                    "-f",
                    "-",
                ],
                yaml,
            )
            .await;
        assert!(
            out.status.success(),
            "kubectl apply failed: {}
{yaml}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A jsonpath of an object (`kubectl get -o jsonpath`), trimmed; empty if it is not
    /// there.
    pub async fn get(&self, namespace: &str, what: &str, jsonpath: &str) -> String {
        let path = format!("jsonpath={jsonpath}");
        let out = self
            .api()
            .kubectl(["get", "-n", namespace, what, "-o", &path])
            .await;
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Waits until the TrafficRoute's current generation is Ready; how long that took.
    pub async fn wait_route_ready(
        &self,
        namespace: &str,
        name: &str,
        within: Duration,
    ) -> Duration {
        let started = Instant::now();
        let what = format!("trafficroute/{name}");
        loop {
            let state = self
                .get(
                    namespace,
                    &what,
                    "{.metadata.generation} {.status.observedGeneration} {.status.conditions[?(@.type==\"Ready\")].status} {.status.conditions[?(@.type==\"Ready\")].observedGeneration}",
                )
                .await;
            let fields: Vec<&str> = state.split_whitespace().collect();
            if let [generation, observed, "True", condition_generation] = fields[..]
                && generation == observed
                && generation == condition_generation
            {
                return started.elapsed();
            }
            if started.elapsed() > within {
                let status = self.get(namespace, &what, "{.status}").await;
                panic!(
                    "route {namespace}/{name} not Ready within {within:?}: {status}\n{}",
                    self.diagnostics().await
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Pod logs of a container (all its files), for a test's own assertions.
    pub fn pod_logs(&self, namespace: &str, pod_prefix: &str) -> String {
        let mut out = String::new();
        for file in files_under(&self.dir.join("pod-logs")) {
            let path = file.to_string_lossy();
            if path.contains(&format!("/{namespace}_{pod_prefix}")) {
                out.push_str(&std::fs::read_to_string(&file).unwrap_or_default());
            }
        }
        out
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::env::var_os("SWITCHYARD_E2E_KEEP").is_some() || std::thread::panicking() {
            let kept = std::env::temp_dir().join(format!("switchyard-rig-{}-logs", self.id));
            let _ = Command::new("cp")
                .arg("-r")
                .arg(self.dir.join("logs"))
                .arg(&kept)
                .status();
            let _ = Command::new("cp")
                .arg("-r")
                .arg(self.dir.join("pod-logs"))
                .arg(kept.join("pods"))
                .status();
            eprintln!("node logs kept in {}", kept.display());
        }
        // The kubelet first, so that it restarts nothing; then the containers.
        for process in self.processes.iter_mut().rev() {
            process.kill();
        }
        teardown::cgroups(&self.id);
        teardown::processes_naming(&self.containerd_socket().to_string_lossy());
        self.api = None; // etcd and kube-apiserver
        tear_down_rest(&self.id, &self.dir);
    }
}

fn tear_down_rest(id: &str, dir: &Path) {
    teardown::folder(dir);
    let ns = NetworkNamespace {
        name: id.to_string(),
    };
    ns.delete();
    teardown::dead_shim_sockets();
}

/// Tears down the nodes of test processes that died without doing it themselves.
fn clear_leftovers() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(FOLDER_PREFIX) {
            continue;
        }
        let owner = std::fs::read_to_string(entry.path().join("owner.pid")).unwrap_or_default();
        let alive = owner
            .trim()
            .parse::<u32>()
            .is_ok_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if alive {
            continue;
        }
        eprintln!("clearing the leftovers of node {name}");
        teardown::cgroups(&name);
        teardown::processes_naming(&entry.path().to_string_lossy());
        tear_down_rest(&name, &entry.path());
    }
}

/// The kubelet wants its cgroup root in every hierarchy before it starts.
fn create_cgroup_root(id: &str) {
    if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
        for entry in entries.flatten() {
            if entry.path().join("cgroup.procs").exists() {
                let _ = std::fs::create_dir_all(entry.path().join(id));
            }
        }
    }
}

/// The Pod network: one bridge, host-local addresses, no masquerading (nothing leaves).
fn cni_config(ipam_dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "switchyard-node",
        "plugins": [{
            "type": "bridge",
            "bridge": netns::BRIDGE,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "dataDir": ipam_dir,
                "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                "routes": [{"dst": "0.0.0.0/0"}]
            }
        }]
    })
    .to_string()
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&d) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    out.push(path);
                }
            }
        }
    }
    out.sort();
    out
}

async fn run_bounded(mut command: tokio::process::Command) -> Output {
    let line = format!("{command:?}");
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {line}: {e}"));
    tokio::time::timeout(COMMAND_WITHIN, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{line} did not finish within {COMMAND_WITHIN:?}"))
        .unwrap_or_else(|e| panic!("{line}: {e}"))
}
