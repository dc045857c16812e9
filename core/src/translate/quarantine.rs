//! Keeps routes that an Envoy refused from holding back anyone else's (I8).
//!
//! Envoy refuses a whole route configuration for one virtual host it rejects (RE2's program
//! size, say, which nothing but RE2 computes), and then accepts no other change either. So
//! routes go on trial before they are promoted (see [`crate::model::VersionProbe`]), and this
//! leaves out of the route configuration every trial an Envoy refused.
//!
//! When an Envoy refuses the current route configuration, its suspects are the trials that
//! the last configuration an Envoy accepted did not hold as they are now. A lone suspect is
//! refused (until its routes change). Of several, the trials of routes not yet live are
//! benched first when routes already serving users are among the suspects (a flood of new
//! routes must not hold back a change to a live one); otherwise the later half is. The
//! others are sent again, until a refusal has a lone suspect. An accepted configuration clears
//! the trials it held and brings back the group benched last: a depth-first search that
//! finds k bad trials among n in about k·log2(n) rounds. Leaving a trial out touches no
//! traffic: nothing but the prober reaches it.
//!
//! No I/O: the caller feeds in what Envoys answered and what it publishes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use prost::encoding::{WireType, decode_key, decode_varint};

use super::{Cause, Problem, ROUTE_CONFIG_NAME, Subject, VERSION_PROBE_VHOST_PREFIX, proto};
use crate::model::TRIAL_PREFIX;
use crate::xds::snapshot::{ROUTE, Resource, Snapshot, VIRTUAL_HOST};
use crate::xds::vhds;

/// How every problem in an Envoy's words begins.
const ENVOY: &str = "Envoy ";
const REFUSED_THESE_ROUTES: &str = " rejected these routes: ";
/// The problem of a trial sitting out a round.
const BENCHED: &str = "routes on trial held back for a moment: an Envoy rejected a route configuration that carried them with others, and the route to blame is being found";

impl Problem {
    /// Envoy `node` refused the routes on trial of `route` (its id) with `error`: the
    /// problem names the Envoy, for a user to know where to look, and gives its words.
    pub fn refused(route: &str, node: &str, error: &str) -> Problem {
        Problem::with_cause(
            Subject::VirtualHost(route.to_owned()),
            format!("{ENVOY}{node}{REFUSED_THESE_ROUTES}{error}"),
            Cause::Refused,
        )
    }

    /// The routes on trial of `route` sit out a round.
    pub fn benched(route: &str) -> Problem {
        Problem::with_cause(
            Subject::VirtualHost(route.to_owned()),
            BENCHED.to_owned(),
            Cause::Benched,
        )
    }

    /// Envoy `node` refused the route configuration with `error`, and no trial explains it.
    pub fn unexplained(node: &str, error: &str) -> Problem {
        Problem::with_cause(
            Subject::EveryRoute,
            format!(
                "{ENVOY}{node} rejected the route configuration, and no route on trial explains it: {error}"
            ),
            Cause::Unexplained,
        )
    }

    /// A problem told as text (another replica's report: replicas of this version and of
    /// the one before it tell each other problems as subject and message only), with its
    /// cause read back from the words the verdicts above are put in. Any other words of an
    /// Envoy count as [`Cause::Unexplained`]: they stand as they are, and wait for no one
    /// route's change.
    pub fn from_text(subject: Subject, message: String) -> Problem {
        let cause = if message == BENCHED {
            Cause::Benched
        } else if !message.starts_with(ENVOY) {
            Cause::Input
        } else if message.contains(REFUSED_THESE_ROUTES) {
            Cause::Refused
        } else {
            Cause::Unexplained
        };
        Problem::with_cause(subject, message, cause)
    }
}

/// The field number of `virtual_hosts` in RouteConfiguration, and of `name` in VirtualHost.
const VIRTUAL_HOSTS_FIELD: u32 = 2;
const NAME_FIELD: u32 = 1;

#[derive(Debug, Default)]
pub struct Quarantine {
    /// The trials of the last route configuration an Envoy accepted: virtual host name →
    /// digest of its encoding.
    accepted: HashMap<String, u64>,
    /// Trials refused, left out while they stay as they were: name → (digest, which Envoy
    /// refused it and Envoy's words).
    refused: BTreeMap<String, (u64, (String, String))>,
    /// Trials sitting out, in the groups they were benched in (last benched on top):
    /// name → digest.
    benched: Vec<BTreeMap<String, u64>>,
    /// Version of the route configuration last published through [`Quarantine::apply`]:
    /// verdicts on any other are stale.
    current: Option<String>,
    /// Version of the last route configuration an Envoy accepted.
    accepted_version: Option<String>,
    /// Which Envoy refused the current configuration and why, when no trial explains it.
    unexplained: Option<(String, String)>,
}

