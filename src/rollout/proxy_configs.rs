//! The one way the engine reads and writes a unit's ProxyConfigs, for every front-end.
//!
//! Reads come from the watch's store when it holds what the API server last answered
//! for that object ([`Known`]), and from the API server otherwise. Every write and delete
//! is conditional on the object as it was read or last written (resourceVersion, uid): a
//! store that lags behind another writer, or a leader that lost its Lease without knowing,
//! costs a conflict (409) and a fresh read on the next pass, never a lost update.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use tracing::warn;

use super::batch::{Batches, Created};
use super::known::Known;
use super::{FIELD_MANAGER, PROMOTED_AT, ROUTE_LABEL, label_value};
use crate::api::{ProxyConfig, ProxyConfigSpec};
use crate::k8s::batches::{batch_of, batch_of_version, member_object};
use crate::k8s::model_cache::ObjectKey;
use crate::k8s::watched::{Filter, Watched};

/// A ProxyConfig read or write that failed, with the object it was about.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing ProxyConfig {name}: {source}")]
    Write { name: String, source: kube::Error },
    #[error("reading ProxyConfig {name}: {source}")]
    Read { name: String, source: kube::Error },
}

impl Error {
    pub fn source(&self) -> &kube::Error {
        match self {
            Self::Write { source, .. } | Self::Read { source, .. } => source,
        }
    }

    /// The API server refuses the write as invalid: it would refuse it again, so the unit
    /// is told instead of retried (400, 413, 422). The message is the API server's.
    pub fn refusal(&self) -> Option<(&str, &str)> {
        match self {
            Self::Write {
                name,
                source: kube::Error::Api(status),
            } if matches!(status.code, 400 | 413 | 422) => Some((name, &status.message)),
            _ => None,
        }
    }

    /// Another writer got there first (or our store lagged): read again and decide anew.
    pub fn is_conflict(&self) -> bool {
        matches!(self.source(), kube::Error::Api(s) if s.code == 409)
    }

    /// What went wrong, as the failure metric counts it, and how soon to try again.
    pub fn policy(&self) -> (&'static str, Duration) {
        let status = match self.source() {
            kube::Error::Api(status) => Some(status.code),
            _ => None,
        };
        match status {
            // Another writer got there first: the next pass reads what it wrote.
            Some(409) => ("conflict", Duration::from_millis(100)),
            // The API server (or our own client-side limit) asks to slow down.
            Some(429) => ("throttled", Duration::from_secs(5)),
            // Missing permissions are fixed by a person: retry, but not in a hurry.
            Some(401 | 403) => ("forbidden", Duration::from_secs(30)),
            Some(code) if code >= 500 => ("unavailable", Duration::from_secs(1)),
            Some(_) => ("refused", Duration::from_secs(2)),
            // The API server is unreachable: rollouts go on as soon as it is back.
            None => ("unavailable", Duration::from_secs(1)),
        }
    }
}

/// Who a unit's ProxyConfigs belong to: the object that owns them (garbage collection
/// follows it) and the labels its front-end finds them by.
#[derive(Clone, Debug, Default)]
pub struct Owner {
    pub reference: Option<OwnerReference>,
    /// Besides [`ROUTE_LABEL`] (the unit's name), which the engine sets.
    pub labels: BTreeMap<String, String>,
}

/// The unit a ProxyConfig is written for.
pub struct UnitRef<'a> {
    /// Where its ProxyConfigs live.
    pub namespace: &'a str,
    /// Its name, unique in the namespace: its ProxyConfigs are named after it.
    pub name: &'a str,
    pub owner: Owner,
}

/// The ProxyConfigs of the units one front-end rolls out.
pub struct ProxyConfigs {
    client: Client,
    store: Watched<ProxyConfig>,
    known: Arc<Known>,
    /// Where ProxyConfigs to be created may be written together (none: each alone).
    batches: Option<Arc<Batches>>,
}

impl ProxyConfigs {
    /// `store`: a watch holding at least these units' ProxyConfigs (batches shown as their
    /// members: `k8s::batches`).
    pub fn new(client: Client, store: Watched<ProxyConfig>, batches: Option<Arc<Batches>>) -> Self {
        Self {
            client,
            store,
            known: Arc::default(),
            batches,
        }
    }

