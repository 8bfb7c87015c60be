//! What a relay's answer means for the recipient: its reply code and
//! enhanced status code (RFC 3463), read once, then judged by number —
//! never by searching the text.

use std::fmt;

/// An enhanced status code, `class.subject.detail` (e.g. 5.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enhanced {
    pub class: u8,
    pub subject: u16,
    pub detail: u16,
}

impl Enhanced {
    /// The code at the start of a reply text, if it carries one.
    pub fn parse(text: &str) -> Option<Enhanced> {
        let word = text.split_whitespace().next()?;
        let mut parts = word.split('.');
        let class: u8 = parts.next()?.parse().ok()?;
        let subject: u16 = parts.next()?.parse().ok()?;
        let detail: u16 = parts.next()?.parse().ok()?;
        if parts.next().is_some() || !matches!(class, 2 | 4 | 5) || subject > 999 || detail > 999 {
            return None;
        }
        Some(Enhanced {
            class,
            subject,
            detail,
        })
    }
}

impl fmt::Display for Enhanced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.class, self.subject, self.detail)
    }
}

/// A negative answer, or the local failure that stands in for one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The SMTP reply code (e.g. 550); `None` for a timeout, a lost
    /// connection or a message the client refused to send.
    pub code: Option<u16>,
    pub enhanced: Option<Enhanced>,
    /// What goes into the ledger's `last_error`: code and text.
    pub text: String,
}

impl Reply {
    /// A reply from the relay: `code` and its text lines joined.
    pub fn from_relay(code: u16, message: &str) -> Reply {
        let message = message.trim();
        Reply {
            code: Some(code),
            enhanced: Enhanced::parse(message),
            text: format!("{code} {message}"),
        }
    }

    /// A failure without a reply (timeout, connection lost, client error).
    pub fn local(text: impl Into<String>) -> Reply {
        Reply {
            code: None,
            enhanced: None,
            text: text.into(),
        }
    }

    /// Whether a permanent refusal says the address itself is bad (5.1.x,
    /// but not 5.1.7/5.1.8, which are about the sender): a hard bounce at
    /// send time. A policy block (5.7.x) or a code-less 5xx is not.
    pub fn says_bad_address(&self) -> bool {
        matches!(
            (self.code, self.enhanced),
            (
                Some(500..=599),
                Some(Enhanced {
                    class: 5,
                    subject: 1,
                    detail,
                })
            ) if detail != 7 && detail != 8
        )
    }

    /// Whether the relay or the mailbox provider throttles us (asks us to
    /// send less), so the recipient is deferred, not failed: 421 (closing,
    /// too many connections; Gmail's 421 4.7.28), a temporary policy
    /// refusal 4.7.x (Microsoft's 451 4.7.650; not 454), 450–452 naming a rate,
    /// "too many" or throttling, and 454 naming throttling (Amazon SES's
    /// `454 Throttling failure: Maximum sending rate exceeded`). The text
    /// is read for the 45x codes only, as whole words, because SES and
    /// others say it in no code; "too many recipients" (4.5.3) is about
    /// the message, not the rate.
    pub fn throttles(&self) -> bool {
        let Some(code) = self.code else {
            return false;
        };
        if code == 421 {
            return true;
        }
        if !(400..=499).contains(&code) {
            return false;
        }
        match self.enhanced {
            // 454 4.7.0 is also "TLS not available": judged by its text.
            Some(Enhanced {
                class: 4,
                subject: 7,
                ..
            }) if code != 454 => return true,
            Some(Enhanced {
                class: 4,
                subject: 5,
                detail: 3,
            }) => return false,
            _ => {}
        }
        let text = self.text.to_ascii_lowercase();
        let words: Vec<&str> = text
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect();
        let throttling = words.iter().any(|w| w.starts_with("throttl"));
        let rate = words
            .iter()
            .any(|w| matches!(*w, "rate" | "ratelimit" | "ratelimited" | "ratelimiting"));
        let too_many = words.windows(2).any(|p| p == ["too", "many"]);
        match code {
            450..=452 => throttling || rate || too_many,
            454 => throttling,
            _ => false,
        }
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// What a send attempt means for the recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx: accepted.
    Sent,
    /// 5xx or a message the relay can never take: record as failed.
    Permanent(Reply),
    /// 4xx, timeout, lost connection: try again later.
    Transient(Reply),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enhanced_codes() {
        assert_eq!(
            Enhanced::parse("5.1.1 no such user"),
            Some(Enhanced {
                class: 5,
                subject: 1,
                detail: 1
            })
        );
        assert_eq!(Enhanced::parse("no such user 5.1.1"), None);
        assert_eq!(Enhanced::parse("3.1.1 odd"), None);
        assert_eq!(Enhanced::parse("5.1"), None);
        assert_eq!(Enhanced::parse(""), None);
    }

    #[test]
    fn throttling_replies_of_real_relays() {
        let throttles = |code, text| Reply::from_relay(code, text).throttles();
        assert!(throttles(
            454,
            "Throttling failure: Maximum sending rate exceeded."
        ));
        assert!(throttles(
            454,
            "4.7.0 Throttling failure: Daily message quota exceeded."
        ));
        assert!(throttles(
            421,
            "4.7.28 Gmail has detected an unusual rate of unsolicited mail originating from your IP address."
        ));
        assert!(throttles(
            451,
            "4.7.650 The mail server [192.0.2.1] has been temporarily rate limited due to IP reputation."
        ));
        assert!(throttles(421, "4.7.0 too many connections"));
        assert!(throttles(421, "closing"));
        assert!(throttles(450, "4.2.1 The user you are trying to contact is receiving mail at a rate that prevents additional messages from being delivered."));
        assert!(throttles(452, "Too many messages, slow down"));
        assert!(throttles(451, "Ratelimit exceeded for sender"));
        // A mailbox that happens to contain "421" or "rate" is no signal,
        // nor a refusal that is not about the rate.
        assert!(!throttles(451, "4.3.0 user421@x: slow down later"));
        assert!(!throttles(451, "4.3.0 generate@example.test: try later"));
        assert!(!throttles(452, "4.5.3 Error: too many recipients"));
        assert!(!throttles(452, "4.2.2 mailbox full"));
        assert!(!throttles(
            454,
            "4.7.0 TLS not available due to local problem"
        ));
        assert!(!throttles(454, "4.3.0 temporary authentication failure"));
        assert!(!throttles(550, "5.7.1 rate limit policy"));
        assert!(!throttles(554, "Throttling failure"));
        assert!(!Reply::local("no reply within 30s").throttles());
    }

    #[test]
    fn bad_addresses_are_told_from_policy_blocks() {
        assert!(Reply::from_relay(550, "5.1.1 no such user").says_bad_address());
        assert!(Reply::from_relay(550, "5.1.10 recipient not found").says_bad_address());
        assert!(!Reply::from_relay(554, "5.7.1 relay access denied").says_bad_address());
        assert!(!Reply::from_relay(550, "5.1.8 bad sender domain").says_bad_address());
        assert!(!Reply::from_relay(550, "no such user").says_bad_address());
        assert!(!Reply::from_relay(450, "4.1.1 try later").says_bad_address());
    }
}
