//! DKIM (RFC 6376; ed25519 per RFC 8463): say which DNS TXT record
//! publishes a key, and sign composed messages exactly as they go on the
//! wire. Keys over their life (generate, rotate, activate) are in [`keys`];
//! canonicalization in `canon`.
//!
//! Signing is done here rather than by lettre's `dkim` feature for three
//! reasons: lettre signs with the `rsa` crate, whose private-key operations
//! are not constant time (RUSTSEC-2023-0071) and several times slower;
//! lettre's `h=` names every configured header whether the message has it
//! or not, and cannot over-sign (name a header once more than it occurs, so
//! nobody can add a second `List-Unsubscribe` or `From` without breaking
//! the signature); and signing the final bytes means no second
//! serialisation can differ from what was hashed.
//!
//! RSA signs with OpenSSL (the system's libssl, through the `openssl`
//! crate), several times faster than `ring` at RSA (`dkim-speed` measures
//! both; the figures are in BENCHMARKS.md). Its private-key operation is
//! blinded and uses constant-time modular exponentiation (OpenSSL's
//! default for every RSA key; nothing here turns it off). ed25519 signs
//! with `ring`, constant time too and an order of magnitude cheaper. A key is parsed once per process and kept per
//! (domain, selector) ([`SigningKey::cached`]); the time spent signing is
//! counted in thread CPU time ([`signing_cpu`]).
//!
//! Canonicalization is relaxed/relaxed, what bulk senders use: it survives
//! relays that re-fold headers or trim trailing blanks.

mod canon;
pub mod keys;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use data_encoding::BASE64;
use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Private};
use ring::signature::Ed25519KeyPair;
use sha2::{Digest, Sha256};

pub use crate::store::dkim_keys::{DkimAlgorithm, KeyState, StoredKey};
use canon::{relaxed_body, relaxed_field, select_fields, signed_names, split_message, Folded};
pub use keys::{
    activate, delete_keys, generate, keygen, keys, rotate, GeneratedKey, KeygenError, Rotated,
    DEFAULT_SELECTOR,
};

/// RSA modulus size `dkim keygen` generates: what Gmail, Yahoo and Outlook
/// recommend (at least 1024 is required; 2048 fits a TXT record).
pub const RSA_BITS: usize = 2048;

/// Headers signed when present, in this order. Each is also *over-signed*
/// (named once more than it occurs): a header added later, such as a second
/// `List-Unsubscribe` or `From`, breaks the signature. RFC 8058 §4: a
/// one-click unsubscribe counts only when the signature covers both
/// `List-Unsubscribe` headers.
pub const SIGNED_HEADERS: &[&str] = &[
    "From",
    "To",
    "Cc",
    "Reply-To",
    "Subject",
    "Date",
    "Message-ID",
    "MIME-Version",
    "Content-Type",
    "Content-Transfer-Encoding",
    "List-Id",
    "List-Unsubscribe",
    "List-Unsubscribe-Post",
    "Feedback-ID",
];

/// Longest line of the DKIM-Signature header we write (RFC 5322 asks for
/// 78 where possible).
const FOLD_AT: usize = 76;

#[derive(Debug, thiserror::Error)]
pub enum DkimError {
    #[error("bad domain {0:?}: expected a domain name such as example.com")]
    BadDomain(String),
    #[error("bad selector {0:?}: use letters, digits and hyphens (dots between labels), e.g. mailsplit or s2025")]
    BadSelector(String),
    #[error("cannot generate a {0} key: {1}")]
    Keygen(DkimAlgorithm, String),
    /// The stored key does not load; never says more about the key.
    #[error(
        "the stored {algorithm} DKIM key of {domain} (selector {selector}) is unreadable: {why}"
    )]
    BadStoredKey {
        domain: String,
        selector: String,
        algorithm: DkimAlgorithm,
        why: &'static str,
    },
    #[error("DKIM signing failed")]
    Sign,
    #[error("{0} has no active DKIM key; `mailsplit dkim keygen {0}` makes one")]
    NoActiveKey(String),
    #[error("{domain} has no active {algorithm} DKIM key to rotate; `mailsplit dkim keygen {domain} --algorithm {algorithm}` makes one")]
    NoActiveKeyOf {
        domain: String,
        algorithm: DkimAlgorithm,
    },
    #[error("{0} has an active rsa and an active ed25519 key: name the one to rotate with --algorithm rsa or --algorithm ed25519")]
    WhichAlgorithm(String),
    #[error("{domain} has no DKIM key with selector {selector}; `mailsplit dkim list` shows them")]
    NoSuchKey { domain: String, selector: String },
}

