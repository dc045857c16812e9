use super::*;
use crate::api::proxy_config::{
    ResolvedBackend, ResolvedListener, ResolvedRule, ResolvedTls, ResolvedVirtualHost,
};
use crate::api::{ProxyConfig, ProxyConfigRole, ProxyConfigSpec};
use crate::k8s::fixtures::{self, cluster};
use crate::translate::Translator;

fn live(route: &str, services: &[&str], version: &str) -> ProxyConfig {
    let mut pc = ProxyConfig::new(
        &format!("{route}-live"),
        ProxyConfigSpec {
            drain_period: None,
            members: Vec::new(),
            listener: None,
            route_created: None,
            role: ProxyConfigRole::Live,
            route: route.into(),
            generation: 1,
            version: "v1".into(),
            virtual_host: Some(ResolvedVirtualHost {
                hosts: vec![format!("{route}.test")],
                tls: None,
                rules: vec![ResolvedRule {
                    name: "all".into(),
                    backends: services
                        .iter()
                        .map(|s| ResolvedBackend {
                            cluster: cluster(s),
                            weight: 1,
                            request_headers: None,
                        })
                        .collect(),
                    ..Default::default()
                }],
            }),
            clusters: services.iter().map(|s| cluster(s)).collect(),
            kept_clusters: Vec::new(),
        },
    );
    pc.metadata.namespace = Some("shop".into());
    pc.metadata.resource_version = Some(version.into());
    pc
}

fn probe(route: &str, services: &[&str], version: &str) -> ProxyConfig {
    let mut pc = live(route, services, version);
    pc.metadata.name = Some(format!("{route}-probe"));
    pc.spec.role = ProxyConfigRole::Probe;
    pc.spec.version = "v2".into();
    pc.spec.virtual_host = None;
    pc
}

fn slice(name: &str, service: &str, addresses: &[&str], version: &str) -> EndpointSlice {
    let mut slice = fixtures::slice(name, service);
    slice.metadata.resource_version = Some(version.into());
    slice.endpoints = Some(addresses.iter().map(|a| fixtures::endpoint(a)).collect());
    slice.ports = Some(vec![fixtures::port("http", 8080)]);
    slice
}

fn listeners() -> ListenerSettings {
    crate::model::Config::default().listeners
}

/// The keys whose objects differ between `before` and `now`: what the watchers would
/// report.
fn changed<V: serde::Serialize>(
    before: &HashMap<ObjectKey, Arc<V>>,
    now: &HashMap<ObjectKey, Arc<V>>,
) -> BTreeSet<ObjectKey> {
    let json = |v: Option<&Arc<V>>| v.map(|v| serde_json::to_value(v.as_ref()).ok());
    before
        .keys()
        .chain(now.keys())
        .filter(|key| json(before.get(*key)) != json(now.get(*key)))
        .cloned()
        .collect()
}

/// A builder's model cache and translator, stepped as the builder steps them: the
/// objects that changed since the last step, or a full build when it must.
struct Rig {
    cache: ModelCache,
    translator: Translator,
    objects: ObjectMaps,
    /// The TLS Secrets the watch holds.
    secrets: BTreeMap<(String, String), TlsData>,
}

impl Rig {
    fn new() -> Self {
        Self {
            cache: ModelCache::default(),
            translator: Translator::new(),
            objects: ObjectMaps::default(),
            secrets: BTreeMap::new(),
        }
    }

    /// One step; the translator must end where a fresh translation of a full model of
    /// the same inputs does. True when the step was a full build.
    fn step(&mut self, proxy_configs: &[&ProxyConfig], slices: &[&EndpointSlice]) -> bool {
        let now = ObjectMaps::new(proxy_configs, slices);
        let touched = Touched {
            proxy_configs: changed(&self.objects.proxy_configs, &now.proxy_configs),
            endpoint_slices: changed(&self.objects.endpoint_slices, &now.endpoint_slices),
        };
        self.step_touched(now, &touched, proxy_configs, slices)
    }

