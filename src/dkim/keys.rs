//! DKIM keys over their life: generated (`dkim keygen`, active at once),
//! rotated (`dkim rotate`: a pending key beside the active one, so its TXT
//! record can be published first), activated (`dkim activate`: it signs
//! from then on, the one it replaces is retired), listed and deleted.

use data_encoding::BASE64;
use openssl::pkey::PKey;
use openssl::rsa::Rsa;
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair};

use super::{check_selector, DkimAlgorithm, DkimError, StoredKey, RSA_BITS};
use crate::store::dkim_keys::{self, KeyState};
use crate::store::Conn;

/// The selector `dkim keygen` uses when none is given; taken already for
/// the domain (an RSA key next to which an ed25519 one is made), it is
/// followed by the algorithm: `mailsplit-ed25519`.
pub const DEFAULT_SELECTOR: &str = "mailsplit";

/// Why a key command failed: the key (domain, selector, generation) or the
/// database.
#[derive(Debug, thiserror::Error)]
pub enum KeygenError {
    #[error(transparent)]
    Dkim(#[from] DkimError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

impl KeygenError {
    /// What the user can fix: the key's names, or a key that exists
    /// already or not at all.
    pub fn is_usage(&self) -> bool {
        match self {
            KeygenError::Dkim(e) => e.is_usage(),
            KeygenError::Store(e) => e.is_usage(),
        }
    }
}

fn checked_domain(domain: &str) -> Result<String, DkimError> {
    crate::mailbox::dns_name(domain).ok_or_else(|| DkimError::BadDomain(domain.to_string()))
}

/// Generate a key for `domain` under `selector` (see [`DEFAULT_SELECTOR`]
/// when `None`) and store it, active (one active key per algorithm and
/// domain): what `dkim keygen` does. The domain and selector are checked
/// first.
pub fn keygen(
    conn: &mut Conn,
    domain: &str,
    selector: Option<&str>,
    algorithm: DkimAlgorithm,
) -> Result<StoredKey, KeygenError> {
    let domain = checked_domain(domain)?;
    let selector = match selector {
        Some(s) => check_selector(s)?,
        None => {
            let taken = dkim_keys::all_for_domain(conn, &domain)?
                .iter()
                .any(|k| k.selector == DEFAULT_SELECTOR);
            if taken {
                format!("{DEFAULT_SELECTOR}-{algorithm}")
            } else {
                DEFAULT_SELECTOR.to_string()
            }
        }
    };
    store_new(conn, domain, selector, algorithm, KeyState::Active)
}

fn store_new(
    conn: &mut Conn,
    domain: String,
    selector: String,
    algorithm: DkimAlgorithm,
    state: KeyState,
) -> Result<StoredKey, KeygenError> {
    let key = generate(algorithm)?;
    let mut stored = StoredKey::new(
        domain,
        selector,
        algorithm,
        BASE64.encode(&key.private_pkcs8),
        BASE64.encode(&key.public),
    );
    stored.state = state;
    dkim_keys::insert(conn, &stored)?;
    Ok(stored)
}

/// A key `dkim rotate` made, and the selector of the active key that keeps
/// signing until it is activated.
#[derive(Debug)]
pub struct Rotated {
    pub key: StoredKey,
    pub signing: String,
}

/// Make a pending key for `domain`: of the algorithm of its active key (or
/// `algorithm`), under `selector` or `mailsplit-YYYYMMDD` (`-ed25519` for
/// ed25519; `-2`, `-3`… when taken). It signs nothing until [`activate`].
pub fn rotate(
    conn: &mut Conn,
    domain: &str,
    algorithm: Option<DkimAlgorithm>,
    selector: Option<&str>,
) -> Result<Rotated, KeygenError> {
    let domain = checked_domain(domain)?;
    let keys = dkim_keys::all_for_domain(conn, &domain)?;
    let active: Vec<&StoredKey> = keys
        .iter()
        .filter(|k| k.state == KeyState::Active)
        .collect();
    let algorithm = match algorithm {
        Some(a) => a,
        None => match active.as_slice() {
            [one] => one.algorithm,
            [] => return Err(DkimError::NoActiveKey(domain).into()),
            _ => return Err(DkimError::WhichAlgorithm(domain).into()),
        },
    };
    let Some(signing) = active.iter().find(|k| k.algorithm == algorithm) else {
        return Err(DkimError::NoActiveKeyOf { domain, algorithm }.into());
    };
    let signing = signing.selector.clone();
    let selector = match selector {
        Some(s) => check_selector(s)?,
        None => {
            let taken = |s: &str| keys.iter().any(|k| k.selector == s);
            let day = time::OffsetDateTime::now_utc().date();
            let ymd = format!(
                "{:04}{:02}{:02}",
                day.year(),
                u8::from(day.month()),
                day.day()
            );
            let base = match algorithm {
                DkimAlgorithm::Rsa => format!("{DEFAULT_SELECTOR}-{ymd}"),
                DkimAlgorithm::Ed25519 => format!("{DEFAULT_SELECTOR}-ed25519-{ymd}"),
            };
            (1..)
                .map(|n| {
                    if n == 1 {
                        base.clone()
                    } else {
                        format!("{base}-{n}")
                    }
                })
                .find(|s| !taken(s))
                .unwrap_or(base)
        }
    };
    let key = store_new(conn, domain, selector, algorithm, KeyState::Pending)?;
    Ok(Rotated { key, signing })
}

/// Make `selector`'s key the one that signs `domain`'s mail of its
/// algorithm; returns it and the selector of the key it retired. Workers
/// sign with it from their next key refresh (within seconds).
pub fn activate(
    conn: &mut Conn,
    domain: &str,
    selector: &str,
) -> Result<(StoredKey, Option<String>), KeygenError> {
    let domain = checked_domain(domain)?;
    let selector = check_selector(selector)?;
    dkim_keys::activate(conn, &domain, &selector)?
        .ok_or_else(|| DkimError::NoSuchKey { domain, selector }.into())
}

/// Every stored key, by domain.
pub fn keys(conn: &mut Conn) -> crate::store::Result<Vec<StoredKey>> {
    dkim_keys::list(conn)
}

/// Delete a domain's keys (only the one with `selector`, if given); how
/// many went. The domain is checked first.
pub fn delete_keys(
    conn: &mut Conn,
    domain: &str,
    selector: Option<&str>,
) -> Result<(String, usize), KeygenError> {
    let domain = checked_domain(domain)?;
    let deleted = dkim_keys::delete(conn, &domain, selector)?;
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

/// Generate a key pair (RSA with OpenSSL, ed25519 with ring).
pub fn generate(algorithm: DkimAlgorithm) -> Result<GeneratedKey, DkimError> {
    let failed = |e: &dyn std::fmt::Display| DkimError::Keygen(algorithm, e.to_string());
    match algorithm {
        DkimAlgorithm::Rsa => {
            let bits = u32::try_from(RSA_BITS).map_err(|e| failed(&e))?;
            let private = Rsa::generate(bits).map_err(|e| failed(&e))?;
            let public = private.public_key_to_der().map_err(|e| failed(&e))?;
            let pkey = PKey::from_rsa(private).map_err(|e| failed(&e))?;
            let pkcs8 = pkey.private_key_to_pkcs8().map_err(|e| failed(&e))?;
            Ok(GeneratedKey {
                private_pkcs8: pkcs8,
                public,
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
