//! The dashboard's page for one campaign, `GET /campaigns/ID`: its
//! progress, its schedule, its current content rendered for a sample
//! recipient (the first active list member) and the history of its
//! content versions with how many recipients got each; for a campaign
//! that tracks them, first opens and first clicks over time on the same
//! buckets as sent and failed, and the clicks on each link.
//!
//! The content is the user's own HTML: it is shown only inside
//! `<iframe sandbox="" srcdoc="…">`, the whole document escaped into the
//! attribute (askama escapes `<`, `>`, `&`, `"` and `'`), so nothing in it
//! can close the frame and land in this page. The empty `sandbox` gives the
//! frame an opaque origin and no scripts, forms, popups or top navigation;
//! this page's policy ([`POLICY`], which a `srcdoc` frame inherits) allows
//! no script at all and no remote image, font or style, so a preview
//! neither runs code nor tells a tracker it was looked at. Inline styles
//! are allowed because mail carries its CSS inline (see
//! `compose::source::inline_css`); everything this page writes itself is
//! escaped, so they come from the content alone.
//!
//! The preview is rendered after the figures are read, off the admin
//! connection and off the request threads, and waited for at most
//! [`PREVIEW_WAIT`]: a template that uses its whole render budget
//! stalls neither this page nor the dashboard, the API or the metrics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock::{rfc3339, Precision};
use askama::Template;
use axum::extract::{Path, Query, State as Extract};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};

use super::auth::Access;
use super::chart::{self, Axis, Figure, Series};
use super::flash;
use super::page::{secure, CampaignRow};
use super::State;
use crate::campaign::status::CampaignStatus;
use crate::compose::sample::{render_sample, sample, CampaignMail};
use crate::compose::ComposeError;
use crate::store::content::{self, Track, VersionInfo};
use crate::store::engagement;
use crate::store::recipients::Recipient;
use crate::store::timeline::{self, Timeline};
use crate::store::{campaigns, Conn, Counters, StoreError};
use crate::tokens::Identity;

/// This page's Content-Security-Policy: no script anywhere, styles from
/// this listener and inline ones (the preview's), images from this
/// listener or inline `data:` only; its own forms post only here; never
/// framed itself.
pub const POLICY: &str = "default-src 'none'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The routes of this page (merged into the admin router, behind its gate).
pub fn routes() -> Router<State> {
    Router::new()
        .route("/campaigns/{id}", get(page))
        .route("/static/campaign.css", get(stylesheet))
}

/// One content version in the history table.
pub struct VersionRow {
    pub version: i64,
    /// When it was stored, RFC 3339 UTC.
    pub when: String,
    /// Its subject template, as written.
    pub subject: String,
    pub kind: String,
    /// Recipients sent this version.
    pub sent: i64,
    pub current: bool,
}

/// One tracked link in the clicks table.
pub struct LinkRow {
    pub version: i64,
    /// Link N of the version (what `/c/TOKEN/N` names).
    pub n: i64,
    pub url: String,
    pub clicks: i64,
}

/// The current content rendered for the sample recipient.
pub struct Preview {
    pub email: String,
    pub subject: String,
    /// The whole HTML document: goes into `srcdoc`, escaped.
    pub html: String,
    pub text: String,
}

/// Everything the page shows.
pub struct CampaignView {
    pub row: CampaignRow,
    /// `send_at`, RFC 3339 UTC; `None`: sends as soon as it is enqueued.
    pub send_at: Option<String>,
    pub versions: Vec<VersionRow>,
    /// Sent and failed over the campaign's life, one chart each; opens
    /// and clicks too when the campaign tracks them.
    pub charts: Vec<Figure>,
    /// Clicks per link; `None` when the campaign does not track clicks.
    pub links: Option<Vec<LinkRow>>,
    /// The preview, or why there is none (empty list, content that does
    /// not render for this recipient); rendered by [`page`] after the
    /// figures are read (see the module documentation).
    pub preview: Result<Preview, String>,
}

/// What the preview is rendered from: the campaign's content and the
/// sample recipient, or why there is none.
pub type Sample = Result<(CampaignMail, Recipient), String>;

/// How long the page waits for its preview. A render ends by its fuel
/// (`compose::content::RENDER_FUEL`) well within this; the wait only
/// guards the page against a machine too busy to finish it.
pub const PREVIEW_WAIT: Duration = Duration::from_secs(10);

