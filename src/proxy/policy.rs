//! The egress decision for one destination: the grant's mode and allow list, then the addresses
//! the name resolves to, checked against the ranges no sandbox may reach. The caller connects to
//! the addresses checked here, so a second lookup cannot swap in another (DNS rebinding).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use super::grant::Egress;

const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// The cloud metadata service, which hands out the host's credentials.
const METADATA: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

/// Where a destination may go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Connect to these addresses (in order), and only these.
    Allow(Vec<SocketAddr>),
    /// Refused, and why.
    Deny(String),
}

/// Decide on `host:port` (host lowercased, IPv6 without brackets) under `egress`.
pub async fn decide(egress: &Egress, host: &str, port: u16) -> Verdict {
    let literal = host.parse::<IpAddr>().ok();
    let listed_ip = match egress {
        Egress::ModelOnly => {
            return Verdict::Deny(
                "the run's egress mode is modelOnly (the model APIs through rover only)".into(),
            )
        }
        Egress::Closed => return Verdict::Deny("the run's egress mode is none".into()),
        Egress::Open => false,
        Egress::Allow { hosts } => {
            match hosts
                .iter()
                .find_map(|entry| entry_matches(entry, host, port))
            {
                Some(listed_ip) => listed_ip,
                None => {
                    return Verdict::Deny(format!(
                        "{} is not on the run's allow list",
                        show(host, port)
                    ))
                }
            }
        }
    };
    let addrs: Vec<SocketAddr> = if let Some(ip) = literal {
        vec![SocketAddr::new(ip, port)]
    } else {
        match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port))).await {
            Ok(Ok(addrs)) => addrs.collect(),
            Ok(Err(e)) => return Verdict::Deny(format!("{host} does not resolve ({e})")),
            Err(_) => return Verdict::Deny(format!("{host} did not resolve within 10 seconds")),
        }
    };
    if addrs.is_empty() {
        return Verdict::Deny(format!("{host} resolves to no address"));
    }
    // One forbidden address refuses the name: it may be a rebinding attempt.
    for addr in &addrs {
        if let Some(kind) = forbidden(addr.ip(), listed_ip) {
            return Verdict::Deny(if literal.is_some() {
                format!("{host} is {kind}")
            } else {
                format!("{host} resolves to {}, {kind}", addr.ip())
            });
        }
    }
    Verdict::Allow(addrs)
}

/// `host:port` as people write it (IPv6 in brackets).
pub fn show(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Whether the allow-list `entry` admits `host:port`; `Some(true)` when the entry is an IP
/// literal (which may then be a private or loopback address).
fn entry_matches(entry: &str, host: &str, port: u16) -> Option<bool> {
    let entry = entry.trim().to_ascii_lowercase();
    let (name, entry_port) = split_entry(&entry);
    let port_ok = match entry_port {
        Some(p) => p == port,
        None => port == 443 || port == 80,
    };
    if !port_ok {
        return None;
    }
    if let Ok(ip) = name.parse::<IpAddr>() {
        let asked = host.parse::<IpAddr>().ok()?;
        return (canonical(ip) == canonical(asked)).then_some(true);
    }
    let name = name.trim_end_matches('.');
    let matched = match name.strip_prefix("*.") {
        Some(suffix) => host
            .strip_suffix(suffix)
            .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        None => host == name,
    };
    matched.then_some(false)
}

/// An entry's name and port: `host`, `host:port`, `1.2.3.4:5`, `[::1]:5`, `::1`.
fn split_entry(entry: &str) -> (&str, Option<u16>) {
    if let Some(rest) = entry.strip_prefix('[') {
        if let Some((ip, tail)) = rest.split_once(']') {
            return (ip, tail.strip_prefix(':').and_then(|p| p.parse().ok()));
        }
    }
    if entry.parse::<Ipv6Addr>().is_ok() {
        return (entry, None);
    }
    match entry.rsplit_once(':') {
        Some((name, port)) => match port.parse() {
            Ok(port) => (name, Some(port)),
            Err(_) => (entry, None),
        },
        None => (entry, None),
    }
}

/// An IPv4-mapped or -compatible IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    }
}

