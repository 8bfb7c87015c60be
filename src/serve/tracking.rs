//! Public tracking routes: `/o/TOKEN`, a campaign message's
//! open pixel (a 1×1 transparent GIF), and `/c/TOKEN/N`, its link N: a
//! redirect to exactly link N of the message's content version, as stored
//! in `campaign_links` when the version was stored. Nothing in the request
//! but the token and N chooses where it goes (a query string is ignored),
//! and the token's HMAC covers campaign, recipient, version and N, so a
//! forged or altered token, or another link number, gets one plain 404 and
//! records nothing. A genuine hit goes to the batched writer ([`hits`]);
//! the answer never waits on the database, except a click's first look-up
//! of its version's link table (cached).
//!
//! Message-template mail (flow steps) has pixels here too, its tokens
//! naming the message; its clicks go through `/l/`.
//!
//! Machine opens: an open from a known mail proxy is marked here (see
//! [`is_prefetch`]); one within seconds of delivery is marked by the store.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::extract::{ConnectInfo, Path, State as Extract};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::hits::{self, Recorder};
use super::State;
use crate::store::engagement::{Hit, HitKind};
use crate::store::message_engagement::{self, MessageHit};
use crate::store::now_ms;
use crate::tokens::Tracked;

/// Longer paths are no token of ours (ours are about 24 characters).
pub(super) const MAX_TOKEN_LEN: usize = 64;
/// Link tables kept in memory at most (one per tracked content version).
const MAX_CACHED_VERSIONS: usize = 1_000;

/// A 1×1 transparent GIF (43 bytes).
pub const PIXEL: &[u8] = &[
    0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0x01, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xff, 0xff, 0xff, 0x21, 0xf9, 0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x01, 0x00, 0x00, 0x02, 0x02, 0x44, 0x01, 0x00, 0x3b,
];

/// Link tables by (campaign, content version).
type LinkTables = HashMap<(i64, i64), Arc<Vec<String>>>;

/// The tracking routes' state: the writer and the link tables read.
pub struct TrackingRoutes {
    pub recorder: Recorder,
    links: Mutex<LinkTables>,
}

impl TrackingRoutes {
    pub fn new(recorder: Recorder) -> TrackingRoutes {
        TrackingRoutes {
            recorder,
            links: Mutex::default(),
        }
    }

    fn cached(&self, key: (i64, i64)) -> Option<Arc<Vec<String>>> {
        self.lock().get(&key).map(Arc::clone)
    }

    fn remember(&self, key: (i64, i64), links: Arc<Vec<String>>) {
        let mut cache = self.lock();
        if cache.len() >= MAX_CACHED_VERSIONS {
            cache.clear();
        }
        cache.insert(key, links);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LinkTables> {
        self.links.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `GET /o/TOKEN`: the pixel; the open is recorded.
pub async fn open(
    Extract(state): Extract<State>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path(token): Path<String>,
) -> Response {
    if token.len() > MAX_TOKEN_LEN {
        return not_found();
    }
    let Some(m) = state.identity.signer.read_open(&token) else {
        return message_open(&state, &token, &headers, peer).unwrap_or_else(not_found);
    };
    if m.recipient != 0 {
        let hit = hit(m, HitKind::Open, is_prefetch(&headers, peer.ip()));
        if !state
            .tracking
            .recorder
            .queue(hit, hits::WAIT_FOR_ROOM)
            .await
        {
            tracing::warn!(
                campaign = m.campaign,
                "open not recorded: the hit writer is behind; answered 503"
            );
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [
                    (header::RETRY_AFTER, "1"),
                    (header::CACHE_CONTROL, "no-store"),
                ],
            )
                .into_response();
        }
    }
    pixel()
}

/// `/o/TOKEN` of message-template mail (a flow step), or `None`: not
/// a message's open token. Its tokens are made under purposes of their
/// own ([`crate::tokens::Signer::message_open_token`]), so one never reads
/// as a campaign's.
fn message_open(
    state: &State,
    token: &str,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> Option<Response> {
    let message = state.identity.signer.read_message_open(token)?;
    let proxy = is_prefetch(headers, peer.ip());
    record_message(state, message, MessageHit::Open { proxy });
    Some(pixel())
}

/// Record a hit of a message by a task of its own: the pixel or redirect
/// does not wait for the database.
pub(super) fn record_message(state: &State, message: i64, hit: MessageHit) {
    let state = State::clone(state);
    let at = now_ms();
    tokio::spawn(async move {
        let done = state
            .public
            .db(move |c| message_engagement::record(c, message, &hit, at))
            .await;
        if let Err(e) = done {
            tracing::warn!(message, error = %e, "a message's open or click is not recorded");
        }
    });
}

/// The pixel's answer: never cached, so every open asks again.
fn pixel() -> Response {
    (
        [
            (header::CONTENT_TYPE, "image/gif"),
            (
                header::CACHE_CONTROL,
                "no-store, no-cache, must-revalidate, private",
            ),
        ],
        PIXEL,
    )
        .into_response()
}

/// `GET /c/TOKEN/N`: a redirect to link N of the token's version; the
/// click is recorded.
pub async fn click(
    Extract(state): Extract<State>,
    Path((token, n)): Path<(String, String)>,
) -> Response {
    let n = match n.parse::<u32>() {
        Ok(n) if n >= 1 && token.len() <= MAX_TOKEN_LEN => n,
        _ => return not_found(),
    };
    let Some(m) = state.identity.signer.read_click(&token, n) else {
        return not_found();
    };
    let location = match link(&state, m, n).await {
        // A link stored before `campaign create` refused control
        // characters is no valid Location: not found, never a 302
        // without one.
        Ok(Some(url)) => match HeaderValue::from_str(&url) {
            Ok(location) => location,
            Err(_) => {
                tracing::warn!(
                    campaign = m.campaign,
                    link = n,
                    "a stored link is no valid Location; answered not found"
                );
                return not_found();
            }
        },
        Ok(None) => return not_found(),
        Err(e) => {
            tracing::warn!(campaign = m.campaign, error = %e, "cannot read a campaign's links");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "5")],
            )
                .into_response();
        }
    };
    record_click(&state, m, HitKind::Click(i64::from(n))).await;
    redirect(location)
}