impl Quarantine {
    /// An Envoy accepted `config`. True when what is left out changed.
    pub fn accepted(&mut self, config: &Resource) -> bool {
        // Every Envoy ACKs each version: the first says it all.
        if !self.is_current(config) || self.accepted_version.as_deref() == Some(&config.version) {
            return false;
        }
        let Ok(hosts) = virtual_hosts(&config.body.value) else {
            return false;
        };
        self.accepted = hosts
            .iter()
            .filter(|h| is_trial(h.name))
            .map(|h| (h.name.to_owned(), h.digest))
            .collect();
        self.accepted_version = Some(config.version.clone());
        let changed = !self.benched.is_empty() || self.unexplained.is_some();
        self.benched.pop();
        self.unexplained = None;
        changed
    }

    /// The Envoy `node` refused `config` with `error`. True when what is left out changed.
    pub fn refused(&mut self, config: &Resource, node: &str, error: &str) -> bool {
        if !self.is_current(config) {
            return false;
        }
        let hosts = match virtual_hosts(&config.body.value) {
            Ok(hosts) => hosts,
            Err(_) => return false,
        };
        let suspects: Vec<(&str, u64)> = hosts
            .iter()
            .filter(|h| is_trial(h.name) && self.accepted.get(h.name) != Some(&h.digest))
            .map(|h| (h.name, h.digest))
            .collect();
        match suspects.as_slice() {
            [] => {
                // Every Envoy refuses alike: the first to say so is named.
                let changed = self.unexplained.as_ref().is_none_or(|(_, e)| e != error);
                if changed {
                    self.unexplained = Some((node.to_owned(), error.to_owned()));
                }
                changed
            }
            [(name, digest)] => {
                self.refused.insert(
                    (*name).to_owned(),
                    (*digest, (node.to_owned(), error.to_owned())),
                );
                true
            }
            several => {
                let live: HashSet<&str> = hosts.iter().map(|h| h.name).collect();
                let (of_live, of_new): (Vec<_>, Vec<_>) = several
                    .iter()
                    .partition(|(name, _)| live.contains(live_probe_of(name).as_str()));
                let sitting_out = if of_live.is_empty() || of_new.is_empty() {
                    // In the configuration's order, which is by name: the later half.
                    several[several.len() / 2..].iter().collect()
                } else {
                    of_new
                };
                let group = sitting_out
                    .into_iter()
                    .map(|(name, digest)| ((*name).to_owned(), *digest))
                    .collect();
                self.benched.push(group);
                true
            }
        }
    }

    /// `snapshot` without the trials left out; remembers its route configuration as the
    /// current one. Trials whose routes changed since are tried again.
    pub fn apply(&mut self, snapshot: &Snapshot) -> Snapshot {
        let config = snapshot
            .resources(ROUTE)
            .and_then(|r| r.get(ROUTE_CONFIG_NAME))
            .cloned();
        let Some(config) = config else {
            self.current = None;
            return snapshot.clone();
        };
        loop {
            let out = self.leave_out(&config);
            let version = out
                .as_ref()
                .map_or(&config.version, |(resource, _)| &resource.version)
                .clone();
            // What an Envoy accepted already draws no new answer (an Envoy that holds
            // it is not sent it again): it counts as accepted, and the next group is due.
            if self.accepted_version.as_deref() == Some(version.as_str())
                && !self.benched.is_empty()
            {
                self.benched.pop();
                continue;
            }
            self.current = Some(version);
            let Some((resource, left_out)) = out else {
                return snapshot.clone();
            };
            // Served in parts too (see `xds::vhds`): the same virtual hosts go.
            let parts = left_out.iter().map(|name| {
                (
                    VIRTUAL_HOST,
                    vhds::virtual_host_name(ROUTE_CONFIG_NAME, name),
                )
            });
            let mut snapshot = snapshot.clone();
            snapshot.update(parts, [Arc::new(resource)]);
            return snapshot;
        }
    }