    /// A step told that every object changed (as after a watcher's relist): the
    /// unchanged ones must be passed over.
    fn step_all_touched(
        &mut self,
        proxy_configs: &[&ProxyConfig],
        slices: &[&EndpointSlice],
    ) -> bool {
        let now = ObjectMaps::new(proxy_configs, slices);
        let touched = Touched {
            proxy_configs: now.proxy_configs.keys().cloned().collect(),
            endpoint_slices: now.endpoint_slices.keys().cloned().collect(),
        };
        self.step_touched(now, &touched, proxy_configs, slices)
    }

    fn step_touched(
        &mut self,
        now: ObjectMaps,
        touched: &Touched,
        proxy_configs: &[&ProxyConfig],
        slices: &[&EndpointSlice],
    ) -> bool {
        self.objects = now;
        let secrets = self.secrets.clone();
        let listeners = listeners();
        let inputs = Inputs {
            listeners: listeners.clone(),
            proxy_configs: proxy_configs.to_vec(),
            endpoint_slices: slices.to_vec(),
            secrets: &secrets,
        };
        let settings = Settings {
            listeners: &listeners,
            secrets: &secrets,
        };
        let clusters = |name: &str| self.translator.cluster(name);
        let step = self
            .cache
            .step(&settings, touched, (&self.objects, &clusters));
        let (step, problems) = match step {
            Some(step) => step,
            None => self.cache.full(&inputs),
        };
        let full = matches!(step, Step::Full(_));
        let translation = match step {
            Step::Full(config) => self.translator.update(&config),
            Step::Changes(changes) => self.translator.apply(changes),
        };
        let (config, expected_problems) = to_model::build(&inputs);
        assert_eq!(problems, expected_problems);
        let fresh = crate::translate::translate(&config);
        assert!(
            translation.snapshot == fresh.snapshot,
            "the incremental step differs from a full build"
        );
        assert_eq!(translation.problems, fresh.problems);
        full
    }
}

/// A Gateway listener on `port` (HTTP), named as the Gateway front-end names them.
fn gateway_listener(port: i32) -> ResolvedListener {
    ResolvedListener {
        name: format!("shop/edge/{port}/HTTP"),
        port,
        probe_port: port + 10000,
        tls: false,
        default_certificate: None,
        client_validation: None,
        protocol: Default::default(),
    }
}

/// The live ProxyConfig of an HTTPRoute's virtual host on `listener`.
fn on_gateway(route: &str, listener: &ResolvedListener, version: &str) -> ProxyConfig {
    let mut pc = live(route, &["web"], version);
    pc.spec.listener = Some(listener.clone());
    pc
}

/// A Gateway port's own unit: no hosts, it defines the listener.
fn gateway_port(listener: &ResolvedListener, version: &str) -> ProxyConfig {
    let mut pc = on_gateway(&format!("port-{}", listener.port), listener, version);
    pc.spec.clusters = Vec::new();
    if let Some(vh) = pc.spec.virtual_host.as_mut() {
        vh.hosts = Vec::new();
        vh.rules = Vec::new();
    }
    pc
}

