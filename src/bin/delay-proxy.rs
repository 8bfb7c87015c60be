//! `delay-proxy`: a TCP forwarder that adds a fixed delay in each
//! direction, for `scripts/bench.sh --network` (this machine's kernel has
//! no `netem` qdisc to do it with `tc`).
//!
//! Usage: `delay-proxy LISTEN_ADDR TARGET_ADDR ONE_WAY_MS`, e.g.
//! `delay-proxy 127.0.0.1:2525 127.0.0.1:25 10` puts a relay 20 ms (round
//! trip) away. Every chunk read on one side is written to the other
//! `ONE_WAY_MS` after it was read, in order; chunks behind it are not held
//! up longer (a pipe with latency, not a slower link). A close is passed on
//! after the same delay. When a connection ends it prints, on stderr, how
//! many chunks (reads) went each way: for a request/response protocol
//! (PostgreSQL, beanstalkd) the client's chunks are its round trips. Not
//! part of mailsplit's own work: a bench tool.

use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Chunks in flight per direction before the reader waits (backpressure).
const IN_FLIGHT: usize = 1024;

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, target, ms] = args.as_slice() else {
        anyhow::bail!("usage: delay-proxy LISTEN_ADDR TARGET_ADDR ONE_WAY_MS");
    };
    let delay = Duration::from_micros(
        (ms.parse::<f64>().context("ONE_WAY_MS must be a number")? * 1000.0) as u64,
    );
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    loop {
        let (client, _) = listener.accept().await.context("accept")?;
        let target = target.clone();
        tokio::spawn(async move {
            let server = match TcpStream::connect(&target).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("delay-proxy: cannot connect to {target}: {e}");
                    return;
                }
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let (up, down) = tokio::join!(pipe(cr, sw, delay), pipe(sr, cw, delay));
            eprintln!("delay-proxy: connection to {target} closed: {up} chunks up, {down} down");
        });
    }
}

/// Carry `from` to `to`, each chunk `delay` after it was read; the number
/// of chunks carried.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) -> u64 {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut chunks = 0;
        loop {
            let n = from.read(&mut buf).await.unwrap_or(0);
            chunks += u64::from(n > 0);
            // An empty chunk stands for the end of the stream.
            if tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .await
                .is_err()
                || n == 0
            {
                return chunks;
            }
        }
    };
    let writer = async move {
        // The channel keeps the order; each chunk waits for its own time.
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if bytes.is_empty() || to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer).0
}
