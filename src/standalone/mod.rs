//! Standalone mode: routing configuration and static endpoints from YAML files in a
//! directory, served over xDS without Kubernetes. The embedded default of the demo and of
//! the tests that need no API server.

pub mod build;
pub mod file;
mod unknown_fields;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use crate::hash;
use crate::metrics::Metrics;
use crate::translate::Translator;
use crate::xds::Desired;
use build::SecretPem;
use file::File;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Parse {
        path: PathBuf,
        line: u64,
        column: u64,
        message: String,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("{0}: no *.yaml or *.yml files")]
    Empty(PathBuf),
}

/// Everything read from the directory.
#[derive(Debug)]
pub struct Loaded {
    pub file: File,
    pub secrets: Vec<SecretPem>,
    /// Digest of every byte read: unchanged input, unchanged fingerprint.
    pub fingerprint: String,
}

pub fn load_dir(dir: &Path) -> Result<Loaded, LoadError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LoadError::Io { path, source }
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file() && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
        })
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(LoadError::Empty(dir.to_path_buf()));
    }
    load_paths(dir, &paths)
}

/// One file of the format; the paths it names are relative to its directory.
pub fn load_file(path: &Path) -> Result<Loaded, LoadError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    load_paths(dir, &[path.to_path_buf()])
}

/// `paths`, merged; `dir` is where secrets' files are found.
fn load_paths(dir: &Path, paths: &[PathBuf]) -> Result<Loaded, LoadError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LoadError::Io { path, source }
    };
    let mut merged = File::default();
    let mut contents = Vec::new();
    let mut seen_routes = BTreeSet::new();
    let mut seen_services = BTreeSet::new();
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(io(path))?;
        let part = parse(path, &text)?;
        for route in &part.routes {
            if !seen_routes.insert((route.namespace.clone(), route.name.clone())) {
                return Err(invalid(
                    path,
                    format!("route {}/{} is defined twice", route.namespace, route.name),
                ));
            }
        }
        for service in &part.services {
            if !seen_services.insert((service.namespace.clone(), service.name.clone())) {
                return Err(invalid(
                    path,
                    format!(
                        "service {}/{} is defined twice",
                        service.namespace, service.name
                    ),
                ));
            }
        }
        if part.listeners.is_some() && merged.listeners.is_some() {
            return Err(invalid(
                path,
                "listeners are set in more than one file".into(),
            ));
        }
        contents.push((path.display().to_string(), hash::digest(text.as_bytes())));
        merged.listeners = merged.listeners.or(part.listeners);
        merged.routes.extend(part.routes);
        merged.services.extend(part.services);
        merged.secrets.extend(part.secrets);
    }
    let mut secrets = Vec::new();
    for spec in &merged.secrets {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(io(&path))
        };
        let pem = SecretPem {
            namespace: spec.namespace.clone(),
            name: spec.name.clone(),
            certificate_chain: read(&spec.cert_file)?,
            private_key: read(&spec.key_file)?,
        };
        contents.push((
            format!("{}/{}", spec.namespace, spec.name),
            hash::digest(format!("{}{}", pem.certificate_chain, pem.private_key).as_bytes()),
        ));
        secrets.push(pem);
    }
    Ok(Loaded {
        file: merged,
        secrets,
        fingerprint: hash::digest_of_versions(contents),
    })
}

/// One file's text, read as the format. `path` only names it in errors. Pure, so that it can be fuzzed.
pub fn parse(path: &Path, text: &str) -> Result<File, LoadError> {
    if text.trim().is_empty() {
        return Ok(File::default());
    }
    let part: File = serde_saphyr::from_str(text).map_err(|e| {
        let location = e.location();
        LoadError::Parse {
            path: path.to_path_buf(),
            line: location.map_or(0, |l| l.line()),
            column: location.map_or(0, |l| l.column()),
            message: first_line(&e.to_string()),
        }
    })?;
    // The schema is made once: the watcher parses every file each time it looks.
    static SCHEMA: std::sync::LazyLock<schemars::Schema> =
        std::sync::LazyLock::new(|| schemars::schema_for!(File));
    if let Some(unknown) = unknown_fields::first_unknown(text, &SCHEMA) {
        return Err(LoadError::Parse {
            path: path.to_path_buf(),
            line: unknown.line,
            column: unknown.column,
            message: format!("unknown field {}", unknown.path),
        });
    }
    Ok(part)
}

fn invalid(path: &Path, message: String) -> LoadError {
    LoadError::Invalid {
        path: path.to_path_buf(),
        message,
    }
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or(text).to_string()
}

/// Watches the directory and publishes a new snapshot whenever its content changes.
/// Invalid content is reported and the last good snapshot keeps serving.
pub struct Watcher {
    pub dir: PathBuf,
    pub probe_token: String,
    pub poll_interval: Duration,
    pub desired: Arc<Desired>,
    pub metrics: Metrics,
}

impl Watcher {
    pub async fn run(self) {
        let mut applied: Option<String> = None;
        let mut translator = Translator::new();
        let mut last_error: Option<String> = None;
        loop {
            match load_dir(&self.dir) {
                Ok(loaded) => {
                    last_error = None;
                    if applied.as_deref() != Some(loaded.fingerprint.as_str()) {
                        applied = Some(loaded.fingerprint.clone());
                        self.apply(&loaded, &mut translator);
                    }
                }
                Err(err) => {
                    let text = err.to_string();
                    if last_error.as_deref() != Some(text.as_str()) {
                        self.metrics.config_errors.inc();
                        if self.desired.is_open() {
                            error!(error = %text, "invalid configuration; the last good one keeps serving");
                        } else {
                            error!(error = %text, "invalid configuration; nothing is served until it is fixed");
                        }
                        last_error = Some(text);
                    }
                }
            }
            tokio::time::sleep(self.poll_interval).await;
        }
    }

    /// Translates the loaded files; `translator` holds the previous translation, so only
    /// what changed is rebuilt.
    fn apply(&self, loaded: &Loaded, translator: &mut Translator) {
        let started = Instant::now();
        let resolved = build::build(&loaded.file, &loaded.secrets, &self.probe_token);
        let translation = translator.update(&resolved.config);
        let elapsed = started.elapsed();
        let problems: Vec<String> = resolved
            .problems
            .into_iter()
            .chain(translation.problems.iter().map(|p| p.to_string()))
            .collect();
        for problem in &problems {
            warn!(%problem, "left out of the configuration");
        }
        if !problems.is_empty() {
            self.metrics.config_errors.inc();
        }
        let snapshot = Arc::new(translation.snapshot);
        self.metrics.record_snapshot(&snapshot, elapsed);
        info!(
            version = snapshot.version(),
            resources = snapshot.len(),
            routes = loaded.file.routes.len(),
            left_out = problems.len(),
            build_ms = elapsed.as_secs_f64() * 1000.0,
            "configuration loaded"
        );
        if self.desired.publish_and_open(snapshot) {
            info!("first full snapshot built: serving xDS");
        }
    }
}
