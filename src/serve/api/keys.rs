//! API keys, the stage `mailsplit apikey` and the `/api/v1` gate share: a
//! key is `ms_` and 43 characters of base64url (256 random bits), printed
//! once by [`create`]; the database keeps its SHA-256 only, so a stolen
//! table holds no usable key, and a key is found by its hash.

use data_encoding::{BASE64URL_NOPAD, HEXLOWER};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::store::api_keys;
pub use crate::store::api_keys::{ApiKey, Scope};
use crate::store::{now_ms, Conn, StoreError};

/// What every key starts with: recognisable in a leaked config file or a
/// secret scanner's rules.
pub const PREFIX: &str = "ms_";
/// Longest key name.
const MAX_NAME: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("key name {0:?} is not valid: use 1 to 64 letters, digits, '.', '_' or '-'")]
    BadName(String),
    #[error("an API key named {0:?} exists already; revoke it first or pick another name")]
    Exists(String),
    #[error("no API key named {0:?}; `mailsplit apikey ls` shows the keys")]
    Unknown(String),
    #[error("a key needs at least one scope: send, subscribers, campaigns, read")]
    NoScopes,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl KeyError {
    pub fn is_usage(&self) -> bool {
        match self {
            KeyError::Store(e) => e.is_usage(),
            _ => true,
        }
    }
}

/// `send,read` → scopes, refusing unknown ones and an empty list.
pub fn parse_scopes(text: &str) -> Result<Vec<Scope>, KeyError> {
    let scopes = api_keys::parse_scopes(text)?;
    if scopes.is_empty() {
        return Err(KeyError::NoScopes);
    }
    Ok(scopes)
}

/// The stored form of a key.
pub fn hash(key: &str) -> String {
    HEXLOWER.encode(&Sha256::digest(key.as_bytes()))
}

/// Make key `name` with `scopes`; the key, which nothing shows again.
pub fn create(conn: &mut Conn, name: &str, scopes: &[Scope]) -> Result<String, KeyError> {
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > MAX_NAME || !name.chars().all(valid) {
        return Err(KeyError::BadName(name.to_string()));
    }
    if scopes.is_empty() {
        return Err(KeyError::NoScopes);
    }
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let key = format!("{PREFIX}{}", BASE64URL_NOPAD.encode(&bytes));
    if !api_keys::create(conn, name, &hash(&key), scopes, now_ms())? {
        return Err(KeyError::Exists(name.to_string()));
    }
    Ok(key)
}

/// Every key (never the keys themselves: they are not stored).
pub fn list(conn: &mut Conn) -> Result<Vec<ApiKey>, KeyError> {
    Ok(api_keys::list(conn)?)
}

/// Delete key `name`: every request with it is refused from now on.
pub fn revoke(conn: &mut Conn, name: &str) -> Result<(), KeyError> {
    if api_keys::revoke(conn, name)? {
        Ok(())
    } else {
        Err(KeyError::Unknown(name.to_string()))
    }
}

/// The key a request presented, if it is one of ours and not revoked.
/// Text that cannot be a key is refused without a query.
pub fn authenticate(conn: &mut Conn, given: &str) -> Result<Option<ApiKey>, StoreError> {
    if !given.starts_with(PREFIX) || given.len() > 128 {
        return Ok(None);
    }
    api_keys::authenticate(conn, &hash(given), now_ms())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_parse_sorted_once_and_refuse_unknown_or_none() {
        let s = parse_scopes("read, send,read").unwrap();
        assert_eq!(s, vec![Scope::Send, Scope::Read]);
        assert!(parse_scopes("read,admin").is_err());
        assert!(matches!(parse_scopes(" , "), Err(KeyError::NoScopes)));
    }

    #[test]
    fn the_hash_is_not_the_key() {
        let h = hash("ms_abc");
        assert_eq!(h.len(), 64);
        assert!(!h.contains("abc"));
    }
}
