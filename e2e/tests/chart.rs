//! The Helm chart `charts/switchyard`: it ships the CRDs of `crds/` unchanged and exactly
//! the ClusterRole the code needs; `helm lint --strict` and `helm template` pass for every
//! variant; what it renders keeps its promises (the probe port stays internal, operator and
//! Envoy agree on ports, the bootstrap is the one `src/bootstrap.rs` writes and Envoy
//! accepts it, with and without mutual TLS for xDS, restrictive security contexts); and a
//! real API server accepts the rendered
//! manifests (`kubectl apply --server-side --dry-run=server`).
//!
//! `UPDATE_CHART=1 cargo test -p switchyard-e2e --test chart` copies `crds/` into the chart
//! and regenerates `files/clusterrole-rules.yaml` from the code, then checks as usual.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use k8s_openapi::api::rbac::v1::PolicyRule;
use serde_json::Value;
use switchyard::bootstrap::{Bootstrap, XdsTls};
use switchyard::xds::Protocol;
use switchyard_e2e::kube::{self as rig, KubeApi};

const RELEASE: &str = "sy";
const FIELD_MANAGER: &str = "chart-test";
const CRDS: &[&str] = &[
    "trafficroutes.switchyard.dev",
    "proxyconfigs.switchyard.dev",
];
/// Where both pods mount their xDS TLS Secret (xds.tls.enabled).
const TLS_PATH: &str = "/etc/switchyard/xds-tls";
/// An image digest (a macro, so that `concat!` can use it in a `--set`).
macro_rules! digest {
    () => {
        "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    };
}

/// A set of `--set` values and what must hold of its rendering, on top of the invariants
/// every rendering keeps ([`check_invariants`]).
struct Variant {
    name: &'static str,
    set: &'static [&'static str],
    check: fn(&Rendered),
}

