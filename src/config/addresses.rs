//! Where things are: beanstalkd server lists, SMTP relay URLs, the public
//! unsubscribe URL and listen addresses, parsed and checked.

use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use super::ConfigError;
use crate::redact;

/// `host:port[,host:port…]` into resolved IPv4 socket addresses, in order.
/// A malformed entry and a host name that does not resolve get different
/// messages: the fix differs.
pub fn parse_beanstalkd(list: &str) -> Result<Vec<SocketAddr>, ConfigError> {
    let mut out = Vec::new();
    for raw in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = || ConfigError::BadBeanstalkd(raw.to_string());
        let (host, port) = raw.rsplit_once(':').ok_or_else(bad)?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(bad());
        }
        let addrs = raw
            .to_socket_addrs()
            .map_err(|e| ConfigError::Unresolvable {
                host: host.to_string(),
                why: e.to_string(),
            })?;
        let v4 = addrs
            .into_iter()
            .find(SocketAddr::is_ipv4)
            .ok_or_else(|| ConfigError::NoIpv4(raw.to_string()))?;
        out.push(v4);
    }
    if out.is_empty() {
        return Err(ConfigError::BadBeanstalkd(list.to_string()));
    }
    Ok(out)
}

/// How an SMTP session is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tls {
    /// Plain text: for a relay on localhost or a trusted network.
    None,
    /// STARTTLS when offered; `required` refuses to go on without it.
    StartTls { required: bool },
    /// TLS from the first byte (`smtps://`, port 465).
    Implicit,
}

/// A parsed SMTP relay URL. `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct SmtpUrl {
    pub host: String,
    pub port: u16,
    pub tls: Tls,
    /// User and password, percent-decoded.
    pub credentials: Option<(String, String)>,
    /// `auth=plain-insecure`: the URL allows AUTH without TLS (a relay on
    /// this machine only). Otherwise a session that is not encrypted never
    /// sends the password, whatever the relay offers.
    pub auth_in_clear: bool,
    /// PEM file of an extra root certificate to trust (a private CA).
    pub ca: Option<String>,
}

impl fmt::Debug for SmtpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmtpUrl")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field(
                "credentials",
                &self
                    .credentials
                    .as_ref()
                    .map(|(user, _)| (user, redact::Hidden)),
            )
            .field("auth_in_clear", &self.auth_in_clear)
            .field("ca", &self.ca)
            .finish()
    }
}

/// Whether `host` is this machine: the only place a password may travel in
/// clear text (`auth=plain-insecure`).
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl SmtpUrl {
    pub fn parse(raw: &str) -> Result<SmtpUrl, ConfigError> {
        let bad = |why: &str| ConfigError::BadSmtpUrl {
            url: crate::redact::url(raw),
            why: why.to_string(),
        };
        let url = url::Url::parse(raw).map_err(|e| bad(&e.to_string()))?;
        let (default_port, tls) = match url.scheme() {
            "smtp" => (25, Tls::None),
            "smtps" => (465, Tls::Implicit),
            other => return Err(bad(&format!("unknown scheme {other:?}"))),
        };
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let Options {
            tls,
            ca,
            auth_in_clear,
        } = read_options(&url, tls, &bad)?;
        let credentials = read_credentials(&url, &bad)?;
        if ca.is_some() && tls == Tls::None {
            return Err(bad("ca= needs TLS: add tls=required or use smtps://"));
        }
        if auth_in_clear && !is_loopback(&host) {
            return Err(bad(&format!(
                "auth=plain-insecure sends the password in clear text and is allowed only for a relay on this machine (localhost, 127.0.0.1, ::1), not {host:?}: use tls=required or smtps://"
            )));
        }
        if credentials.is_some() && tls == Tls::None && !auth_in_clear {
            return Err(ConfigError::AuthInClear {
                url: redact::url(raw),
            });
        }
        Ok(SmtpUrl {
            host,
            port: url.port().unwrap_or(default_port),
            tls,
            credentials,
            auth_in_clear,
            ca,
        })
    }
}

/// What an SMTP URL's query asks for.
struct Options {
    tls: Tls,
    ca: Option<String>,
    auth_in_clear: bool,
}