#[derive(Template)]
#[template(path = "admin/campaign.html")]
struct Page<'a> {
    v: &'a CampaignView,
    /// The token the page's forms carry (see `auth`).
    csrf: &'a str,
    /// What the form that made the campaign warned of, shown once.
    warnings: &'a [String],
}

/// The timelines last read, by campaign. Counting a campaign's outcomes
/// per minute reads its whole key range of the ledger (about a second
/// for a million rows on PostgreSQL, BENCHMARKS.md), so a reload of the
/// page reuses the last count while the counters it was read at stand
/// (a finished campaign's never move) or for [`FRESH_FOR`] while it
/// sends.
#[derive(Default)]
pub struct Timelines(Mutex<HashMap<i64, Read>>);

/// How long a sending campaign's timeline is shown before it is read again.
pub const FRESH_FOR: Duration = Duration::from_secs(15);

/// At most this many campaigns' timelines are kept.
const KEPT: usize = 64;

type Key = (Option<i64>, Option<i64>, i64, i64, i64, i64, (bool, bool));

struct Read {
    /// `first_at`, `last_at`, `sent`, `failed`, `opened`, `clicked` and
    /// what it tracks when it was read.
    at: Key,
    when: Instant,
    timeline: Arc<Timeline>,
}

impl Timelines {
    /// The campaign's timeline (with the first opens and clicks `track`
    /// names), read again only when its counters (`c`, `e`) moved and the
    /// last read is older than [`FRESH_FOR`].
    pub fn get(
        &self,
        conn: &mut Conn,
        c: &Counters,
        e: &engagement::Engagement,
        track: Track,
    ) -> Result<Arc<Timeline>, StoreError> {
        let tracks = (track.opens, track.clicks);
        let at = (
            c.first_at, c.last_at, c.sent, c.failed, e.opened, e.clicked, tracks,
        );
        if let Ok(kept) = self.0.lock() {
            if let Some(r) = kept.get(&c.campaign_id) {
                if r.at == at || r.when.elapsed() < FRESH_FOR {
                    return Ok(r.timeline.clone());
                }
            }
        }
        let timeline = Arc::new(timeline::read(conn, c, track)?);
        if let Ok(mut kept) = self.0.lock() {
            if kept.len() >= KEPT {
                kept.clear();
            }
            let read = Read {
                at,
                when: Instant::now(),
                timeline: timeline.clone(),
            };
            kept.insert(c.campaign_id, read);
        }
        Ok(timeline)
    }
}

/// Read everything the page shows for campaign `id` and what its preview
/// is rendered from (the view's preview is not rendered yet); `Ok(None)`:
/// there is no such campaign.
pub fn gather(
    conn: &mut Conn,
    id: i64,
    identity: &Identity,
    timelines: &Timelines,
    member: Option<&str>,
) -> Result<Option<(CampaignView, Sample)>, StoreError> {
    let Some(c) = campaigns::get(conn, id)? else {
        return Ok(None);
    };
    let counters = campaigns::counters(conn, c.id)?;
    let track = content::tracked(conn, c.id)?;
    let engaged = engagement::counts(conn, &[c.id])?
        .remove(&c.id)
        .unwrap_or_default();
    let charts = charts(timelines.get(conn, &counters, &engaged, track)?.as_ref());
    let links = match track.clicks {
        true => Some(links(conn, c.id)?),
        false => None,
    };
    let sent = content::sent_by_version(conn, c.id)?;
    let history = content::history(conn, c.id)?;
    let current = history.first().map_or(0, |v| v.version);
    let status = CampaignStatus::new(&c, &counters).with_versions(current, &sent);
    let versions = history
        .into_iter()
        .map(|v: VersionInfo| VersionRow {
            when: rfc3339(v.created_at, Precision::Seconds),
            subject: v.subject,
            kind: v.kind.to_string(),
            sent: sent
                .iter()
                .find(|(n, _)| *n == v.version)
                .map_or(0, |s| s.1),
            current: v.version == current,
            version: v.version,
        })
        .collect();
    let sample = match preview_sample(conn, &c, identity, member) {
        Ok(s) => Ok(s),
        Err(ComposeError::Store(e)) => return Err(e),
        Err(e) => Err(e.to_string()),
    };
    let view = CampaignView {
        send_at: status.send_at.clone(),
        row: CampaignRow::new(status),
        versions,
        charts,
        links,
        preview: Err("not rendered yet".into()),
    };
    Ok(Some((view, sample)))
}

