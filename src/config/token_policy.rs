//! What `serve` accepts as its admin and webhook tokens, checked at start
//! so a token that could never work, or that anyone could guess, is refused
//! before a listener is bound:
//!
//! - a token with spaces around it is refused (a browser's login form and
//!   every HTTP stack trim them, so it could never be typed in);
//! - with a non-loopback `--admin-listen`, the admin token must be at
//!   least [`MIN_EXPOSED_LEN`] characters that look random: at least
//!   [`MIN_DISTINCT`] different characters, and not mostly runs or steps
//!   (`aaaa…`, `abcd…`, `1234…`). `openssl rand -base64 32` passes.
//!
//! The values are never part of an error message.

use std::net::SocketAddr;

/// Shortest admin token accepted on a non-loopback address.
pub const MIN_EXPOSED_LEN: usize = 24;
/// Fewest different characters in such a token.
pub const MIN_DISTINCT: usize = 10;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("{var} has spaces around it, so no client could ever send it: remove them")]
    Spaces { var: &'static str },
    #[error("{var} is too weak for the non-loopback --admin-listen {listen}: {why}; use at least {MIN_EXPOSED_LEN} random characters, e.g. `openssl rand -base64 32`")]
    Weak {
        var: &'static str,
        listen: SocketAddr,
        why: &'static str,
    },
}

/// The token from `var`'s value: `None` when unset or blank.
pub fn read(var: &'static str, value: Option<String>) -> Result<Option<String>, TokenError> {
    let Some(value) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    if value.trim() != value {
        return Err(TokenError::Spaces { var });
    }
    Ok(Some(value))
}

/// The admin token for a listener on `listen`: see the module doc.
pub fn admin(
    var: &'static str,
    value: Option<String>,
    listen: SocketAddr,
) -> Result<Option<String>, TokenError> {
    let token = read(var, value)?;
    if let Some(t) = &token {
        if !listen.ip().is_loopback() {
            if let Some(why) = weakness(t) {
                return Err(TokenError::Weak { var, listen, why });
            }
        }
    }
    Ok(token)
}

/// Why a token is guessable, if it is.
pub fn weakness(token: &str) -> Option<&'static str> {
    let chars: Vec<char> = token.chars().collect();
    if chars.len() < MIN_EXPOSED_LEN {
        return Some("it is shorter than 24 characters");
    }
    let mut distinct = chars.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < MIN_DISTINCT {
        return Some("it uses fewer than 10 different characters");
    }
    if chars.iter().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("it contains spaces or control characters");
    }
    // Repeats and steps (`aaaa`, `abcd`, `4321`) between neighbours.
    let patterned = chars
        .windows(2)
        .filter(|w| (w[0] as i64 - w[1] as i64).abs() <= 1)
        .count();
    if patterned * 4 > chars.len() - 1 {
        return Some("it is mostly repeated or consecutive characters");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weak_tokens_are_named() {
        for weak in [
            "x",
            "hook-s3cret",
            "aaaaaaaaaaaaaaaaaaaaaaaa",
            "abcdefghijklmnopqrstuvwxyz",
            "123456789012345678901234567890",
            "abababababababababababababab",
        ] {
            assert!(weakness(weak).is_some(), "{weak}");
        }
        for strong in [
            "kQ7vX2pLm9RtYw4ZsB8nHc3J",
            "3f9a1c7e5b2d8064fa3c9e1b7d5a2c80",
            "Zm9vYmFyYmF6cXV4cXV1eDEyMzQ1Njc4OTA=",
        ] {
            assert_eq!(weakness(strong), None, "{strong}");
        }
    }

    #[test]
    fn spaces_are_refused_and_blank_is_none() {
        let v = |s: &str| Some(s.to_string());
        assert_eq!(
            read("T", v(" t0ken ")),
            Err(TokenError::Spaces { var: "T" })
        );
        assert_eq!(
            read("T", v("t0ken\n")),
            Err(TokenError::Spaces { var: "T" })
        );
        assert_eq!(read("T", v("   ")), Ok(None));
        assert_eq!(read("T", None), Ok(None));
        let loopback: SocketAddr = "127.0.0.1:8081".parse().unwrap();
        let exposed: SocketAddr = "0.0.0.0:8081".parse().unwrap();
        assert_eq!(admin("T", v("x"), loopback), Ok(v("x")));
        assert!(admin("T", v("x"), exposed).is_err());
    }
}