    /// Whether a ProxyConfig a watch event brings is only this replica's own write heard
    /// back (the answer to it, or, before the answer, what it asked for): nothing a pass
    /// has to look at again. For [`Watched::notify_unless_echo`].
    pub fn echoes(&self) -> Filter<ProxyConfig> {
        let known = self.known.clone();
        Arc::new(move |pc: &ProxyConfig| known.is_echo(pc))
    }

    /// The watch's store.
    pub fn store(&self) -> &Watched<ProxyConfig> {
        &self.store
    }

    /// ProxyConfig `name` of `namespace` as the API server holds it now, as far as this
    /// replica can tell: from the store when it agrees with the last answer, else asked.
    pub async fn read(&self, namespace: &str, name: &str) -> Result<Option<ProxyConfig>, Error> {
        let key = (namespace.to_owned(), name.to_owned());
        let stored = self.store.get(&key);
        if !self.known.knows(&key) {
            match &stored {
                // Nothing this leader wrote or read, and the watch's store (complete before
                // any pass runs) holds none: there is none as far as a read could tell. At
                // a start with 10k routes to roll out, that was two reads answering 404 per
                // route. (A create is no more conditional after a read: an apply without a
                // resourceVersion creates or overwrites alike.)
                None => {
                    self.known.saw(key, None);
                    return Ok(None);
                }
                // A batch's member: members never change inside their batch, and what
                // takes one over is an object of the unit's own, which the store shows in
                // its place. Asking would cost a read of the whole batch.
                Some(member) if batch_of(member).is_some() => {
                    self.known.saw(key, Some(member));
                    return Ok(Some(member.as_ref().clone()));
                }
                Some(_) => {}
            }
        }
        if let Some(pc) = self.known.stored_if_current(&key, stored) {
            return Ok(pc);
        }
        let api: Api<ProxyConfig> = Api::namespaced(self.client.clone(), namespace);
        let read_error = |name: &str| {
            let name = name.to_owned();
            move |source| Error::Read { name, source }
        };
        let mut pc = api.get_opt(name).await.map_err(read_error(name))?;
        // None of its own: the batch this leader wrote it in, or the store shows it in,
        // may hold it.
        let stored = self.store.get(&key);
        let known = self.known.version(&key);
        let batch = (stored.as_deref().and_then(batch_of))
            .or_else(|| known.as_deref().and_then(batch_of_version));
        if pc.is_none()
            && let Some(batch) = batch
        {
            let batch = api.get_opt(batch).await.map_err(read_error(batch))?;
            pc = batch.and_then(|batch| {
                let member = batch.spec.members.iter().find(|m| m.name == name)?;
                Some(member_object(&batch, member))
            });
        }
        self.known.saw(key, pc.as_ref());
        Ok(pc)
    }

    /// Creates `unit`'s first ProxyConfig `name` (the unit has nothing live, and none of
    /// this name): in a batch when others come at the same time ([`Batches::create`]),
    /// else as [`ProxyConfigs::apply`] does.
    pub async fn create_first(
        &self,
        unit: &UnitRef<'_>,
        name: &str,
        spec: ProxyConfigSpec,
        promoted_at: Option<String>,
    ) -> Result<ProxyConfig, Error> {
        if let Some(batches) = &self.batches {
            let namespace = unit.namespace;
            let mut pc = desired(name, unit, spec.clone(), promoted_at.clone(), None);
            pc.metadata.namespace = Some(namespace.to_owned());
            let key = (namespace.to_owned(), name.to_owned());
            self.known.sending(key.clone(), &pc);
            match batches.create(pc).await {
                Ok(Created::Batched(member)) => {
                    self.known.saw(key, Some(&member));
                    return Ok(*member);
                }
                Ok(Created::Alone) => {}
                Err(error) => {
                    self.known.unsure(&key);
                    return Err(error);
                }
            }
        }
        self.apply(unit, name, spec, promoted_at, None).await
    }

