//! Where tools may connect: by default only to public addresses.
//!
//! An agent's HTTP tools and MCP servers are reached with URLs that the model (through tool
//! arguments) or a config author controls, from inside the deployment's network. Without a
//! rule they would reach the loopback interface, the private network and the cloud metadata
//! service (169.254.169.254): server-side request forgery. So every address a tool connects to
//! is checked **after resolution, at connect time** (the HTTP client's resolver filters what
//! DNS returns, so a name that resolves to a public address when checked and a private one
//! when used cannot slip through), and IP literals in URLs are checked before the request.
//!
//! A tool's config may allow more with `allow_private`: a list of IP addresses, CIDR blocks
//! (`10.0.0.0/8`), host names (that name may resolve anywhere), or `"*"`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// What a tool may reach besides public addresses.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    rules: Arc<[Rule]>,
}

#[derive(Debug, Clone, PartialEq)]
enum Rule {
    Any,
    Net { base: IpAddr, prefix: u8 },
    Host(String),
}

/// A refused target. Its text (what the model, and through it the user, reads) names the host
/// and the rule but not the address it resolved to or its class, which would map internal
/// names; those are fields, for the log.
#[derive(Debug, Clone, thiserror::Error)]
#[error("refused to connect to {host}: it is not a public address (allow it with the tool's `allow_private` setting)")]
pub struct Refused {
    pub host: String,
    pub addr: IpAddr,
    pub class: &'static str,
}

impl EgressPolicy {
    /// Parses `allow_private` entries.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut rules = Vec::new();
        for e in entries {
            let e = e.trim();
            let rule = if e == "*" {
                Rule::Any
            } else if let Some((ip, prefix)) = e.split_once('/') {
                let base: IpAddr = ip
                    .parse()
                    .map_err(|_| format!("allow_private: {e:?} is not a CIDR block"))?;
                let max = if base.is_ipv4() { 32 } else { 128 };
                let prefix: u8 = prefix
                    .parse()
                    .ok()
                    .filter(|p| *p <= max)
                    .ok_or_else(|| format!("allow_private: {e:?} has a bad prefix length"))?;
                Rule::Net { base, prefix }
            } else if let Ok(ip) = e.trim_matches(['[', ']']).parse::<IpAddr>() {
                Rule::Net {
                    base: ip,
                    prefix: if ip.is_ipv4() { 32 } else { 128 },
                }
            } else if !e.is_empty() && !e.contains(char::is_whitespace) {
                Rule::Host(e.to_ascii_lowercase())
            } else {
                return Err(format!(
                    "allow_private: {e:?} is not an address, CIDR block or host"
                ));
            };
            rules.push(rule);
        }
        Ok(EgressPolicy {
            rules: rules.into(),
        })
    }

    fn host_allowed(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.rules.iter().any(|r| match r {
            Rule::Any => true,
            Rule::Host(h) => *h == host,
            Rule::Net { .. } => false,
        })
    }

    fn addr_allowed(&self, addr: IpAddr) -> bool {
        self.rules.iter().any(|r| match r {
            Rule::Any => true,
            Rule::Net { base, prefix } => in_net(addr, *base, *prefix),
            Rule::Host(_) => false,
        })
    }

    /// Checks one address `host` resolved to (or an IP literal).
    pub fn check(&self, host: &str, addr: IpAddr) -> Result<(), Refused> {
        match non_public(addr) {
            Some(class) if !self.host_allowed(host) && !self.addr_allowed(addr) => Err(Refused {
                host: host.to_string(),
                addr,
                class,
            }),
            _ => Ok(()),
        }
    }

    /// Checks a URL's host if it is an IP literal (names are checked by [`Self::resolve`]).
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), Refused> {
        let host = url.host_str().unwrap_or("").trim_matches(['[', ']']);
        match host.parse::<IpAddr>() {
            Ok(ip) => self.check(host, ip),
            Err(_) => Ok(()),
        }
    }

    /// Resolves `host` and keeps the addresses this policy allows; an error names the rule
    /// when none is left.
    pub async fn resolve(&self, host: &str) -> std::io::Result<Vec<SocketAddr>> {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, 0)).await?.collect();
        let mut refused = None;
        let allowed: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|a| match self.check(host, a.ip()) {
                Ok(()) => true,
                Err(r) => {
                    refused.get_or_insert(r);
                    false
                }
            })
            .collect();
        match (allowed.is_empty(), refused) {
            (true, Some(r)) => Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, r)),
            _ => Ok(allowed),
        }
    }
}

fn in_net(addr: IpAddr, base: IpAddr, prefix: u8) -> bool {
    match (addr, base) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(a) & mask == u128::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V4(_)) => a
            .to_ipv4_mapped()
            .is_some_and(|v4| in_net(IpAddr::V4(v4), base, prefix)),
        _ => false,
    }
}

/// The class of a non-public address, or `None` for a public one.
pub fn non_public(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V4(v4) => non_public_v4(v4),
        IpAddr::V6(v6) => non_public_v6(v6),
    }
}