#[test]
fn gateway_virtual_hosts_come_and_go_without_a_full_build() {
    let mut rig = Rig::new();
    let web = slice("web-1", "web", &["10.0.0.1"], "1");
    let (http, other) = (gateway_listener(80), gateway_listener(8080));
    let port = gateway_port(&http, "1");
    let a = on_gateway("a", &http, "1");
    assert!(rig.step(&[&port, &a], &[&web]));
    // Thousands of HTTPRoutes on one listener: each new one brings the listener its
    // virtual host is served on, which the translator already has.
    let b = on_gateway("b", &http, "1");
    let c = on_gateway("c", &http, "1");
    assert!(!rig.step(&[&port, &a, &b], &[&web]));
    assert!(!rig.step(&[&port, &a, &b, &c], &[&web]));
    assert!(!rig.step(&[&port, &a, &c], &[&web]));
    // A virtual host on a listener no port defines yet, then its port, then the port
    // changed while its virtual hosts still carry the definition before.
    let d = on_gateway("d", &other, "1");
    assert!(!rig.step(&[&port, &a, &c, &d], &[&web]));
    let other_port = gateway_port(&other, "1");
    assert!(!rig.step(&[&port, &other_port, &a, &c, &d], &[&web]));
    let mut changed = other.clone();
    changed.probe_port += 1;
    let other_port = gateway_port(&changed, "2");
    assert!(!rig.step(&[&port, &other_port, &a, &c, &d], &[&web]));
    let d = on_gateway("d", &changed, "2");
    assert!(!rig.step(&[&port, &other_port, &a, &c, &d], &[&web]));
    // The port goes, then its last virtual host; a TrafficRoute's beside them all.
    assert!(!rig.step(&[&port, &a, &c, &d], &[&web]));
    let shared = live("t", &["web"], "1");
    assert!(!rig.step(&[&port, &a, &c, &shared], &[&web]));
    assert!(!rig.step(&[&a, &c, &shared], &[&web]));
}

/// `pc` served over TLS with Secret `secret` of its namespace.
fn with_tls(mut pc: ProxyConfig, secret: &str) -> ProxyConfig {
    if let Some(vh) = pc.spec.virtual_host.as_mut() {
        vh.tls = Some(ResolvedTls {
            namespace: None,
            secret_name: secret.into(),
            redirect_http: false,
            listener_hostname: None,
        });
    }
    pc
}

#[test]
fn tls_secrets_come_and_go_with_their_users_without_a_full_build() {
    let mut rig = Rig::new();
    let data = |n: u8| TlsData {
        certificate_chain: format!("chain {n}"),
        private_key: format!("key {n}"),
    };
    rig.secrets.insert(("shop".into(), "cert".into()), data(1));
    rig.secrets.insert(("shop".into(), "other".into()), data(2));
    let web = slice("web-1", "web", &["10.0.0.1"], "1");
    let a = with_tls(live("a", &["web"], "1"), "cert");
    assert!(rig.step(&[&a], &[&web]));
    // Thousands of routes served with one certificate: the second and third users, a
    // user changed, the first of another Secret, one the watch does not hold.
    let b = with_tls(live("b", &["web"], "1"), "cert");
    let c = with_tls(live("c", &["web"], "1"), "cert");
    assert!(!rig.step(&[&a, &b], &[&web]));
    assert!(!rig.step(&[&a, &b, &c], &[&web]));
    let b = with_tls(live("b", &["web"], "2"), "other");
    assert!(!rig.step(&[&a, &b, &c], &[&web]));
    let d = with_tls(live("d", &["web"], "1"), "missing");
    let e = with_tls(live("e", &["web"], "1"), "absent");
    assert!(!rig.step(&[&a, &b, &c, &d, &e], &[&web]));
    assert!(!rig.step(&[&a, &b, &c, &e], &[&web]));
    // The last users go, one Secret after the other; a route without TLS stays.
    let plain = live("p", &["web"], "1");
    assert!(!rig.step(&[&a, &b, &plain], &[&web]));
    assert!(!rig.step(&[&b, &plain], &[&web]));
    assert!(!rig.step(&[&plain], &[&web]));
    // A Secret's content changes: a full build.
    rig.secrets.insert(("shop".into(), "cert".into()), data(3));
    assert!(rig.step(&[&plain, &c], &[&web]));
}

