//! `/api/v1/campaigns`: create (the checks of `mailsplit campaign
//! create`, in [`crate::campaign`]), enqueue (the splitter, in the
//! background), pause, resume, cancel (the dashboard's [`control`]), and
//! the objects of `status --json`.
//!
//! [`control`]: crate::campaign::control

use std::path::{Path as FsPath, PathBuf};

use axum::extract::{Path, State as Extract};
use axum::http::StatusCode;
use axum::Json;
use data_encoding::HEXLOWER;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::{self, Need};
use super::problem::{Errors, Problem};
use super::subscribers::store_problem;
use super::Input;
use crate::campaign::ab::AbRequest;
use crate::campaign::status::{CampaignStatus, Phase};
use crate::campaign::{self, CampaignError, ContentSource, CreateRequest};
use crate::config::{DEFAULT_BATCH_SIZE, DEFAULT_ENQUEUE_WAIT};
use crate::enqueue::{self, Options};
use crate::serve::actions::{parse_action, run_control};
use crate::serve::guard::Client;
use crate::serve::State;
use crate::store::{Conn, StoreError};

pub fn routes() -> OpenApiRouter<State> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(get_one))
        .routes(routes!(enqueue))
        .routes(routes!(control))
}

/// A campaign to create: the options of `mailsplit campaign create`, with
/// the content itself instead of file names.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewCampaign {
    pub name: String,
    /// The list it goes to (must exist).
    pub list: String,
    pub subject: String,
    /// `Name <address>` or an address.
    pub from: String,
    /// HTML content (a Jinja template); exactly one of html, markdown, template.
    pub html: Option<String>,
    /// Markdown content (a Jinja template).
    pub markdown: Option<String>,
    /// A starter template's name (`mailsplit templates`).
    pub template: Option<String>,
    /// Plain-text part beside `html` (made from the HTML otherwise).
    pub text: Option<String>,
    /// RFC 3339 start time, or `now`.
    pub send_at: Option<String>,
    /// `opens`, `clicks`, `opens,clicks` or `none`.
    pub track: Option<String>,
    /// beanstalkd priority (lower first).
    pub priority: Option<u32>,
    /// Where `serve`'s public listener is reachable (one-click unsubscribe).
    pub public_url: Option<String>,
    pub return_path: Option<String>,
    /// `20%`, `0.2` or `off` (default 20%).
    pub max_failure_rate: Option<String>,
    /// `0.3%`, `0.003` or `off` (default 0.3%): complaints that pause it.
    pub max_complaint_rate: Option<String>,
    /// An A/B test, as `campaign create --variant-subject …
    /// --variant-html … --ab-sample … --ab-wait … --ab-metric …`.
    pub ab: Option<AbOptions>,
}

/// An A/B test: variants B, C, … of the subject and/or the HTML (paired in
/// order: B gets the first of each; a variant without one has the
/// campaign's), a random sample split evenly among all variants, and the
/// winner sent to the rest after the wait.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AbOptions {
    /// Subjects of variants B, C, … (the campaign's `subject` is A's).
    #[serde(default)]
    pub variant_subjects: Vec<String>,
    /// HTML of variants B, C, … (Jinja templates, checked as `html` is).
    #[serde(default)]
    pub variant_html: Vec<String>,
    /// Share of the list that tests the variants: `1%` to `50%`.
    pub sample: Option<String>,
    /// How long the sample is watched from the first send: `30m`, `2h`, `1d`.
    pub wait: Option<String>,
    /// `opens` or `clicks` (default `opens`); needs `track` of the same.
    pub metric: Option<String>,
}

/// The file `variant_html[i]` is written to, for the stage to read.
fn variant_file(i: usize) -> String {
    format!("variant-{i}.html")
}

/// The A/B options as `campaign create` takes them: each variant's HTML a
/// file, written to `dir`.
fn ab_of(ab: Option<AbOptions>, dir: &Scratch) -> Result<AbRequest, Problem> {
    let Some(ab) = ab else {
        return Ok(AbRequest::default());
    };
    let variant_html = ab
        .variant_html
        .iter()
        .enumerate()
        .map(|(i, html)| dir.file(&variant_file(i), html))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| Problem::internal(&e))?;
    Ok(AbRequest {
        variant_subjects: ab.variant_subjects,
        variant_html,
        sample: ab.sample,
        wait: ab.wait,
        metric: ab.metric,
    })
}

/// A created campaign, with what `mailsplit campaign create` warns of.
#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedCampaign {
    #[serde(flatten)]
    pub campaign: CampaignStatus,
    /// What large providers will miss in its messages (no public URL so
    /// no one-click unsubscribe, no DKIM key for the From domain, a return
    /// path not aligned with From, content that mail clients strip): the
    /// campaign is created all the same; empty when there is nothing to say.
    pub warnings: Vec<String>,
}

