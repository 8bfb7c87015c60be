//! `mailsplit doctor DOMAIN`: before the first send, what a receiving
//! mailbox provider will look up about a sending domain, checked one line
//! each (pass, warn or fail, and the fix): the DKIM TXT record of every
//! active key, SPF, DMARC and From's alignment with DKIM and the return
//! path, the return path domain's MX (bounces arrive), and the one-click
//! unsubscribe URL over https. The DNS is asked through [`dns`], a server
//! of the user's choice (`--resolver`) or the system's.

pub mod dns;

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use crate::compose::align;
use crate::store::database::Conn;
use crate::store::dkim_keys::{self, KeyState, StoredKey};

use dns::{Dns, Found};

/// What the doctor is asked about, resolved by the CLI.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The From domain.
    pub domain: String,
    /// A DNS server to ask instead of the system's (tests, a split horizon).
    pub resolver: Option<SocketAddr>,
    /// `MAILSPLIT_RETURN_PATH`: the envelope sender's address.
    pub return_path: Option<String>,
    /// `MAILSPLIT_PUBLIC_URL`: where the one-click unsubscribe links point.
    pub public_url: Option<String>,
    /// The relay's host when it is an IP address (SPF must allow it).
    pub relay_ip: Option<IpAddr>,
}

#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    #[error("bad domain {0:?}: expected a domain name such as example.com")]
    BadDomain(String),
    #[error("cannot set up the DNS resolver: {0}; pass one with --resolver HOST:PORT")]
    Resolver(String),
    #[error("cannot start the runtime: {0}")]
    Runtime(#[from] std::io::Error),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Warn,
    Fail,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "pass",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        })
    }
}

/// One line of the report: the check's name, verdict, and what was found
/// or what to do.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: String,
    pub verdict: Verdict,
    pub detail: String,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<4}  {:<22} {}", self.verdict, self.name, self.detail)
    }
}

fn check(name: impl Into<String>, verdict: Verdict, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        verdict,
        detail: detail.into(),
    }
}

/// The domain as keys and DNS names hold it: lower case, A-labels.
fn checked_domain(raw: &str) -> Result<String, DoctorError> {
    let trimmed = raw.trim().trim_end_matches('.');
    match url::Host::parse(trimmed) {
        Ok(url::Host::Domain(d)) if d.contains('.') => Ok(d),
        _ => Err(DoctorError::BadDomain(raw.to_string())),
    }
}

/// Run every check; the report's lines in order.
pub fn run(conn: &mut Conn, settings: &Settings) -> Result<Vec<Check>, DoctorError> {
    let domain = checked_domain(&settings.domain)?;
    let keys: Vec<StoredKey> = dkim_keys::list(conn)?
        .into_iter()
        .filter(|k| k.domain == domain && k.state == KeyState::Active)
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let dns = Dns::new(settings.resolver)?;
        Ok(checks(&dns, &domain, &keys, settings).await)
    })
}

async fn checks(dns: &Dns, domain: &str, keys: &[StoredKey], s: &Settings) -> Vec<Check> {
    let mut out = Vec::new();
    for key in keys {
        out.push(dkim(dns, domain, key).await);
    }
    if keys.is_empty() {
        out.push(check(
            "DKIM",
            Verdict::Fail,
            format!("no active DKIM key for {domain}: `mailsplit dkim keygen {domain}`, then publish the record it prints"),
        ));
    }
    let rp_domain = s
        .return_path
        .as_deref()
        .and_then(|rp| rp.rsplit_once('@'))
        .map(|(_, d)| d.trim_end_matches('.').to_ascii_lowercase())
        .unwrap_or_else(|| domain.to_string());
    out.push(spf(dns, &rp_domain, s.relay_ip).await);
    out.push(dmarc(dns, domain).await);
    out.push(alignment(
        domain,
        !keys.is_empty(),
        s.return_path.as_deref(),
    ));
    out.push(mx(dns, &rp_domain).await);
    out.push(unsubscribe(s.public_url.as_deref()).await);
    out
}

/// The tags of a `k=v; k=v` record (DKIM, DMARC).
fn tags(record: &str) -> Vec<(String, String)> {
    record
        .split(';')
        .filter_map(|t| t.split_once('='))
        .map(|(k, v)| {
            let v: String = v.chars().filter(|c| !c.is_whitespace()).collect();
            (k.trim().to_ascii_lowercase(), v)
        })
        .collect()
}