#[test]
fn slice_changes_update_only_their_services_clusters() {
    let mut rig = Rig::new();
    let a = live("a", &["web", "api"], "1");
    let b = live("b", &["api", "img"], "1");
    let web = slice("web-1", "web", &["10.0.0.1"], "1");
    let api = slice("api-1", "api", &["10.0.1.1"], "1");
    let img = slice("img-1", "img", &["10.0.2.1"], "1");
    let pcs = [&a, &b];
    assert!(rig.step(&pcs, &[&web, &api, &img]));

    // An endpoint moves.
    let api2 = slice("api-1", "api", &["10.0.1.1", "10.0.1.2"], "2");
    assert!(!rig.step(&pcs, &[&web, &api2, &img]));
    // A second slice for a Service, then a slice goes away.
    let api3 = slice("api-2", "api", &["10.0.1.3"], "3");
    assert!(!rig.step(&pcs, &[&web, &api2, &api3, &img]));
    assert!(!rig.step(&pcs, &[&api2, &api3, &img]));
    // A slice is relabelled to another Service: both Services change.
    let moved = slice("api-2", "img", &["10.0.1.3"], "4");
    assert!(!rig.step(&pcs, &[&api2, &moved, &img]));
    // Nothing changed; then told that everything did (a relist): nothing to do.
    assert!(!rig.step(&pcs, &[&api2, &moved, &img]));
    assert!(!rig.step_all_touched(&pcs, &[&api2, &moved, &img]));
    // A ProxyConfig changes: "api" loses a user but keeps one, nothing is rebuilt.
    let b2 = live("b", &["img"], "2");
    let slices = [&api2, &moved, &img];
    assert!(!rig.step(&[&a, &b2], &slices));
    // "web" gets a slice back; a new route takes a new Service and an old one.
    let web = slice("web-1", "web", &["10.0.0.7"], "5");
    let slices = [&web, &api2, &moved, &img];
    let c = live("c", &["web", "new"], "1");
    let new = slice("new-1", "new", &["10.0.3.1"], "1");
    let with_new = [&web, &api2, &moved, &img, &new];
    assert!(!rig.step(&[&a, &b2, &c], &slices));
    assert!(!rig.step(&[&a, &b2, &c], &with_new));
    // A probe ProxyConfig comes and goes; a route goes, taking its last clusters.
    let probe = probe("a", &["api", "other"], "1");
    assert!(!rig.step(&[&a, &b2, &c, &probe], &with_new));
    assert!(!rig.step(&[&a, &b2, &c], &with_new));
    assert!(!rig.step(&[&b2, &c], &with_new));
    // A route moves to another Service and back in one step each.
    let c2 = live("c", &["img"], "2");
    assert!(!rig.step(&[&b2, &c2], &with_new));
    assert!(!rig.step(&[&b2, &c], &with_new));
    // Two ProxyConfigs claiming one route: left to full builds.
    let twin = {
        let mut twin = live("c", &["web"], "1");
        twin.metadata.name = Some("c-twin".into());
        twin
    };
    assert!(rig.step(&[&b2, &c, &twin], &with_new));
    assert!(rig.step(&[&b2, &c, &twin], &with_new));
    assert!(rig.step(&[&b2, &c], &with_new));
    // A live ProxyConfig with TLS, its Secret not there: its problem comes and goes.
    let tls = with_tls(live("d", &["web"], "1"), "cert");
    assert!(!rig.step(&[&b2, &c, &tls], &with_new));
    assert!(!rig.step(&[&b2, &c], &with_new));
    // ProxyConfigs with problems, handed out in any order: problems in key order, as
    // a full build lists them, through additions and removals.
    let broken = |route: &str| {
        let mut pc = live(route, &["web"], "1");
        pc.spec.virtual_host = None;
        pc
    };
    let (x, y, z) = (broken("x"), broken("y"), broken("z"));
    assert!(!rig.step(&[&z, &b2, &x, &c], &with_new));
    assert!(!rig.step(&[&y, &z, &b2, &x, &c], &with_new));
    assert!(!rig.step(&[&y, &b2, &c], &with_new));
}

