//! `mailsplit serve`: the HTTP side of mailsplit, on two listeners split by
//! trust so that exposing one never exposes the other:
//!
//! - [`public`] on `--listen`: what a reverse proxy puts at the campaigns'
//!   public URL (one-click unsubscribe, provider webhooks: [`webhook`]);
//! - [`admin`] on `--admin-listen`: the operator's routes ([`dashboard`],
//!   [`campaign_page`], JSON API, [`metrics`]), every request checked by
//!   [`auth`] against `MAILSPLIT_ADMIN_TOKEN`; [`snapshot`] gathers what
//!   they show. [`api`] is `/api/v1`, with keys and scopes of its own.
//!
//! Each side is one axum `Router` built from [`AppState`]; a new route is a
//! line in its module. Each side reads the database through a reconnecting
//! [`Db`] handle of its own and does its blocking work in a bounded
//! [`pool`] of its own, so the admin side can never starve the public one;
//! [`health`] answers `/healthz`. [`listen`] accepts connections (timeouts
//! for slow and idle clients, a cap per listener); SIGTERM or SIGINT stop
//! accepting and let requests in flight finish, for a few seconds at most.

pub mod actions;
pub mod admin;
pub mod api;
pub mod auth;
pub mod campaign_actions;
pub mod campaign_archive;
pub mod campaign_form;
pub mod campaign_page;
pub mod chart;
pub mod cookie;
pub mod dashboard;
pub mod flow_page;
pub mod guard;
pub mod health;
pub mod hits;
pub mod listen;
pub mod manage;
pub mod metrics;
pub mod multipart;
pub mod page;
pub mod pages;
pub mod people;
pub mod people_actions;
pub mod pool;
pub mod public;
pub mod snapshot;
pub mod subscribe;
pub mod template_link;
pub mod tracking;
pub mod webhook;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use tokio_util::sync::CancellationToken;

use crate::config::ServeSettings;
use crate::shutdown;
use crate::store::{self, installation, Db, Plans};
use crate::tokens::Identity;
use health::Health;
use pool::{Pool, Side};

/// What every handler can reach.
pub struct AppState {
    /// The public routes' connection and threads.
    pub public: Side,
    /// The admin routes' own connection and threads.
    pub admin: Side,
    pub health: Health,
    /// This database's identity: the signer that checks unsubscribe tokens.
    pub identity: Identity,
    pub settings: ServeSettings,
    /// Failed logins per client address and token prefix.
    pub failures: guard::Failures,
    /// The campaign page's outcome counts over time, last read.
    pub timelines: campaign_page::Timelines,
    /// Opens and clicks: the batched writer, the link tables read.
    pub tracking: tracking::TrackingRoutes,
    /// `/api/v1`'s rate buckets and background work.
    pub api: api::ApiState,
}

pub type State = Arc<AppState>;

/// Why `serve` could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The database is unreachable, unmigrated, or its URL is wrong.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// Binding or serving failed.
    #[error(transparent)]
    Run(#[from] anyhow::Error),
}

/// Check the database, bind both listeners (failing with the address that
/// could not be bound), and serve until SIGTERM or SIGINT.
pub fn run(settings: ServeSettings) -> Result<(), ServeError> {
    let mut conn = store::open_migrated(&settings.database_url)?;
    let identity = Identity::from(&installation::load(&mut conn)?);
    // Sessions of an earlier admin token end here (their cookies' MACs
    // no longer match either; this also keeps them from coming back if
    // that token is ever set again).
    let fingerprint = cookie::token_fingerprint(settings.admin_token.as_deref());
    store::sessions::end_other_tokens(&mut conn, &fingerprint)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(pool::MAX_BLOCKING_THREADS)
        .build()
        .context("cannot start the async runtime")?;
    listen::raise_file_limit(2 * settings.max_connections + 64);
    let recorder = hits::Recorder::start(Db::new(&settings.database_url, None, Plans::Custom))
        .context("cannot start the hit writer")?;
    let served: Result<()> = runtime.block_on(async move {
        let url = &settings.database_url;
        let state = Arc::new(AppState {
            public: Side::new(
                Db::new(url, Some(conn), Plans::Custom),
                Pool::new("public", pool::PUBLIC_THREADS),
            ),
            admin: Side::new(
                Db::new(url, None, Plans::Custom),
                Pool::new("admin", pool::ADMIN_THREADS),
            ),
            health: Health::default(),
            identity,
            settings: settings.clone(),
            failures: guard::Failures::default(),
            timelines: campaign_page::Timelines::default(),
            tracking: tracking::TrackingRoutes::new(recorder),
            api: api::ApiState::new(url, settings.api_rate, settings.api_burst),
        });
        let stop = CancellationToken::new();
        shutdown::on_signals(stop.clone()).context("cannot install signal handlers")?;
        let public = bind(settings.listen, "--listen").await?;
        let admin = bind(settings.admin_listen, "--admin-listen").await?;
        tracing::info!(
            public = %settings.listen,
            admin = %settings.admin_listen,
            admin_token = settings.admin_token.is_some(),
            "serving"
        );
        let cap = settings.max_connections;
        let deliverer = tokio::spawn(crate::webhooks::deliver::run(
            Db::new(url, None, Plans::Custom),
            settings.webhooks,
            stop.clone(),
        ));
        tokio::join!(
            listen::serve(
                public,
                public::router(Arc::clone(&state)),
                cap,
                stop.clone()
            ),
            listen::serve(admin, admin::router(Arc::clone(&state)), cap, stop.clone()),
        );
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), deliverer).await;
        // Requests are over: record the opens and clicks still queued.
        let last = Arc::clone(&state);
        tokio::task::spawn_blocking(move || last.tracking.recorder.finish())
            .await
            .context("the hit writer failed")?;
        tracing::info!("serve stopped");
        Ok(())
    });
    // Blocking work still running (each bounded by its own deadline) is
    // not waited for beyond this.
    runtime.shutdown_timeout(listen::SHUTDOWN_GRACE);
    Ok(served?)
}

async fn bind(addr: SocketAddr, option: &str) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({option})"))
}
