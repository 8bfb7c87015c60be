//! DKIM keys kept in the database, so every worker on every machine signs
//! with the same key without copying files around. One key per (domain,
//! algorithm): a domain with an RSA and an ed25519 key gets both
//! signatures. The private key is a secret: [`StoredKey`] never shows it
//! in a debug dump, and nothing prints it.

use diesel::prelude::*;

use super::schema::dkim_keys as k;
use super::{now_ms, on, Conn, Result, StoreError};

text_enum! {
    /// A DKIM signing algorithm (the TXT record's `k=`).
    pub enum DkimAlgorithm ("DKIM algorithm (rsa, ed25519)") {
        /// RSA 2048 with SHA-256: what every receiver verifies.
        Rsa = "rsa",
        /// Ed25519 with SHA-256 (RFC 8463): small and fast, not yet
        /// verified by every receiver.
        Ed25519 = "ed25519",
    }
}

/// One stored key.
#[derive(Clone, Queryable, Selectable)]
#[diesel(table_name = k)]
pub struct StoredKey {
    /// Lower case, A-labels (punycode) for an international domain.
    pub domain: String,
    pub selector: String,
    pub algorithm: DkimAlgorithm,
    /// PKCS#8 DER, base64.
    private_key: String,
    /// The TXT record's `p=` value.
    pub public_key: String,
    pub created_at: i64,
}

impl StoredKey {
    pub fn new(
        domain: String,
        selector: String,
        algorithm: DkimAlgorithm,
        private_key: String,
        public_key: String,
    ) -> StoredKey {
        StoredKey {
            domain,
            selector,
            algorithm,
            private_key,
            public_key,
            created_at: now_ms(),
        }
    }

    /// The private key (PKCS#8 DER, base64), for the signer only.
    pub fn private_key(&self) -> &str {
        &self.private_key
    }
}

impl std::fmt::Debug for StoredKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredKey")
            .field("domain", &self.domain)
            .field("selector", &self.selector)
            .field("algorithm", &self.algorithm)
            .field("private_key", &"<redacted>")
            .field("public_key", &self.public_key)
            .finish()
    }
}

/// Store a new key; refuses a second key of the same algorithm, or a
/// selector already used, for the domain (replacing a key that DNS still
/// publishes would break every signature until DNS changes).
pub fn insert(conn: &mut Conn, key: &StoredKey) -> Result<()> {
    conn.transaction(|conn| {
        let existing = for_domain(conn, &key.domain)?;
        if let Some(old) = existing
            .iter()
            .find(|o| o.algorithm == key.algorithm || o.selector == key.selector)
        {
            return Err(StoreError::DkimKeyExists {
                domain: key.domain.clone(),
                selector: old.selector.clone(),
                algorithm: old.algorithm.to_string(),
            });
        }
        on!(conn, |c| diesel::insert_into(k::table)
            .values((
                k::domain.eq(&key.domain),
                k::selector.eq(&key.selector),
                k::algorithm.eq(key.algorithm),
                k::private_key.eq(&key.private_key),
                k::public_key.eq(&key.public_key),
                k::created_at.eq(key.created_at),
            ))
            .execute(c))?;
        Ok(())
    })
}

/// Every key, by domain then selector.
pub fn list(conn: &mut Conn) -> Result<Vec<StoredKey>> {
    Ok(on!(conn, |c| k::table
        .order((k::domain, k::selector))
        .select(StoredKey::as_select())
        .load(c))?)
}

/// The keys of one domain (RSA first).
pub fn for_domain(conn: &mut Conn, domain: &str) -> Result<Vec<StoredKey>> {
    let mut keys: Vec<StoredKey> = on!(conn, |c| k::table
        .filter(k::domain.eq(domain))
        .select(StoredKey::as_select())
        .load(c))?;
    keys.sort_by_key(|key| key.algorithm);
    Ok(keys)
}

/// Delete a domain's keys (only the one with `selector` if given); returns
/// how many were deleted.
pub fn delete(conn: &mut Conn, domain: &str, selector: Option<&str>) -> Result<usize> {
    Ok(match selector {
        Some(s) => on!(conn, |c| diesel::delete(
            k::table
                .filter(k::domain.eq(domain))
                .filter(k::selector.eq(s))
        )
        .execute(c))?,
        None => on!(conn, |c| diesel::delete(
            k::table.filter(k::domain.eq(domain))
        )
        .execute(c))?,
    })
}