#[test]
fn only_changed_clusters_are_handed_over() {
    let mut cache = ModelCache::default();
    // The clusters a step reads are the translator's, as the steps before left them.
    let mut translator = Translator::new();
    let a = live("a", &["web", "api"], "1");
    let web = slice("web-1", "web", &["10.0.0.1"], "1");
    let api = slice("api-1", "api", &["10.0.1.1"], "1");
    let secrets = BTreeMap::new();
    let listeners = listeners();
    let settings = Settings {
        listeners: &listeners,
        secrets: &secrets,
    };
    let inputs = Inputs {
        listeners: listeners.clone(),
        proxy_configs: vec![&a],
        endpoint_slices: vec![&web, &api],
        secrets: &secrets,
    };
    let mut objects = ObjectMaps::new(&[&a], &[&web, &api]);
    let none = Touched::default();
    // A step as the builder takes it: a full build when the cache cannot tell.
    let mut step = |cache: &mut ModelCache, touched: &Touched, objects: &ObjectMaps| {
        let clusters = |name: &str| translator.cluster(name);
        let step = cache.step(&settings, touched, (objects, &clusters));
        let step = step.map_or_else(|| cache.full(&inputs).0, |s| s.0);
        match &step {
            Step::Full(config) => translator.update(config),
            Step::Changes(changes) => translator.apply(changes.clone()),
        };
        step
    };
    assert!(
        matches!(step(&mut cache, &none, &objects), Step::Full(_)),
        "the first step is a full build"
    );
    let web_key = key_of(&web);
    let touched = Touched {
        endpoint_slices: [web_key.clone()].into(),
        ..Touched::default()
    };
    let web2 = slice("web-1", "web", &["10.0.0.9"], "2");
    objects
        .endpoint_slices
        .insert(web_key.clone(), Arc::new(web2));
    match step(&mut cache, &touched, &objects) {
        Step::Changes(changes) => {
            let names: Vec<&str> = changes
                .clusters
                .iter()
                .map(|c| match c {
                    Edit::Put(c) => c.service.name.as_str(),
                    Edit::Remove(name) => name.as_str(),
                })
                .collect();
            assert_eq!(names, ["web"]);
            assert!(changes.virtual_hosts.is_empty());
        }
        _ => panic!("a slice change is not a full build"),
    }
    // A new resourceVersion with the same content hands over nothing.
    let web3 = slice("web-1", "web", &["10.0.0.9"], "3");
    objects.endpoint_slices.insert(web_key, Arc::new(web3));
    assert!(matches!(
        step(&mut cache, &touched, &objects),
        Step::Changes(c) if c.is_empty()
    ));
    // Nothing touched: nothing looked at, nothing handed over.
    assert!(matches!(
        step(&mut cache, &none, &objects),
        Step::Changes(c) if c.is_empty()
    ));
}

/// The builder holds the last slice of a deleted Service as a leaving copy (see
/// `departed`): a step takes it as a change of that slice, and the probe asking its
/// cluster ready for a switch is left out, then back once the Service has a slice again.
#[test]
fn a_held_slice_serves_but_never_passes_for_a_switch() {
    let mut rig = Rig::new();
    let a = live("a", &["web"], "1");
    let switch = probe("a", &["web", "new"], "1");
    let web = slice("web-1", "web", &["10.0.0.1"], "1");
    let new = slice("new-1", "new", &["10.0.3.1"], "1");
    let pcs = [&a, &switch];
    assert!(rig.step(&pcs, &[&web, &new]));
    assert!(rig.translator.translation().problems.is_empty());

    let mut held = new.clone();
    held.annotations_mut()
        .insert(to_model::LEAVING.into(), "true".into());
    held.metadata.resource_version = Some("1-leaving".into());
    assert!(!rig.step(&pcs, &[&web, &held]));
    let problems = rig.translator.translation().problems;
    let subjects: Vec<String> = problems.iter().map(|p| p.subject().to_string()).collect();
    assert_eq!(subjects, ["probe/shop/a/v2"]);

    let recreated = slice("new-2", "new", &["10.0.3.2"], "2");
    assert!(!rig.step(&pcs, &[&web, &recreated]));
    assert!(rig.translator.translation().problems.is_empty());
}