/// A refusal of the campaign stage as the client sees it.
pub(in crate::serve) fn refused(e: CampaignError) -> Problem {
    match e {
        CampaignError::Store(StoreError::CampaignExists(_)) => {
            Problem::new(StatusCode::CONFLICT, e.to_string())
        }
        CampaignError::Store(StoreError::UnknownList { .. }) => {
            Problem::unprocessable(e.to_string())
        }
        CampaignError::Store(s) => store_problem(&s),
        CampaignError::NotDraft { .. } | CampaignError::NotEditable { .. } => {
            Problem::new(StatusCode::CONFLICT, e.to_string())
        }
        e => Problem::unprocessable(e.to_string()),
    }
}

/// A private directory for the content of one request, removed on drop.
pub(in crate::serve) struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new() -> std::io::Result<Scratch> {
        use std::os::unix::fs::DirBuilderExt;
        let mut tag = [0u8; 12];
        rand::rng().fill_bytes(&mut tag);
        let dir = std::env::temp_dir().join(format!("mailsplit-api-{}", HEXLOWER.encode(&tag)));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(Scratch(dir))
    }

    pub fn file(&self, name: &str, content: &str) -> std::io::Result<PathBuf> {
        let path = self.0.join(name);
        std::fs::write(&path, content)?;
        Ok(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The content as `campaign create` takes it: files, written to `dir`.
fn content_of(body: &NewCampaign, dir: &Scratch) -> Result<ContentSource, Problem> {
    let io = |e: std::io::Error| Problem::internal(&e);
    match (&body.html, &body.markdown, &body.template) {
        (Some(html), None, None) => Ok(ContentSource::Html {
            html: dir.file("content.html", html).map_err(io)?,
            text: match &body.text {
                Some(t) => Some(dir.file("content.txt", t).map_err(io)?),
                None => None,
            },
        }),
        (None, Some(md), None) if body.text.is_none() => Ok(ContentSource::Markdown(
            dir.file("content.md", md).map_err(io)?,
        )),
        (None, None, Some(t)) if body.text.is_none() => Ok(ContentSource::Template(t.clone())),
        _ => Err(Problem::bad_request(
            "give exactly one of `html` (optionally with `text`), `markdown`, `template`",
        )),
    }
}

/// Check and create, on a blocking thread: the content is read from files.
pub(in crate::serve) fn create_blocking(
    url: &str,
    body: NewCampaign,
) -> Result<CreatedCampaign, Problem> {
    let dir = Scratch::new().map_err(|e| Problem::internal(&e))?;
    let request = CreateRequest {
        content: content_of(&body, &dir)?,
        ab: ab_of(body.ab, &dir)?,
        name: body.name,
        list: body.list,
        subject: body.subject,
        from: body.from,
        priority: body.priority,
        // As `campaign create --public-url`, whose default it is.
        public_url: body.public_url.or_else(|| {
            std::env::var("MAILSPLIT_PUBLIC_URL")
                .ok()
                .filter(|u| !u.trim().is_empty())
        }),
        return_path: body.return_path,
        max_failure_rate: body.max_failure_rate.unwrap_or_else(|| "20%".into()),
        max_complaint_rate: body.max_complaint_rate.unwrap_or_default(),
        send_at: body.send_at,
        track: body.track,
    };
    let checked = campaign::check(request).map_err(|e| readable(e, dir.0.as_path()))?;
    let mut conn = Conn::open(url).map_err(|e| store_problem(&e))?;
    let created = campaign::create(&mut conn, checked).map_err(refused)?;
    Ok(CreatedCampaign {
        campaign: one(&mut conn, &created.campaign.name)?,
        warnings: created.warnings.iter().map(|w| w.to_string()).collect(),
    })
}

/// A content error names the file it read: name the field instead.
pub(in crate::serve) fn readable(e: CampaignError, dir: &FsPath) -> Problem {
    let mut p = refused(e);
    p.detail = p.detail.replace(&format!("{}/", dir.display()), "");
    for (file, field) in [
        ("content.html", "html"),
        ("content.txt", "text"),
        ("content.md", "markdown"),
    ] {
        p.detail = p.detail.replace(file, field);
    }
    for i in 0..crate::campaign::ab::MAX_VARIANTS {
        p.detail = p
            .detail
            .replace(&variant_file(i), &format!("ab.variant_html[{i}]"));
    }
    p
}

fn one(conn: &mut Conn, name: &str) -> Result<CampaignStatus, Problem> {
    match campaign::statuses(conn, Some(name)) {
        Ok(mut all) if !all.is_empty() => Ok(all.remove(0)),
        Ok(_) | Err(StoreError::UnknownCampaign(_)) => {
            Err(Problem::not_found(format!("no campaign {name:?}")))
        }
        Err(e) => Err(store_problem(&e)),
    }
}

/// Create a campaign (a draft until enqueued).
#[utoipa::path(post, path = "/campaigns", operation_id = "create_campaign", tag = "campaigns",
    request_body = NewCampaign,
    responses((status = 201, description = "created; `warnings` says what large providers will miss", body = CreatedCampaign), Errors),
    security(("bearer" = [])))]
async fn create(
    _: Need<auth::Campaigns>,
    Extract(state): Extract<State>,
    Input(body): Input<NewCampaign>,
) -> Result<(StatusCode, Json<CreatedCampaign>), Problem> {
    let url = state.settings.database_url.clone();
    let made = state
        .admin
        .pool
        .blocking(move || create_blocking(&url, body))
        .await
        .map_err(|e| Problem::internal(&e))??;
    Ok((StatusCode::CREATED, Json(made)))
}

