//! The checks every outbound request passes before any connection: its
//! method and origin against the grant, and every address it would connect
//! to (a resolved name's included) against the ranges a plugin may not reach.
//!
//! Invariants: loopback, link-local (the cloud metadata address
//! 169.254.169.254 among them), private, unique-local, unspecified,
//! broadcast, multicast and shared (CGNAT) addresses are refused unless the
//! request's origin names that address as an IP literal (or, for loopback,
//! as `localhost`): a name resolving to one of them is refused, so DNS
//! rebinding reaches nothing. The host's own MCP port (any address of this
//! machine it is served on, a public one included: see [`own_listeners`])
//! is refused unless the origin names that address as an IP literal. The
//! resolver hands the connector only checked addresses: what is checked is
//! what is connected to.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::grant::{CheckedHttpGrant, Origin, OriginHost};
use super::own_listeners;

/// Why an address is special, if it is.
pub fn special_range(ip: IpAddr) -> Option<&'static str> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4.is_loopback() {
                Some("loopback")
            } else if v4.is_link_local() {
                Some("link-local (the cloud metadata address is one)")
            } else if v4.is_private() {
                Some("private")
            } else if a == 100 && (64..128).contains(&b) {
                Some("shared address space")
            } else if v4.is_unspecified() || a == 0 {
                Some("unspecified")
            } else if v4.is_broadcast() || v4.is_multicast() || a >= 240 {
                Some("broadcast, multicast or reserved")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6.is_loopback() {
                Some("loopback")
            } else if v6.is_unspecified() {
                Some("unspecified")
            } else if first & 0xffc0 == 0xfe80 {
                Some("link-local")
            } else if first & 0xfe00 == 0xfc00 {
                Some("unique-local")
            } else if v6.is_multicast() {
                Some("multicast")
            } else {
                None
            }
        }
    }
}

/// The origin of a request, as the guest addressed it.
#[derive(Clone, Debug)]
pub struct Target {
    pub https: bool,
    /// Lower-case; an IPv6 literal without brackets.
    pub host: String,
    pub port: u16,
}

impl Target {
    /// The target of `uri`, or why it has none.
    pub fn of(uri: &http::Uri) -> Result<Self, String> {
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            other => return Err(format!("scheme {other:?} is neither http nor https")),
        };
        let host = uri.host().ok_or("the request has no host")?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        let host = host.strip_suffix('.').map(str::to_string).unwrap_or(host);
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        Ok(Self { https, host, port })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

/// Checks a request's method and target against the grant: the origin it
/// matches, or the refusal, worded for the guest and the model.
pub fn check_request<'g>(
    grant: &'g CheckedHttpGrant,
    method: &http::Method,
    target: &Target,
) -> Result<&'g Origin, String> {
    let Some(origin) = grant.origins.iter().find(|o| o.matches(target.https, &target.host, target.port)) else {
        return Err(format!(
            "taskhost refused the request: origin {target} is not granted to this plugin \
             ([producer.grants.http] origins)"
        ));
    };
    if !grant.methods.contains(method) {
        let allowed: Vec<&str> = grant.methods.iter().map(http::Method::as_str).collect();
        return Err(format!(
            "taskhost refused the request: method {method} is not granted for {target} (granted: {})",
            allowed.join(", ")
        ));
    }
    if let Ok(ip) = target.host.parse::<IpAddr>() {
        address_allowed(origin, SocketAddr::new(ip, target.port))
            .map_err(|why| format!("taskhost refused the request to {target}: {why}"))?;
    }
    Ok(origin)
}

/// Why an address is refused to a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddressRefusal {
    /// The host's own MCP port, served on `listener`.
    OwnMcpPort { address: SocketAddr, listener: SocketAddr },
    /// A special range (`range` says which) the origin does not name.
    SpecialRange { ip: IpAddr, range: &'static str },
}

impl std::fmt::Display for AddressRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OwnMcpPort { address, listener } => write!(
                f,
                "address {address} is the host's own MCP port (served on {listener}), which a plugin reaches \
                 only when an origin of [producer.grants.http] names that address and port as an IP literal"
            ),
            Self::SpecialRange { ip, range } => write!(
                f,
                "address {ip} is {range}, which a plugin reaches only when an origin of \
                 [producer.grants.http] names that address"
            ),
        }
    }
}

/// Whether a request allowed by `origin` may connect to `address`.
fn address_allowed(origin: &Origin, address: SocketAddr) -> Result<(), AddressRefusal> {
    let ip = address.ip();
    let named_literally = matches!(&origin.host, OriginHost::Ip(named) if *named == ip);
    if let Some(listener) = own_listeners::serving_at(address)
        && !named_literally
    {
        return Err(AddressRefusal::OwnMcpPort { address, listener });
    }
    let Some(range) = special_range(ip) else { return Ok(()) };
    let named = match &origin.host {
        OriginHost::Ip(_) => named_literally,
        OriginHost::Name(name) => name == "localhost" && ip.is_loopback(),
        OriginHost::Subdomains(_) => false,
    };
    if named { Ok(()) } else { Err(AddressRefusal::SpecialRange { ip, range }) }
}