fn non_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    Some(if ip.is_loopback() {
        "loopback"
    } else if ip.is_private() {
        "private"
    } else if ip.is_link_local() {
        "link-local (cloud metadata)"
    } else if ip.is_unspecified() || a == 0 {
        "unspecified"
    } else if a == 100 && (64..128).contains(&b) {
        "shared (carrier-grade NAT)"
    } else if ip.is_broadcast() || ip.is_multicast() || a >= 240 {
        "multicast or reserved"
    } else if a == 198 && (b == 18 || b == 19) {
        "benchmarking"
    } else if a == 192 && b == 0 && ip.octets()[2] == 0 {
        "IETF protocol assignment"
    } else {
        return None;
    })
}

fn non_public_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return non_public_v4(v4);
    }
    let seg = ip.segments();
    // NAT64 (64:ff9b::/96) carries an IPv4 address in its last 32 bits.
    if seg[0] == 0x64 && seg[1] == 0xff9b && seg[2..6] == [0, 0, 0, 0] {
        let [.., a, b] = seg;
        return non_public_v4(Ipv4Addr::from((u32::from(a) << 16) | u32::from(b)));
    }
    // 6to4 (2002::/16) carries one in bits 16..48; IPv4-compatible (::/96) in the last 32.
    if seg[0] == 0x2002 {
        return non_public_v4(Ipv4Addr::from(
            (u32::from(seg[1]) << 16) | u32::from(seg[2]),
        ));
    }
    if seg[..6] == [0, 0, 0, 0, 0, 0] && !ip.is_loopback() && !ip.is_unspecified() {
        return non_public_v4(Ipv4Addr::from(
            (u32::from(seg[6]) << 16) | u32::from(seg[7]),
        ));
    }
    Some(if ip.is_loopback() {
        "loopback"
    } else if ip.is_unspecified() {
        "unspecified"
    } else if seg[0] == 0x2001 && seg[1] == 0 {
        "Teredo tunnel"
    } else if seg[0] == 0x64 && seg[1] == 0xff9b && seg[2] == 1 {
        "local NAT64"
    } else if seg[0] & 0xfe00 == 0xfc00 {
        "private (unique local)"
    } else if seg[0] & 0xffc0 == 0xfe80 || seg[0] & 0xffc0 == 0xfec0 {
        "link-local"
    } else if ip.is_multicast() {
        "multicast or reserved"
    } else {
        return None;
    })
}

/// reqwest 0.12's resolver hook (HTTP tools).
#[derive(Debug, Clone)]
pub struct Resolver(pub EgressPolicy);

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0.clone();
        Box::pin(async move {
            let addrs = policy.resolve(name.as_str()).await?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// reqwest 0.13's resolver hook (rmcp's client, MCP over HTTP).
#[derive(Debug, Clone)]
pub struct McpResolver(pub EgressPolicy);

impl mcp_reqwest::dns::Resolve for McpResolver {
    fn resolve(&self, name: mcp_reqwest::dns::Name) -> mcp_reqwest::dns::Resolving {
        let policy = self.0.clone();
        Box::pin(async move {
            let addrs = policy.resolve(name.as_str()).await?;
            Ok(Box::new(addrs.into_iter()) as mcp_reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn private_loopback_link_local_and_unspecified_are_refused_by_default() {
        let p = EgressPolicy::default();
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "::7f00:1",
            "2002:7f00:1::",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "198.18.0.1",
        ] {
            assert!(p.check("h", ip(a)).is_err(), "{a} should be refused");
        }
        for a in ["8.8.8.8", "1.1.1.1", "2606:4700::1111"] {
            assert!(p.check("h", ip(a)).is_ok(), "{a} should be allowed");
        }
        let e = p.check("metadata", ip("169.254.169.254")).unwrap_err();
        assert_eq!(e.class, "link-local (cloud metadata)", "{e:?}");
        // What the model (and the user through it) reads names neither the address nor its
        // class: they would map internal names.
        assert!(
            !e.to_string().contains("169.254") && !e.to_string().contains("link-local"),
            "{e}"
        );
    }

    #[test]
    fn allow_private_takes_addresses_blocks_and_hosts() {
        let p = EgressPolicy::parse(&[
            "127.0.0.1".into(),
            "10.0.0.0/8".into(),
            "db.internal".into(),
        ])
        .unwrap();
        assert!(p.check("x", ip("127.0.0.1")).is_ok());
        assert!(p.check("x", ip("127.0.0.2")).is_err());
        assert!(p.check("x", ip("10.200.0.1")).is_ok());
        assert!(p.check("db.internal", ip("192.168.0.9")).is_ok());
        assert!(p.check("x", ip("::ffff:10.0.0.1")).is_ok());
        assert!(EgressPolicy::parse(&["*".into()])
            .unwrap()
            .check("x", ip("::1"))
            .is_ok());
        assert!(EgressPolicy::parse(&["10.0.0.0/99".into()]).is_err());
        assert!(EgressPolicy::parse(&["not a host".into()]).is_err());
    }
}