impl DkimError {
    /// What the user can fix (a name, a missing or ambiguous key), as
    /// opposed to a failure of the machine or the stored key.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            DkimError::BadDomain(_)
                | DkimError::BadSelector(_)
                | DkimError::NoActiveKey(_)
                | DkimError::NoActiveKeyOf { .. }
                | DkimError::WhichAlgorithm(_)
                | DkimError::NoSuchKey { .. }
        )
    }
}

/// The DNS name of a key's TXT record: `SELECTOR._domainkey.DOMAIN`.
pub fn txt_name(selector: &str, domain: &str) -> String {
    format!("{selector}._domainkey.{domain}")
}

/// The TXT record's value: `v=DKIM1; k=rsa; p=…`.
pub fn txt_value(algorithm: DkimAlgorithm, public_b64: &str) -> String {
    format!("v=DKIM1; k={}; p={public_b64}", algorithm.as_str())
}

/// A TXT value as zone-file strings of at most 255 characters each (one
/// DNS character-string cannot hold more; resolvers join them).
pub fn zone_strings(value: &str) -> String {
    value
        .as_bytes()
        .chunks(255)
        .map(|c| format!("\"{}\"", String::from_utf8_lossy(c)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A selector as DNS needs it: dot-separated labels of letters, digits
/// and hyphens, lower-cased.
pub fn check_selector(raw: &str) -> Result<String, DkimError> {
    let s = raw.trim().to_ascii_lowercase();
    if crate::mailbox::is_ldh_name(&s) {
        Ok(s)
    } else {
        Err(DkimError::BadSelector(raw.to_string()))
    }
}

enum Pair {
    Rsa(PKey<Private>),
    Ed25519(Ed25519KeyPair),
}

/// A loaded key, ready to sign mail of its domain.
pub struct SigningKey {
    pub domain: String,
    pub selector: String,
    /// The stored public key: a key made anew under the same selector
    /// (deleted, then generated again) is not taken for the cached one.
    public_key: String,
    pair: Pair,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("domain", &self.domain)
            .field("selector", &self.selector)
            .field("algorithm", &self.algorithm())
            .finish_non_exhaustive()
    }
}

/// Keys parsed in this process, by (domain, selector): parsing and checking
/// an RSA key costs more than a signature, and a worker reloads a
/// campaign's keys on every change. A handful of entries (one per key).
static LOADED: Mutex<Option<Loaded>> = Mutex::new(None);

/// Parsed keys by (domain, selector).
type Loaded = HashMap<(String, String), Arc<SigningKey>>;

/// Signatures made by this process, and their thread CPU time (ns).
static SIGNATURES: AtomicU64 = AtomicU64::new(0);
static SIGNING_NS: AtomicU64 = AtomicU64::new(0);

/// How many signatures this process made, and the CPU time they took (the
/// signing threads' own CPU time, so waiting for a core does not count).
pub fn signing_cpu() -> (u64, std::time::Duration) {
    (
        SIGNATURES.load(Ordering::Relaxed),
        std::time::Duration::from_nanos(SIGNING_NS.load(Ordering::Relaxed)),
    )
}

/// This thread's CPU time in ns (0 where the clock is unavailable).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0;
    if !ok {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

impl SigningKey {
    /// Load a stored key.
    pub fn load(stored: &StoredKey) -> Result<SigningKey, DkimError> {
        let bad = |why| DkimError::BadStoredKey {
            domain: stored.domain.clone(),
            selector: stored.selector.clone(),
            algorithm: stored.algorithm,
            why,
        };
        let der = BASE64
            .decode(stored.private_key().as_bytes())
            .map_err(|_| bad("not base64"))?;
        let pair = match stored.algorithm {
            DkimAlgorithm::Rsa => {
                let pkey =
                    PKey::private_key_from_pkcs8(&der).map_err(|_| bad("not an RSA PKCS#8 key"))?;
                let rsa = pkey.rsa().map_err(|_| bad("not an RSA PKCS#8 key"))?;
                if !rsa.check_key().unwrap_or(false) {
                    return Err(bad("an inconsistent RSA key"));
                }
                Pair::Rsa(pkey)
            }
            DkimAlgorithm::Ed25519 => Pair::Ed25519(
                Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der)
                    .map_err(|_| bad("not an ed25519 PKCS#8 key"))?,
            ),
        };
        Ok(SigningKey {
            domain: stored.domain.clone(),
            selector: stored.selector.clone(),
            public_key: stored.public_key.clone(),
            pair,
        })
    }

    /// [`SigningKey::load`] once per process: the key parsed before for
    /// this (domain, selector), if it is the same key.
    pub fn cached(stored: &StoredKey) -> Result<Arc<SigningKey>, DkimError> {
        let id = (stored.domain.clone(), stored.selector.clone());
        let found = LOADED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(HashMap::new)
            .get(&id)
            .filter(|k| k.public_key == stored.public_key)
            .cloned();
        if let Some(key) = found {
            return Ok(key);
        }
        let key = Arc::new(SigningKey::load(stored)?);
        LOADED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(id, Arc::clone(&key));
        Ok(key)
    }

    pub fn algorithm(&self) -> DkimAlgorithm {
        match self.pair {
            Pair::Rsa(_) => DkimAlgorithm::Rsa,
            Pair::Ed25519(_) => DkimAlgorithm::Ed25519,
        }
    }

    /// The `DKIM-Signature` header field (ending in CRLF) for `message`
    /// (headers, blank line, body, CRLF line ends), signed at `timestamp`
    /// (seconds since the epoch).
    pub fn signature(&self, message: &[u8], timestamp: u64) -> Result<Vec<u8>, DkimError> {
        let (fields, body) = split_message(message);
        let body_hash = BASE64.encode(&Sha256::digest(relaxed_body(body)));
        let names = signed_names(&fields);
        let algorithm = match self.pair {
            Pair::Rsa(_) => "rsa-sha256",
            Pair::Ed25519(_) => "ed25519-sha256",
        };
        let mut header = Folded::new(format!(
            "DKIM-Signature: v=1; a={algorithm}; c=relaxed/relaxed; d={};",
            self.domain
        ));
        header.push(&format!("s={};", self.selector));
        header.push(&format!("t={timestamp};"));
        let last = names.len().saturating_sub(1);
        for (k, name) in names.iter().enumerate() {
            let name = name.to_ascii_lowercase();
            let end = if k == last { ";" } else { ":" };
            if k == 0 {
                header.push(&format!("h={name}{end}"));
            } else {
                header.glue(&format!("{name}{end}"));
            }
        }
        header.push(&format!("bh={body_hash};"));
        header.push("b=");
        // What is left of the `b=` line for the first piece of the value.
        let room = FOLD_AT.saturating_sub(header.line);
        let unsigned = header.text;

        let mut data = Vec::with_capacity(1024);
        for field in select_fields(&fields, &names) {
            data.extend_from_slice(&relaxed_field(field));
        }
        let own = relaxed_field(unsigned.as_bytes());
        data.extend_from_slice(own.strip_suffix(b"\r\n").unwrap_or(&own));

        let signature = self.sign_data(&data)?;
        let mut out = unsigned.into_bytes();
        let b64 = BASE64.encode(&signature);
        // The first piece continues the `b=` line; the rest are folded.
        let first = room.min(b64.len());
        out.extend_from_slice(&b64.as_bytes()[..first]);
        for chunk in b64.as_bytes()[first..].chunks(FOLD_AT - 1) {
            out.extend_from_slice(b"\r\n\t");
            out.extend_from_slice(chunk);
        }
        out.extend_from_slice(b"\r\n");
        Ok(out)
    }

    /// The private-key operation over the canonicalized header data, its
    /// thread CPU time added to [`signing_cpu`].
    fn sign_data(&self, data: &[u8]) -> Result<Vec<u8>, DkimError> {
        let start = thread_cpu_ns();
        let signature = match &self.pair {
            Pair::Rsa(pkey) => {
                let mut signer = openssl::sign::Signer::new(MessageDigest::sha256(), pkey)
                    .map_err(|_| DkimError::Sign)?;
                signer.update(data).map_err(|_| DkimError::Sign)?;
                signer.sign_to_vec().map_err(|_| DkimError::Sign)?
            }
            // RFC 8463: ed25519 signs the SHA-256 hash of the data.
            Pair::Ed25519(pair) => pair.sign(&Sha256::digest(data)).as_ref().to_vec(),
        };
        SIGNING_NS.fetch_add(thread_cpu_ns().saturating_sub(start), Ordering::Relaxed);
        SIGNATURES.fetch_add(1, Ordering::Relaxed);
        Ok(signature)
    }
}

/// Sign `message` with each key (an RSA and an ed25519 key of one domain
/// give two signatures, RSA's on top: a receiver that knows only RSA
/// finds it first); the signature headers go on top.
pub fn sign(keys: &[Arc<SigningKey>], message: Vec<u8>) -> Result<Vec<u8>, DkimError> {
    if keys.is_empty() {
        return Ok(message);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut headers = Vec::new();
    for key in keys {
        headers.extend(key.signature(&message, now)?);
    }
    headers.extend_from_slice(&message);
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_and_names() {
        assert_eq!(check_selector(" S2025 ").unwrap(), "s2025");
        assert!(check_selector("a.b-c").is_ok());
        for bad in ["", "-a", "a b", "a..b", "a_b", "ä"] {
            assert!(check_selector(bad).is_err(), "{bad}");
        }
        let long = "v=DKIM1; k=rsa; p=".to_string() + &"A".repeat(400);
        let zone = zone_strings(&long);
        assert_eq!(zone.matches('"').count(), 4);
    }

    #[test]
    fn generated_keys_sign_and_never_show_in_debug() {
        let key = generate(DkimAlgorithm::Ed25519).unwrap();
        let shown = format!("{key:?}");
        assert!(!shown.contains(&BASE64.encode(&key.private_pkcs8)));
        let stored = StoredKey::new(
            "example.test".into(),
            "sel".into(),
            DkimAlgorithm::Ed25519,
            BASE64.encode(&key.private_pkcs8),
            BASE64.encode(&key.public),
        );
        assert!(!format!("{stored:?}").contains(stored.private_key()));
        let signer = SigningKey::load(&stored).unwrap();
        let header = signer
            .signature(b"From: a@example.test\r\nSubject: hi\r\n\r\nbody\r\n", 1)
            .unwrap();
        let text = String::from_utf8(header).unwrap();
        assert!(text.starts_with("DKIM-Signature: v=1; a=ed25519-sha256;"));
        assert!(text.contains("h=from:from:subject:subject;"), "{text}");
        assert!(text.lines().all(|l| l.len() <= FOLD_AT), "{text}");
    }

    fn stored(selector: &str, key: &GeneratedKey, algorithm: DkimAlgorithm) -> StoredKey {
        StoredKey::new(
            "cache.test".into(),
            selector.into(),
            algorithm,
            BASE64.encode(&key.private_pkcs8),
            BASE64.encode(&key.public),
        )
    }

    #[test]
    fn a_key_is_parsed_once_and_a_new_key_under_its_selector_is_not_mistaken_for_it() {
        let first = generate(DkimAlgorithm::Rsa).unwrap();
        let a = SigningKey::cached(&stored("s1", &first, DkimAlgorithm::Rsa)).unwrap();
        let again = SigningKey::cached(&stored("s1", &first, DkimAlgorithm::Rsa)).unwrap();
        assert!(Arc::ptr_eq(&a, &again));
        // Deleted and made anew under the same selector: parsed anew.
        let second = generate(DkimAlgorithm::Ed25519).unwrap();
        let b = SigningKey::cached(&stored("s1", &second, DkimAlgorithm::Ed25519)).unwrap();
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(b.algorithm(), DkimAlgorithm::Ed25519);
        // A damaged key is an error, not a panic, and is not cached.
        let mut bad = stored("s2", &first, DkimAlgorithm::Rsa);
        bad = StoredKey::new(
            bad.domain,
            bad.selector,
            DkimAlgorithm::Rsa,
            BASE64.encode(&first.private_pkcs8[..100]),
            bad.public_key,
        );
        assert!(matches!(
            SigningKey::cached(&bad),
            Err(DkimError::BadStoredKey { .. })
        ));
        // Each signature's CPU time is counted.
        let (before, _) = signing_cpu();
        a.signature(b"From: a@cache.test\r\n\r\nbody\r\n", 1)
            .unwrap();
        assert!(signing_cpu().0 > before);
    }
}