async fn dkim(dns: &Dns, domain: &str, key: &StoredKey) -> Check {
    let name = format!("{}._domainkey.{domain}", key.selector);
    let label = format!("DKIM {}", key.selector);
    let publish = format!(
        "publish the TXT record `mailsplit dkim list` shows for selector {} at {name}",
        key.selector
    );
    let records = match dns.txt(&name).await {
        Found::Records(r) => r,
        Found::None => {
            return check(
                label,
                Verdict::Fail,
                format!("no TXT record at {name}: {publish}"),
            )
        }
        Found::Error(e) => {
            return check(label, Verdict::Fail, format!("cannot look up {name}: {e}"))
        }
    };
    let published: Vec<String> = records
        .iter()
        .filter_map(|r| tags(r).into_iter().find(|(k, _)| k == "p").map(|(_, v)| v))
        .collect();
    if published.contains(&key.public_key) {
        return check(label, Verdict::Pass, format!("{name} publishes this key"));
    }
    if published.is_empty() {
        return check(
            label,
            Verdict::Fail,
            format!("the TXT record at {name} has no p= key: {publish}"),
        );
    }
    check(
        label,
        Verdict::Fail,
        format!("the key published at {name} is not the one mailsplit signs with (receivers will fail every signature): {publish}"),
    )
}

async fn spf(dns: &Dns, rp_domain: &str, relay: Option<IpAddr>) -> Check {
    let spf: Vec<String> = match dns.txt(rp_domain).await {
        Found::Records(r) => r
            .into_iter()
            .filter(|r| r.trim_start().to_ascii_lowercase().starts_with("v=spf1"))
            .collect(),
        Found::None => Vec::new(),
        Found::Error(e) => {
            return check(
                "SPF",
                Verdict::Fail,
                format!("cannot look up {rp_domain}: {e}"),
            )
        }
    };
    let fix = format!("publish a TXT record at {rp_domain} such as \"v=spf1 ip4:RELAY-IP -all\" (or your provider's include:)");
    let record = match spf.as_slice() {
        [] => {
            return check(
                "SPF",
                Verdict::Fail,
                format!("no SPF record at {rp_domain}: {fix}"),
            )
        }
        [one] => one,
        _ => {
            return check(
                "SPF",
                Verdict::Fail,
                format!(
                    "{} SPF records at {rp_domain} (receivers treat that as an error): keep one",
                    spf.len()
                ),
            )
        }
    };
    let Some(ip) = relay.filter(|ip| !ip.is_loopback()) else {
        return check("SPF", Verdict::Pass, format!("{rp_domain}: {record}"));
    };
    let mech = match ip {
        IpAddr::V4(_) => format!("ip4:{ip}"),
        IpAddr::V6(_) => format!("ip6:{ip}"),
    };
    if record
        .split_whitespace()
        .any(|t| t.trim_start_matches('+').eq_ignore_ascii_case(&mech))
    {
        check(
            "SPF",
            Verdict::Pass,
            format!("{rp_domain} allows the relay {ip}: {record}"),
        )
    } else {
        check(
            "SPF",
            Verdict::Warn,
            format!("{rp_domain}'s SPF does not name the relay's address {ip} ({record}); add {mech} unless an include: covers it"),
        )
    }
}

async fn dmarc(dns: &Dns, domain: &str) -> Check {
    let fix = format!(
        "publish a TXT record at _dmarc.{domain}, e.g. \"v=DMARC1; p=none; rua=mailto:dmarc@{domain}\" (Gmail and Yahoo require one from bulk senders)"
    );
    let org = crate::compose::align::organisation(domain);
    let mut names = vec![format!("_dmarc.{domain}")];
    if org != domain {
        names.push(format!("_dmarc.{org}"));
    }
    for name in names {
        match dns.txt(&name).await {
            Found::Records(r) => {
                if let Some(rec) = r
                    .iter()
                    .find(|r| r.trim_start().to_ascii_uppercase().starts_with("V=DMARC1"))
                {
                    let policy = tags(rec)
                        .into_iter()
                        .find(|(k, _)| k == "p")
                        .map(|(_, v)| v)
                        .unwrap_or_default();
                    return check("DMARC", Verdict::Pass, format!("{name}: p={policy}"));
                }
            }
            Found::None => {}
            Found::Error(e) => {
                return check(
                    "DMARC",
                    Verdict::Fail,
                    format!("cannot look up {name}: {e}"),
                )
            }
        }
    }
    check("DMARC", Verdict::Fail, format!("no DMARC record: {fix}"))
}