    /// Server-side applies `spec` as `unit`'s ProxyConfig `name`, conditional on
    /// `current`: the object as this pass read or wrote it (None: there was none when
    /// read, and the write creates it).
    pub async fn apply(
        &self,
        unit: &UnitRef<'_>,
        name: &str,
        spec: ProxyConfigSpec,
        promoted_at: Option<String>,
        current: Option<&ProxyConfig>,
    ) -> Result<ProxyConfig, Error> {
        let namespace = unit.namespace;
        let api: Api<ProxyConfig> = Api::namespaced(self.client.clone(), namespace);
        // A member of a batch is taken over by an object of the unit's own, created here;
        // the member then leaves its batch (below).
        let member = current.and_then(batch_of).map(str::to_owned);
        let current = current.filter(|_| member.is_none());
        let pc = desired(name, unit, spec, promoted_at, current);
        let key = (namespace.to_owned(), name.to_owned());
        self.known.sending(key.clone(), &pc);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        // An apply carrying a resourceVersion is refused if the object moved on since. One
        // without (the object was absent when read) creates it: a create (POST) would be
        // conditional too, but its fields would then belong to an Update manager, and
        // later applies could never remove them.
        let written = api.patch(name, &params, &Patch::Apply(&pc)).await;
        match &written {
            Ok(pc) => self.known.saw(key, Some(pc)),
            Err(_) => self.known.unsure(&key),
        }
        // The member taken over leaves its batch now: were the unit's own object deleted
        // before the sweep took it out, the member would stand for the name again.
        if written.is_ok()
            && let (Some(batch), Some(batches)) = (&member, &self.batches)
            && let Err(error) = batches.remove(namespace, batch, name).await
        {
            warn!(%namespace, proxy_config = %name, %error, "cannot take a member taken over out of its batch; the sweep will");
        }
        written.map_err(|source| Error::Write {
            name: name.to_owned(),
            source,
        })
    }

    /// Deletes ProxyConfig `name` of `namespace` if it is still `current` (None: whatever
    /// it is). Gone already is done.
    pub async fn delete(
        &self,
        namespace: &str,
        name: &str,
        current: Option<&ProxyConfig>,
    ) -> Result<(), Error> {
        let key = (namespace.to_owned(), name.to_owned());
        if let Some(batch) = current.and_then(batch_of)
            && let Some(batches) = &self.batches
        {
            let removed = batches.remove(namespace, batch, name).await;
            match &removed {
                Ok(()) => self.known.saw(key, None),
                Err(_) => self.known.unsure(&key),
            }
            return removed;
        }
        let api: Api<ProxyConfig> = Api::namespaced(self.client.clone(), namespace);
        let params = DeleteParams {
            preconditions: current.map(unchanged_since),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                self.known.unsure(&key);
                return Err(Error::Write {
                    name: name.to_owned(),
                    source,
                });
            }
        }
        // A member of that name still in a batch (the unit's own object took it over
        // less than a sweep ago) would stand for the name again: it goes too.
        if let Some(batches) = &self.batches {
            for batch in batches.holding(&key) {
                batches.remove(namespace, &batch, name).await?;
            }
        }
        self.known.saw(key, None);
        Ok(())
    }

    /// Nothing this replica knows of `namespace/name` holds any more: it is the next
    /// read's business (its unit is gone).
    pub fn forget(&self, key: &ObjectKey) {
        self.known.forget(key);
    }
}

/// The object an apply sends.
fn desired(
    name: &str,
    unit: &UnitRef<'_>,
    spec: ProxyConfigSpec,
    promoted_at: Option<String>,
    current: Option<&ProxyConfig>,
) -> ProxyConfig {
    let mut pc = ProxyConfig::new(name, spec);
    pc.metadata.resource_version = current.and_then(|c| c.resource_version());
    pc.metadata.owner_references = unit.owner.reference.clone().map(|o| vec![o]);
    let mut labels = unit.owner.labels.clone();
    labels.insert(ROUTE_LABEL.to_owned(), label_value(unit.name));
    pc.metadata.labels = Some(labels);
    pc.metadata.annotations = promoted_at.map(|at| [(PROMOTED_AT.to_owned(), at)].into());
    pc
}

