//! What the translator's problem map is keyed by.

/// Keys of the problem map: the step of a translation that found its problems, which
/// replaces or drops them all when it runs again.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Found {
    /// A virtual host's checks and its claim on its hosts, by name.
    Host(String),
    /// A cluster's build, by name.
    Cluster(String),
    /// A version probe's checks, by id.
    VersionProbe(String),
    /// A version probe's placement, by id: left out with its virtual host.
    LeftOut(String),
    /// The choice of every endpoint probe.
    EndpointProbes,
    /// The shared listeners' settings.
    Listeners,
    /// The choice of every Gateway listener.
    GatewayListeners,
}
