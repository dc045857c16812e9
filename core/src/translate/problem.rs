//! What was left out of a translation, and why: a [`Problem`] names its [`Subject`] and says
//! what is wrong in words; its [`Cause`] says where it comes from, for code to act on.
//!
//! Subjects read as they always have (`ns/web`, `cluster/<name>`, `*`): status, logs,
//! golden files and other replicas' reports (see `src/k8s/fleet_report.rs`) carry them as
//! text, and problems are listed in the order of that text.

use std::cmp::Ordering;
use std::fmt;

/// What a problem is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    /// A virtual host, by name: a route's id (`namespace/name`). The quarantine's verdicts
    /// on a route's routes on trial are about it too.
    VirtualHost(String),
    /// An endpoint probe, by id: reads `probe/<id>`.
    EndpointProbe(String),
    /// A version probe, by id: reads `version-probe/<id>`.
    VersionProbe(String),
    /// A cluster, by name: reads `cluster/<name>`.
    Cluster(String),
    /// A TLS secret, by name (`namespace/name`): reads `secret/<name>`.
    Secret(String),
    /// A Gateway listener, by name: reads `gateway-listener/<name>`.
    GatewayListener(String),
    /// The shared listeners' settings: reads `listeners`.
    Listeners,
    /// Every route: an Envoy refused the route configuration, and no route on trial
    /// explains it. Reads `*`.
    EveryRoute,
}

impl Subject {
    /// The text it reads as, in two parts: a fixed prefix and the name.
    fn parts(&self) -> (&'static str, &str) {
        match self {
            Self::VirtualHost(name) => ("", name),
            Self::EndpointProbe(id) => ("probe/", id),
            Self::VersionProbe(id) => ("version-probe/", id),
            Self::Cluster(name) => ("cluster/", name),
            Self::Secret(name) => ("secret/", name),
            Self::GatewayListener(name) => ("gateway-listener/", name),
            Self::Listeners => ("listeners", ""),
            Self::EveryRoute => ("*", ""),
        }
    }

    /// Tells apart subjects that read alike (a virtual host named `listeners`).
    fn rank(&self) -> u8 {
        match self {
            Self::VirtualHost(_) => 0,
            Self::EndpointProbe(_) => 1,
            Self::VersionProbe(_) => 2,
            Self::Cluster(_) => 3,
            Self::Secret(_) => 4,
            Self::GatewayListener(_) => 5,
            Self::Listeners => 6,
            Self::EveryRoute => 7,
        }
    }

    /// The virtual host's name, when the subject is one.
    pub fn virtual_host(&self) -> Option<&str> {
        match self {
            Self::VirtualHost(name) => Some(name),
            _ => None,
        }
    }

    /// The route (`namespace/name`) the subject belongs to: a virtual host is named after
    /// its route, an endpoint probe's id is the route's and a version
    /// (`namespace/name/version`).
    pub fn route(&self) -> Option<&str> {
        match self {
            Self::VirtualHost(name) => Some(name),
            Self::EndpointProbe(id) => id.rsplit_once('/').map(|(route, _)| route),
            _ => None,
        }
    }
}

/// A bare name is a virtual host's: most problems are about one.
impl From<&str> for Subject {
    fn from(name: &str) -> Self {
        Self::VirtualHost(name.to_owned())
    }
}

impl From<&String> for Subject {
    fn from(name: &String) -> Self {
        Self::VirtualHost(name.clone())
    }
}

impl From<String> for Subject {
    fn from(name: String) -> Self {
        Self::VirtualHost(name)
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (prefix, name) = self.parts();
        write!(f, "{prefix}{name}")
    }
}

impl Ord for Subject {
    /// In the order of the text they read as (problems are listed in it, byte for byte as
    /// when subjects were strings), without writing that text out.
    fn cmp(&self, other: &Self) -> Ordering {
        let ((a, a_name), (b, b_name)) = (self.parts(), other.parts());
        let text = a.bytes().chain(a_name.bytes());
        text.cmp(b.bytes().chain(b_name.bytes()))
            .then_with(|| self.rank().cmp(&other.rank()))
    }
}

impl PartialOrd for Subject {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Where a problem comes from, which decides what a route's status does with it: the
/// input, an Envoy's answer (the quarantine's verdicts), or a TLS Secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cause {
    /// The input cannot be served as it is: every replica that translates it finds the
    /// same.
    Input,
    /// An Envoy refused the route's routes on trial; the message names the Envoy and gives
    /// its words. They stay left out until the route changes.
    Refused,
    /// The route's routes on trial sit out for a moment, while the route to blame for a
    /// refused route configuration is found.
    Benched,
    /// An Envoy refused the route configuration, and no route on trial explains it.
    Unexplained,
    /// The route's TLS Secret, as the operator's watch has it, cannot serve (see
    /// `src/k8s/tls_secrets.rs`): it is `missing` (else its content is not a certificate
    /// and key), and its last good certificate is `kept` serving (else the route is left
    /// out until it has a good one).
    TlsSecret { missing: bool, kept: bool },
}

