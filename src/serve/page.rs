//! What every admin page shares: the security headers, static assets, a
//! campaign's row (state, progress bar, ETA, which buttons apply) and the
//! name as a path segment. The dashboard and the campaign page both build
//! on it; it imports neither.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use crate::campaign::status::{CampaignStatus, Phase};

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

/// An admin page rendered, with [`secure`]'s headers; 500 when the
/// template fails (logged with `what`).
pub fn rendered(page: &impl askama::Template, what: &str) -> Response {
    match page.render() {
        Ok(html) => secure(axum::response::Html(html).into_response()),
        Err(e) => {
            tracing::error!(error = %e, "cannot render {what}");
            let failed = (
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "cannot render page\n",
            );
            failed.into_response()
        }
    }
}

/// `response` with `status` instead of a success (a page that failed to
/// render keeps its own).
pub fn with_status(mut response: Response, status: axum::http::StatusCode) -> Response {
    if response.status().is_success() {
        *response.status_mut() = status;
    }
    response
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