/// The verdict on `ip` for a request to a name whose granted origins are
/// `origins`. The resolver is not told the request's port, so the address
/// must be allowed for one of them, and the host's own MCP port refuses it
/// for every port of the name.
fn resolved_address_allowed(origins: &[&Origin], ip: IpAddr) -> Result<(), AddressRefusal> {
    let verdicts: Vec<Result<(), AddressRefusal>> =
        origins.iter().map(|o| address_allowed(o, SocketAddr::new(ip, o.port))).collect();
    if let Some(own) = verdicts.iter().find_map(|v| match v {
        Err(own @ AddressRefusal::OwnMcpPort { .. }) => Some(own.clone()),
        _ => None,
    }) {
        return Err(own);
    }
    if verdicts.iter().any(Result::is_ok) {
        return Ok(());
    }
    Err(verdicts.into_iter().find_map(Result::err).unwrap_or(AddressRefusal::SpecialRange { ip, range: "refused" }))
}

/// The addresses of `resolved` (the addresses `host` resolved to) a request
/// to `host` may connect to, or the refusal, worded for the guest.
pub fn allowed_addresses(grant: &CheckedHttpGrant, host: &str, resolved: Vec<IpAddr>) -> Result<Vec<IpAddr>, String> {
    let origins: Vec<&Origin> =
        grant.origins.iter().filter(|o| o.matches(true, host, o.port) || o.matches(false, host, o.port)).collect();
    let mut refused = None;
    let allowed: Vec<IpAddr> = resolved
        .into_iter()
        .filter(|ip| match resolved_address_allowed(&origins, *ip) {
            Ok(()) => true,
            Err(why) => {
                refused.get_or_insert((*ip, why));
                false
            }
        })
        .collect();
    if allowed.is_empty() {
        return Err(match refused {
            Some((ip, why)) => format!("taskhost refused the request: {host} resolves to {ip}: {why}"),
            None => format!("{host} has no address"),
        });
    }
    Ok(allowed)
}

/// The DNS resolver of a plugin's HTTP client: resolves once and returns
/// only the addresses the grant allows for that name, so the connection
/// goes to a checked address.
pub struct GuardedResolver {
    pub grant: Arc<CheckedHttpGrant>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let grant = self.grant.clone();
        Box::pin(async move {
            let host = name.as_str().to_ascii_lowercase();
            let host = host.strip_suffix('.').map(str::to_string).unwrap_or(host);
            let resolved: Vec<IpAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.map(|a| a.ip()).collect();
            let allowed = allowed_addresses(&grant, &host, resolved)?;
            Ok(Box::new(allowed.into_iter().map(|ip| SocketAddr::new(ip, 0))) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(origins: &[&str]) -> CheckedHttpGrant {
        let text = format!("origins = {origins:?}\nmethods = [\"GET\"]");
        toml::from_str::<super::super::grant::HttpGrant>(&text)
            .unwrap()
            .check_at_load(std::path::Path::new("."))
            .unwrap()
    }

    fn target(url: &str) -> Target {
        Target::of(&url.parse().unwrap()).unwrap()
    }

    #[test]
    fn special_ranges_are_named() {
        for (ip, range) in [
            ("127.0.0.1", "loopback"),
            ("169.254.169.254", "link-local"),
            ("10.1.2.3", "private"),
            ("192.168.0.1", "private"),
            ("172.16.0.1", "private"),
            ("100.64.0.1", "shared"),
            ("0.0.0.0", "unspecified"),
            ("::1", "loopback"),
            ("fe80::1", "link-local"),
            ("fd00::1", "unique-local"),
            ("::ffff:127.0.0.1", "loopback"),
        ] {
            let found = special_range(ip.parse().unwrap()).unwrap_or_else(|| panic!("{ip} is special"));
            assert!(found.starts_with(range), "{ip}: {found}");
        }
        assert_eq!(special_range("93.184.216.34".parse().unwrap()), None);
        assert_eq!(special_range("2606:4700::1".parse().unwrap()), None);
    }

    #[test]
    fn requests_are_checked_against_origins_methods_and_named_addresses() {
        let g = grant(&["http://127.0.0.1:8080", "https://*.example.com", "http://10.0.0.5"]);
        assert!(check_request(&g, &http::Method::GET, &target("http://127.0.0.1:8080/x")).is_ok(), "named");
        let other_port = check_request(&g, &http::Method::GET, &target("http://127.0.0.1:8081/")).unwrap_err();
        assert!(other_port.contains("origin http://127.0.0.1:8081 is not granted"), "{other_port}");
        let post = check_request(&g, &http::Method::POST, &target("https://a.example.com/")).unwrap_err();
        assert!(post.contains("method POST is not granted"), "{post}");
        assert!(check_request(&g, &http::Method::GET, &target("http://10.0.0.5/")).is_ok());
        let metadata = check_request(&g, &http::Method::GET, &target("http://169.254.169.254/")).unwrap_err();
        assert!(metadata.contains("not granted"), "{metadata}");
        let g = grant(&["http://localhost:8080"]);
        assert!(address_allowed(&g.origins[0], "127.0.0.1:8080".parse().unwrap()).is_ok(), "localhost names loopback");
        let g = grant(&["https://*.example.com"]);
        let why = address_allowed(&g.origins[0], "127.0.0.1:8080".parse().unwrap()).unwrap_err().to_string();
        assert!(why.contains("is loopback"), "{why}");
    }
}