/// One chart per series of the timeline: sent, failed, and first opens
/// and first clicks when the campaign tracks them.
pub fn charts(t: &Timeline) -> Vec<Figure> {
    let axis = Axis {
        start_ms: t.start_ms,
        bucket_ms: t.bucket_ms,
    };
    let mut series = vec![
        Series {
            name: "Sent",
            class: "sent",
            values: &t.sent,
        },
        Series {
            name: "Failed",
            class: "failed",
            values: &t.failed,
        },
    ];
    if let Some(opens) = &t.opens {
        series.push(Series {
            name: "Opened (first opens)",
            class: "opens",
            values: opens,
        });
    }
    if let Some(clicks) = &t.clicks {
        series.push(Series {
            name: "Clicked (first clicks)",
            class: "clicks",
            values: clicks,
        });
    }
    chart::figures(axis, &series)
}

/// Clicks on each tracked link, by version and link number.
fn links(conn: &mut Conn, campaign: i64) -> Result<Vec<LinkRow>, StoreError> {
    Ok(engagement::link_clicks(conn, campaign)?
        .into_iter()
        .map(|(version, n, url, clicks)| LinkRow {
            version,
            n,
            url,
            clicks,
        })
        .collect())
}

/// The current content and the recipient it is previewed for (`member`,
/// or the first active list member), to render the preview from.
fn preview_sample(
    conn: &mut Conn,
    c: &crate::store::Campaign,
    identity: &Identity,
    member: Option<&str>,
) -> Result<(CampaignMail, Recipient), ComposeError> {
    let r = sample(conn, c.list_id, member)?;
    let mail = CampaignMail::load(conn, c, identity)?;
    Ok((mail, r))
}

/// The current content as the sample recipient would read it, rendered on
/// the blocking pool and waited for at most [`PREVIEW_WAIT`].
pub async fn preview(sample: Sample) -> Result<Preview, String> {
    let (mail, r) = sample?;
    let render = tokio::task::spawn_blocking(move || {
        let rendered = render_sample(&mail, &r).map_err(|why| {
            ComposeError::Unsendable {
                email: r.email.clone(),
                why,
            }
            .to_string()
        });
        rendered.map(|(subject, rendered)| Preview {
            email: r.email,
            subject,
            html: rendered.html,
            text: rendered.text,
        })
    });
    match tokio::time::timeout(PREVIEW_WAIT, render).await {
        Ok(Ok(preview)) => preview,
        Ok(Err(e)) => Err(format!("rendering the preview failed: {e}")),
        Err(_) => Err(format!(
            "the preview took longer than {} s to render; the page is shown without it",
            PREVIEW_WAIT.as_secs()
        )),
    }
}

/// `?member=EMAIL`: whom the preview is rendered for.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct PreviewFor {
    pub member: String,
}

/// `GET /campaigns/ID[?member=EMAIL]`.
pub async fn page(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
    Path(id): Path<String>,
    Query(preview_for): Query<PreviewFor>,
    headers: HeaderMap,
) -> Response {
    let Ok(id) = id.parse::<i64>() else {
        return not_found();
    };
    let shared = state.clone();
    let member = Some(preview_for.member.trim().to_string()).filter(|m| !m.is_empty());
    let (mut view, sample) = match state
        .admin
        .db(move |c| {
            gather(
                c,
                id,
                &shared.identity,
                &shared.timelines,
                member.as_deref(),
            )
        })
        .await
    {
        Ok(Some(v)) => v,
        Ok(None) => return not_found(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the campaign page's figures");
            return secure(
                (StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n").into_response(),
            );
        }
    };
    view.preview = preview(sample).await;
    let csrf = access.csrf(&state);
    let path = format!("/campaigns/{id}");
    match (Page {
        v: &view,
        csrf: &csrf,
        warnings: &flash::read(&state, &headers, &path),
    })
    .render()
    {
        Ok(html) => flash::clear(with_policy(Html(html).into_response()), &headers, &path),
        Err(e) => {
            tracing::error!(error = %e, "cannot render the campaign page");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot render page\n").into_response()
        }
    }
}

fn not_found() -> Response {
    secure((StatusCode::NOT_FOUND, "no such campaign\n").into_response())
}

/// The admin pages' headers, with this page's own policy.
fn with_policy(response: Response) -> Response {
    let mut response = secure(response);
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    response
}

/// `GET /static/campaign.css`.
pub async fn stylesheet() -> Response {
    super::page::asset(
        "text/css; charset=utf-8",
        include_str!("../../templates/admin/campaign.css"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(rfc3339(0, Precision::Seconds), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(1_764_156_000_999, Precision::Seconds),
            "2025-11-26T11:20:00Z"
        );
    }
}