    /// `config` less the trials left out, and their names; None when it keeps them all.
    fn leave_out(&mut self, config: &Resource) -> Option<(Resource, Vec<String>)> {
        if self.refused.is_empty() && self.benched.is_empty() {
            return None;
        }
        let fields = fields(&config.body.value).ok()?;
        let mut kept = Vec::with_capacity(config.body.value.len());
        let mut present = HashMap::new();
        let mut left_out = Vec::new();
        for field in &fields {
            if let Some(host) = field.virtual_host() {
                present.insert(host.name, host.digest);
                if self.leaves_out(&host) {
                    left_out.push(host.name.to_owned());
                    continue;
                }
            }
            kept.extend_from_slice(field.raw);
        }
        // Forget what is no longer there as it was: changed routes get a new trial.
        self.refused
            .retain(|name, (digest, _)| present.get(name.as_str()) == Some(digest));
        for group in &mut self.benched {
            group.retain(|name, digest| present.get(name.as_str()) == Some(digest));
        }
        self.benched.retain(|group| !group.is_empty());
        if kept.len() == config.body.value.len() {
            return None;
        }
        Some((
            Resource::new(
                ROUTE_CONFIG_NAME,
                proto::pack_bytes::<RouteConfiguration>(kept),
            ),
            left_out,
        ))
    }

    /// What is left out and why, by route (the trial's id without its prefix).
    pub fn problems(&self) -> Vec<Problem> {
        let refused = self
            .refused
            .iter()
            .map(|(name, (_, (node, error)))| Problem::refused(route_of(name), node, error));
        let benched = self
            .benched
            .iter()
            .flat_map(BTreeMap::keys)
            .map(|name| Problem::benched(route_of(name)));
        let unexplained = self
            .unexplained
            .iter()
            .map(|(node, error)| Problem::unexplained(node, error));
        refused.chain(benched).chain(unexplained).collect()
    }

    /// How many trials are left out.
    pub fn left_out(&self) -> usize {
        self.refused.len() + self.benched.iter().map(BTreeMap::len).sum::<usize>()
    }

    fn is_current(&self, config: &Resource) -> bool {
        config.name == ROUTE_CONFIG_NAME && self.current.as_deref() == Some(config.version.as_str())
    }

    fn leaves_out(&self, host: &HostEntry<'_>) -> bool {
        self.refused
            .get(host.name)
            .is_some_and(|(d, _)| *d == host.digest)
            || self
                .benched
                .iter()
                .any(|group| group.get(host.name) == Some(&host.digest))
    }
}

fn is_trial(vhost_name: &str) -> bool {
    vhost_name
        .strip_prefix(VERSION_PROBE_VHOST_PREFIX)
        .is_some_and(|id| id.starts_with(TRIAL_PREFIX))
}

/// "switchyard-probe/trial/ns/web" → "switchyard-probe/ns/web": the version answer of the
/// route's live configuration, there once the route serves users.
fn live_probe_of(trial_vhost_name: &str) -> String {
    format!("{VERSION_PROBE_VHOST_PREFIX}{}", route_of(trial_vhost_name))
}

/// "switchyard-probe/trial/ns/web" → "ns/web".
fn route_of(vhost_name: &str) -> &str {
    vhost_name
        .strip_prefix(VERSION_PROBE_VHOST_PREFIX)
        .and_then(|id| id.strip_prefix(TRIAL_PREFIX))
        .unwrap_or(vhost_name)
}

/// An encoding that does not parse (never one the translator made).
#[derive(Debug)]
struct Malformed;

/// One field of an encoded message: its raw bytes (key included), and for a
/// length-delimited field its number and payload.
struct Field<'a> {
    raw: &'a [u8],
    number: u32,
    payload: Option<&'a [u8]>,
}

impl<'a> Field<'a> {
    fn virtual_host(&self) -> Option<HostEntry<'a>> {
        let payload = self
            .payload
            .filter(|_| self.number == VIRTUAL_HOSTS_FIELD)?;
        let name = fields(payload)
            .ok()?
            .into_iter()
            .find(|f| f.number == NAME_FIELD)
            .and_then(|f| f.payload)
            .and_then(|p| std::str::from_utf8(p).ok())?;
        Some(HostEntry {
            name,
            digest: xxhash_rust::xxh3::xxh3_64(payload),
        })
    }
}

struct HostEntry<'a> {
    name: &'a str,
    digest: u64,
}