/// Something in the input that was left out of the snapshot, or an Envoy's verdict on it.
/// Problems are ordered by subject, then message, as they read.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Problem {
    subject: Subject,
    message: String,
    cause: Cause,
}

impl Problem {
    /// A problem with the input: `subject` (a bare name is a virtual host's) cannot be
    /// served as it is, for the reason `message` gives.
    pub fn new(subject: impl Into<Subject>, message: impl Into<String>) -> Self {
        Self::with_cause(subject.into(), message.into(), Cause::Input)
    }

    /// Route `route`'s TLS Secret cannot serve, as `message` tells (see [`Cause::TlsSecret`]).
    pub fn tls_secret(route: &str, message: impl Into<String>, missing: bool, kept: bool) -> Self {
        let subject = Subject::VirtualHost(route.to_owned());
        Self::with_cause(subject, message.into(), Cause::TlsSecret { missing, kept })
    }

    /// The message must say what `cause` is: the constructors here and the quarantine's
    /// (see [`super::quarantine`]) see to it.
    pub(super) fn with_cause(subject: Subject, message: String, cause: Cause) -> Self {
        Self {
            subject,
            message,
            cause,
        }
    }

    pub fn subject(&self) -> &Subject {
        &self.subject
    }

    /// What is wrong, in words: what a user reads in status and logs.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn into_message(self) -> String {
        self.message
    }

    pub fn cause(&self) -> Cause {
        self.cause
    }

    /// Comes from an Envoy's answer (the quarantine's verdicts), not from the input, which
    /// every replica translates alike: the replica whose Envoy answered has to tell the
    /// others.
    pub fn from_an_envoy(&self) -> bool {
        matches!(
            self.cause,
            Cause::Refused | Cause::Benched | Cause::Unexplained
        )
    }

    /// An Envoy's own words (a refusal), which say what to fix.
    pub fn in_envoys_words(&self) -> bool {
        matches!(self.cause, Cause::Refused | Cause::Unexplained)
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.subject, self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_read_and_sort_as_their_text() {
        let subjects = [
            Subject::EveryRoute,
            Subject::VirtualHost("ns/web".into()),
            Subject::EndpointProbe("ns/web/1".into()),
            Subject::VersionProbe("ns/web".into()),
            Subject::Cluster("ns/api/80".into()),
            Subject::Secret("ns/cert".into()),
            Subject::GatewayListener("gw/web/http".into()),
            Subject::Listeners,
            Subject::VirtualHost("listeners".into()),
        ];
        let texts: Vec<String> = subjects.iter().map(Subject::to_string).collect();
        assert_eq!(
            texts,
            [
                "*",
                "ns/web",
                "probe/ns/web/1",
                "version-probe/ns/web",
                "cluster/ns/api/80",
                "secret/ns/cert",
                "gateway-listener/gw/web/http",
                "listeners",
                "listeners",
            ]
        );
        let mut by_subject = subjects.to_vec();
        by_subject.sort();
        let mut by_text = texts.clone();
        by_text.sort();
        assert_eq!(
            by_subject
                .iter()
                .map(Subject::to_string)
                .collect::<Vec<_>>(),
            by_text
        );
        // Two that read alike are still two.
        assert_ne!(
            Subject::Listeners.cmp(&Subject::VirtualHost("listeners".into())),
            Ordering::Equal
        );
    }

    #[test]
    fn a_virtual_host_and_an_endpoint_probe_belong_to_their_route() {
        let route = |s: Subject| s.route().map(str::to_owned);
        assert_eq!(
            route(Subject::VirtualHost("ns/web".into())).as_deref(),
            Some("ns/web")
        );
        let probe = Subject::EndpointProbe("ns/web/4f2a".into());
        assert_eq!(route(probe).as_deref(), Some("ns/web"));
        assert_eq!(route(Subject::VersionProbe("ns/web".into())), None);
        assert_eq!(route(Subject::Cluster("ns/web/80".into())), None);
    }

    #[test]
    fn a_bare_name_is_a_virtual_host() {
        let p = Problem::new("ns/web", "virtual host has no hosts");
        assert_eq!(p.subject().virtual_host(), Some("ns/web"));
        assert_eq!(p.cause(), Cause::Input);
        assert!(!p.from_an_envoy());
        assert_eq!(p.to_string(), "ns/web: virtual host has no hosts");
    }
}
