//! DKIM keys kept in the database, so every worker on every machine signs
//! with the same key without copying files around. One *active* key per
//! (domain, algorithm): a domain with an active RSA and an active ed25519
//! key gets both signatures. Rotation (migration 30) adds `pending` keys
//! beside the active one, and activating one retires the one it replaces.
//! The private key is a secret: [`StoredKey`] never shows it in a debug
//! dump, and nothing prints it.

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

text_enum! {
    /// Where a key is in its rotation.
    pub enum KeyState ("DKIM key state (active, pending, retired)") {
        /// Signs the domain's mail (one per algorithm).
        Active = "active",
        /// Made by `dkim rotate`; signs nothing until `dkim activate`.
        Pending = "pending",
        /// Replaced by an activated one; signs nothing, can be activated again.
        Retired = "retired",
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
    pub state: KeyState,
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
            state: KeyState::Active,
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
            .field("state", &self.state)
            .finish()
    }
}

/// Store a new key. An active one is refused when the domain has an
/// active key of its algorithm (replacing a key that DNS still publishes
/// would break every signature until DNS changes); any is refused when its
/// selector is taken for the domain.
pub fn insert(conn: &mut Conn, key: &StoredKey) -> Result<()> {
    conn.transaction(|conn| {
        let existing = all_for_domain(conn, &key.domain)?;
        if let Some(old) = existing.iter().find(|o| {
            o.selector == key.selector
                || (key.state == KeyState::Active
                    && o.state == KeyState::Active
                    && o.algorithm == key.algorithm)
        }) {
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
                k::state.eq(key.state),
            ))
            .execute(c))?;
        Ok(())
    })
}

/// Make the key `selector` of `domain` the active one of its algorithm;
/// the active key it replaces becomes retired. Returns the activated key
/// and the retired one's selector; `None` if there is no such key.
pub fn activate(
    conn: &mut Conn,
    domain: &str,
    selector: &str,
) -> Result<Option<(StoredKey, Option<String>)>> {
    conn.transaction(|conn| {
        let keys = all_for_domain(conn, domain)?;
        let Some(mut key) = keys.iter().find(|k| k.selector == selector).cloned() else {
            return Ok(None);
        };
        let replaced = keys
            .iter()
            .find(|o| {
                o.state == KeyState::Active
                    && o.algorithm == key.algorithm
                    && o.selector != selector
            })
            .map(|o| o.selector.clone());
        if let Some(old) = &replaced {
            set_state(conn, domain, old, KeyState::Retired)?;
        }
        set_state(conn, domain, selector, KeyState::Active)?;
        key.state = KeyState::Active;
        Ok(Some((key, replaced)))
    })
}

fn set_state(conn: &mut Conn, domain: &str, selector: &str, state: KeyState) -> Result<()> {
    on!(conn, |c| diesel::update(
        k::table
            .filter(k::domain.eq(domain))
            .filter(k::selector.eq(selector))
    )
    .set(k::state.eq(state))
    .execute(c))?;
    Ok(())
}

/// Every key, by domain then selector.
pub fn list(conn: &mut Conn) -> Result<Vec<StoredKey>> {
    Ok(on!(conn, |c| k::table
        .order((k::domain, k::selector))
        .select(StoredKey::as_select())
        .load(c))?)
}

/// The active keys of one domain, the ones that sign (RSA first).
pub fn for_domain(conn: &mut Conn, domain: &str) -> Result<Vec<StoredKey>> {
    let mut keys: Vec<StoredKey> = on!(conn, |c| k::table
        .filter(k::domain.eq(domain))
        .filter(k::state.eq(KeyState::Active))
        .select(StoredKey::as_select())
        .load(c))?;
    keys.sort_by_key(|key| key.algorithm);
    Ok(keys)
}

/// Every key of one domain, whatever its state, by selector.
pub fn all_for_domain(conn: &mut Conn, domain: &str) -> Result<Vec<StoredKey>> {
    Ok(on!(conn, |c| k::table
        .filter(k::domain.eq(domain))
        .order(k::selector)
        .select(StoredKey::as_select())
        .load(c))?)
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
