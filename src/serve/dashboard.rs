//! The dashboard: one server-rendered page (askama, `templates/admin/`)
//! with every campaign (state, progress bar, rates, ETA, Pause / Resume /
//! Cancel), the worker fleet, the beanstalkd servers and the rate groups.
//! Its only script (`dashboard.js`, a dozen lines) fetches `/live`, the
//! same template's live part, every two seconds and swaps it in, and asks
//! before a Cancel; without script the page reloads itself. The buttons are
//! plain HTML forms that POST to `/campaigns/NAME/ACTION` with the page's
//! CSRF token and come back to the page (303), doing what the CLI does.

use askama::Template;
use axum::extract::{Path, State as Extract};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Extension;

use super::admin::{parse_action, run_control, ControlFailure};
use super::auth::Access;
use super::snapshot::{self, Snapshot};
use super::State;
use crate::fleet::ago;
use crate::status::{CampaignStatus, Phase};

/// How often the page refreshes itself (the script's interval is the same).
pub const REFRESH_SECONDS: u32 = 2;

/// What the templates show.
pub struct View {
    pub s: Snapshot,
    pub campaigns: Vec<CampaignRow>,
    /// `HH:MM:SS` UTC of the snapshot.
    pub time: String,
}

pub struct CampaignRow {
    pub c: CampaignStatus,
    /// The name as a URL path segment.
    pub path: String,
    pub bar: Vec<Segment>,
    /// Share of recipients with a final outcome, e.g. `42.5`.
    pub done_pct: String,
    pub eta: String,
    pub can_pause: bool,
    pub can_resume: bool,
    pub can_cancel: bool,
}

/// One part of a progress bar, in percent of the recipients.
pub struct Segment {
    pub class: &'static str,
    pub x: String,
    pub width: String,
    pub title: String,
}

impl View {
    fn new(s: Snapshot) -> View {
        let secs = s.at.div_euclid(1000).rem_euclid(86_400);
        View {
            campaigns: s.campaigns.iter().cloned().map(CampaignRow::new).collect(),
            time: format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60),
            s,
        }
    }

    /// `3m` since `at_ms`, as of the snapshot.
    pub fn ago(&self, at_ms: &i64) -> String {
        ago(self.s.at - at_ms)
    }
}

impl CampaignRow {
    pub fn new(c: CampaignStatus) -> CampaignRow {
        let total = c.recipients.max(1) as f64;
        let mut x = 0.0;
        let mut bar = Vec::new();
        for (class, n) in [
            ("sent", c.sent),
            ("failed", c.failed),
            ("skipped", c.skipped),
            ("pending", c.pending),
        ] {
            let width = n.max(0) as f64 * 100.0 / total;
            bar.push(Segment {
                class,
                x: format!("{x:.3}"),
                width: format!("{width:.3}"),
                title: format!("{class} {n}"),
            });
            x += width;
        }
        let done = (c.sent + c.failed + c.skipped) as f64 * 100.0 / total;
        let eta = match c.eta_seconds {
            Some(s) => format!("{}m{:02}s", s / 60, s % 60),
            None => "-".into(),
        };
        let live = !matches!(c.state, Phase::Cancelled | Phase::Done);
        CampaignRow {
            path: path_segment(&c.name),
            bar,
            done_pct: format!("{:.1}", done.min(100.0)),
            eta,
            // A draft has nothing to pause (`pause` refuses it too).
            // Nor a scheduled campaign before `enqueue`.
            can_pause: live
                && !matches!(c.state, Phase::Paused | Phase::Draft)
                && !(c.state == Phase::Scheduled && c.enqueued == 0),
            can_resume: c.state == Phase::Paused,
            can_cancel: live,
            c,
        }
    }
}

/// Percent-encode everything but RFC 3986's unreserved characters.
pub fn path_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[derive(Template)]
#[template(path = "admin/dashboard.html")]
struct Page<'a> {
    v: &'a View,
    csrf: &'a str,
    refresh: u32,
    /// Whether the page was opened with a login session (shows Log out).
    session: bool,
}

#[derive(Template)]
#[template(path = "admin/live.html")]
struct Live<'a> {
    v: &'a View,
    csrf: &'a str,
}

/// Headers every admin page carries: no framing (the buttons must not be
/// clickable through another site's frame), scripts and styles only from
/// this listener, nothing cached, no referrer.
pub fn secure(mut response: Response) -> Response {
    let h = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn render(page: impl Template) -> Response {
    match page.render() {
        Ok(html) => secure(Html(html).into_response()),
        Err(e) => {
            tracing::error!(error = %e, "cannot render the dashboard");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot render page\n").into_response()
        }
    }
}

async fn view(state: &State) -> Result<View, Response> {
    snapshot::take(state).await.map(View::new).map_err(|e| {
        tracing::warn!(error = %e, "cannot read the dashboard's figures");
        secure(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "database unavailable; retrying on the next refresh\n",
            )
                .into_response(),
        )
    })
}

/// `GET /`: the whole page.
pub async fn page(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
) -> Response {
    show(&state, &access, true).await
}

/// `GET /live`: the part of the page that changes.
pub async fn live(
    Extract(state): Extract<State>,
    Extension(access): Extension<Access>,
) -> Response {
    show(&state, &access, false).await
}

async fn show(state: &State, access: &Access, whole: bool) -> Response {
    let v = match view(state).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let csrf = access.csrf(state);
    if whole {
        render(Page {
            v: &v,
            csrf: &csrf,
            refresh: REFRESH_SECONDS,
            session: matches!(access, Access::Session(_)),
        })
    } else {
        render(Live { v: &v, csrf: &csrf })
    }
}

/// `POST /campaigns/NAME/ACTION` from the page's buttons: do it, then back
/// to the page; a refusal (e.g. resume a campaign that is not paused) is
/// shown with a link back.
pub async fn control(
    Extract(state): Extract<State>,
    super::guard::Client(client): super::guard::Client,
    Path((name, action)): Path<(String, String)>,
) -> Response {
    let Some(action) = parse_action(&action) else {
        return failure_page(
            StatusCode::NOT_FOUND,
            "unknown action: use pause, resume or cancel",
        );
    };
    match run_control(&state, client, &name, action).await {
        Ok(_) => Redirect::to("/").into_response(),
        Err(ControlFailure { status, message }) => failure_page(status, &message),
    }
}

#[derive(Template)]
#[template(path = "admin/refused.html")]
struct Refused<'a> {
    message: &'a str,
}

fn failure_page(status: StatusCode, message: &str) -> Response {
    let mut page = render(Refused { message });
    *page.status_mut() = status;
    page
}

/// `GET /static/dashboard.css` and `/static/dashboard.js`.
pub async fn stylesheet() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("../../templates/admin/dashboard.css"),
    )
}

pub async fn script() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("../../templates/admin/dashboard.js"),
    )
}

pub fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = ([(header::CONTENT_TYPE, content_type)], body).into_response();
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("max-age=300"),
    );
    r.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_safe_path_segments() {
        assert_eq!(path_segment("spring-2025_a.b~"), "spring-2025_a.b~");
        assert_eq!(path_segment("a/b c\"<é"), "a%2Fb%20c%22%3C%C3%A9");
    }
}