/// Why `ip` may not be reached, if it may not; `listed_ip` (the allow entry is this literal IP)
/// lifts the ban on loopback and private addresses, never on the others.
fn forbidden(ip: IpAddr, listed_ip: bool) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4 == METADATA {
                Some("the cloud metadata address")
            } else if a == 0 {
                Some("an unspecified address")
            } else if v4.is_link_local() {
                Some("a link-local address")
            } else if v4.is_multicast() || v4.is_broadcast() {
                Some("a multicast or broadcast address")
            } else if listed_ip {
                None
            } else if v4.is_loopback() {
                Some("a loopback address (allow it by its literal IP if it must be reached)")
            } else if v4.is_private() || (a == 100 && (64..128).contains(&b)) {
                Some("a private address (allow it by its literal IP if it must be reached)")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6.is_unspecified() {
                Some("an unspecified address")
            } else if first & 0xffc0 == 0xfe80 {
                Some("a link-local address")
            } else if v6.is_multicast() {
                Some("a multicast address")
            } else if listed_ip {
                None
            } else if v6.is_loopback() {
                Some("a loopback address (allow it by its literal IP if it must be reached)")
            } else if first & 0xfe00 == 0xfc00 {
                Some("a private address (allow it by its literal IP if it must be reached)")
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(hosts: &[&str]) -> Egress {
        Egress::Allow {
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        }
    }

    #[test]
    fn allow_entries_match_names_suffixes_and_ports() {
        assert_eq!(entry_matches("pypi.org", "pypi.org", 443), Some(false));
        assert_eq!(entry_matches("pypi.org", "pypi.org", 8443), None);
        assert_eq!(
            entry_matches("pypi.org:8443", "pypi.org", 8443),
            Some(false)
        );
        assert_eq!(
            entry_matches("*.pythonhosted.org", "files.pythonhosted.org", 443),
            Some(false)
        );
        assert_eq!(
            entry_matches("*.pythonhosted.org", "pythonhosted.org", 443),
            None
        );
        assert_eq!(
            entry_matches("*.pythonhosted.org", "evilpythonhosted.org", 443),
            None
        );
        assert_eq!(
            entry_matches("127.0.0.1:9000", "127.0.0.1", 9000),
            Some(true)
        );
        assert_eq!(entry_matches("[::1]:9000", "::1", 9000), Some(true));
        assert_eq!(entry_matches("::1", "::1", 443), Some(true));
    }

    #[tokio::test]
    async fn forbidden_ranges_are_refused_in_every_mode() {
        for (egress, host) in [
            (Egress::Open, "127.0.0.1"),
            (Egress::Open, "169.254.169.254"),
            (Egress::Open, "10.1.2.3"),
            (Egress::Open, "::ffff:127.0.0.1"),
            (Egress::Open, "fd00::1"),
            (Egress::Open, "0.0.0.0"),
            (allow(&["169.254.169.254"]), "169.254.169.254"),
            (allow(&["0.0.0.0"]), "0.0.0.0"),
            (Egress::Open, "localhost"),
            (Egress::ModelOnly, "93.184.216.34"),
            (Egress::Closed, "93.184.216.34"),
        ] {
            assert!(
                matches!(decide(&egress, host, 443).await, Verdict::Deny(_)),
                "{egress:?} {host}"
            );
        }
        for (egress, host) in [
            (Egress::Open, "93.184.216.34"),
            (allow(&["10.1.2.3"]), "10.1.2.3"),
            (allow(&["127.0.0.1"]), "127.0.0.1"),
        ] {
            assert!(
                matches!(decide(&egress, host, 443).await, Verdict::Allow(_)),
                "{egress:?} {host}"
            );
        }
    }
}
