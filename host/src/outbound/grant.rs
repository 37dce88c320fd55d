//! `[producer.grants.http]`: which origins and methods a plugin may reach,
//! its bounds, and the credentials the host adds for an origin.
//!
//! Invariants: an origin is `scheme://host[:port]` (`http` or `https`, the
//! port defaulting to the scheme's), its host a DNS name, an IP literal or
//! `*.<domain>` (every subdomain of `<domain>`, not `<domain>` itself);
//! anything else is refused when the configuration loads, as is a bound
//! above its ceiling. A credential's secret is read once, when the grant is
//! checked at load, and is only ever written into a request's headers.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use serde::Deserialize;

/// Default bound on one response body.
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 1024 * 1024;
/// Ceiling of `max_response_bytes`.
pub const MAX_RESPONSE_BYTES_CEILING: u64 = 64 * 1024 * 1024;
/// Default bound on one response's header section (names and values).
pub const DEFAULT_MAX_HEADER_BYTES: u64 = 64 * 1024;
/// Ceiling of `max_header_bytes`.
pub const MAX_HEADER_BYTES_CEILING: u64 = 1024 * 1024;
/// Default bound on one request body the guest sends.
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 1024 * 1024;
/// Ceiling of `max_request_bytes`.
pub const MAX_REQUEST_BYTES_CEILING: u64 = 64 * 1024 * 1024;
/// Default number of requests one task may make.
pub const DEFAULT_MAX_REQUESTS_PER_TASK: u64 = 10_000;
/// Default time one request may take, connect to last body byte.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 30_000;
/// Ceiling of `request_timeout_ms`.
pub const REQUEST_TIMEOUT_CEILING_MS: u64 = 10 * 60 * 1000;

/// `[producer.grants.http]` as written. Non-exhaustive: outside this crate,
/// build it with [`HttpGrant::new`] (every bound at its default) and set
/// the fields.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct HttpGrant {
    /// Origins the plugin may reach: `https://api.example.com`,
    /// `http://127.0.0.1:8080`, `https://*.example.com`.
    pub origins: Vec<String>,
    /// Methods it may use (default GET and HEAD).
    #[serde(default = "default_methods")]
    pub methods: Vec<String>,
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: u64,
    #[serde(default = "default_max_header_bytes")]
    pub max_header_bytes: u64,
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: u64,
    #[serde(default = "default_max_requests_per_task")]
    pub max_requests_per_task: u64,
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Headers the host adds to every request to an origin.
    #[serde(default)]
    pub credentials: Vec<Credential>,
}

/// `[[producer.grants.http.credentials]]`: a header the host adds to the
/// requests to `origin`, its value from the server's environment or a file.
/// Non-exhaustive: outside this crate, build it with
/// [`Credential::from_env`] or [`Credential::from_file`].
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Credential {
    pub origin: String,
    pub header: String,
    pub value_env: Option<String>,
    pub value_file: Option<PathBuf>,
}

impl HttpGrant {
    /// A grant of `origins` with the default methods (GET, HEAD), bounds
    /// and no credential.
    pub fn new(origins: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            origins: origins.into_iter().map(Into::into).collect(),
            methods: default_methods(),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_requests_per_task: DEFAULT_MAX_REQUESTS_PER_TASK,
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
            credentials: Vec::new(),
        }
    }
}

impl Credential {
    /// `header` for `origin`, its value the server's environment variable `name`.
    pub fn from_env(origin: impl Into<String>, header: impl Into<String>, name: impl Into<String>) -> Self {
        Self { origin: origin.into(), header: header.into(), value_env: Some(name.into()), value_file: None }
    }

    /// `header` for `origin`, its value the contents of `path` (relative to
    /// the configuration's directory; trailing line ends dropped).
    pub fn from_file(origin: impl Into<String>, header: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        Self { origin: origin.into(), header: header.into(), value_env: None, value_file: Some(path.into()) }
    }
}

fn default_methods() -> Vec<String> {
    vec!["GET".into(), "HEAD".into()]
}
fn default_max_response_bytes() -> u64 {
    DEFAULT_MAX_RESPONSE_BYTES
}
fn default_max_header_bytes() -> u64 {
    DEFAULT_MAX_HEADER_BYTES
}
fn default_max_request_bytes() -> u64 {
    DEFAULT_MAX_REQUEST_BYTES
}
fn default_max_requests_per_task() -> u64 {
    DEFAULT_MAX_REQUESTS_PER_TASK
}
fn default_request_timeout_ms() -> u64 {
    DEFAULT_REQUEST_TIMEOUT_MS
}

/// The host part of an origin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OriginHost {
    /// A DNS name, lower-case, without a trailing dot.
    Name(String),
    /// Every subdomain of this name (`*.<name>`).
    Subdomains(String),
    /// An IP literal: names its address explicitly.
    Ip(IpAddr),
}

/// A parsed origin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub https: bool,
    pub host: OriginHost,
    pub port: u16,
}

