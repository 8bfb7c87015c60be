//! A worker driven in-process: `worker::run` takes its shutdown signal as
//! an argument (as mini-redis's `server::run` does), so a test can start
//! one on its own runtime, let it send a campaign, and stop it by
//! cancelling the token, without signals or a child process.

use std::time::Duration;

use crate::util::*;
use mailsplit::config::{SmtpUrl, WorkerSettings};
use tokio_util::sync::CancellationToken;

#[test]
fn a_worker_sends_a_campaign_and_stops_when_its_token_is_cancelled() {
    let env = World::with_peer(Kind::Sqlite, Script::default());
    let peer = env.peer();
    env.campaign("news", 40);
    let settings = WorkerSettings {
        database_url: env.db.url.clone(),
        servers: vec![env.beanstalkd.parse().unwrap()],
        tube: env.tube.clone(),
        smtp: SmtpUrl::parse(&env.smtp).unwrap(),
        concurrency: 4,
        max_attempts: 3,
        grace: Duration::from_secs(5),
        smtp_timeout: Duration::from_secs(10),
        max_per_session: 100,
        max_message: mailsplit::compose::content::DEFAULT_MAX_MESSAGE,
        webhooks: Default::default(),
        resolver: None,
    };
    let stop = CancellationToken::new();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let worker = runtime.spawn(mailsplit::worker::run(settings, stop.clone()));
    wait_for(60, "the campaign to be sent", || {
        env.status("news")["sent"] == 40
    });
    stop.cancel();
    let stopped =
        runtime.block_on(async { tokio::time::timeout(Duration::from_secs(30), worker).await });
    let result = stopped.expect("the worker stops once its token is cancelled");
    result.unwrap().unwrap();
    assert_eq!(peer.total(), 40);
    assert_eq!(peer.duplicates(), 0);
}
