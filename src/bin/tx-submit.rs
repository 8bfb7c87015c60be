//! `tx-submit N SECONDS KEY-PREFIX`: submit N messages of template `order`
//! through the library (`messages::submit`, one connection, one thread),
//! evenly over SECONDS (0: as fast as it can), each with its submit time in
//! `data.t0`, to `buyer<i>@example.org`. Prints the accept rate. The
//! submitter of `scripts/bench.sh --transactional`: it costs the machine
//! what an HTTP handler would, not a process per message as `mailsplit
//! send` does. Reads DATABASE_URL, BEANSTALKD and MAILSPLIT_TUBE. Not a
//! test: nothing here asserts a speed.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use mailsplit::messages::{self, Queue, Submit};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).context("N")?.parse()?;
    let seconds: f64 = args.get(2).context("SECONDS")?.parse()?;
    let prefix = args.get(3).context("KEY-PREFIX")?;
    let env = |k: &str| std::env::var(k).with_context(|| format!("{k} is not set"));
    let mut conn = mailsplit::store::Conn::open(&env("DATABASE_URL")?)?;
    let queue = Queue {
        servers: vec![env("BEANSTALKD")?.parse()?],
        tube: env("MAILSPLIT_TUBE")?,
    };
    let start = Instant::now();
    let mut failed = 0;
    for i in 0..n {
        let due = start + Duration::from_secs_f64(seconds * i as f64 / n as f64);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let t0 = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs_f64();
        let s = Submit {
            template: "order".into(),
            to: format!("buyer{i}@example.org"),
            data: Some(serde_json::json!({"order": i, "t0": t0})),
            idempotency_key: Some(format!("{prefix}-{i}")),
        };
        if let Err(e) = messages::submit(&mut conn, &queue, s) {
            eprintln!("message {i}: {e:#}");
            failed += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "accepted {} in {secs:.2} s = {:.0} msg/s, {failed} failed",
        n - failed,
        (n - failed) as f64 / secs
    );
    Ok(())
}
