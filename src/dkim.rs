//! DKIM (RFC 6376; ed25519 per RFC 8463): generate a key pair, say which
//! DNS TXT record publishes it, and sign composed messages exactly as they
//! go on the wire.
//!
//! Signing is done here rather than by lettre's `dkim` feature for three
//! reasons: lettre signs with the `rsa` crate, whose private-key operations
//! are not constant time (RUSTSEC-2023-0071) and several times slower than
//! `ring`, which the TLS stack already brings; lettre's `h=` names every
//! configured header whether the message has it or not, and cannot
//! over-sign (name a header once more than it occurs, so nobody can add a
//! second `List-Unsubscribe` or `From` without breaking the signature); and
//! signing the final bytes means no second serialisation can differ from
//! what was hashed. The `rsa` crate is used only to generate RSA keys
//! (`ring` cannot), once per `dkim keygen`.
//!
//! Canonicalization is relaxed/relaxed, what bulk senders use: it survives
//! relays that re-fold headers or trim trailing blanks.

use data_encoding::BASE64;
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair, RsaKeyPair, RSA_PKCS1_SHA256};
use sha2::{Digest, Sha256};

pub use crate::store::dkim_keys::{DkimAlgorithm, StoredKey};

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
}

/// Generate a key for `domain` under `selector` and store it (one key per
/// algorithm and domain): what `dkim keygen` does. The domain and selector
/// are checked first.
pub fn keygen(
    conn: &mut crate::store::Conn,
    domain: &str,
    selector: &str,
    algorithm: &str,
) -> Result<StoredKey, KeygenError> {
    let domain = crate::compose::ascii_domain(domain)
        .ok_or_else(|| DkimError::BadDomain(domain.to_string()))?;
    let selector = check_selector(selector)?;
    let algorithm: DkimAlgorithm = algorithm.parse()?;
    let key = generate(algorithm)?;
    let stored = StoredKey::new(
        domain,
        selector,
        algorithm,
        BASE64.encode(&key.private_pkcs8),
        BASE64.encode(&key.public),
    );
    crate::store::dkim_keys::insert(conn, &stored)?;
    Ok(stored)
}

/// Why `dkim keygen` failed: the key (domain, selector, generation) or the
/// database.
#[derive(Debug, thiserror::Error)]
pub enum KeygenError {
    #[error(transparent)]
    Dkim(#[from] DkimError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// Every stored key, by domain.
pub fn keys(conn: &mut crate::store::Conn) -> crate::store::Result<Vec<StoredKey>> {
    crate::store::dkim_keys::list(conn)
}

/// Delete a domain's keys (only the one with `selector`, if given); how
/// many went. The domain is checked first.
pub fn delete_keys(
    conn: &mut crate::store::Conn,
    domain: &str,
    selector: Option<&str>,
) -> Result<(String, usize), KeygenError> {
    let domain = crate::compose::ascii_domain(domain)
        .ok_or_else(|| DkimError::BadDomain(domain.to_string()))?;
    let deleted = crate::store::dkim_keys::delete(conn, &domain, selector)?;
    Ok((domain, deleted))
}

/// A new key pair: the private key to store (PKCS#8 DER) and the public
/// key as the TXT record's `p=` wants it (SubjectPublicKeyInfo DER for
/// RSA, the raw 32 bytes for ed25519).
pub struct GeneratedKey {
    pub private_pkcs8: Vec<u8>,
    pub public: Vec<u8>,
}

/// Never print the private key, not even in a debug dump.
impl std::fmt::Debug for GeneratedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedKey")
            .field("private_pkcs8", &"<redacted>")
            .field("public", &BASE64.encode(&self.public))
            .finish()
    }
}

