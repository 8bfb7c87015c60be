//! This database's identity: an id that every job carries, so a worker
//! attached to another database leaves the job alone, and the secret that
//! every token is signed with (job bodies, unsubscribe links, VERP return
//! paths). `migrate` creates both once; every worker and every `serve` on
//! every machine reads the same values, so nothing needs configuring.

use diesel::prelude::*;
use rand::RngCore;

use super::schema::installation as i;
use super::{now_ms, on, Conn, Result, StoreError};

/// Bytes of the signing secret.
pub const SECRET_BYTES: usize = 32;

/// The identity row.
#[derive(Clone, PartialEq, Eq)]
pub struct Installation {
    /// Short random id, e.g. `db-7f3a9c21d4e8b605`.
    pub database_id: String,
    /// The signing secret ([`SECRET_BYTES`] random bytes).
    pub secret: Vec<u8>,
}

/// Never print the secret, not even in a debug dump.
impl std::fmt::Debug for Installation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Installation")
            .field("database_id", &self.database_id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// Create the identity if this database has none yet (what `migrate`
/// does); an existing one is never replaced, so tokens already sent stay
/// valid. Returns it either way.
pub fn ensure(conn: &mut Conn) -> Result<Installation> {
    let mut rng = rand::rng();
    let mut id = [0u8; 8];
    let mut secret = [0u8; SECRET_BYTES];
    rng.fill_bytes(&mut id);
    rng.fill_bytes(&mut secret);
    on!(conn, |c| diesel::insert_into(i::table)
        .values((
            i::singleton.eq(1),
            i::database_id.eq(format!("db-{}", hex(&id))),
            i::secret.eq(hex(&secret)),
            i::created_at.eq(now_ms()),
        ))
        .on_conflict(i::singleton)
        .do_nothing()
        .execute(c))?;
    load(conn)
}

/// The identity, or an error naming `mailsplit migrate` when it is missing.
pub fn load(conn: &mut Conn) -> Result<Installation> {
    let row: Option<(String, String)> = on!(conn, |c| i::table
        .select((i::database_id, i::secret))
        .first(c)
        .optional())?;
    let (database_id, secret) = row.ok_or(StoreError::NotMigrated("without an identity"))?;
    let secret = unhex(&secret)
        .filter(|s| s.len() == SECRET_BYTES)
        .ok_or_else(|| StoreError::BadValue {
            what: "installation secret",
            value: "<redacted>".into(),
        })?;
    Ok(Installation {
        database_id,
        secret,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|k| u8::from_str_radix(text.get(k..k + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_junk() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(unhex(&hex(&bytes)), Some(bytes.to_vec()));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let i = Installation {
            database_id: "db-1".into(),
            secret: vec![0x42; SECRET_BYTES],
        };
        assert!(!format!("{i:?}").contains("4242"));
    }
}
