//! The node's network namespace: `lo` and the Pod bridge, and no route out of it. Every
//! process of the node and the test's own clients live in it, so no packet and no DNS
//! query can leave the machine, whatever a Pod or a misconfigured test tries.

use std::os::fd::AsRawFd;
use std::process::Command;

/// The node's address: the bridge's, which is also the Pods' gateway.
pub const NODE_IP: &str = "198.18.0.1";
/// Pods take addresses from here (host-local IPAM on the bridge).
pub const POD_SUBNET: &str = "198.18.0.0/16";
/// ClusterIPs.
pub const SERVICE_RANGE: &str = "198.19.0.0/16";
/// The `kubernetes` Service: the first address of [`SERVICE_RANGE`].
pub const API_SERVICE_IP: &str = "198.19.0.1";
/// CoreDNS's Service.
pub const DNS_SERVICE_IP: &str = "198.19.0.10";
/// The bridge the CNI plugin attaches Pods to; made here first, so the node has its
/// address before the first Pod.
pub const BRIDGE: &str = "cni0";

/// A network namespace made by `ip netns add` (mounted at /run/netns/NAME).
pub struct NetworkNamespace {
    pub name: String,
}

fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl NetworkNamespace {
    /// Creates it with `lo` up, the bridge at [`NODE_IP`] and the Service range on the
    /// bridge (the only routes); forwarding on and bridged
    /// traffic through iptables, as kube-proxy needs (both settings are per namespace).
    pub fn create(name: &str) -> Result<NetworkNamespace, String> {
        ip(&["netns", "add", name])?;
        let ns = NetworkNamespace {
            name: name.to_string(),
        };
        let address = format!("{NODE_IP}/16");
        for args in [
            vec!["-n", name, "link", "set", "lo", "up"],
            vec!["-n", name, "link", "add", BRIDGE, "type", "bridge"],
            vec!["-n", name, "addr", "add", &address, "dev", BRIDGE],
            vec!["-n", name, "link", "set", BRIDGE, "up"],
            // A local client's packet to a ClusterIP needs a route before kube-proxy's
            // DNAT rewrites it to a Pod's address; there is no default route to take.
            vec!["-n", name, "route", "add", SERVICE_RANGE, "dev", BRIDGE],
        ] {
            ip(&args)?;
        }
        ip(&[
            "netns",
            "exec",
            name,
            "sysctl",
            "-q",
            "-w",
            "net.ipv4.ip_forward=1",
            "net.bridge.bridge-nf-call-iptables=1",
        ])?;
        Ok(ns)
    }

    /// Moves the calling thread into the namespace. Threads it starts later, and the
    /// processes they spawn, are born in it too.
    pub fn enter_current_thread(&self) -> Result<(), String> {
        let path = format!("/run/netns/{}", self.name);
        let file = std::fs::File::open(&path).map_err(|e| format!("open {path}: {e}"))?;
        // SAFETY: setns on a valid descriptor of a network namespace changes only this
        // thread's namespace.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc != 0 {
            return Err(format!(
                "setns({path}): {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// `ip route show table all` inside: what a test checks for a way out.
    pub fn routes(&self) -> Result<String, String> {
        ip(&["-n", &self.name, "route", "show", "table", "all"])
    }

    /// The names of its interfaces.
    pub fn links(&self) -> Result<Vec<String>, String> {
        let out = ip(&["-n", &self.name, "-o", "link", "show"])?;
        Ok(out
            .lines()
            .filter_map(|l| l.split(':').nth(1))
            .map(|n| n.trim().split('@').next().unwrap_or("").to_string())
            .collect())
    }

    /// Unmounts and removes it; its veths go with it once no process holds it.
    pub fn delete(&self) {
        let _ = ip(&["netns", "delete", &self.name]);
    }
}

/// Whether a namespace of this name exists.
pub fn exists(name: &str) -> bool {
    std::path::Path::new("/run/netns").join(name).exists()
}
