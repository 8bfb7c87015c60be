//! Who calls `/api/v1` and what they may do: the bearer key, checked in
//! the database on every request (a revoke holds from the next request),
//! on the API's own few connections (`super::DbPool`),
//! its scopes, and its rate.
//!
//! A handler states the scope it needs by taking [`Need<S>`] as its first
//! argument (`Need<Read>`, `Need<Subscribers>`, …): the key is checked
//! before the body is read, so a key without the scope gets 403 whatever
//! it sent. The admin token (`MAILSPLIT_ADMIN_TOKEN`) holds every scope.
//! A wrong key counts as a failed login in [`guard`]'s limiter, exactly as
//! a wrong admin token does; the right key is never refused by it.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, StatusCode};

use super::keys::{self, Scope};
use super::problem::Problem;
use crate::serve::cookie::constant_time_eq;
use crate::serve::guard::{self, Credential};
use crate::serve::State;

/// Keys whose buckets are remembered at most; beyond, full buckets are
/// forgotten first (a full bucket is what a new one starts as).
const MAX_BUCKETS: usize = 10_000;
/// The name the admin token's requests are counted under.
pub const ADMIN: &str = "(admin token)";

/// The caller of a request: a key's name (or [`ADMIN`]) and its scopes.
#[derive(Debug, Clone)]
pub struct Caller {
    pub name: String,
    pub scopes: Vec<Scope>,
}

/// A scope a route needs, as a type: see [`Need`].
pub trait Required {
    const SCOPE: Scope;
    /// A second scope that serves as well.
    const OR: Option<Scope> = None;
}

macro_rules! required {
    ($($name:ident => $scope:ident),*) => {$(
        #[doc = concat!("The `", stringify!($scope), "` scope.")]
        pub struct $name;
        impl Required for $name {
            const SCOPE: Scope = Scope::$scope;
        }
    )*};
}
required!(Read => Read, Subscribers => Subscribers, Campaigns => Campaigns, Send => Send);

/// The `read` scope or the `send` scope: what a message's status needs
/// (the application that sent it asks how it went).
pub struct ReadOrSend;
impl Required for ReadOrSend {
    const SCOPE: Scope = Scope::Read;
    const OR: Option<Scope> = Some(Scope::Send);
}

/// An authenticated caller holding scope `S`, or the request is answered
/// 401, 403 or 429 before its handler runs.
pub struct Need<S: Required>(pub Caller, PhantomData<S>);

impl<S: Required> FromRequestParts<State> for Need<S> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &State) -> Result<Self, Problem> {
        let caller = authenticate(parts, state).await?;
        let held = |s: Scope| caller.scopes.contains(&s);
        if !held(S::SCOPE) && !S::OR.is_some_and(held) {
            let detail = match S::OR {
                Some(or) => format!(
                    "this key lacks the `{}` or `{or}` scope this route needs",
                    S::SCOPE
                ),
                None => format!("this key lacks the `{}` scope this route needs", S::SCOPE),
            };
            return Err(Problem::new(StatusCode::FORBIDDEN, detail));
        }
        state.api.buckets.take(&caller.name)?;
        Ok(Need(caller, PhantomData))
    }
}

fn unauthorized() -> Problem {
    Problem::new(
        StatusCode::UNAUTHORIZED,
        "send a valid API key as `Authorization: Bearer KEY`",
    )
}

async fn authenticate(parts: &Parts, state: &State) -> Result<Caller, Problem> {
    let client = guard::client_of(
        &parts.extensions,
        &parts.headers,
        &state.settings.trusted_proxies,
    );
    let given = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(given) = given.filter(|g| !g.is_empty()) else {
        if let Some(wait) = state.failures.client_blocked(client) {
            return Err(locked_out(wait));
        }
        return Err(unauthorized());
    };
    if let Some(admin) = state.settings.admin_token.as_deref() {
        if constant_time_eq(given.as_bytes(), admin.as_bytes()) {
            let scopes = Scope::ALL.to_vec();
            return Ok(Caller {
                name: ADMIN.into(),
                scopes,
            });
        }
    }
    let key = given.to_string();
    match state
        .api
        .dbs
        .run(move |c| keys::authenticate(c, &key))
        .await
    {
        Ok(Some(k)) => Ok(Caller {
            name: k.name,
            scopes: k.scopes,
        }),
        Ok(None) => {
            if let Some(wait) = state.failures.blocked(client, Credential::Admin, given) {
                return Err(locked_out(wait));
            }
            state
                .failures
                .failed(client, Credential::Admin, "api key", given);
            Err(unauthorized())
        }
        Err(e) => {
            tracing::warn!(error = %e, "api: cannot check a key");
            Err(Problem::unavailable())
        }
    }
}

fn locked_out(wait: std::time::Duration) -> Problem {
    Problem::too_many(
        "too many failed attempts from this address: wait a minute",
        wait.as_secs() + 1,
    )
}

/// A token bucket per key: `rate` requests a second on average, `burst`
/// at once.
#[derive(Debug)]
pub struct Buckets {
    rate: f64,
    burst: f64,
    by_key: Mutex<HashMap<String, (f64, Instant)>>,
}

impl Buckets {
    pub fn new(rate: u32, burst: u32) -> Buckets {
        Buckets {
            rate: f64::from(rate.max(1)),
            burst: f64::from(burst.max(1)),
            by_key: Mutex::new(HashMap::new()),
        }
    }

    /// Take one token of `key`'s bucket, or 429 saying when one is back.
    pub fn take(&self, key: &str) -> Result<(), Problem> {
        let now = Instant::now();
        let mut map = self.by_key.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_BUCKETS && !map.contains_key(key) {
            let (rate, burst) = (self.rate, self.burst);
            map.retain(|_, (tokens, at)| *tokens + at.elapsed().as_secs_f64() * rate < burst);
            if map.len() >= MAX_BUCKETS {
                map.clear();
            }
        }
        let (tokens, at) = map.entry(key.to_string()).or_insert((self.burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.rate).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            return Ok(());
        }
        let wait = ((1.0 - *tokens) / self.rate).ceil() as u64;
        Err(Problem::too_many(
            format!(
                "this key's rate limit ({} requests a second) is used up",
                self.rate
            ),
            wait,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_gives_its_burst_then_refuses_with_a_wait_and_keys_are_apart() {
        let b = Buckets::new(1, 3);
        for _ in 0..3 {
            assert!(b.take("a").is_ok());
        }
        let refused = b.take("a").unwrap_err();
        assert_eq!(refused.status, 429);
        assert_eq!(refused.retry_after, Some(1));
        assert!(b.take("b").is_ok());
    }
}
