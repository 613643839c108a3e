//! Owner endpoints and the allowlist they must pass before the internal
//! token is attached to a request for them.
//!
//! An endpoint is `http://<host>:<port>` exactly: no user info, path,
//! query or fragment (a trailing `/` is tolerated), an explicit port, and a
//! host that is an IP literal or a DNS name the policy lists.
//!
//! A host forwards only to the internal port that every host of a
//! deployment shares: with no explicit policy, it derives
//! [`EndpointPolicy::internal_port`] from the port of its own advertised
//! endpoint, accepting loopback (`127.0.0.0/8`, `::1`) and private
//! addresses (`10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`,
//! `100.64.0.0/10`, `fc00::/7`) on that port only, and no DNS names. A
//! forged owner record naming another local port (a database, an admin
//! listener) is refused before anything connects. [`EndpointPolicy::default`]
//! (loopback and private on any port) is only for an explicit
//! [`crate::HostConfig::endpoint_policy`], e.g. tests whose hosts listen on
//! several ports of one machine; [`EndpointPolicy::ports`] narrows it to the
//! ports such a deployment uses.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The longest endpoint, in bytes.
pub const MAX_ENDPOINT_BYTES: usize = 512;

/// A validated owner endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    host: String,
    port: u16,
}

impl Endpoint {
    /// The host (an IP literal, IPv6 in brackets, or a DNS name).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The canonical form, `http://host:port`.
    pub fn url(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}:{}", self.host, self.port)
    }
}

/// Which endpoints a host forwards to (with its internal token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointPolicy {
    /// Accept loopback addresses.
    pub loopback: bool,
    /// Accept private addresses (RFC 1918, 100.64/10, IPv6 ULA).
    pub private: bool,
    /// DNS names accepted as they are (lowercase, exact match).
    pub hosts: Vec<String>,
    /// When set, only these ports.
    pub ports: Option<Vec<u16>>,
}

/// Loopback and private addresses on any port, no DNS names (only as an
/// explicit policy: a host's derived policy is
/// [`EndpointPolicy::internal_port`]).
impl Default for EndpointPolicy {
    fn default() -> Self {
        Self {
            loopback: true,
            private: true,
            hosts: Vec::new(),
            ports: None,
        }
    }
}

/// Why an endpoint was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("endpoint refused: {0}")]
pub struct EndpointRefused(pub String);

impl EndpointPolicy {
    /// Loopback and private addresses on `port` only, no DNS names: the
    /// policy a host derives from its own advertised endpoint's port (the
    /// internal port every host of a deployment shares).
    pub fn internal_port(port: u16) -> Self {
        Self::ports([port])
    }

    /// Loopback and private addresses on these ports only, no DNS names
    /// (hosts of one machine listening on several ports).
    pub fn ports(ports: impl IntoIterator<Item = u16>) -> Self {
        Self {
            ports: Some(ports.into_iter().collect()),
            ..Self::default()
        }
    }

    /// Loopback addresses on any port, no private addresses or DNS names:
    /// hosts of one machine that bind ephemeral ports (test and demo
    /// clusters), where no single internal port exists.
    pub fn loopback() -> Self {
        Self {
            private: false,
            ..Self::default()
        }
    }

    /// Parses `raw` and checks it against the policy.
    ///
    /// # Errors
    /// [`EndpointRefused`] naming the broken rule (grammar or allowlist).
    pub fn check(&self, raw: &str) -> Result<Endpoint, EndpointRefused> {
        let endpoint = parse(raw)?;
        if let Some(ports) = &self.ports
            && !ports.contains(&endpoint.port)
        {
            return Err(EndpointRefused(format!(
                "port {} is not allowed",
                endpoint.port
            )));
        }
        let bare = endpoint.host.trim_start_matches('[').trim_end_matches(']');
        match bare.parse::<IpAddr>() {
            Ok(ip) if self.ip_allowed(ip) => Ok(endpoint),
            Ok(ip) => Err(EndpointRefused(format!(
                "address {ip} is neither loopback nor private (or not allowed)"
            ))),
            Err(_) if self.hosts.iter().any(|h| h == &endpoint.host) => Ok(endpoint),
            Err(_) => Err(EndpointRefused(format!(
                "host name {} is not on the allowlist",
                endpoint.host
            ))),
        }
    }

    fn ip_allowed(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => self.v4_allowed(v4),
            IpAddr::V6(v6) => {
                if let Some(v4) = v6.to_ipv4_mapped() {
                    return self.v4_allowed(v4);
                }
                (self.loopback && v6 == Ipv6Addr::LOCALHOST)
                    || (self.private && (v6.segments()[0] & 0xfe00) == 0xfc00)
            }
        }
    }

    fn v4_allowed(&self, v4: Ipv4Addr) -> bool {
        let [a, b, ..] = v4.octets();
        let private = a == 10
            || (a == 172 && (16..=31).contains(&b))
            || (a == 192 && b == 168)
            || (a == 100 && (64..=127).contains(&b));
        (self.loopback && v4.is_loopback()) || (self.private && private)
    }
}

fn parse(raw: &str) -> Result<Endpoint, EndpointRefused> {
    let bad = |why: &str| EndpointRefused(why.to_owned());
    if raw.is_empty() || raw.len() > MAX_ENDPOINT_BYTES {
        return Err(bad("an endpoint is 1..=512 bytes"));
    }
    if !raw.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad(
            "an endpoint holds only visible ASCII (no spaces or control characters)",
        ));
    }
    let rest = raw
        .strip_prefix("http://")
        .ok_or_else(|| bad("an endpoint starts with http://"))?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#', '@', '\\', '%']) {
        return Err(bad(
            "an endpoint has no user info, path, query, fragment or escapes",
        ));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (inner, after) = v6
            .split_once(']')
            .ok_or_else(|| bad("an IPv6 host is closed by ]"))?;
        inner
            .parse::<Ipv6Addr>()
            .map_err(|_| bad("the bracketed host is not an IPv6 address"))?;
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| bad("an endpoint names its port"))?;
        (format!("[{inner}]"), port)
    } else {
        let (host, port) = authority
            .rsplit_once(':')
            .ok_or_else(|| bad("an endpoint names its port"))?;
        let dns = host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        });
        if !dns {
            return Err(bad(
                "the host is not an IPv4 address or a lowercase DNS name",
            ));
        }
        let numeric = host.bytes().all(|b| b.is_ascii_digit() || b == b'.');
        if numeric && host.parse::<Ipv4Addr>().is_err() {
            return Err(bad("the host is not a canonical dotted IPv4 address"));
        }
        (host.to_owned(), port)
    };
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("the port is 1..=65535 in decimal"));
    }
    if port.starts_with('0') {
        return Err(bad("the port has no leading zero"));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| bad("the port is 1..=65535 in decimal"))?;
    Ok(Endpoint { host, port })
}

#[cfg(test)]
mod tests;