const VARIANTS: &[Variant] = &[
    Variant {
        name: "defaults",
        set: &[],
        check: |r| {
            assert_eq!(r.envoy_workload()["kind"], "Deployment");
            assert_eq!(r.envoy_workload()["spec"]["replicas"], 2);
            assert_eq!(r.operator()["spec"]["replicas"], 2);
            assert_eq!(
                r.bootstrap()["dynamic_resources"]["ads_config"]["api_type"],
                "DELTA_GRPC"
            );
            assert_eq!(r.public_service()["spec"]["type"], "LoadBalancer");
            assert_eq!(r.env("SWITCHYARD_HTTP_PORT"), "8080");
            assert_eq!(r.env("SWITCHYARD_HTTPS_PORT"), "8443");
            assert_eq!(r.env("SWITCHYARD_PROBE_PORT"), "8090");
            assert!(!r.has_env("SWITCHYARD_NAMESPACES"), "all namespaces");
            assert!(
                !r.has_env("SWITCHYARD_XDS_TLS_CERT"),
                "plaintext xDS by default"
            );
            assert_eq!(
                r.xds_service()["spec"]["ports"][0]["appProtocol"],
                "kubernetes.io/h2c"
            );
            assert_eq!(r.count("PodDisruptionBudget"), 2);
            assert_eq!(r.count("Secret"), 1);
            assert_eq!(r.count("ServiceAccount"), 2);
            let image = r.operator_pod()["containers"][0]["image"].clone();
            assert_eq!(image, "ghcr.io/switchyard/switchyard:0.1.0");
        },
    },
    Variant {
        name: "Envoy as a DaemonSet",
        set: &["envoy.kind=DaemonSet"],
        check: |r| {
            let envoy = r.envoy_workload();
            assert_eq!(envoy["kind"], "DaemonSet");
            assert!(envoy["spec"].get("replicas").is_none());
            assert!(envoy["spec"].get("strategy").is_none());
            assert_eq!(envoy["spec"]["updateStrategy"]["type"], "RollingUpdate");
            assert_eq!(r.count("Deployment"), 1, "only the operator");
        },
    },
    Variant {
        name: "3 replicas",
        set: &["replicas=3"],
        check: |r| assert_eq!(r.operator()["spec"]["replicas"], 3),
    },
    Variant {
        name: "state-of-the-world xDS",
        set: &["xds.protocol=sotw"],
        check: |r| {
            assert_eq!(
                r.bootstrap()["dynamic_resources"]["ads_config"]["api_type"],
                "GRPC"
            );
        },
    },
    Variant {
        name: "NodePort, other ports, own names and secret",
        set: &[
            "fullnameOverride=edge",
            "envoy.service.type=NodePort",
            "envoy.service.nodePorts.http=30080",
            "envoy.service.externalTrafficPolicy=Local",
            "envoy.ports.http=9080",
            "envoy.ports.https=9443",
            "envoy.ports.probe=9090",
            "envoy.adminPort=19901",
            "envoy.concurrency=2",
            "xds.port=18001",
            "adminPort=9001",
            "bindAddress=::",
            "probeToken.existingSecret=my-probe-token",
            "probeToken.existingSecretKey=value",
            "watchNamespaces={team-a,team-b}",
            "podDisruptionBudget.enabled=false",
            "envoy.podDisruptionBudget.maxUnavailable=25%",
            "serviceAccount.create=false",
            "envoy.serviceAccount.create=false",
            "leaderElection.leaseName=edge-lease",
        ],
        check: |r| {
            assert_eq!(r.env("SWITCHYARD_HTTP_PORT"), "9080");
            assert_eq!(r.env("SWITCHYARD_PROBE_PORT"), "9090");
            assert_eq!(r.env("SWITCHYARD_XDS_ADDRESS"), "[::]:18001");
            assert_eq!(r.env("SWITCHYARD_ADMIN_ADDRESS"), "[::]:9001");
            assert_eq!(r.env("SWITCHYARD_NAMESPACES"), "team-a,team-b");
            assert_eq!(r.env("SWITCHYARD_LEASE_NAME"), "edge-lease");
            assert_eq!(r.count("Secret"), 0, "the existing Secret is used");
            assert_eq!(r.count("ServiceAccount"), 0);
            assert_eq!(r.count("PodDisruptionBudget"), 1, "the Envoy one");
            let public = r.public_service();
            assert_eq!(public["metadata"]["name"], "edge-envoy");
            assert_eq!(public["spec"]["type"], "NodePort");
            assert_eq!(public["spec"]["externalTrafficPolicy"], "Local");
            assert_eq!(public["spec"]["ports"][0]["nodePort"], 30080);
            assert!(public["spec"]["ports"][1].get("nodePort").is_none());
            let args = r.envoy_args();
            assert!(
                args.windows(2).any(|w| w == ["--concurrency", "2"]),
                "{args:?}"
            );
            let admin = &r.bootstrap()["admin"]["address"]["socket_address"];
            assert_eq!(admin["port_value"], 19901);
        },
    },
    Variant {
        name: "mutual TLS for xDS",
        set: &["xds.tls.enabled=true"],
        check: |r| {
            assert_eq!(
                r.env("SWITCHYARD_XDS_TLS_CERT"),
                format!("{TLS_PATH}/tls.crt")
            );
            assert_eq!(
                r.env("SWITCHYARD_XDS_TLS_KEY"),
                format!("{TLS_PATH}/tls.key")
            );
            assert_eq!(
                r.env("SWITCHYARD_XDS_CLIENT_CA"),
                format!("{TLS_PATH}/ca.crt")
            );
            assert_eq!(
                r.tls_secret(r.operator_pod()),
                Some(format!("{RELEASE}-switchyard-xds-server-tls"))
            );
            assert_eq!(
                r.tls_secret(r.envoy_pod()),
                Some(format!("{RELEASE}-switchyard-xds-client-tls"))
            );
            assert_eq!(r.count("Secret"), 1, "the TLS Secrets are the user's");
            assert!(
                r.xds_service()["spec"]["ports"][0]
                    .get("appProtocol")
                    .is_none(),
                "not h2c: TLS"
            );
        },
    },
    Variant {
        name: "mutual TLS for xDS, own Secrets, sotw, DaemonSet",
        set: &[
            "xds.tls.enabled=true",
            "xds.tls.serverSecret=xds-server",
            "xds.tls.clientSecret=xds-client",
            "xds.protocol=sotw",
            "envoy.kind=DaemonSet",
            "fullnameOverride=edge",
        ],
        check: |r| {
            assert_eq!(r.tls_secret(r.operator_pod()), Some("xds-server".into()));
            assert_eq!(r.tls_secret(r.envoy_pod()), Some("xds-client".into()));
            assert_eq!(
                r.bootstrap()["dynamic_resources"]["ads_config"]["api_type"],
                "GRPC"
            );
        },
    },
    Variant {
        name: "LoadBalancer options, pinned images",
        set: &[
            "envoy.service.loadBalancerClass=example.com/lb",
            "envoy.service.loadBalancerSourceRanges={10.0.0.0/8}",
            "envoy.service.annotations.example\\.com/scheme=internet-facing",
            concat!("image.digest=", digest!()),
            "envoy.image.tag=v1.40.0",
            "imagePullSecrets[0].name=registry",
            "commonLabels.team=edge",
        ],
        check: |r| {
            let public = r.public_service();
            assert_eq!(public["spec"]["loadBalancerClass"], "example.com/lb");
            assert_eq!(public["spec"]["loadBalancerSourceRanges"][0], "10.0.0.0/8");
            let image = r.operator_pod()["containers"][0]["image"].clone();
            assert_eq!(image, concat!("ghcr.io/switchyard/switchyard@", digest!()));
            let envoy = r.envoy_pod()["containers"][0]["image"].clone();
            assert_eq!(envoy, "envoyproxy/envoy:v1.40.0");
            assert_eq!(r.envoy_pod()["imagePullSecrets"][0]["name"], "registry");
            assert!(
                r.objects
                    .iter()
                    .all(|o| o["metadata"]["labels"]["team"] == "edge")
            );
        },
    },
];

/// Values the chart must refuse, and a piece of the message.
const INVALID: &[(&[&str], &str)] = &[
    (&["xds.protocol=grpc"], "/xds/protocol"),
    (&["envoy.kind=StatefulSet"], "/envoy/kind"),
    (&["replicas=0"], "/replicas"),
    (&["envoy.service.ports.probe=8090"], "additional properties"),
    (&["tyop=1"], "additional properties"),
    (&["envoy.ports.probe=8080"], "must differ"),
    (&["envoy.preStopSleepSeconds=30"], "must be shorter"),
    (&["xds.tls.enabled=maybe"], "/xds/tls/enabled"),
    (&["xds.tls.secret=x"], "additional properties"),
];

// ------------------------------------------------------------------------------ tests --