/// The virtual hosts of an encoded route configuration, read without decoding them.
fn virtual_hosts(config: &[u8]) -> Result<Vec<HostEntry<'_>>, Malformed> {
    Ok(fields(config)?
        .iter()
        .filter_map(Field::virtual_host)
        .collect())
}

/// The top-level fields of an encoded message, in order.
fn fields(mut bytes: &[u8]) -> Result<Vec<Field<'_>>, Malformed> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let start = bytes;
        let (number, wire_type) = decode_key(&mut bytes).map_err(|_| Malformed)?;
        let payload = match wire_type {
            WireType::Varint => {
                decode_varint(&mut bytes).map_err(|_| Malformed)?;
                None
            }
            WireType::SixtyFourBit => skip(&mut bytes, 8)?,
            WireType::ThirtyTwoBit => skip(&mut bytes, 4)?,
            WireType::LengthDelimited => {
                let len = usize::try_from(decode_varint(&mut bytes).map_err(|_| Malformed)?)
                    .map_err(|_| Malformed)?;
                skip(&mut bytes, len)?
            }
            WireType::StartGroup | WireType::EndGroup => {
                return Err(Malformed);
            }
        };
        let used = start.len() - bytes.len();
        out.push(Field {
            raw: &start[..used],
            number,
            payload: payload.filter(|_| wire_type == WireType::LengthDelimited),
        });
    }
    Ok(out)
}