/// Preconditions of a write that holds only if `pc` is still as this pass read (or last
/// wrote) it: a leader that lost its lease without knowing, or any other writer that got
/// there first, makes the API server refuse it (409), and the next pass reads afresh.
pub fn unchanged_since(pc: &ProxyConfig) -> Preconditions {
    Preconditions {
        uid: pc.uid(),
        resource_version: pc.resource_version(),
    }
}

/// How long ago `pc` was promoted (the drain period runs from then); None if unknown.
pub fn promoted_ago(pc: &ProxyConfig) -> Option<Duration> {
    let text = pc.annotations().get(PROMOTED_AT)?;
    let at: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    let ago = k8s_openapi::jiff::Timestamp::now().duration_since(at);
    Duration::try_from(ago).ok()
}

/// When a promotion of `spec_version` over `live` starts its drain period: now for a new
/// version, the time it had for a metadata-only promotion (a new generation of the same
/// content keeps its drain period running).
pub fn promotion_time(live: Option<&ProxyConfig>, spec_version: &str) -> Option<String> {
    match live {
        Some(l) if l.spec.version == spec_version => l.annotations().get(PROMOTED_AT).cloned(),
        _ => Some(k8s_openapi::jiff::Timestamp::now().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ProxyConfigSpec {
        serde_json::from_value(serde_json::json!({
            "role": "probe", "route": "web", "generation": 1, "version": "p1", "clusters": [],
        }))
        .expect("spec")
    }

    #[test]
    fn a_write_holds_only_while_the_object_is_as_read() {
        let mut pc = ProxyConfig::new("web-probe", spec());
        pc.metadata.uid = Some("u-1".into());
        pc.metadata.resource_version = Some("41".into());
        let pre = unchanged_since(&pc);
        assert_eq!(pre.uid.as_deref(), Some("u-1"));
        assert_eq!(pre.resource_version.as_deref(), Some("41"));
        // The apply carries the version it was decided on, and the unit's label.
        let unit = UnitRef {
            namespace: "shop",
            name: "web",
            owner: Owner {
                reference: None,
                labels: [("switchyard.dev/gateway".to_owned(), "edge".to_owned())].into(),
            },
        };
        let sent = desired("web-probe", &unit, spec(), None, Some(&pc));
        assert_eq!(sent.metadata.resource_version.as_deref(), Some("41"));
        let labels = sent.metadata.labels.unwrap_or_default();
        assert_eq!(labels.get(ROUTE_LABEL).map(String::as_str), Some("web"));
        assert_eq!(labels.len(), 2);
        // A route name longer than a label value may be: cut, and told apart by a digest.
        let long = "r".repeat(200);
        let unit = UnitRef {
            name: &long,
            ..unit
        };
        let sent = desired("long-probe", &unit, spec(), None, None);
        let labels = sent.metadata.labels.unwrap_or_default();
        let value = &labels[ROUTE_LABEL];
        assert!(value.len() <= 63 && value.starts_with("rrrr"), "{value}");
        assert_ne!(*value, label_value(&"r".repeat(199)));
    }

    #[test]
    fn each_kind_of_error_has_its_own_retry() {
        let error = |code: u16| Error::Write {
            name: "web-live".into(),
            source: kube::Error::Api(
                kube::core::Status::failure("refused", "Reason")
                    .with_code(code)
                    .boxed(),
            ),
        };
        let kinds: Vec<_> = [409, 429, 403, 503, 422]
            .into_iter()
            .map(|code| error(code).policy().0)
            .collect();
        assert_eq!(
            kinds,
            [
                "conflict",
                "throttled",
                "forbidden",
                "unavailable",
                "refused"
            ]
        );
        assert!(error(409).policy().1 < error(503).policy().1);
        assert!(error(503).policy().1 < error(403).policy().1);
        assert!(error(409).is_conflict());
        assert_eq!(error(422).refusal(), Some(("web-live", "refused")));
        assert_eq!(error(409).refusal(), None);
    }
}
