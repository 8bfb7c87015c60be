//! The admin session cookie and what signs it: `EXPIRES.NONCE.MAC`, an
//! HMAC under the admin token (or a random per-process key when none is
//! set), the session's row id a hash of its nonce, and the comparisons
//! that take the same time whatever they compare.

use std::sync::LazyLock;
use std::time::Duration;

use axum::http::{header, HeaderMap};
use data_encoding::BASE64URL_NOPAD;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::State;
use crate::store::now_ms;

pub(super) type HmacSha256 = Hmac<Sha256>;

/// Name of the session cookie.
pub const COOKIE: &str = "mailsplit_admin";

/// How long a login lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// Key for MACs when no token is configured: random, per process.
static OPEN_KEY: LazyLock<[u8; 32]> = LazyLock::new(|| {
    let mut key = [0u8; 32];
    rand::rng().fill_bytes(&mut key);
    key
});

pub(super) fn key(state: &State) -> &[u8] {
    match &state.settings.admin_token {
        Some(token) => token.as_bytes(),
        None => &OPEN_KEY[..],
    }
}

pub(super) fn mac(state: &State, label: &str, data: &str) -> HmacSha256 {
    // HMAC takes keys of any length.
    let mut m = HmacSha256::new_from_slice(key(state))
        .unwrap_or_else(|_| HmacSha256::new_from_slice(&[0]).expect("HMAC key"));
    m.update(label.as_bytes());
    m.update(b"\0");
    m.update(data.as_bytes());
    m
}

/// Which admin token sessions were made under, as stored beside them: a
/// MAC under the token itself, so the table never holds the token.
pub fn token_fingerprint(token: Option<&str>) -> String {
    let Some(token) = token else {
        return String::new();
    };
    let tag = HmacSha256::new_from_slice(token.as_bytes())
        .map(|m| {
            m.chain_update(b"mailsplit admin token fingerprint")
                .finalize()
                .into_bytes()
        })
        .unwrap_or_default();
    data_encoding::HEXLOWER.encode(&tag[..16])
}

/// A session's row id: a hash of its nonce, so the table alone cannot
/// make a cookie.
pub(super) fn session_id(nonce: &str) -> String {
    data_encoding::HEXLOWER.encode(&Sha256::digest(nonce.as_bytes()))
}

/// A new session: the cookie's value `EXPIRES.NONCE.MAC`, its row id and
/// when it expires (ms).
pub(super) fn new_session(state: &State) -> (String, String, i64) {
    let mut nonce = [0u8; 16];
    rand::rng().fill_bytes(&mut nonce);
    let nonce = BASE64URL_NOPAD.encode(&nonce);
    let expires = now_ms() / 1000 + SESSION_TTL.as_secs() as i64;
    let body = format!("{expires}.{nonce}");
    let tag = mac(state, "mailsplit admin session", &body)
        .finalize()
        .into_bytes();
    (
        format!("{body}.{}", BASE64URL_NOPAD.encode(&tag)),
        session_id(&nonce),
        expires * 1000,
    )
}

/// The nonce of a valid, unexpired session cookie value.
pub(super) fn read_session(state: &State, value: &str) -> Option<String> {
    let (body, tag) = value.rsplit_once('.')?;
    let (expires, nonce) = body.split_once('.')?;
    let tag = BASE64URL_NOPAD.decode(tag.as_bytes()).ok()?;
    mac(state, "mailsplit admin session", body)
        .verify_slice(&tag)
        .ok()?;
    let expires: i64 = expires.parse().ok()?;
    (expires > now_ms() / 1000).then(|| nonce.to_string())
}

pub(super) fn cookie_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Equality that takes as long whatever the position of the first
/// difference (the length is not secret).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