/// `?tls=`, `?ca=` and `?auth=`, on top of what the scheme says.
fn read_options(
    url: &url::Url,
    mut tls: Tls,
    bad: &impl Fn(&str) -> ConfigError,
) -> Result<Options, ConfigError> {
    let mut ca = None;
    let mut auth_in_clear = false;
    for (key, value) in url.query_pairs() {
        match (key.as_ref(), value.as_ref(), tls) {
            ("ca", path, _) => ca = Some(path.to_string()),
            ("auth", "plain-insecure", _) => auth_in_clear = true,
            ("auth", v, _) => {
                return Err(bad(&format!(
                    "auth={v:?}: the only choice is auth=plain-insecure (AUTH without TLS, loopback relays only)"
                )))
            }
            ("tls", "required", Tls::None) => tls = Tls::StartTls { required: true },
            ("tls", "opportunistic", Tls::None) => tls = Tls::StartTls { required: false },
            ("tls", "none", Tls::None) => {}
            ("tls", _, Tls::Implicit) => return Err(bad("smtps:// is always TLS; drop ?tls=")),
            ("tls", v, _) => {
                return Err(bad(&format!(
                    "tls={v:?}: use tls=required, tls=opportunistic or tls=none"
                )))
            }
            (k, _, _) => return Err(bad(&format!("unknown parameter {k:?}"))),
        }
    }
    Ok(Options {
        tls,
        ca,
        auth_in_clear,
    })
}

/// The user and password of the URL, if it names a user. User-info is
/// percent-encoded (RFC 3986), not form-encoded: a literal '+' in a
/// password is a '+', never a space.
fn read_credentials(
    url: &url::Url,
    bad: &impl Fn(&str) -> ConfigError,
) -> Result<Option<(String, String)>, ConfigError> {
    if url.username().is_empty() {
        return Ok(None);
    }
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| bad("the user or password is not UTF-8 once percent-decoded"))
    };
    Ok(Some((
        decode(url.username())?,
        decode(url.password().unwrap_or(""))?,
    )))
}

/// Longest `--public-url`: a token and `/u/` still fit in a header line
/// and in any link.
pub const MAX_PUBLIC_URL: usize = 200;

/// `campaign create --public-url`: the base of the one-click unsubscribe
/// links, `https://` (receivers POST to it from the internet; RFC 8058
/// requires https), or `http://` only for a loopback host (tests, a local
/// try-out). No user-info (a password in every message), query or
/// fragment. Returned without a trailing `/`, its host in A-labels.
pub fn parse_public_url(raw: &str) -> Result<String, ConfigError> {
    let bad = |why| ConfigError::BadPublicUrl {
        url: crate::redact::url(raw),
        why,
    };
    let url = url::Url::parse(raw.trim()).map_err(|_| bad("not a URL"))?;
    let loopback = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost" || d.ends_with(".localhost"),
        None => return Err(bad("no host")),
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => return Err(bad("http:// is only for a loopback host; use https://")),
        _ => return Err(bad("not an https:// URL")),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad(
            "it holds a user name or password, which every message would show",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad(
            "it has a query or fragment; /u/TOKEN is appended to its path",
        ));
    }
    let out = url.as_str().trim_end_matches('/').to_string();
    if out.len() > MAX_PUBLIC_URL {
        return Err(bad("longer than 200 characters"));
    }
    Ok(out)
}

/// A listen address, `HOST:PORT`, resolved.
pub fn parse_listen(what: &'static str, raw: &str) -> Result<SocketAddr, ConfigError> {
    let bad = || ConfigError::BadListen {
        what,
        value: raw.to_string(),
    };
    raw.trim()
        .to_socket_addrs()
        .map_err(|_| bad())?
        .next()
        .ok_or_else(bad)
}

/// A DNS server as `--resolver` names it: `1.1.1.1:53`, `[::1]:53` or
/// `ns.example.com:53`, resolved.
pub fn parse_resolver(raw: &str) -> Result<SocketAddr, ConfigError> {
    let bad = || ConfigError::BadResolver(raw.to_string());
    raw.trim()
        .to_socket_addrs()
        .map_err(|_| bad())?
        .next()
        .ok_or_else(bad)
}