fn alignment(domain: &str, dkim_key: bool, return_path: Option<&str>) -> Check {
    let spf_aligned = align::warning(domain, return_path).is_none();
    match (dkim_key, spf_aligned) {
        (true, true) => check(
            "alignment",
            Verdict::Pass,
            format!("From {domain} aligns with DKIM d={domain} and the return path"),
        ),
        (true, false) => check(
            "alignment",
            Verdict::Warn,
            format!("From {domain} aligns with DKIM d={domain} but not with the return path: {}", align::warning(domain, return_path).unwrap_or_default()),
        ),
        (false, true) => check(
            "alignment",
            Verdict::Warn,
            format!("From {domain} aligns only with the return path (SPF), which forwarding breaks: add a DKIM key"),
        ),
        (false, false) => check(
            "alignment",
            Verdict::Fail,
            format!("From {domain} aligns with neither DKIM nor the return path: DMARC fails; `mailsplit dkim keygen {domain}`"),
        ),
    }
}

async fn mx(dns: &Dns, rp_domain: &str) -> Check {
    match dns.mx(rp_domain).await {
        Found::Records(hosts) if !hosts.is_empty() => check(
            "return-path MX",
            Verdict::Pass,
            format!("{rp_domain}: {}", hosts.join(", ")),
        ),
        Found::Error(e) => check("return-path MX", Verdict::Fail, format!("cannot look up the MX of {rp_domain}: {e}")),
        _ => check(
            "return-path MX",
            Verdict::Fail,
            format!("{rp_domain} has no MX record: bounces cannot arrive; publish an MX pointing at the host that runs `mailsplit bounce`"),
        ),
    }
}

async fn unsubscribe(public_url: Option<&str>) -> Check {
    let name = "unsubscribe URL";
    let Some(url) = public_url.filter(|u| !u.trim().is_empty()) else {
        return check(name, Verdict::Warn, "MAILSPLIT_PUBLIC_URL is not set: messages carry no one-click unsubscribe (Gmail and Yahoo require it); set it to where `mailsplit serve`'s public listener is reachable over https");
    };
    let Ok(parsed) = url::Url::parse(url.trim()) else {
        return check(
            name,
            Verdict::Fail,
            format!("{url} is not a URL: set MAILSPLIT_PUBLIC_URL to https://HOST"),
        );
    };
    if parsed.scheme() != "https" {
        return check(name, Verdict::Warn, format!("{url} is not https: receivers POST one-click unsubscribes only to https (RFC 8058)"));
    }
    match dns::https_answers(&parsed).await {
        Ok(status) => check(
            name,
            Verdict::Pass,
            format!("{url}/healthz answers over https (HTTP {status})"),
        ),
        Err(e) => check(
            name,
            Verdict::Fail,
            format!("{url} does not answer over https ({e}): run `mailsplit serve` behind it"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_split_and_drop_the_blanks_inside_a_key() {
        let t = tags("v=DKIM1; k=rsa; p=AB CD\tEF");
        assert_eq!(t[2], ("p".to_string(), "ABCDEF".to_string()));
    }

    #[test]
    fn domains_are_checked_and_lowered() {
        assert_eq!(
            checked_domain("Example.COM.").ok().as_deref(),
            Some("example.com")
        );
        assert!(checked_domain("not a domain").is_err());
        assert!(checked_domain("localhost").is_err());
    }

    #[test]
    fn alignment_fails_only_without_dkim_and_aligned_return_path() {
        assert_eq!(
            alignment("shop.com", true, Some("b@bounce.shop.com")).verdict,
            Verdict::Pass
        );
        assert_eq!(
            alignment("shop.com", true, Some("b@esp.net")).verdict,
            Verdict::Warn
        );
        assert_eq!(
            alignment("shop.com", false, Some("b@esp.net")).verdict,
            Verdict::Fail
        );
    }
}