/// Record a click of a genuine token (a test or preview message, recipient
/// 0, counts nothing), without making the reader wait for a writer that is
/// behind: `/c/` and `/l/` alike.
pub(super) async fn record_click(state: &State, m: Tracked, kind: HitKind) {
    if m.recipient == 0 {
        return;
    }
    let what = kind.clone();
    if !state
        .tracking
        .recorder
        .queue(hit(m, kind, false), hits::WAIT_FOR_ROOM_CLICK)
        .await
    {
        tracing::warn!(
            campaign = m.campaign,
            ?what,
            "click not recorded: the hit writer is behind; redirected anyway"
        );
    }
}

/// The redirect of a followed link: never cached, no referrer.
pub(super) fn redirect(location: HeaderValue) -> Response {
    (
        StatusCode::FOUND,
        [
            (header::LOCATION, location),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
        ],
    )
        .into_response()
}

/// Link `n` of the message's version, from the cache or the database.
async fn link(
    state: &State,
    m: Tracked,
    n: u32,
) -> Result<Option<String>, crate::store::StoreError> {
    let key = (m.campaign, m.version);
    let links = match state.tracking.cached(key) {
        Some(links) => links,
        None => {
            let (c, v) = key;
            let urls = state
                .public
                .db(move |conn| crate::store::content::links(conn, c, v))
                .await?;
            let urls = Arc::new(urls);
            state.tracking.remember(key, Arc::clone(&urls));
            urls
        }
    };
    Ok(links.get(n as usize - 1).cloned())
}

pub(super) fn hit(m: Tracked, kind: HitKind, proxy: bool) -> Hit {
    Hit {
        campaign: m.campaign,
        recipient: m.recipient,
        version: m.version,
        kind,
        at: now_ms(),
        proxy,
    }
}

/// Whether an open comes from a mail provider fetching images before
/// anybody reads the message: Apple Mail Privacy Protection (the bare user
/// agent `Mozilla/5.0`, or an address in Apple's 17.0.0.0/8) loads them
/// when the message arrives. Gmail's and Yahoo's proxies
/// (`GoogleImageProxy`, `YahooMailProxy`) are not counted here: they fetch
/// when the reader opens the message, so their opens are the readers'
/// (one within seconds of delivery is still a machine's, by the store's
/// rule).
pub fn is_prefetch(headers: &HeaderMap, peer: IpAddr) -> bool {
    let agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim();
    let apple = match peer {
        IpAddr::V4(v4) => v4.octets()[0] == 17,
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some_and(|v4| v4.octets()[0] == 17),
    };
    apple || agent == "Mozilla/5.0"
}

/// The one answer to anything that is not a genuine token and link.
pub(super) fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        "not found\n",
    )
        .into_response()
}
