//! Mail addresses: which spellings name the same mailbox, and how an
//! address goes on the wire.
//!
//! * **Identity** ([`key`]): `Ada@Example.com` and `ada@example.com`, or
//!   `user@bücher.de` and `user@xn--bcher-kva.de`, are one mailbox. The key
//!   folds the local part's case (RFC 5321 lets a server tell them apart;
//!   no mailbox provider does, and two mails to one person are the worse
//!   failure) and writes the domain as a lower-case A-label (IDNA). The
//!   recipient keeps the spelling it was imported with for sending.
//! * **Transport** ([`for_transport`]): a domain goes into SMTP commands and
//!   headers as its A-label (punycode), which every relay takes; only a
//!   non-ASCII local part needs the relay's SMTPUTF8 ([`needs_smtputf8`]).

use std::borrow::Cow;
use std::str::FromStr;

use lettre::Address;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MailboxError {
    #[error("{0:?} has no @domain")]
    NoDomain(String),
    #[error("domain {0:?} is not a valid internationalised domain name")]
    BadDomain(String),
}

/// A domain as DNS and SMTP without SMTPUTF8 know it: lower-case, each
/// non-ASCII label as its A-label (`bücher.de` → `xn--bcher-kva.de`).
pub fn ascii_domain(domain: &str) -> Result<Cow<'_, str>, MailboxError> {
    if domain.is_ascii() {
        // Lower-casing alone, exactly as SQL's lower() does it: migration 4
        // computed the keys of ASCII addresses that way.
        return Ok(if domain.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(domain.to_ascii_lowercase())
        } else {
            Cow::Borrowed(domain)
        });
    }
    // UTS 46 (IDNA) through `url`, which every HTTP and SMTP URL here
    // already goes through.
    match url::Host::parse(domain) {
        Ok(url::Host::Domain(ascii)) => Ok(Cow::Owned(ascii)),
        _ => Err(MailboxError::BadDomain(domain.to_string())),
    }
}

/// A domain as DNS and headers want it: lower case, international labels
/// as A-labels (punycode), never an encoded word. `None` when it is no
/// domain name.
pub fn dns_name(domain: &str) -> Option<String> {
    match url::Host::parse(domain.trim()).ok()? {
        url::Host::Domain(d) if is_ldh_name(&d) => Some(d),
        _ => None,
    }
}

/// Letters, digits and hyphens in labels of 1-63 characters, at most 253 in
/// all, no label starting or ending with a hyphen.
pub fn is_ldh_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// The identity of the mailbox `addr` names: local part in lower case, `@`,
/// the domain as a lower-case A-label. Two addresses with one key are one
/// recipient.
pub fn key(addr: &str) -> Result<String, MailboxError> {
    let (local, domain) = addr
        .rsplit_once('@')
        .ok_or_else(|| MailboxError::NoDomain(addr.to_string()))?;
    let local = if local.is_ascii() {
        local.to_ascii_lowercase()
    } else {
        local.to_lowercase()
    };
    Ok(format!("{local}@{}", ascii_domain(domain)?))
}

/// `addr` with its domain as an A-label: what goes into MAIL FROM, RCPT TO
/// and the From/To headers. The local part stays as written.
pub fn for_transport(addr: &Address) -> Result<Address, MailboxError> {
    match ascii_domain(addr.domain())? {
        Cow::Borrowed(_) => Ok(addr.clone()),
        Cow::Owned(domain) => {
            let raw: &str = addr.as_ref();
            // The local part as written (a quoted one keeps its quotes).
            let local = raw.rsplit_once('@').map_or(addr.user(), |(l, _)| l);
            Address::from_str(&format!("{local}@{domain}"))
                .map_err(|_| MailboxError::BadDomain(addr.domain().to_string()))
        }
    }
}

/// Whether sending to or from `addr` needs the relay's SMTPUTF8 extension
/// even after [`for_transport`]: its local part is not ASCII.
pub fn needs_smtputf8(addr: &Address) -> bool {
    !addr.user().is_ascii()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_per_mailbox() {
        assert_eq!(key("Ada@Example.com").unwrap(), "ada@example.com");
        assert_eq!(key("ada@example.com").unwrap(), "ada@example.com");
        assert_eq!(key("user@bücher.de").unwrap(), "user@xn--bcher-kva.de");
        assert_eq!(key("user@BÜCHER.de").unwrap(), "user@xn--bcher-kva.de");
        assert_eq!(
            key("user@xn--bcher-kva.de").unwrap(),
            "user@xn--bcher-kva.de"
        );
        assert_eq!(
            key("USER@XN--BCHER-KVA.DE").unwrap(),
            "user@xn--bcher-kva.de"
        );
        assert_eq!(key("Ädä@Example.com").unwrap(), "ädä@example.com");
        assert_eq!(
            key("\"Quoted User\"@Example.test").unwrap(),
            "\"quoted user\"@example.test"
        );
        assert!(key("no-domain").is_err());
    }

    #[test]
    fn transport_spelling() {
        let a = Address::from_str("User@bücher.de").unwrap();
        let t = for_transport(&a).unwrap();
        assert_eq!(t.to_string(), "User@xn--bcher-kva.de");
        assert!(t.to_string().is_ascii());
        assert!(!needs_smtputf8(&t));
        let plain = Address::from_str("news@example.com").unwrap();
        assert_eq!(for_transport(&plain).unwrap(), plain);
        let utf8_local = Address::from_str("ädä@bücher.de").unwrap();
        let t = for_transport(&utf8_local).unwrap();
        assert_eq!(t.to_string(), "ädä@xn--bcher-kva.de");
        assert!(needs_smtputf8(&t));
    }
}