impl Origin {
    /// Parses `scheme://host[:port]` (no path, query or user).
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let (scheme, rest) = text.split_once("://").with_context(|| format!("origin {text:?} has no scheme"))?;
        let https = match scheme.to_ascii_lowercase().as_str() {
            "https" => true,
            "http" => false,
            other => bail!("origin {text:?}: scheme {other:?} is neither http nor https"),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
            bail!("origin {text:?} must be scheme://host[:port], without path, query or user");
        }
        let default_port = if https { 443 } else { 80 };
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (addr, after) = v6.split_once(']').with_context(|| format!("origin {text:?}: unclosed `[`"))?;
            let port = match after.strip_prefix(':') {
                Some(port) => port.parse().with_context(|| format!("origin {text:?}: bad port"))?,
                None if after.is_empty() => default_port,
                None => bail!("origin {text:?}: unexpected {after:?}"),
            };
            let ip: IpAddr = addr.parse().with_context(|| format!("origin {text:?}: bad IPv6 address"))?;
            (OriginHost::Ip(ip), port)
        } else {
            let (host, port) = match rest.rsplit_once(':') {
                Some((host, port)) => (host, port.parse().with_context(|| format!("origin {text:?}: bad port"))?),
                None => (rest, default_port),
            };
            let host = host.to_ascii_lowercase();
            let host = host.strip_suffix('.').unwrap_or(&host).to_string();
            let parsed = if let Ok(ip) = host.parse::<IpAddr>() {
                OriginHost::Ip(ip)
            } else if let Some(domain) = host.strip_prefix("*.") {
                check_name(text, domain)?;
                OriginHost::Subdomains(domain.to_string())
            } else {
                check_name(text, &host)?;
                OriginHost::Name(host)
            };
            (parsed, port)
        };
        if port == 0 {
            bail!("origin {text:?}: port 0");
        }
        Ok(Self { https, host, port })
    }

    /// Whether a request to `host:port` over `https` is to this origin.
    /// `host` is lower-case, an IP literal without brackets or a name.
    pub fn matches(&self, https: bool, host: &str, port: u16) -> bool {
        if self.https != https || self.port != port {
            return false;
        }
        match &self.host {
            OriginHost::Name(name) => name == host,
            OriginHost::Subdomains(domain) => {
                host.strip_suffix(domain.as_str()).is_some_and(|sub| sub.len() > 1 && sub.ends_with('.'))
            }
            OriginHost::Ip(ip) => host.parse::<IpAddr>().is_ok_and(|h| h == *ip),
        }
    }
}

fn check_name(origin: &str, name: &str) -> anyhow::Result<()> {
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
        });
    if !valid {
        bail!("origin {origin:?}: {name:?} is not a host name (wildcards only as a leading `*.`)");
    }
    // A URL parser reads a name ending in a number as an IPv4 address
    // (`127.1`, `2130706433`, `0x7f000001`), which the client would then
    // connect to without resolving it: only a dotted IP literal names one.
    let last = name.rsplit('.').next().unwrap_or_default();
    let hex = last.strip_prefix("0x").is_some_and(|digits| digits.bytes().all(|b| b.is_ascii_hexdigit()));
    if hex || last.bytes().all(|b| b.is_ascii_digit()) {
        bail!(
            "origin {origin:?}: {name:?} ends in a number, which is read as an IP address; write the address as a dotted IPv4 or a bracketed IPv6 literal"
        );
    }
    Ok(())
}

/// A credential ready to send: its origin, header and secret.
#[derive(Clone)]
pub struct ResolvedCredential {
    pub origin: Origin,
    pub header: http::HeaderName,
    pub value: http::HeaderValue,
}

impl std::fmt::Debug for ResolvedCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedCredential").field("header", &self.header).finish_non_exhaustive()
    }
}

/// A grant checked at load: origins parsed, methods known, bounds within
/// their ceilings, credentials read.
#[derive(Clone, Debug)]
pub struct CheckedHttpGrant {
    pub origins: Vec<Origin>,
    pub methods: Vec<http::Method>,
    pub max_response_bytes: u64,
    pub max_header_bytes: u64,
    pub max_request_bytes: u64,
    pub max_requests_per_task: u64,
    pub request_timeout: std::time::Duration,
    pub credentials: Vec<ResolvedCredential>,
}

