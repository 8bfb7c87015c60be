//! Rate group names, parsed in one place: `relay:HOST:PORT` (a worker's
//! `--smtp` relay), `campaign:NAME`, `domain:DOMAIN` (recipients at that
//! domain), `domain:*` (every domain without a group of its own) and
//! `mx:SUFFIX` (every domain whose preferred MX host ends in SUFFIX). The
//! database, the limiter and the scheduler all key groups by the
//! [`Display`](std::fmt::Display) form of a [`Group`]; nothing else spells
//! a prefix. Sits below the store, beside [`crate::mailbox`], whose domain
//! check (lower case, IDNA A-labels) a domain group goes through.

use std::fmt;
use std::str::FromStr;

use crate::mailbox;

const RELAY: &str = "relay:";
const CAMPAIGN: &str = "campaign:";
const DOMAIN: &str = "domain:";
const ANY_DOMAIN: &str = "*";
const MX: &str = "mx:";

/// One rate group.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Group {
    /// A relay as `HOST:PORT`, as the workers' `--smtp` names it.
    Relay(String),
    /// Recipients at one domain: lower case, non-ASCII labels as A-labels.
    Domain(String),
    /// Recipients at every domain without a group of its own.
    AnyDomain,
    /// One campaign, by name.
    Campaign(String),
    /// Recipients at every domain whose preferred MX host is this name or
    /// ends in `.` + it (`google.com`: Gmail and Workspace domains).
    Mx(String),
}

/// Why a group name does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    #[error("bad rate group {0:?}: use relay:HOST:PORT (a worker's --smtp relay), campaign:NAME, domain:DOMAIN, domain:* (every other domain) or mx:SUFFIX (domains whose MX host ends in it), e.g. domain:gmail.com or mx:google.com")]
    Unknown(String),
    #[error("bad rate group {name:?}: {why}")]
    Bad { name: String, why: String },
}

impl Group {
    /// The group of recipients at `domain`, as a message's domain is
    /// matched (lower case).
    pub fn domain(domain: &str) -> Group {
        Group::Domain(domain.to_lowercase())
    }

    /// Whether a stored group name is a relay's, without parsing the rest.
    pub fn is_relay_name(name: &str) -> bool {
        name.starts_with(RELAY)
    }

    /// The suffix of a stored `mx:` group's name, without parsing it.
    pub fn mx_suffix(name: &str) -> Option<&str> {
        name.strip_prefix(MX)
    }

    /// Whether MX host `host` is in the rollup of `suffix`.
    pub fn mx_matches(host: &str, suffix: &str) -> bool {
        host.strip_suffix(suffix)
            .is_some_and(|rest| rest.is_empty() || rest.ends_with('.'))
    }

    /// Whether a stored group name is a campaign's, without parsing the rest.
    pub fn is_campaign_name(name: &str) -> bool {
        name.starts_with(CAMPAIGN)
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Group::Relay(relay) => write!(f, "{RELAY}{relay}"),
            Group::Domain(domain) => write!(f, "{DOMAIN}{domain}"),
            Group::AnyDomain => write!(f, "{DOMAIN}{ANY_DOMAIN}"),
            Group::Campaign(name) => write!(f, "{CAMPAIGN}{name}"),
            Group::Mx(suffix) => write!(f, "{MX}{suffix}"),
        }
    }
}

impl FromStr for Group {
    type Err = GroupError;

    fn from_str(name: &str) -> Result<Group, GroupError> {
        if let Some(relay) = name.strip_prefix(RELAY) {
            let port_ok = relay.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
            });
            if !port_ok {
                return Err(GroupError::Bad {
                    name: name.to_string(),
                    why: "a relay group names the relay with its port, as the workers' --smtp does: relay:HOST:PORT, e.g. relay:127.0.0.1:25".into(),
                });
            }
            return Ok(Group::Relay(relay.to_string()));
        }
        if let Some(domain) = name.strip_prefix(DOMAIN) {
            if domain == ANY_DOMAIN {
                return Ok(Group::AnyDomain);
            }
            if !domain.is_empty() && !domain.contains(char::is_whitespace) {
                return domain_name(
                    name,
                    domain,
                    "domain:example.com, or domain:* for every other domain",
                )
                .map(Group::Domain);
            }
        }
        if let Some(suffix) = name.strip_prefix(MX) {
            return domain_name(name, suffix, "mx:google.com").map(Group::Mx);
        }
        match name.strip_prefix(CAMPAIGN) {
            Some(campaign) if !campaign.is_empty() => Ok(Group::Campaign(campaign.to_string())),
            _ => Err(GroupError::Unknown(name.to_string())),
        }
    }
}

/// `text` as a domain group's name holds it: lower case A-labels.
fn domain_name(name: &str, text: &str, example: &str) -> Result<String, GroupError> {
    let bad = |why: String| GroupError::Bad {
        name: name.to_string(),
        why,
    };
    if text.is_empty() || text.contains(char::is_whitespace) {
        return Err(bad(format!("name a domain, e.g. {example}")));
    }
    match mailbox::ascii_domain(text) {
        Ok(ascii) if mailbox::is_ldh_name(&ascii) => Ok(ascii.into_owned()),
        Ok(ascii) => Err(bad(format!(
            "{ascii:?} is not a domain name (letters, digits and hyphens in dot-separated labels), e.g. {example}"
        ))),
        Err(e) => Err(bad(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips() {
        for name in [
            "relay:127.0.0.1:25",
            "relay:[::1]:2525",
            "domain:gmail.com",
            "domain:*",
            "campaign:news",
            "mx:google.com",
        ] {
            assert_eq!(name.parse::<Group>().unwrap().to_string(), name);
        }
    }

    #[test]
    fn domains_are_lower_case_a_labels() {
        let g: Group = "domain:Bücher.DE".parse().unwrap();
        assert_eq!(g, Group::Domain("xn--bcher-kva.de".into()));
        assert_eq!(
            "domain:Example.COM".parse::<Group>().unwrap().to_string(),
            "domain:example.com"
        );
    }

    #[test]
    fn mx_hosts_match_whole_labels() {
        assert!(Group::mx_matches(
            "gmail-smtp-in.l.google.com",
            "google.com"
        ));
        assert!(Group::mx_matches("google.com", "google.com"));
        assert!(!Group::mx_matches("notgoogle.com", "google.com"));
        assert!(!Group::mx_matches("google.com.evil.example", "google.com"));
    }

    #[test]
    fn bad_names_say_why() {
        for bad in [
            "relay:host",
            "relay::25",
            "domain:",
            "domain:a b",
            "campaign:",
            "mx:",
            "mx:a b",
            "x:y",
        ] {
            assert!(bad.parse::<Group>().is_err(), "{bad}");
        }
    }
}