#[test]
fn chart_crds_are_the_top_level_crds() {
    let top = repo().join("crds");
    let chart = chart().join("crds");
    if updating() {
        let _ = std::fs::remove_dir_all(&chart);
        std::fs::create_dir_all(&chart).expect("create the chart's crds/");
        for name in yaml_files(&top) {
            std::fs::copy(top.join(&name), chart.join(&name)).expect("copy a CRD");
        }
    }
    let names = yaml_files(&top);
    assert_eq!(names.len(), CRDS.len(), "crds/ holds {names:?}");
    assert_eq!(
        names,
        yaml_files(&chart),
        "charts/switchyard/crds/ must hold the files of crds/ \
         (UPDATE_CHART=1 cargo test -p switchyard-e2e --test chart)"
    );
    for name in &names {
        assert!(
            read(&top.join(name)) == read(&chart.join(name)),
            "charts/switchyard/crds/{name} differs from crds/{name} \
             (UPDATE_CHART=1 cargo test -p switchyard-e2e --test chart)"
        );
    }
}

/// The Gateway API CRDs (standard channel) of the release Switchyard speaks, as its Go
/// module ships them, one document each, with Helm's keep policy: uninstalling the chart
/// must not delete every Gateway and HTTPRoute of the cluster.
fn gateway_api_crds() -> String {
    let dir = std::fs::canonicalize(rig::tool("gateway-api")).expect("the Gateway API CRDs");
    let mut out = String::from(
        "# The Gateway API CRDs, standard channel, of the release src/gateway/api is generated\n\
         # from (e2e/provision.sh, GATEWAY_API_VERSION), each with Helm's keep policy. Written\n\
         # by UPDATE_CHART=1 cargo test -p switchyard-e2e --test chart; never by hand.\n",
    );
    let crds = yaml_files(&dir)
        .into_iter()
        .filter(|name| !name.contains("_vap_"));
    for name in crds {
        let text = read(&dir.join(&name));
        let kept = text.replacen(
            "metadata:\n  annotations:\n",
            "metadata:\n  annotations:\n    helm.sh/resource-policy: keep\n",
            1,
        );
        assert_ne!(
            kept, text,
            "{name}: no metadata.annotations to add the keep policy to"
        );
        out.push_str("---\n");
        out.push_str(&kept);
    }
    out
}

#[test]
fn chart_gateway_api_crds_are_the_release_s_and_installed_only_when_asked() {
    let file = chart().join("files/gateway-api-crds.yaml");
    let wanted = gateway_api_crds();
    if updating() {
        std::fs::write(&file, &wanted).expect("write the Gateway API CRDs");
    }
    assert!(
        read(&file) == wanted,
        "charts/switchyard/files/gateway-api-crds.yaml is not the release's CRDs \
         (UPDATE_CHART=1 cargo test -p switchyard-e2e --test chart)"
    );
    let asked = render("switchyard-system", &["gatewayAPI.installCRDs=true"]);
    let names: BTreeSet<String> = asked
        .all("CustomResourceDefinition")
        .map(|c| {
            c["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    for kind in [
        "gatewayclasses",
        "gateways",
        "httproutes",
        "referencegrants",
    ] {
        assert!(
            names.contains(&format!("{kind}.gateway.networking.k8s.io")),
            "{kind} missing: {names:?}"
        );
    }
    for crd in asked.all("CustomResourceDefinition") {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{}",
            crd["metadata"]["name"]
        );
    }
    let default = render("switchyard-system", &[]);
    assert_eq!(
        default.count("CustomResourceDefinition"),
        0,
        "only when asked"
    );
}

#[test]
fn chart_cluster_role_is_what_the_code_needs() {
    let wanted = switchyard::k8s::rbac::cluster_role("switchyard")
        .rules
        .expect("the code's rules");
    let file = chart().join("files/clusterrole-rules.yaml");
    if updating() {
        let header: String = read(&file)
            .lines()
            .take_while(|l| l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        let yaml = serde_saphyr::to_string(&wanted).expect("rules as YAML");
        std::fs::write(&file, format!("{header}{yaml}")).expect("write the rules");
    }
    let rendered = render("switchyard-system", &[]);
    let role = rendered.one("ClusterRole");
    let rules: Vec<PolicyRule> =
        serde_json::from_value(role["rules"].clone()).expect("the chart's rules");
    assert_eq!(
        rules, wanted,
        "the chart's ClusterRole (charts/switchyard/files/clusterrole-rules.yaml) is not \
         what `switchyard rbac` prints (UPDATE_CHART=1 cargo test -p switchyard-e2e --test chart)"
    );
    let binding = rendered.one("ClusterRoleBinding");
    assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{
            "kind": "ServiceAccount",
            "name": rendered.operator_pod()["serviceAccountName"],
            "namespace": "switchyard-system",
        }])
    );
    // No other RBAC object grants anything.
    assert_eq!(rendered.count("Role") + rendered.count("RoleBinding"), 0);
}

#[test]
fn helm_lint_and_template_pass_for_every_variant() {
    for variant in VARIANTS {
        let mut args = vec!["lint".to_string(), "--strict".to_string()];
        args.push(chart().display().to_string());
        args.extend(set_args(variant.set));
        let out = helm(&args);
        let text = output_text(&out);
        assert!(
            out.status.success(),
            "helm lint --strict, {}: {text}",
            variant.name
        );
        assert!(
            text.contains("0 chart(s) failed") && !text.contains("[WARNING]"),
            "helm lint --strict, {}: {text}",
            variant.name
        );

        let rendered = render("switchyard-system", variant.set);
        check_invariants(&rendered, "switchyard-system");
        (variant.check)(&rendered);
        eprintln!(
            "{:<45} {} objects: {}",
            variant.name,
            rendered.objects.len(),
            rendered.kinds()
        );
    }
    for (set, message) in INVALID {
        let out = helm_template("switchyard-system", set, &[]);
        let text = output_text(&out);
        assert!(!out.status.success(), "helm template {set:?} succeeded");
        assert!(
            text.contains(message),
            "helm template {set:?}: expected {message:?} in: {text}"
        );
    }
}

