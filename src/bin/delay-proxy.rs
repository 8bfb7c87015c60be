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

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// Chunks in flight per direction before the reader waits (backpressure).
const IN_FLIGHT: usize = 1024;

/// Plain threads, not tokio: tokio's timer rounds every sleep up to the
/// next millisecond, which would lengthen every short hop by more than
/// the delay asked for is worth (a LAN round trip most of all). A thread's
/// sleep ends within tens of microseconds of its deadline.
fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, target, ms] = args.as_slice() else {
        anyhow::bail!("usage: delay-proxy LISTEN_ADDR TARGET_ADDR ONE_WAY_MS");
    };
    let delay = Duration::from_micros(
        (ms.parse::<f64>().context("ONE_WAY_MS must be a number")? * 1000.0) as u64,
    );
    let listener =
        TcpListener::bind(listen).with_context(|| format!("cannot listen on {listen}"))?;
    for client in listener.incoming() {
        let client = client.context("accept")?;
        let target = target.clone();
        thread::spawn(move || {
            let server = match TcpStream::connect(&target) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("delay-proxy: cannot connect to {target}: {e}");
                    return;
                }
            };
            match carry(client, server, delay) {
                Ok((up, down)) => eprintln!(
                    "delay-proxy: connection to {target} closed: {up} chunks up, {down} down"
                ),
                Err(e) => eprintln!("delay-proxy: connection to {target}: {e}"),
            }
        });
    }
    Ok(())
}

/// Both directions of one connection; the chunks carried each way.
fn carry(client: TcpStream, server: TcpStream, delay: Duration) -> std::io::Result<(u64, u64)> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let up = pipe(client.try_clone()?, server.try_clone()?, delay);
    let down = pipe(server, client, delay);
    Ok((up.join().unwrap_or(0), down.join().unwrap_or(0)))
}

/// Carry `from` to `to` on two threads, each chunk `delay` after it was
/// read, in order; chunks behind it are not held up longer (a pipe with
/// latency, not a slower link). Joins to the number of chunks carried.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Duration) -> thread::JoinHandle<u64> {
    let (tx, rx) = mpsc::sync_channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let writer = thread::spawn(move || {
        // An empty chunk stands for the end of the stream.
        for (at, bytes) in rx {
            let now = Instant::now();
            if at > now {
                thread::sleep(at - now);
            }
            if bytes.is_empty() || to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut chunks = 0;
        loop {
            let n = from.read(&mut buf).unwrap_or(0);
            chunks += u64::from(n > 0);
            if tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
                || n == 0
            {
                break;
            }
        }
        drop(tx);
        let _ = writer.join();
        chunks
    })
}