/// Generate a key pair.
pub fn generate(algorithm: DkimAlgorithm) -> Result<GeneratedKey, DkimError> {
    let failed = |e: &dyn std::fmt::Display| DkimError::Keygen(algorithm, e.to_string());
    match algorithm {
        DkimAlgorithm::Rsa => {
            use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey};
            let private = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, RSA_BITS)
                .map_err(|e| failed(&e))?;
            let public = rsa::RsaPublicKey::from(&private)
                .to_public_key_der()
                .map_err(|e| failed(&e))?;
            let pkcs8 = private.to_pkcs8_der().map_err(|e| failed(&e))?;
            Ok(GeneratedKey {
                private_pkcs8: pkcs8.as_bytes().to_vec(),
                public: public.as_bytes().to_vec(),
            })
        }
        DkimAlgorithm::Ed25519 => {
            let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
                .map_err(|_| failed(&"no randomness"))?;
            let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|e| failed(&e))?;
            Ok(GeneratedKey {
                private_pkcs8: pkcs8.as_ref().to_vec(),
                public: pair.public_key().as_ref().to_vec(),
            })
        }
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
    Rsa(RsaKeyPair),
    Ed25519(Ed25519KeyPair),
}

/// A loaded key, ready to sign mail of its domain.
pub struct SigningKey {
    pub domain: String,
    pub selector: String,
    pair: Pair,
    rng: SystemRandom,
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
                Pair::Rsa(RsaKeyPair::from_pkcs8(&der).map_err(|_| bad("not an RSA PKCS#8 key"))?)
            }
            DkimAlgorithm::Ed25519 => Pair::Ed25519(
                Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der)
                    .map_err(|_| bad("not an ed25519 PKCS#8 key"))?,
            ),
        };
        Ok(SigningKey {
            domain: stored.domain.clone(),
            selector: stored.selector.clone(),
            pair,
            rng: SystemRandom::new(),
        })
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

        let signature = match &self.pair {
            Pair::Rsa(pair) => {
                let mut sig = vec![0u8; pair.public().modulus_len()];
                pair.sign(&RSA_PKCS1_SHA256, &self.rng, &data, &mut sig)
                    .map_err(|_| DkimError::Sign)?;
                sig
            }
            // RFC 8463: ed25519 signs the SHA-256 hash of the data.
            Pair::Ed25519(pair) => pair.sign(&Sha256::digest(&data)).as_ref().to_vec(),
        };
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
}

/// Sign `message` with each key (an RSA and an ed25519 key of one domain
/// give two signatures); the signature headers go on top.
pub fn sign(keys: &[SigningKey], message: Vec<u8>) -> Result<Vec<u8>, DkimError> {
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

/// A header built from tokens, folded before a token that would make the
/// line longer than [`FOLD_AT`].
struct Folded {
    text: String,
    line: usize,
}

impl Folded {
    fn new(start: String) -> Folded {
        Folded {
            line: start.len(),
            text: start,
        }
    }
    /// Add `token` after a space.
    fn push(&mut self, token: &str) {
        self.add(" ", token);
    }
    /// Add `token` right after the previous one (a fold is still allowed).
    fn glue(&mut self, token: &str) {
        self.add("", token);
    }
    fn add(&mut self, gap: &str, token: &str) {
        if self.line + gap.len() + token.len() > FOLD_AT {
            self.text.push_str("\r\n\t");
            self.line = 1;
        } else {
            self.text.push_str(gap);
            self.line += gap.len();
        }
        self.text.push_str(token);
        self.line += token.len();
    }
}

/// The header fields (each with its continuation lines, without the final
/// CRLF) and the body of a message.
fn split_message(message: &[u8]) -> (Vec<&[u8]>, &[u8]) {
    let (head, body) = match find(message, b"\r\n\r\n") {
        Some(at) => (&message[..at + 2], &message[at + 4..]),
        None => (message, &b""[..]),
    };
    let mut fields: Vec<&[u8]> = Vec::new();
    let mut start = 0;
    let mut pos = 0;
    while pos < head.len() {
        let end = find(&head[pos..], b"\r\n").map_or(head.len(), |k| pos + k);
        let next = (end + 2).min(head.len());
        let continues = matches!(head.get(next), Some(b' ' | b'\t'));
        if !continues {
            if end > start {
                fields.push(&head[start..end]);
            }
            start = next;
        }
        pos = next;
    }
    (fields, body)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn field_name(field: &[u8]) -> &[u8] {
    let colon = field.iter().position(|&b| b == b':').unwrap_or(field.len());
    field[..colon].trim_ascii_end()
}

/// The `h=` list: every [`SIGNED_HEADERS`] name the message has, as often
/// as it has it plus once more (over-signing).
fn signed_names(fields: &[&[u8]]) -> Vec<&'static str> {
    let mut names = Vec::new();
    for name in SIGNED_HEADERS {
        let present = fields
            .iter()
            .filter(|f| field_name(f).eq_ignore_ascii_case(name.as_bytes()))
            .count();
        if present > 0 {
            names.extend(std::iter::repeat_n(*name, present + 1));
        }
    }
    names
}

/// The fields `names` pick, in order: for each name the last instance not
/// yet picked (RFC 6376 §5.4.2); a name with none left picks nothing.
fn select_fields<'a>(fields: &[&'a [u8]], names: &[&str]) -> Vec<&'a [u8]> {
    let mut used = vec![false; fields.len()];
    let mut out = Vec::new();
    for name in names {
        let found = (0..fields.len())
            .rev()
            .find(|&k| !used[k] && field_name(fields[k]).eq_ignore_ascii_case(name.as_bytes()));
        if let Some(k) = found {
            used[k] = true;
            out.push(fields[k]);
        }
    }
    out
}