async fn status_of(state: &State, name: String) -> Result<CampaignStatus, Problem> {
    state
        .admin
        .db(move |c| Ok(one(c, &name)))
        .await
        .map_err(|e| store_problem(&e))?
}

/// Every campaign, as `mailsplit status --json` prints them.
#[utoipa::path(get, path = "/campaigns", operation_id = "list_campaigns", tag = "campaigns",
    responses((status = 200, description = "every campaign", body = Vec<CampaignStatus>), Errors),
    security(("bearer" = [])))]
async fn list(
    _: Need<auth::Read>,
    Extract(state): Extract<State>,
) -> Result<Json<Vec<CampaignStatus>>, Problem> {
    state
        .admin
        .db(|c| campaign::statuses(c, None))
        .await
        .map(Json)
        .map_err(|e| store_problem(&e))
}

/// One campaign, as `mailsplit status NAME --json` prints it.
#[utoipa::path(get, path = "/campaigns/{name}", operation_id = "get_campaign", tag = "campaigns",
    params(("name" = String, Path, description = "campaign name or id")),
    responses((status = 200, description = "the campaign", body = CampaignStatus), Errors),
    security(("bearer" = [])))]
async fn get_one(
    _: Need<auth::Read>,
    Extract(state): Extract<State>,
    Path(name): Path<String>,
) -> Result<Json<CampaignStatus>, Problem> {
    status_of(&state, name).await.map(Json)
}

/// Put the campaign's recipients into beanstalkd, in the background; 202
/// at once. Safe to repeat: the splitter never enqueues a recipient twice
/// (a second run waits for the first, then finds nothing left).
#[utoipa::path(post, path = "/campaigns/{name}/enqueue", operation_id = "enqueue_campaign", tag = "campaigns",
    params(("name" = String, Path, description = "campaign name or id")),
    responses((status = 202, description = "enqueueing has started; the campaign as it was", body = CampaignStatus), Errors),
    security(("bearer" = [])))]
async fn enqueue(
    _: Need<auth::Campaigns>,
    Extract(state): Extract<State>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<CampaignStatus>), Problem> {
    let before = begin_enqueue(&state, name).await?;
    Ok((StatusCode::ACCEPTED, Json(before)))
}

/// Start the splitter for campaign `name` in the background (what
/// `mailsplit enqueue` does); the campaign as it was. Refused for a
/// cancelled campaign, and while other campaigns are being enqueued.
pub(in crate::serve) async fn begin_enqueue(
    state: &State,
    name: String,
) -> Result<CampaignStatus, Problem> {
    let before = status_of(state, name).await?;
    if before.state == Phase::Cancelled {
        let detail = format!(
            "campaign {:?} is cancelled; nothing to enqueue",
            before.name
        );
        return Err(Problem::new(StatusCode::CONFLICT, detail));
    }
    let Ok(permit) = state.api.enqueues.clone().try_acquire_owned() else {
        return Err(Problem::too_many(
            "other campaigns are being enqueued; try again",
            5,
        ));
    };
    let settings = state.settings.clone();
    let campaign = before.name.clone();
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let opts = Options {
            batch_size: DEFAULT_BATCH_SIZE,
            servers: settings.servers.clone(),
            tube: settings.tube.clone(),
            progress: false,
            wait: DEFAULT_ENQUEUE_WAIT,
        };
        let done = Conn::open(&settings.database_url)
            .map_err(enqueue::EnqueueError::from)
            .and_then(|mut c| enqueue::enqueue(&mut c, &campaign, &opts));
        match done {
            Ok(e) => {
                tracing::info!(campaign = %campaign, jobs = e.jobs, recipients = e.recipients, "api: enqueued")
            }
            Err(e) => tracing::warn!(campaign = %campaign, error = %e, "api: enqueue failed"),
        }
    });
    Ok(before)
}

/// `pause`, `resume` or `cancel`, as `mailsplit pause|resume|cancel`.
#[utoipa::path(post, path = "/campaigns/{name}/{action}", operation_id = "control_campaign", tag = "campaigns",
    params(
        ("name" = String, Path, description = "campaign name or id"),
        ("action" = String, Path, description = "pause, resume or cancel", pattern = "^(pause|resume|cancel)$"),
    ),
    responses((status = 200, description = "the campaign afterwards", body = CampaignStatus), Errors),
    security(("bearer" = [])))]
async fn control(
    _: Need<auth::Campaigns>,
    Extract(state): Extract<State>,
    Client(client): Client,
    Path((name, action)): Path<(String, String)>,
) -> Result<Json<CampaignStatus>, Problem> {
    let Some(action) = parse_action(&action) else {
        return Err(Problem::not_found(
            "unknown action: use enqueue, pause, resume or cancel",
        ));
    };
    let done = run_control(&state, client, &name, action)
        .await
        .map_err(|f| Problem::new(f.status, f.message))?;
    status_of(&state, done.campaign.name).await.map(Json)
}
