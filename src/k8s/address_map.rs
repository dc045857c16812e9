//! Maps one IPv4 range onto another, keeping the host bits.
//!
//! Kubernetes refuses loopback addresses in EndpointSlices, but a single-host rig runs every
//! backend and Envoy on 127.0.0.x. Such a rig lists them under a reserved range (e.g.
//! 198.18.0.0/16) and runs Switchyard with `--endpoint-address-map 198.18.0.0/16=127.0.0.0/16`.
//! Not for production clusters.

use std::net::Ipv4Addr;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressMap {
    from: u32,
    to: u32,
    mask: u32,
}

impl AddressMap {
    pub fn map(&self, address: &str) -> String {
        match Ipv4Addr::from_str(address) {
            Ok(ip) if u32::from(ip) & self.mask == self.from => {
                Ipv4Addr::from(self.to | (u32::from(ip) & !self.mask)).to_string()
            }
            _ => address.to_string(),
        }
    }
}

impl FromStr for AddressMap {
    type Err = String;

    /// "FROM/LEN=TO/LEN", both prefixes the same length.
    fn from_str(text: &str) -> Result<Self, String> {
        let (from, to) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?}: expected FROM/LEN=TO/LEN"))?;
        let (from, from_len) = cidr(from)?;
        let (to, to_len) = cidr(to)?;
        if from_len != to_len {
            return Err(format!("{text:?}: both ranges need the same prefix length"));
        }
        let mask = if from_len == 0 {
            0
        } else {
            u32::MAX << (32 - from_len)
        };
        Ok(Self {
            from: from & mask,
            to: to & mask,
            mask,
        })
    }
}

fn cidr(text: &str) -> Result<(u32, u32), String> {
    let (ip, len) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?}: expected an IPv4 CIDR like 198.18.0.0/16"))?;
    let ip = Ipv4Addr::from_str(ip).map_err(|e| format!("{text:?}: {e}"))?;
    let len: u32 = len.parse().map_err(|e| format!("{text:?}: {e}"))?;
    if len > 32 {
        return Err(format!("{text:?}: prefix length above 32"));
    }
    Ok((u32::from(ip), len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_inside_the_range_only() {
        let map: AddressMap = "198.18.0.0/16=127.0.0.0/16".parse().expect("valid");
        assert_eq!(map.map("198.18.0.41"), "127.0.0.41");
        assert_eq!(map.map("198.18.3.7"), "127.0.3.7");
        assert_eq!(map.map("10.1.2.3"), "10.1.2.3");
        assert_eq!(map.map("fd00::1"), "fd00::1");
        assert!("198.18.0.0/16=127.0.0.0/8".parse::<AddressMap>().is_err());
        assert!("198.18.0.0/16".parse::<AddressMap>().is_err());
    }
}