/// Relaxed header canonicalization (RFC 6376 §3.4.2): lower-case name,
/// unfolded value, runs of blanks as one space, none around the colon or at
/// the end; then CRLF.
fn relaxed_field(field: &[u8]) -> Vec<u8> {
    let colon = field.iter().position(|&b| b == b':').unwrap_or(field.len());
    let mut out: Vec<u8> = field[..colon]
        .trim_ascii_end()
        .iter()
        .map(u8::to_ascii_lowercase)
        .collect();
    out.push(b':');
    let (mut blank, mut started) = (false, false);
    for &b in field.get(colon + 1..).unwrap_or_default() {
        match b {
            b'\r' | b'\n' => {}
            b' ' | b'\t' => blank = true,
            _ => {
                if blank && started {
                    out.push(b' ');
                }
                (blank, started) = (false, true);
                out.push(b);
            }
        }
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Relaxed body canonicalization (RFC 6376 §3.4.4): runs of blanks as one
/// space, no blanks at line ends, no empty lines at the end, and a
/// non-empty body ends in CRLF.
fn relaxed_body(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 2);
    let mut blank = false;
    let mut k = 0;
    while k < body.len() {
        match body[k] {
            b'\r' if body.get(k + 1) == Some(&b'\n') => {
                blank = false;
                out.extend_from_slice(b"\r\n");
                k += 1;
            }
            b' ' | b'\t' => blank = true,
            b => {
                if blank {
                    out.push(b' ');
                }
                blank = false;
                out.push(b);
            }
        }
        k += 1;
    }
    while out.ends_with(b"\r\n") {
        out.truncate(out.len() - 2);
    }
    if !out.is_empty() {
        out.extend_from_slice(b"\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relaxed_canonicalization_follows_rfc_6376_examples() {
        // RFC 6376 §3.4.6, example 2 (relaxed/relaxed).
        let message = b"A: X\r\nB : Y\t\r\n\tZ  \r\n\r\n C \r\nD \t E\r\n\r\n\r\n";
        let (fields, body) = split_message(message);
        assert_eq!(fields.len(), 2);
        assert_eq!(relaxed_field(fields[0]), b"a:X\r\n");
        assert_eq!(relaxed_field(fields[1]), b"b:Y Z\r\n");
        assert_eq!(
            relaxed_field(b"Subject:  a:  b \r\n\tc "),
            b"subject:a: b c\r\n"
        );
        assert_eq!(relaxed_body(body), b" C\r\nD E\r\n");
        assert_eq!(relaxed_body(b""), b"");
        assert_eq!(relaxed_body(b"\r\n\r\n"), b"");
        assert_eq!(relaxed_body(b"x"), b"x\r\n");
    }

    #[test]
    fn over_signs_present_headers_and_picks_from_the_bottom() {
        let message = b"From: a@x\r\nTo: b@y\r\nX-Other: 1\r\nTo: c@z\r\n\r\nbody\r\n";
        let (fields, _) = split_message(message);
        let names = signed_names(&fields);
        assert_eq!(names, ["From", "From", "To", "To", "To"]);
        let picked = select_fields(&fields, &names);
        assert_eq!(picked, [&b"From: a@x"[..], b"To: c@z", b"To: b@y"]);
    }

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
}