/// The bootstrap the chart ships is the one `src/bootstrap.rs` writes for the same
/// Service, port and protocol (the node id comes from `--service-node`), and Envoy accepts
/// it with the arguments the chart gives it.
#[test]
fn envoy_bootstrap_is_the_code_s_and_envoy_accepts_it() {
    let cases: [(&[&str], Protocol, bool); 4] = [
        (&[], Protocol::Delta, false),
        (&["xds.protocol=sotw"], Protocol::Sotw, false),
        (&["xds.tls.enabled=true"], Protocol::Delta, true),
        (
            &["xds.tls.enabled=true", "xds.protocol=sotw"],
            Protocol::Sotw,
            true,
        ),
    ];
    // Envoy reads the TLS files when it validates: real ones, from certgen.
    let certs = tempfile::tempdir().expect("a temporary folder");
    let bundle = switchyard::certgen::generate(&["localhost".to_string()], 1).expect("certgen");
    for (file, text) in [
        ("tls.crt", &bundle.client.cert_pem),
        ("tls.key", &bundle.client.key_pem),
        ("ca.crt", &bundle.ca.cert_pem),
    ] {
        std::fs::write(certs.path().join(file), text).expect("write a certificate");
    }
    for (set, protocol, tls) in cases {
        let namespace = "edge";
        let rendered = render(namespace, set);
        let xds = rendered.one_named("Service", &format!("{RELEASE}-switchyard-xds"));
        let xds_port = xds["spec"]["ports"][0]["port"].as_u64().expect("a port");
        let expected = Bootstrap {
            node_id: String::new(),
            node_cluster: format!("{RELEASE}-switchyard-envoy"),
            xds: vec![(
                format!("{RELEASE}-switchyard-xds.{namespace}.svc.cluster.local"),
                u16::try_from(xds_port).expect("a port"),
            )],
            protocol,
            admin_address: "127.0.0.1".to_string(),
            admin_port: 9901,
            listen_address: None,
            tls: tls.then(|| XdsTls {
                cert: format!("{TLS_PATH}/tls.crt"),
                key: format!("{TLS_PATH}/tls.key"),
                ca: format!("{TLS_PATH}/ca.crt"),
            }),
        };
        let mut expected: Value =
            serde_saphyr::from_str(&expected.to_yaml()).expect("the code's bootstrap");
        expected["node"].as_object_mut().expect("node").remove("id");
        assert_eq!(rendered.bootstrap(), expected, "{set:?}");

        let dir = tempfile::tempdir().expect("a temporary folder");
        let path = dir.path().join("bootstrap.yaml");
        let text = rendered
            .bootstrap_text()
            .replace(TLS_PATH, &certs.path().display().to_string());
        assert_eq!(text.contains("transport_socket"), tls, "{set:?}");
        std::fs::write(&path, text).expect("write the bootstrap");
        let args: Vec<String> = rendered
            .envoy_args()
            .iter()
            .map(|a| {
                if a == "/etc/envoy/bootstrap.yaml" {
                    path.display().to_string()
                } else {
                    a.replace("$(POD_NAME)", "edge-envoy-0")
                }
            })
            .collect();
        assert!(args.contains(&path.display().to_string()), "{args:?}");
        let out = Command::new(switchyard_e2e::envoy_binary())
            .args(["--mode", "validate"])
            .args(&args)
            .output()
            .expect("run envoy");
        assert!(
            out.status.success(),
            "envoy --mode validate {args:?}: {}",
            output_text(&out)
        );
    }
}

#[tokio::test]
async fn rendered_manifests_apply_to_a_real_api_server() {
    let api = KubeApi::shared().await;
    let client = api.client().await;
    install_crds(&api).await;
    let namespace = rig::unique_name("chart");
    rig::create_namespace(&client, &namespace).await;
    for variant in VARIANTS {
        let out = helm_template(&namespace, variant.set, &[]);
        assert!(
            out.status.success(),
            "helm template, {}: {}",
            variant.name,
            output_text(&out)
        );
        let manifests = String::from_utf8_lossy(&out.stdout).into_owned();
        let started = Instant::now();
        let out = api
            .kubectl_input(
                [
                    "apply",
                    "--server-side",
                    "--dry-run=server",
                    &format!("--field-manager={FIELD_MANAGER}"),
                    "-f",
                    "-",
                ],
                &manifests,
            )
            .await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "kubectl apply --server-side --dry-run=server, {}: {stderr}",
            variant.name
        );
        // Warnings (deprecated fields, unknown fields) come on stderr even on success.
        assert!(
            stderr.trim().is_empty(),
            "kubectl apply --dry-run=server, {}, warned: {stderr}",
            variant.name
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        eprintln!(
            "{:<45} {} objects accepted in {:.2?}",
            variant.name,
            stdout
                .lines()
                .filter(|l| l.contains("(server dry run)"))
                .count(),
            started.elapsed()
        );
        assert_eq!(
            stdout
                .lines()
                .filter(|l| l.contains("(server dry run)"))
                .count(),
            manifests.matches("\nkind: ").count(),
            "every object is accepted: {stdout}"
        );
    }

    // The Secrets `switchyard certgen --kubernetes` prints for the TLS variant's defaults.
    let secrets = switchyard::certgen::generate(
        &switchyard::certgen::default_server_names(
            &format!("{RELEASE}-switchyard-xds"),
            &namespace,
        ),
        1,
    )
    .expect("certgen")
    .kubernetes_secrets(
        &namespace,
        &format!("{RELEASE}-switchyard-xds-server-tls"),
        &format!("{RELEASE}-switchyard-xds-client-tls"),
    )
    .expect("the Secrets");
    let out = api
        .kubectl_input(
            [
                "apply",
                "--server-side",
                "--dry-run=server",
                &format!("--field-manager={FIELD_MANAGER}"),
                "-f",
                "-",
            ],
            &secrets,
        )
        .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "certgen's Secrets: {stderr}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("secret/") && l.contains("(server dry run)"))
            .count(),
        2
    );
    rig::delete_namespace(&client, &namespace).await;
}

