"""scripts/bench.sh --transactional: transactional messages while a big
campaign sends at full speed (release build, SQLite, smtp-sink).

  1. the campaign alone (--n recipients, default 200,000; --workers W,
     --concurrency C): its rate;
  2. the same campaign on a fresh database and tube; once it is under way,
     --tx-n messages (default 1,000) are submitted evenly over --tx-seconds
     (default 10) through the library (target/release/tx-submit: one
     process, one connection, what an HTTP handler would cost; the HTTP
     route is not built yet), or with --tx-cli by `mailsplit send`
     processes, 16 in flight at most; the campaign's rate over that window;
  3. each message's latency: from the moment its `send` process was
     started to the ledger's `sent_at` (recorded right after the relay's
     answer to the end of DATA): p50, p99, max;
  4. accept rates with no worker running: `send`, 500 submits, 16 in
     flight; the library, 2,000 submits, one thread; each the median of 3.
Nothing asserts a speed. Prints the figures and appends a row to
BENCHMARKS.md.
"""
import concurrent.futures
import datetime
import json
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import tempfile
import time

IN_FLIGHT = 16


def add_arguments(ap):
    ap.add_argument("--transactional", action="store_true",
                    help="messages submitted while a campaign sends (see scripts/bench_tx.py)")
    ap.add_argument("--tx-n", type=int, default=1000, help="--transactional: messages (default 1,000)")
    ap.add_argument("--tx-seconds", type=float, default=10, help="--transactional: over this long (default 10)")
    ap.add_argument("--tx-cli", action="store_true",
                    help="--transactional: submit with `mailsplit send` processes instead of target/release/tx-submit")


def template(b, env, tmp):
    html = os.path.join(tmp, "order.html")
    with open(html, "w") as f:
        f.write("<p>Order {{ data.order }} for {{ email }}: thank you.</p>\n")
    subprocess.run([b.BIN, "template", "create", "order", "--subject", "Order {{ data.order }}",
                    "--from", "shop@example.test", "--html", html], env=env, check=True, capture_output=True)


def submit(b, env, i, key):
    t0 = time.time()
    out = subprocess.run([b.BIN, "send", "order", "--to", f"buyer{i}@example.org", "--json",
                          "--data", json.dumps({"order": i, "t0": t0}), "--idempotency-key", f"{key}-{i}"],
                         env=env, capture_output=True)
    return out.returncode, time.time() - t0


SUBMITTER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "target", "release", "tx-submit")


def library_submit(env, n, seconds, prefix):
    """n submits through the library (target/release/tx-submit, one
    connection, one thread) evenly over `seconds`; (failures, msg/s)."""
    out = subprocess.run([SUBMITTER, str(n), str(seconds), prefix], env=env, capture_output=True, text=True, check=True)
    m = re.search(r"= (\d+) msg/s, (\d+) failed", out.stdout)
    return int(m.group(2)), float(m.group(1))


def submit_spread(b, env, n, seconds):
    """n submits evenly over `seconds`, IN_FLIGHT at most; (failures, elapsed)."""
    start = time.time()
    failures = 0
    with concurrent.futures.ThreadPoolExecutor(IN_FLIGHT) as pool:
        futures = []
        for i in range(n):
            due = start + i * seconds / n
            time.sleep(max(0.0, due - time.time()))
            futures.append(pool.submit(submit, b, env, i, "tx"))
        for f in futures:
            failures += f.result()[0] != 0
    return failures, time.time() - start


def latencies(db_path):
    con = sqlite3.connect(db_path)
    rows = con.execute("SELECT data, sent_at, status FROM messages").fetchall()
    con.close()
    lat = sorted(sent_at / 1000 - json.loads(data)["t0"] for data, sent_at, st in rows if sent_at)
    return lat, sum(1 for _, _, st in rows if st == "sent")


