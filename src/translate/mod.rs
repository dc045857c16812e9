//! Pure, deterministic translation of the routing model into Envoy xDS resources.
