//! The addresses of the Kubernetes rig's listeners. The API server refuses loopback
//! addresses in EndpointSlices, and every Envoy and backend a slice names runs on this
//! machine; so they bind to addresses in [`RANGE`] (198.18.0.0/15 is reserved for
//! benchmarking), which this machine's `lo` takes as its own: `ip route replace local
//! 198.18.0.0/16 dev lo`, the route the kernel keeps for 127.0.0.0/8. Traffic to them never
//! leaves `lo`, and Switchyard reads them as Kubernetes lists them: nothing is mapped.
//!
//! The route is added once per boot, by the first rig that needs it (as root), and stays.
//! The node of `node/` has a network namespace of its own, where none of this applies.

use std::net::{Ipv4Addr, TcpListener};
use std::process::Command;
use std::sync::OnceLock;

/// The range local to `lo` for the rig's listeners.
pub const RANGE: &str = "198.18.0.0/16";

/// `198.18.{block}.{host}`, an address of [`RANGE`] a listener can bind to.
pub fn address(block: u8, host: u8) -> String {
    ensure_local();
    Ipv4Addr::new(198, 18, block, host).to_string()
}

/// Makes [`RANGE`] local to `lo` unless it is already; panics with what to run when it
/// cannot (not root).
pub fn ensure_local() {
    static LOCAL: OnceLock<Result<(), String>> = OnceLock::new();
    if let Err(e) = LOCAL.get_or_init(make_local) {
        panic!("{e}");
    }
}

fn make_local() -> Result<(), String> {
    if bindable() {
        return Ok(());
    }
    let tried = Command::new("ip")
        .args(["route", "replace", "local", RANGE, "dev", "lo"])
        .output();
    let why = match tried {
        Ok(out) if out.status.success() && bindable() => return Ok(()),
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
        Err(e) => format!("cannot run ip: {e}"),
    };
    Err(format!(
        "the rig's Envoys and backends listen on {RANGE}, which is not local here and \
         could not be made so ({why}); run as root: ip route replace local {RANGE} dev lo"
    ))
}

/// Whether an address of the range can be bound: the route is in place.
fn bindable() -> bool {
    TcpListener::bind((Ipv4Addr::new(198, 18, 255, 254), 0)).is_ok()
}