def pct(xs, p):
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def workers(b, env, args, smtp_url):
    wenv = dict(env, SMTP_URL=smtp_url, MAILSPLIT_LOG="warn")
    return [subprocess.Popen([b.BIN, "worker", "--concurrency", str(args.concurrency)], env=wenv,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(args.workers)]


def stop(procs):
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(60)


def with_messages(b, env, tmp, args, smtp_url, db_path):
    """The campaign with messages submitted meanwhile; the figures."""
    csv = os.path.join(tmp, "txc.csv")
    b.write_csv(csv, args.n)
    subprocess.run([b.BIN, "migrate"], env=env, check=True, capture_output=True)
    template(b, env, tmp)
    subprocess.run([b.BIN, "import", csv, "--list", "txc"], env=env, check=True, capture_output=True)
    subprocess.run([b.BIN, "campaign", "create", "txc", "--list", "txc", "--template", "newsletter",
                    "--subject", "Benchmark news", "--from", "news@example.test"], env=env, check=True, capture_output=True)
    subprocess.run([b.BIN, "enqueue", "txc"], env=env, check=True, capture_output=True)
    procs = workers(b, env, args, smtp_url)
    while b.status(env, "txc")["sent"] < args.n // 10:
        time.sleep(0.2)
    before, t = b.status(env, "txc")["sent"], time.time()
    if args.tx_cli:
        failures, elapsed = submit_spread(b, env, args.tx_n, args.tx_seconds)
    else:
        failures, _ = library_submit(env, args.tx_n, args.tx_seconds, "tx")
        elapsed = time.time() - t
    after, t2 = b.status(env, "txc")["sent"], time.time()
    deadline = time.time() + 300
    while latencies(db_path)[1] < args.tx_n - failures and time.time() < deadline:
        time.sleep(0.5)
    stop(procs)
    lat, sent = latencies(db_path)
    return {"campaign_rate_with": (after - before) / (t2 - t), "submit_failures": failures,
            "submit_seconds": elapsed, "messages_sent": sent, "p50": pct(lat, 50), "p99": pct(lat, 99),
            "max": lat[-1] if lat else float("nan"), "campaign_sent_at_window_end": after}


def accept_rate(b, base_env, tmp, run):
    env = dict(base_env, DATABASE_URL=f"sqlite://{tmp}/accept-{run}.db", MAILSPLIT_TUBE=f"bench-accept-{run}")
    subprocess.run([b.BIN, "migrate"], env=env, check=True, capture_output=True)
    template(b, env, tmp)
    n = 500
    cli_start = time.time()
    with concurrent.futures.ThreadPoolExecutor(IN_FLIGHT) as pool:
        codes = list(pool.map(lambda i: submit(b, env, i, f"a{run}")[0], range(n)))
    cli = (n - sum(c != 0 for c in codes)) / (time.time() - cli_start)
    _, library = library_submit(env, 2000, 0, f"l{run}")
    return cli, library


def run(args, b):
    tmp = tempfile.mkdtemp(prefix="mailsplit-bench-tx-")
    svc = b.Services(tmp)
    try:
        bs = svc.beanstalkd()
        base = dict(os.environ, BEANSTALKD=f"127.0.0.1:{bs}", MAILSPLIT_LOG="warn")
        sink_port, _ = svc.smtp_sink()
        smtp = f"smtp://127.0.0.1:{sink_port}"
        print(f"==> campaign alone: {args.n:,} recipients, {args.workers} workers x {args.concurrency}", flush=True)
        env = dict(base, DATABASE_URL=f"sqlite://{tmp}/alone.db", MAILSPLIT_TUBE="bench-tx-alone")
        alone = b.campaign(env, tmp, args.n, "alone", args.workers, args.concurrency, smtp, 1800)
        print(f"==> the same campaign with {args.tx_n} messages over {args.tx_seconds} s", flush=True)
        db_path = f"{tmp}/with.db"
        env = dict(base, DATABASE_URL=f"sqlite://{db_path}", MAILSPLIT_TUBE="bench-tx-with")
        w = with_messages(b, env, tmp, args, smtp, db_path)
        print("==> accept rate of `mailsplit send`, no worker (3 runs)", flush=True)
        rates = [accept_rate(b, base, tmp, r) for r in range(3)]
    finally:
        svc.stop()
    r = dict(w, campaign_rate_alone=alone["sending_msg_per_s"] or alone["msg_per_s"],
             accept_median=statistics.median(x for x, _ in rates), accept_all=[x for x, _ in rates],
             library_median=statistics.median(y for _, y in rates), library_all=[y for _, y in rates],
             path="`mailsplit send` processes" if args.tx_cli else "the library (tx-submit)")
    report(args, r)


def report(args, r):
    lines = [
        f"messages: {args.tx_n} over {args.tx_seconds:g} s via {r['path']}, "
        f"{r['messages_sent']} sent, {r['submit_failures']} submits failed",
        f"latency submit -> ledger sent_at: p50 {r['p50'] * 1000:.0f} ms, p99 {r['p99'] * 1000:.0f} ms, max {r['max'] * 1000:.0f} ms",
        f"campaign rate: alone {r['campaign_rate_alone']:.0f} msg/s, during the messages {r['campaign_rate_with']:.0f} msg/s",
        f"accept rate of send (16 in flight, no worker): median {r['accept_median']:.0f} msg/s "
        f"({', '.join(f'{x:.0f}' for x in r['accept_all'])})",
        f"accept rate of the library (one thread, one connection): median {r['library_median']:.0f} msg/s "
        f"({', '.join(f'{x:.0f}' for x in r['library_all'])})",
    ]
    print("\n" + "\n".join(lines))
    day = datetime.date.today().isoformat()
    row = (f"| {day} | transactional (SQLite, smtp-sink, {args.n:,} campaign, {args.workers}x{args.concurrency}) "
           f"| {args.tx_n} msgs/{args.tx_seconds:g} s via {r['path']}: p50 {r['p50'] * 1000:.0f} ms, p99 {r['p99'] * 1000:.0f} ms "
           f"(submit start to ledger sent_at); campaign {r['campaign_rate_alone']:.0f} msg/s alone, "
           f"{r['campaign_rate_with']:.0f} msg/s meanwhile; accepted: `send` {r['accept_median']:.0f} msg/s (16 processes), "
           f"library {r['library_median']:.0f} msg/s (one thread), medians of 3 |\n")
    head = ("\n## Transactional messages beside a campaign (`scripts/bench.sh --transactional`)\n\n"
            "| date | setting | figures |\n|---|---|---|\n")
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "BENCHMARKS.md"), "a") as f:
        f.write(head + row)