impl HttpGrant {
    /// Checks the grant and reads its credentials (paths relative to
    /// `base_dir`, the configuration's directory).
    pub fn check_at_load(&self, base_dir: &std::path::Path) -> anyhow::Result<CheckedHttpGrant> {
        if self.origins.is_empty() {
            bail!("[producer.grants.http] names no origin: list the origins the plugin may reach in `origins`");
        }
        let origins = self.origins.iter().map(|o| Origin::parse(o)).collect::<anyhow::Result<Vec<_>>>()?;
        let methods = self
            .methods
            .iter()
            .map(|m| {
                http::Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .with_context(|| format!("[producer.grants.http] method {m:?} is not an HTTP method"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        for (name, value, ceiling) in [
            ("max_response_bytes", self.max_response_bytes, MAX_RESPONSE_BYTES_CEILING),
            ("max_header_bytes", self.max_header_bytes, MAX_HEADER_BYTES_CEILING),
            ("max_request_bytes", self.max_request_bytes, MAX_REQUEST_BYTES_CEILING),
            ("request_timeout_ms", self.request_timeout_ms, REQUEST_TIMEOUT_CEILING_MS),
        ] {
            if value == 0 || value > ceiling {
                bail!("[producer.grants.http] {name} = {value} is outside 1..={ceiling}");
            }
        }
        if self.max_requests_per_task == 0 {
            bail!("[producer.grants.http] max_requests_per_task = 0: remove the grant instead");
        }
        let mut credentials = Vec::new();
        for credential in &self.credentials {
            let origin = Origin::parse(&credential.origin)?;
            if !origins.contains(&origin) {
                bail!("credential for {:?}: that origin is not in `origins`", credential.origin);
            }
            let header = http::HeaderName::from_bytes(credential.header.as_bytes())
                .with_context(|| format!("credential for {:?}: bad header name", credential.origin))?;
            let secret = match (&credential.value_env, &credential.value_file) {
                (Some(name), None) => std::env::var(name).with_context(|| {
                    format!("credential for {:?}: environment variable {name} is not set", credential.origin)
                })?,
                (None, Some(path)) => {
                    let path = base_dir.join(path);
                    let text = std::fs::read_to_string(&path).with_context(|| {
                        format!("credential for {:?}: cannot read {}", credential.origin, path.display())
                    })?;
                    text.trim_end_matches(['\n', '\r']).to_string()
                }
                _ => bail!("credential for {:?}: give exactly one of value_env and value_file", credential.origin),
            };
            let mut value = http::HeaderValue::from_str(&secret).with_context(|| {
                format!("credential for {:?}: the value is not a valid header value", credential.origin)
            })?;
            value.set_sensitive(true);
            credentials.push(ResolvedCredential { origin, header, value });
        }
        Ok(CheckedHttpGrant {
            origins,
            methods,
            max_response_bytes: self.max_response_bytes,
            max_header_bytes: self.max_header_bytes,
            max_request_bytes: self.max_request_bytes,
            max_requests_per_task: self.max_requests_per_task,
            request_timeout: std::time::Duration::from_millis(self.request_timeout_ms),
            credentials,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_parse_and_match_scheme_host_and_port() {
        let api = Origin::parse("https://API.example.com").unwrap();
        assert!(api.matches(true, "api.example.com", 443));
        assert!(!api.matches(false, "api.example.com", 443), "scheme");
        assert!(!api.matches(true, "api.example.com", 8443), "port");
        assert!(!api.matches(true, "evil-api.example.com", 443));
        let wild = Origin::parse("https://*.example.com").unwrap();
        assert!(wild.matches(true, "a.example.com", 443) && wild.matches(true, "a.b.example.com", 443));
        assert!(!wild.matches(true, "example.com", 443), "not the apex");
        assert!(!wild.matches(true, "aexample.com", 443));
        let local = Origin::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(local.host, OriginHost::Ip("127.0.0.1".parse().unwrap()));
        assert!(local.matches(false, "127.0.0.1", 8080));
        let v6 = Origin::parse("http://[::1]:9000/").unwrap();
        assert!(v6.matches(false, "::1", 9000));
        for bad in [
            "ftp://x",
            "example.com",
            "https://x/path",
            "https://u@x",
            "https://a.*.com",
            "https://x:0",
            "http://127.1",
            "http://2130706433",
            "http://0x7f000001",
            "http://a.b.0x1",
            "https://*.10",
        ] {
            assert!(Origin::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_constructor_gives_the_defaults_the_configuration_gives() {
        let written: HttpGrant = toml::from_str("origins = [\"https://api.example.com\"]").unwrap();
        assert_eq!(HttpGrant::new(["https://api.example.com"]), written);
    }

    #[test]
    fn a_grant_is_checked_at_load() {
        let grant = |extra: &str| -> HttpGrant {
            toml::from_str(&format!("origins = [\"https://api.example.com\"]\n{extra}")).unwrap()
        };
        let checked = grant("").check_at_load(std::path::Path::new(".")).unwrap();
        assert_eq!(checked.methods, [http::Method::GET, http::Method::HEAD]);
        let error = |extra: &str| format!("{:#}", grant(extra).check_at_load(std::path::Path::new(".")).unwrap_err());
        assert!(error("max_response_bytes = 0").contains("outside"));
        assert!(error("methods = [\"G ET\"]").contains("not an HTTP method"));
        let missing = error(
            "[[credentials]]\norigin = \"https://api.example.com\"\nheader = \"Authorization\"\nvalue_env = \"TASKHOST_TEST_UNSET_SECRET\"",
        );
        assert!(missing.contains("TASKHOST_TEST_UNSET_SECRET is not set"), "{missing}");
        let elsewhere =
            error("[[credentials]]\norigin = \"https://other.example.com\"\nheader = \"X\"\nvalue_file = \"f\"");
        assert!(elsewhere.contains("not in `origins`"), "{elsewhere}");
    }
}
