//! Addresses erased at their owner's request (`subscriber forget`): only a
//! keyed hash of each is kept, so that no import, API call or flow
//! trigger adds the address again, and only a confirmed double-opt-in
//! sign-up (the person asking again) takes it away. The hash is an
//! HMAC-SHA256 under the installation's secret (`store::installation`):
//! a copy of this table alone tells nobody whether an address is in it.

use std::collections::HashSet;

use diesel::prelude::*;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{installation, now_ms, on, Conn, Result};

diesel::table! {
    /// See migration 86.
    forgotten (digest) {
        digest -> Text,
        suppressed -> Bool,
        forgotten_at -> BigInt,
    }
}

use forgotten as f;

/// Inside the MAC, so this hash is never equal to any token made with the
/// same secret for another purpose (see `crate::tokens`).
const LABEL: &[u8] = b"mailsplit forgotten\0";

/// The digest of mailbox `key` ([`crate::mailbox::key`]) under `secret`.
pub fn digest(secret: &[u8], key: &str) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
        .unwrap_or_else(|_| <Hmac<Sha256> as Mac>::new_from_slice(&[0]).expect("HMAC key"));
    mac.update(LABEL);
    mac.update(key.as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn digest_of(conn: &mut Conn, key: &str) -> Result<String> {
    Ok(digest(&installation::load(conn)?.secret, key))
}

/// Of `keys`, those forgotten. One cheap statement when nobody was ever
/// forgotten (the common case: no hashing at all); otherwise one indexed
/// lookup of the batch's digests.
pub fn among<'k>(conn: &mut Conn, keys: &[&'k str]) -> Result<HashSet<&'k str>> {
    let any: Option<String> = on!(conn, |c| f::table.select(f::digest).first(c).optional())?;
    if any.is_none() || keys.is_empty() {
        return Ok(HashSet::new());
    }
    let secret = installation::load(conn)?.secret;
    let digests: Vec<(String, &str)> = keys.iter().map(|k| (digest(&secret, k), *k)).collect();
    let wanted: Vec<&str> = digests.iter().map(|(d, _)| d.as_str()).collect();
    let mut found: HashSet<String> = HashSet::new();
    for chunk in wanted.chunks(500) {
        let hit: Vec<String> = on!(conn, |c| f::table
            .filter(f::digest.eq_any(chunk))
            .select(f::digest)
            .load(c))?;
        found.extend(hit);
    }
    Ok(digests
        .into_iter()
        .filter(|(d, _)| found.contains(d))
        .map(|(_, k)| k)
        .collect())
}

/// Whether mailbox `key` was forgotten.
pub fn is_forgotten(conn: &mut Conn, key: &str) -> Result<bool> {
    Ok(!among(conn, &[key])?.is_empty())
}

/// Remember that mailbox `key` was forgotten (again: nothing changes but
/// a suppression noted now).
pub fn remember(conn: &mut Conn, key: &str, suppressed: bool) -> Result<()> {
    let digest = digest_of(conn, key)?;
    on!(conn, |c| diesel::insert_into(f::table)
        .values((
            f::digest.eq(&digest),
            f::suppressed.eq(suppressed),
            f::forgotten_at.eq(now_ms()),
        ))
        .on_conflict(f::digest)
        .do_nothing()
        .execute(c))?;
    if suppressed {
        on!(conn, |c| diesel::update(f::table.find(&digest))
            .set(f::suppressed.eq(true))
            .execute(c))?;
    }
    Ok(())
}

/// Take mailbox `key` off the table (its owner confirmed a sign-up).
/// `Some(suppressed)` when it was on it.
pub fn lift(conn: &mut Conn, key: &str) -> Result<Option<bool>> {
    let digest = digest_of(conn, key)?;
    let row: Option<bool> = on!(conn, |c| f::table
        .find(&digest)
        .select(f::suppressed)
        .first(c)
        .optional())?;
    if row.is_some() {
        on!(conn, |c| diesel::delete(f::table.find(&digest)).execute(c))?;
    }
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_is_keyed_and_labelled() {
        let a = digest(&[1; 32], "ada@example.org");
        assert_eq!(a.len(), 64);
        assert_eq!(a, digest(&[1; 32], "ada@example.org"));
        assert_ne!(a, digest(&[2; 32], "ada@example.org"));
        assert_ne!(a, digest(&[1; 32], "bob@example.org"));
        // Not the bare HMAC of the key: the label is inside.
        let mut bare = <Hmac<Sha256> as Mac>::new_from_slice(&[1; 32]).unwrap();
        bare.update(b"ada@example.org");
        let bare: String = bare
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_ne!(a, bare);
    }
}