/// Takes `len` bytes off the front of `bytes`.
fn skip<'a>(bytes: &mut &'a [u8], len: usize) -> Result<Option<&'a [u8]>, Malformed> {
    if bytes.len() < len {
        return Err(Malformed);
    }
    let (head, rest) = bytes.split_at(len);
    *bytes = rest;
    Ok(Some(head))
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::model::{self, VersionProbe};
    use crate::translate::{probe, route};

    fn trial(route_id: &str, version: &str) -> Vec<u8> {
        let p = VersionProbe {
            id: model::trial_id(route_id),
            version: version.into(),
            ..Default::default()
        };
        probe::version_probe_virtual_host(&p, "token").encode_to_vec()
    }

    fn live(route_id: &str, version: &str) -> Vec<u8> {
        let p = VersionProbe {
            id: route_id.into(),
            version: version.into(),
            ..Default::default()
        };
        probe::version_probe_virtual_host(&p, "token").encode_to_vec()
    }

    fn snapshot(hosts: &[Vec<u8>]) -> Snapshot {
        let mut hosts = hosts.to_vec();
        hosts.sort_by_key(|h| name_of(h));
        let body = route::route_configuration(ROUTE_CONFIG_NAME, hosts.iter().map(Vec::as_slice));
        Snapshot::new([Resource::new(ROUTE_CONFIG_NAME, body)])
    }

    fn name_of(host: &[u8]) -> String {
        envoy_types::pb::envoy::config::route::v3::VirtualHost::decode(host)
            .map(|h| h.name)
            .unwrap_or_default()
    }

    fn config(s: &Snapshot) -> Resource {
        s.resources(ROUTE)
            .and_then(|r| r.get(ROUTE_CONFIG_NAME))
            .map(|r| r.as_ref().clone())
            .expect("route configuration")
    }

    fn served(s: &Snapshot) -> Vec<String> {
        let decoded = RouteConfiguration::decode(config(s).body.value.as_slice()).expect("decodes");
        decoded.virtual_hosts.into_iter().map(|h| h.name).collect()
    }

    fn routes(problems: &[Problem]) -> Vec<(String, Cause)> {
        problems
            .iter()
            .map(|p| (p.subject().to_string(), p.cause()))
            .collect()
    }

    #[test]
    fn a_lone_new_trial_that_is_refused_is_left_out_until_it_changes() {
        let mut q = Quarantine::default();
        let first = q.apply(&snapshot(&[live("ns/a", "1"), trial("ns/a", "2")]));
        q.accepted(&config(&first));
        let with_bad = snapshot(&[live("ns/a", "1"), trial("ns/a", "2"), trial("ns/bad", "1")]);
        let sent = q.apply(&with_bad);
        assert!(q.refused(
            &config(&sent),
            "envoy-0",
            "RE2 program size of 165 > max program size of 100"
        ));
        assert_eq!(routes(&q.problems()), [("ns/bad".into(), Cause::Refused)]);
        assert!(
            q.problems()[0]
                .message()
                .ends_with("max program size of 100")
        );
        // The problem names the Envoy that refused: status tells a user where to look.
        assert!(
            q.problems()[0]
                .message()
                .starts_with("Envoy envoy-0 rejected these routes: "),
            "{:?}",
            q.problems()
        );

        let next = q.apply(&with_bad);
        assert_eq!(
            served(&next),
            ["switchyard-probe/ns/a", "switchyard-probe/trial/ns/a"]
        );
        assert_eq!(q.left_out(), 1);

        // The user fixes the route: its new trial is sent.
        let fixed = snapshot(&[live("ns/a", "1"), trial("ns/a", "2"), trial("ns/bad", "2")]);
        let sent = q.apply(&fixed);
        assert_eq!(q.left_out(), 0);
        assert!(served(&sent).contains(&"switchyard-probe/trial/ns/bad".to_string()));
        assert_eq!(q.problems(), []);
    }

    #[test]
    fn a_trial_left_out_leaves_the_parts_too() {
        let hosts = [live("ns/a", "1"), trial("ns/bad", "1")];
        let mut whole = snapshot(&hosts);
        let parts: Vec<Arc<Resource>> = hosts
            .iter()
            .map(|h| Arc::new(vhds::virtual_host(ROUTE_CONFIG_NAME, &name_of(h), h)))
            .collect();
        whole.update([], parts);
        let mut q = Quarantine::default();
        let sent = q.apply(&whole);
        q.refused(&config(&sent), "envoy-0", "bad regex");
        let next = q.apply(&whole);
        let names: Vec<&String> = next
            .resources(VIRTUAL_HOST)
            .expect("parts")
            .keys()
            .collect();
        assert_eq!(
            names,
            [&vhds::virtual_host_name(
                ROUTE_CONFIG_NAME,
                "switchyard-probe/ns/a"
            )]
        );
    }

    #[test]
    fn several_suspects_are_narrowed_down_to_the_one_to_blame() {
        let ids = ["ns/a", "ns/b", "ns/c", "ns/d", "ns/e"];
        let all = snapshot(&ids.iter().map(|id| trial(id, "1")).collect::<Vec<_>>());
        let bad = "switchyard-probe/trial/ns/d";
        let mut q = Quarantine::default();
        // An Envoy that refuses whatever holds the bad trial and accepts the rest, until
        // nothing changes any more.
        for round in 0.. {
            assert!(round < 10, "narrowing down did not end");
            let sent = q.apply(&all);
            let changed = if served(&sent).iter().any(|n| n == bad) {
                q.refused(&config(&sent), "envoy-0", "bad regex")
            } else {
                q.accepted(&config(&sent))
            };
            if !changed {
                break;
            }
        }
        assert_eq!(routes(&q.problems()), [("ns/d".into(), Cause::Refused)]);
        let names = served(&q.apply(&all));
        assert!(!names.iter().any(|n| n == bad), "{names:?}");
        assert_eq!(
            names.len(),
            ids.len() - 1,
            "every other trial is served: {names:?}"
        );
    }

    #[test]
    fn a_change_to_a_live_route_goes_on_trial_before_a_flood_of_new_routes() {
        // "ns/z" serves users and changes while ten new routes arrive, all refused; by
        // name it would sit out with the later half, at the bottom of the search.
        let mut hosts = vec![live("ns/z", "1"), trial("ns/z", "2")];
        let new: Vec<String> = (0..10).map(|i| format!("ns/new{i}")).collect();
        hosts.extend(new.iter().map(|id| trial(id, "1")));
        let all = snapshot(&hosts);
        let mut q = Quarantine::default();
        let sent = q.apply(&all);
        assert!(q.refused(&config(&sent), "envoy-0", "bad regex"));
        let sent = q.apply(&all);
        assert_eq!(
            served(&sent),
            [
                "switchyard-probe/ns/z".to_owned(),
                "switchyard-probe/trial/ns/z".to_owned()
            ],
            "the live route's trial alone"
        );
        assert!(q.accepted(&config(&sent)));
        // Then the new ones come back, to be searched among themselves.
        assert_eq!(served(&q.apply(&all)).len(), hosts.len());
    }

    #[test]
    fn many_bad_trials_among_many_are_each_found_in_few_rounds() {
        let ids: Vec<String> = (0..64).map(|i| format!("ns/r{i:02}")).collect();
        let bad: Vec<String> = ids
            .iter()
            .step_by(5)
            .map(|id| format!("{VERSION_PROBE_VHOST_PREFIX}{}", model::trial_id(id)))
            .collect();
        let all = snapshot(&ids.iter().map(|id| trial(id, "1")).collect::<Vec<_>>());
        let mut q = Quarantine::default();
        let mut rounds = 0;
        loop {
            rounds += 1;
            assert!(rounds < 500, "narrowing down did not end");
            let sent = q.apply(&all);
            let changed = if served(&sent).iter().any(|n| bad.contains(n)) {
                q.refused(&config(&sent), "envoy-0", "bad regex")
            } else {
                q.accepted(&config(&sent))
            };
            if !changed {
                break;
            }
        }
        let problems = q.problems();
        assert!(problems.iter().all(|p| p.cause() == Cause::Refused));
        assert_eq!(problems.len(), bad.len(), "{problems:?}");
        assert_eq!(served(&q.apply(&all)).len(), ids.len() - bad.len());
        // Depth first: about k·log2(n) rounds (13 bad among 64: 78), not k·n.
        assert!(rounds <= 2 * bad.len() * 6, "{rounds} rounds");
    }

    #[test]
    fn leaving_out_back_to_what_an_envoy_accepted_brings_the_next_group_at_once() {
        let mut q = Quarantine::default();
        let sent = q.apply(&snapshot(&[trial("ns/a", "1")]));
        q.accepted(&config(&sent));
        let accepted = config(&sent).version;
        let more = snapshot(&[
            trial("ns/a", "1"),
            trial("ns/b", "1"),
            trial("ns/c", "1"),
            trial("ns/d", "1"),
        ]);
        // Refused: c and d sit out, b goes alone and is refused too.
        let sent = q.apply(&more);
        assert!(q.refused(&config(&sent), "envoy-0", "bad"));
        let sent = q.apply(&more);
        assert_eq!(served(&sent).len(), 2, "a and b");
        assert!(q.refused(&config(&sent), "envoy-0", "bad"));
        // Without b it is what the Envoys hold already, which none of them would answer:
        // c and d come back at once.
        let next = q.apply(&more);
        assert_ne!(config(&next).version, accepted);
        assert_eq!(
            served(&next),
            [
                "switchyard-probe/trial/ns/a",
                "switchyard-probe/trial/ns/c",
                "switchyard-probe/trial/ns/d"
            ]
        );
    }

    #[test]
    fn verdicts_on_a_configuration_no_longer_current_are_ignored() {
        let mut q = Quarantine::default();
        let old = q.apply(&snapshot(&[trial("ns/a", "1")]));
        let _new = q.apply(&snapshot(&[trial("ns/a", "2")]));
        assert!(!q.refused(&config(&old), "envoy-0", "late"));
        assert_eq!(q.problems(), []);
    }

    #[test]
    fn a_refusal_no_trial_explains_concerns_every_route() {
        let mut q = Quarantine::default();
        let sent = q.apply(&snapshot(&[live("ns/a", "1")]));
        assert!(q.refused(&config(&sent), "envoy-0", "something else"));
        assert_eq!(routes(&q.problems()), [("*".into(), Cause::Unexplained)]);
        assert!(q.accepted(&config(&sent)), "an acceptance clears it");
        assert_eq!(q.problems(), []);
    }

    #[test]
    fn verdicts_told_as_text_read_back_as_they_were() {
        let problems = [
            Problem::refused("ns/a", "envoy-0", "bad regex"),
            Problem::benched("ns/b"),
            Problem::unexplained("envoy-1", "something else"),
            Problem::new("ns/c", "virtual host has no hosts"),
        ];
        for p in problems {
            let told = Problem::from_text(p.subject().clone(), p.message().to_owned());
            assert_eq!(told, p);
        }
    }

    #[test]
    fn every_other_field_of_the_configuration_is_kept() {
        let mut q = Quarantine::default();
        let s = snapshot(&[trial("ns/a", "1"), trial("ns/b", "1")]);
        let sent = q.apply(&s);
        q.refused(&config(&sent), "envoy-0", "no");
        let again = q.apply(&s);
        q.refused(&config(&again), "envoy-0", "no");
        let out = RouteConfiguration::decode(config(&q.apply(&s)).body.value.as_slice())
            .expect("decodes");
        assert_eq!(out.name, ROUTE_CONFIG_NAME);
        assert_eq!(
            out.request_headers_to_remove,
            [crate::translate::PROBE_TOKEN_HEADER]
        );
    }
}