/// The chart generates the probe token once and keeps it on every later render against the
/// cluster (`lookup`): a new token on an upgrade would leave replicas disagreeing.
#[tokio::test]
async fn the_generated_probe_token_is_kept() {
    let api = KubeApi::shared().await;
    let client = api.client().await;
    let namespace = rig::unique_name("chart-token");
    rig::create_namespace(&client, &namespace).await;

    let first = render(&namespace, &[]);
    let secret = first.one("Secret");
    let token = secret["data"]["token"]
        .as_str()
        .expect("a token")
        .to_string();
    let again = render(&namespace, &[]);
    assert_ne!(
        again.one("Secret")["data"]["token"],
        token.as_str(),
        "without a cluster to look in, every render makes a new token"
    );
    let decoded = base64_decode(&token);
    assert_eq!(decoded.len(), 32, "32 characters");
    assert!(decoded.iter().all(u8::is_ascii_alphanumeric));

    // As `helm install` would have created it: with Helm's ownership annotations.
    let mut secret = secret.clone();
    secret["metadata"]["annotations"] = serde_json::json!({
        "meta.helm.sh/release-name": RELEASE,
        "meta.helm.sh/release-namespace": namespace,
    });
    let json = serde_json::to_string(&secret).expect("JSON");
    let out = api
        .kubectl_input(
            [
                "apply",
                "--server-side",
                &format!("--field-manager={FIELD_MANAGER}"),
                "-f",
                "-",
            ],
            &json,
        )
        .await;
    assert!(
        out.status.success(),
        "apply the Secret: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kubeconfig = api.kubeconfig.display().to_string();
    let out = helm_template(
        &namespace,
        &[],
        &[
            "--dry-run=server",
            "--skip-crds",
            "--kubeconfig",
            &kubeconfig,
        ],
    );
    assert!(
        out.status.success(),
        "helm template --dry-run=server: {}",
        output_text(&out)
    );
    let upgraded = Rendered::parse(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        upgraded.one("Secret")["data"]["token"],
        token.as_str(),
        "the token in the cluster is kept"
    );
    rig::delete_namespace(&client, &namespace).await;
}

// ------------------------------------------------------------------ invariants --

/// What every rendering keeps, whatever the values.
fn check_invariants(r: &Rendered, namespace: &str) {
    for object in &r.objects {
        let kind = object["kind"].as_str().unwrap_or_default();
        if !matches!(kind, "ClusterRole" | "ClusterRoleBinding" | "FlowSchema") {
            assert_eq!(
                object["metadata"]["namespace"], namespace,
                "{kind} namespace"
            );
        }
        let labels = &object["metadata"]["labels"];
        assert_eq!(
            labels["app.kubernetes.io/instance"], RELEASE,
            "{kind} labels"
        );
        assert!(
            labels["app.kubernetes.io/component"].is_string(),
            "{kind} labels"
        );
    }

    // The Lease requests' FlowSchema names the operator's ServiceAccount and namespace.
    assert_eq!(r.count("FlowSchema"), 1, "the Lease requests' FlowSchema");
    for schema in r.all("FlowSchema") {
        let rule = &schema["spec"]["rules"][0];
        assert_eq!(
            rule["subjects"][0]["serviceAccount"],
            serde_json::json!({
                "name": r.operator_pod()["serviceAccountName"],
                "namespace": namespace,
            }),
            "the FlowSchema's subject"
        );
        assert_eq!(
            rule["resourceRules"][0]["resources"],
            serde_json::json!(["leases"])
        );
        assert_eq!(
            rule["resourceRules"][0]["namespaces"],
            serde_json::json!([namespace])
        );
    }

    // The probe port: on every Envoy, in the fleet Service, never in the public one.
    let probe_port = r.env("SWITCHYARD_PROBE_PORT");
    let envoy_ports = container_ports(&r.envoy_pod()["containers"][0]);
    assert_eq!(
        envoy_ports["http"].to_string(),
        r.env("SWITCHYARD_HTTP_PORT")
    );
    assert_eq!(
        envoy_ports["https"].to_string(),
        r.env("SWITCHYARD_HTTPS_PORT")
    );
    assert_eq!(envoy_ports["probe"].to_string(), probe_port);
    let public = r.public_service();
    let public_ports = &public["spec"]["ports"];
    let target_ports: BTreeSet<&str> = public_ports
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| p["targetPort"].as_str().expect("named target ports"))
        .collect();
    assert_eq!(
        target_ports,
        BTreeSet::from(["http", "https"]),
        "public Service ports"
    );
    assert!(
        public_ports
            .as_array()
            .expect("ports")
            .iter()
            .all(|p| p["port"].as_u64() != probe_port.parse().ok()),
        "the public Service must not expose the probe port: {public_ports}"
    );
    let fleet = r.fleet_service();
    assert_eq!(
        fleet["spec"]["clusterIP"], "None",
        "the fleet Service is headless"
    );
    assert_eq!(fleet["spec"]["ports"].as_array().map(Vec::len), Some(1));
    assert_eq!(fleet["spec"]["ports"][0]["targetPort"], "probe");
    assert_eq!(fleet["spec"]["ports"][0]["port"].to_string(), probe_port);
    assert_ne!(fleet["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(
        r.env("SWITCHYARD_ENVOY_SERVICE"),
        format!(
            "{namespace}/{}",
            fleet["metadata"]["name"].as_str().unwrap_or_default()
        )
    );

    // Selectors: the Envoy Services pick the Envoys, the xDS Service the operator.
    let envoy_labels = &r.envoy_workload()["spec"]["template"]["metadata"]["labels"];
    let operator_labels = &r.operator()["spec"]["template"]["metadata"]["labels"];
    for service in [public, fleet] {
        assert!(selects(&service["spec"]["selector"], envoy_labels));
        assert!(!selects(&service["spec"]["selector"], operator_labels));
    }
    let xds = r
        .objects
        .iter()
        .find(|o| o["kind"] == "Service" && component(o) == "operator")
        .expect("the xDS Service");
    assert!(selects(&xds["spec"]["selector"], operator_labels));
    assert!(!selects(&xds["spec"]["selector"], envoy_labels));
    assert!(selects(
        &r.envoy_workload()["spec"]["selector"]["matchLabels"],
        envoy_labels
    ));
    assert!(selects(
        &r.operator()["spec"]["selector"]["matchLabels"],
        operator_labels
    ));
    for pdb in r.all("PodDisruptionBudget") {
        let selector = &pdb["spec"]["selector"]["matchLabels"];
        assert!(selects(selector, envoy_labels) ^ selects(selector, operator_labels));
    }

    // xDS: the operator listens where the Service sends, the bootstrap names the Service.
    let operator_ports = container_ports(&r.operator_pod()["containers"][0]);
    let xds_port = &xds["spec"]["ports"][0];
    assert_eq!(xds_port["targetPort"], "xds");
    assert!(
        r.env("SWITCHYARD_XDS_ADDRESS")
            .ends_with(&format!(":{}", operator_ports["xds"])),
        "{} vs {operator_ports:?}",
        r.env("SWITCHYARD_XDS_ADDRESS")
    );
    assert!(
        r.env("SWITCHYARD_ADMIN_ADDRESS")
            .ends_with(&format!(":{}", operator_ports["admin"]))
    );
    let bootstrap = r.bootstrap();
    let cluster = &bootstrap["static_resources"]["clusters"][0];
    assert_eq!(cluster["type"], "STRICT_DNS");
    let address = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        ["socket_address"];
    assert_eq!(
        address["address"],
        format!(
            "{}.{namespace}.svc.cluster.local",
            xds["metadata"]["name"].as_str().unwrap_or_default()
        )
    );
    assert_eq!(address["port_value"], xds_port["port"]);
    assert_eq!(
        bootstrap["admin"]["address"]["socket_address"]["address"], "127.0.0.1",
        "Envoy's admin interface stays on loopback"
    );
    let volumes = &r.envoy_pod()["volumes"];
    assert!(
        volumes
            .as_array()
            .expect("volumes")
            .iter()
            .any(|v| v["configMap"]["name"] == r.one("ConfigMap")["metadata"]["name"])
    );

    // xDS TLS: both sides or neither. The operator reads its files from its Secret's
    // mount; the bootstrap reads Envoy's from its mount, and checks the Service's name.
    let transport_socket = cluster.get("transport_socket");
    if r.has_env("SWITCHYARD_XDS_TLS_CERT") {
        for (name, file) in [
            ("SWITCHYARD_XDS_TLS_CERT", "tls.crt"),
            ("SWITCHYARD_XDS_TLS_KEY", "tls.key"),
            ("SWITCHYARD_XDS_CLIENT_CA", "ca.crt"),
        ] {
            assert_eq!(
                r.env(name),
                format!("{}/{file}", r.tls_mount(r.operator_pod())),
                "{name}"
            );
        }
        let socket = transport_socket.expect("the bootstrap's xDS cluster speaks TLS");
        let context = &socket["typed_config"];
        assert_eq!(
            context["@type"],
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
        );
        assert_eq!(context["sni"], address["address"]);
        let common = &context["common_tls_context"];
        let mount = r.tls_mount(r.envoy_pod());
        let files = [
            &common["tls_certificates"][0]["certificate_chain"]["filename"],
            &common["tls_certificates"][0]["private_key"]["filename"],
            &common["validation_context"]["trusted_ca"]["filename"],
        ];
        for (file, name) in files.into_iter().zip(["tls.crt", "tls.key", "ca.crt"]) {
            assert_eq!(*file, format!("{mount}/{name}"));
        }
        assert_eq!(
            common["validation_context"]["match_typed_subject_alt_names"],
            serde_json::json!([{ "san_type": "DNS", "matcher": { "exact": address["address"] } }])
        );
    } else {
        assert!(transport_socket.is_none(), "plaintext on both sides");
        assert!(r.tls_secret(r.operator_pod()).is_none());
        assert!(r.tls_secret(r.envoy_pod()).is_none());
    }

    // The probe token: the generated Secret, or the user's.
    let token = r.operator_pod()["containers"][0]["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == "SWITCHYARD_PROBE_TOKEN")
        .expect("SWITCHYARD_PROBE_TOKEN")["valueFrom"]["secretKeyRef"]
        .clone();
    let annotations = &r.operator()["spec"]["template"]["metadata"]["annotations"];
    if let Some(secret) = r.all("Secret").next() {
        assert_eq!(token["name"], secret["metadata"]["name"]);
        let value = secret["data"][token["key"].as_str().expect("a key")]
            .as_str()
            .expect("the token");
        // A new token rolls every replica, so that they all serve the same one.
        let digest = ring::digest::digest(&ring::digest::SHA256, value.as_bytes());
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(annotations["checksum/probe-token"], hex.as_str());
    } else {
        assert!(annotations.get("checksum/probe-token").is_none());
    }
    for name in ["POD_NAME", "POD_NAMESPACE"] {
        assert!(
            r.operator_pod()["containers"][0]["env"]
                .as_array()
                .expect("env")
                .iter()
                .any(|e| e["name"] == name && e["valueFrom"]["fieldRef"].is_object()),
            "{name} from the downward API"
        );
    }

    // Probes.
    let operator = &r.operator_pod()["containers"][0];
    assert_eq!(operator["args"][0], "operator");
    assert_eq!(operator["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(operator["livenessProbe"]["httpGet"]["port"], "admin");
    assert_eq!(operator["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(operator["readinessProbe"]["httpGet"]["port"], "admin");
    let envoy = &r.envoy_pod()["containers"][0];
    // The path Envoy answers itself on the probe port (a hung one does not).
    assert_eq!(
        envoy["readinessProbe"]["httpGet"]["path"],
        switchyard::translate::READINESS_PATH
    );
    assert_eq!(envoy["readinessProbe"]["httpGet"]["port"], "probe");
    assert!(envoy.get("livenessProbe").is_none());

    // Restrictive security contexts, resource requests, no API token for Envoy.
    for (what, pod) in [("operator", r.operator_pod()), ("envoy", r.envoy_pod())] {
        let context = &pod["securityContext"];
        assert_eq!(context["runAsNonRoot"], true, "{what}");
        assert_eq!(
            context["seccompProfile"]["type"], "RuntimeDefault",
            "{what}"
        );
        for container in pod["containers"].as_array().expect("containers") {
            let context = &container["securityContext"];
            assert_eq!(context["readOnlyRootFilesystem"], true, "{what}");
            assert_eq!(context["allowPrivilegeEscalation"], false, "{what}");
            assert_eq!(context["privileged"], false, "{what}");
            assert_eq!(
                context["capabilities"]["drop"],
                serde_json::json!(["ALL"]),
                "{what}"
            );
            assert!(context["capabilities"].get("add").is_none(), "{what}");
            assert!(
                container["resources"]["requests"]["cpu"].is_string(),
                "{what}"
            );
            assert!(
                container["resources"]["requests"]["memory"].is_string(),
                "{what}"
            );
        }
    }
    assert_eq!(r.envoy_pod()["automountServiceAccountToken"], false);
}

fn selects(selector: &Value, labels: &Value) -> bool {
    let selector = selector.as_object().expect("a selector");
    !selector.is_empty() && selector.iter().all(|(k, v)| labels[k] == *v)
}

fn component(object: &Value) -> &str {
    object["metadata"]["labels"]["app.kubernetes.io/component"]
        .as_str()
        .unwrap_or_default()
}

/// name → containerPort.
fn container_ports(container: &Value) -> BTreeMap<String, u64> {
    container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().expect("named ports").to_string(),
                p["containerPort"].as_u64().expect("a port"),
            )
        })
        .collect()
}

// ------------------------------------------------------------------ rendering --

/// The objects `helm template` printed.
struct Rendered {
    objects: Vec<Value>,
}

impl Rendered {
    fn parse(yaml: &str) -> Rendered {
        let objects: Vec<Value> = serde_saphyr::from_multiple(yaml)
            .unwrap_or_else(|e| panic!("the rendered manifests are not YAML: {e}\n{yaml}"));
        Rendered {
            objects: objects.into_iter().filter(|o| !o.is_null()).collect(),
        }
    }

    fn all<'a>(&'a self, kind: &str) -> impl Iterator<Item = &'a Value> + use<'a> {
        let kind = kind.to_string();
        self.objects
            .iter()
            .filter(move |o| o["kind"] == kind.as_str())
    }

    fn count(&self, kind: &str) -> usize {
        self.all(kind).count()
    }

    fn one(&self, kind: &str) -> &Value {
        let all: Vec<&Value> = self.all(kind).collect();
        assert_eq!(all.len(), 1, "one {kind}");
        all[0]
    }

    fn one_named(&self, kind: &str, name: &str) -> &Value {
        self.all(kind)
            .find(|o| o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    }

    fn kinds(&self) -> String {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for object in &self.objects {
            *counts
                .entry(object["kind"].as_str().unwrap_or("?"))
                .or_default() += 1;
        }
        counts
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn operator(&self) -> &Value {
        self.objects
            .iter()
            .find(|o| o["kind"] == "Deployment" && component(o) == "operator")
            .expect("the operator Deployment")
    }

    fn operator_pod(&self) -> &Value {
        &self.operator()["spec"]["template"]["spec"]
    }

    fn envoy_workload(&self) -> &Value {
        let all: Vec<&Value> = self
            .objects
            .iter()
            .filter(|o| {
                (o["kind"] == "Deployment" || o["kind"] == "DaemonSet") && component(o) == "envoy"
            })
            .collect();
        assert_eq!(all.len(), 1, "one Envoy workload");
        all[0]
    }

    fn envoy_pod(&self) -> &Value {
        &self.envoy_workload()["spec"]["template"]["spec"]
    }

    fn envoy_args(&self) -> Vec<String> {
        let container = &self.envoy_pod()["containers"][0];
        assert_eq!(container["command"], serde_json::json!(["envoy"]));
        container["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("string args").to_string())
            .collect()
    }

    fn envoy_services(&self) -> impl Iterator<Item = &Value> {
        self.all("Service").filter(|s| component(s) == "envoy")
    }

    fn public_service(&self) -> &Value {
        let all: Vec<&Value> = self
            .envoy_services()
            .filter(|s| s["spec"]["clusterIP"] != "None")
            .collect();
        assert_eq!(all.len(), 1, "one public Envoy Service");
        all[0]
    }

    fn fleet_service(&self) -> &Value {
        let all: Vec<&Value> = self
            .envoy_services()
            .filter(|s| s["spec"]["clusterIP"] == "None")
            .collect();
        assert_eq!(all.len(), 1, "one headless fleet Service");
        all[0]
    }

    fn xds_service(&self) -> &Value {
        self.objects
            .iter()
            .find(|o| o["kind"] == "Service" && component(o) == "operator")
            .expect("the xDS Service")
    }

    /// The Secret behind the pod's `xds-tls` volume, if it has one.
    fn tls_secret(&self, pod: &Value) -> Option<String> {
        pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == "xds-tls")
            .map(|v| {
                v["secret"]["secretName"]
                    .as_str()
                    .expect("a Secret volume")
                    .to_string()
            })
    }

    /// Where the pod's first container mounts the `xds-tls` volume (read-only).
    fn tls_mount(&self, pod: &Value) -> String {
        let mount = pod["containers"][0]["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["name"] == "xds-tls")
            .expect("the xds-tls volume is mounted");
        assert_eq!(mount["readOnly"], true);
        assert!(self.tls_secret(pod).is_some(), "from a Secret");
        mount["mountPath"].as_str().expect("a path").to_string()
    }

    fn has_env(&self, name: &str) -> bool {
        self.operator_pod()["containers"][0]["env"]
            .as_array()
            .expect("env")
            .iter()
            .any(|e| e["name"] == name)
    }

    /// The operator's environment variable `name` (a plain value).
    fn env(&self, name: &str) -> String {
        self.operator_pod()["containers"][0]["env"]
            .as_array()
            .expect("env")
            .iter()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("no value for {name}"))
            .to_string()
    }

    fn bootstrap_text(&self) -> &str {
        self.one("ConfigMap")["data"]["bootstrap.yaml"]
            .as_str()
            .expect("bootstrap.yaml")
    }

    fn bootstrap(&self) -> Value {
        serde_saphyr::from_str(self.bootstrap_text()).expect("the bootstrap is YAML")
    }
}

/// `helm template` of the chart in `namespace` with `--set` values; panics on failure.
fn render(namespace: &str, set: &[&str]) -> Rendered {
    let out = helm_template(namespace, set, &[]);
    assert!(
        out.status.success(),
        "helm template {set:?}: {}",
        output_text(&out)
    );
    Rendered::parse(&String::from_utf8_lossy(&out.stdout))
}

fn helm_template(namespace: &str, set: &[&str], extra: &[&str]) -> Output {
    let mut args: Vec<String> = vec![
        "template".into(),
        RELEASE.into(),
        chart().display().to_string(),
        "--namespace".into(),
        namespace.into(),
    ];
    args.extend(set_args(set));
    args.extend(extra.iter().map(|a| a.to_string()));
    helm(&args)
}

fn set_args(set: &[&str]) -> Vec<String> {
    set.iter()
        .flat_map(|s| ["--set".to_string(), s.to_string()])
        .collect()
}

/// Runs the provisioned helm with its own (empty) cache, config and data folders.
fn helm(args: &[String]) -> Output {
    let home = tempfile::tempdir().expect("a temporary folder");
    Command::new(rig::tool("helm"))
        .args(args)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .env_remove("KUBECONFIG")
        .output()
        .unwrap_or_else(|e| panic!("run helm {args:?}: {e}"))
}

// ---------------------------------------------------------------------- helpers --

/// Applies the chart's CRDs for real (as the README tells users to, before the chart) and
/// waits until they are Established.
async fn install_crds(api: &KubeApi) {
    let dir = chart().join("crds").display().to_string();
    api.kubectl_ok([
        "apply",
        "--server-side",
        "--force-conflicts",
        &format!("--field-manager={FIELD_MANAGER}"),
        "-f",
        &dir,
    ])
    .await;
    api.wait_established(CRDS).await;
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart() -> PathBuf {
    repo().join("charts/switchyard")
}

fn updating() -> bool {
    std::env::var("UPDATE_CHART").as_deref() == Ok("1")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The *.yaml files of `dir`, sorted.
fn yaml_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| {
            e.expect("a folder entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    names
}

fn output_text(out: &Output) -> String {
    format!(
        "({}) {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("base64")
}
