"""scripts/bench.sh --transactional: transactional messages while a big
campaign sends at full speed (release build, SQLite, smtp-sink).

  1. the campaign alone (--n recipients, default 200,000; --workers W,
     --concurrency C): its rate;
  2. the same campaign on a fresh database and tube; once it is under way,
     --tx-n messages (default 1,000) are posted evenly over --tx-seconds
     (default 10) to `POST /api/v1/messages` of a `mailsplit serve` with an
     API key of scope `send` (16 keep-alive connections at most); with
     --tx-cli by `mailsplit send` processes, 16 in flight at most; the
     campaign's rate over that window beside the same length of window
     just before it. The posting threads stand for the shop's
     application, which runs on its own machine: here they share the two
     cores, so they run at --tx-client-nice (default 19) and take what the
     campaign leaves; a message's latency starts when its POST was due,
     so a client slow to get to it counts against the figure. The CPU
     each party spent in both windows (from /proc) is reported: a
     campaign message's, a transactional message's to mailsplit (serve
     and workers beyond the campaign's own) and the client's per POST;
  3. each message's latency: from the moment its POST (or `send` process)
     started to the ledger's `sent_at` (recorded right after the relay's
     answer to the end of DATA): p50, p99, max;
  4. accept rates with no worker running, each the median of 3: the API,
     4,000 POSTs over 16 keep-alive connections; `send`, 500 submits, 16
     in flight; the library (target/release/tx-submit), 2,000 submits, one
     thread.
Nothing asserts a speed. Prints the figures and appends a row to
BENCHMARKS.md.
"""
import concurrent.futures
import datetime
import http.client
import json
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import tempfile
import threading
import time

IN_FLIGHT = 16


def add_arguments(ap):
    ap.add_argument("--transactional", action="store_true",
                    help="messages submitted while a campaign sends (see scripts/bench_tx.py)")
    ap.add_argument("--tx-n", type=int, default=1000, help="--transactional: messages (default 1,000)")
    ap.add_argument("--tx-seconds", type=float, default=10, help="--transactional: over this long (default 10)")
    ap.add_argument("--tx-client-nice", type=int, default=19,
                    help="--transactional: niceness of the posting threads (default 19: the shop's application "
                         "runs on its own machine, not on the campaign's two cores; 0 to let it compete)")
    ap.add_argument("--tx-cli", action="store_true",
                    help="--transactional: submit with `mailsplit send` processes instead of POST /api/v1/messages")


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


class Api:
    """A `mailsplit serve` whose admin listener takes /api/v1, and a key
    of scope `send` for it; no per-key rate limit in the way."""

    def __init__(self, b, env, svc):
        self.port = b.free_port()
        key = subprocess.run([b.BIN, "apikey", "create", f"bench{self.port}", "--scopes", "send"],
                             env=env, check=True, capture_output=True, text=True).stdout
        self.key = re.search(r"ms_[A-Za-z0-9_-]+", key).group(0)
        senv = dict(env, MAILSPLIT_ADMIN_TOKEN="bench-admin-token-" + "x" * 32)
        self.proc = subprocess.Popen([b.BIN, "serve", "--listen", f"127.0.0.1:{b.free_port()}",
                                      "--admin-listen", f"127.0.0.1:{self.port}",
                                      "--api-rate", "1000000", "--api-burst", "1000000"],
                                     env=senv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        svc.procs.append(self.proc)
        b.wait_port(self.port, "mailsplit serve")
        self.local = __import__("threading").local()

    def post(self, i, prefix, due=None):
        """One message; (HTTP status, seconds). `due`: when it was meant
        to go, the start of its latency (a client slow to get to it counts
        against the figure)."""
        t0 = due or time.time()
        body = json.dumps({"template": "order", "to": f"buyer{i}@example.org", "data": {"order": i, "t0": t0}})
        for attempt in range(2):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                conn.request("POST", "/api/v1/messages", body, {
                    "Authorization": f"Bearer {self.key}", "Content-Type": "application/json",
                    "Idempotency-Key": f"{prefix}-{i}"})
                resp = conn.getresponse()
                resp.read()
                return resp.status, time.time() - t0
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
        return 0, time.time() - t0


def niced(level):
    """A thread initializer: this thread at niceness `level` (Linux sets
    it per thread)."""
    def init():
        if level:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), level)
    return init


def api_spread(api, n, seconds, prefix, nice=0):
    """n POSTs evenly over `seconds` (all at once when 0), IN_FLIGHT at
    most, the posting threads at niceness `nice`; (failures, msg/s
    accepted)."""
    start = time.time()
    with concurrent.futures.ThreadPoolExecutor(IN_FLIGHT, initializer=niced(nice)) as pool:
        futures = []
        for i in range(n):
            due = None
            if seconds:
                due = start + i * seconds / n
                time.sleep(max(0.0, due - time.time()))
            futures.append(pool.submit(api.post, i, prefix, due))
        codes = [f.result()[0] for f in futures]
    failures = sum(c != 202 for c in codes)
    return failures, (n - failures) / (time.time() - start)


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


def with_messages(b, env, tmp, args, smtp_url, db_path, svc, sink):
    """The campaign with messages submitted meanwhile; the figures, with
    the CPU time each party spent in the window before the messages and
    in the window with them (from /proc, not wall time)."""
    csv = os.path.join(tmp, "txc.csv")
    b.write_csv(csv, args.n)
    subprocess.run([b.BIN, "migrate"], env=env, check=True, capture_output=True)
    template(b, env, tmp)
    subprocess.run([b.BIN, "import", csv, "--list", "txc"], env=env, check=True, capture_output=True)
    subprocess.run([b.BIN, "campaign", "create", "txc", "--list", "txc", "--template", "newsletter",
                    "--subject", "Benchmark news", "--from", "news@example.test"], env=env, check=True, capture_output=True)
    subprocess.run([b.BIN, "enqueue", "txc"], env=env, check=True, capture_output=True)
    api = None if args.tx_cli else Api(b, env, svc)
    procs = workers(b, env, args, smtp_url)
    while b.status(env, "txc")["sent"] < args.n // 10:
        time.sleep(0.2)
    # The same length of sending just before the messages: the rate to
    # compare with, in the same run and the same stretch of the campaign.
    def cpu():
        return {"workers": sum(b.cpu_s(p.pid) or 0.0 for p in procs),
                "serve": b.cpu_s(api.proc.pid) or 0.0 if api else 0.0,
                "sink": b.cpu_s(sink.pid) or 0.0, "client": time.process_time()}
    quiet, tq, c0 = b.status(env, "txc")["sent"], time.time(), cpu()
    time.sleep(args.tx_seconds)
    before, t, c1 = b.status(env, "txc")["sent"], time.time(), cpu()
    if args.tx_cli:
        failures, elapsed = submit_spread(b, env, args.tx_n, args.tx_seconds)
    else:
        failures, _ = api_spread(api, args.tx_n, args.tx_seconds, "tx", args.tx_client_nice)
        elapsed = time.time() - t
    after, t2, c2 = b.status(env, "txc")["sent"], time.time(), cpu()
    quiet_cpu = {k: c1[k] - c0[k] for k in c0}
    with_cpu = {k: c2[k] - c1[k] for k in c0}
    deadline = time.time() + 300
    while latencies(db_path)[1] < args.tx_n - failures and time.time() < deadline:
        time.sleep(0.5)
    stop(procs)
    lat, sent = latencies(db_path)
    return {"campaign_rate_with": (after - before) / (t2 - t), "campaign_rate_before": (before - quiet) / (t - tq),
            "submit_failures": failures,
            "submit_seconds": elapsed, "messages_sent": sent, "p50": pct(lat, 50), "p99": pct(lat, 99),
            "max": lat[-1] if lat else float("nan"), "campaign_sent_at_window_end": after,
            "cpu": cost_per_message(quiet_cpu, before - quiet, with_cpu, after - before, args.tx_n - failures)}


def cost_per_message(quiet, campaign_quiet, with_, campaign_with, messages):
    """CPU microseconds: a campaign message's (workers, before the
    messages); a transactional message's to mailsplit (workers and serve in
    the window with the messages, less what its campaign messages and an
    idle serve cost at the rate before); the client's per POST (the test
    rig, not mailsplit); the sink's per message in each window."""
    per_campaign = quiet["workers"] / campaign_quiet if campaign_quiet else float("nan")
    extra = with_["workers"] + with_["serve"] - campaign_with * per_campaign - quiet["serve"]
    return {
        "campaign_us": per_campaign * 1e6,
        "message_us": extra / messages * 1e6 if messages else float("nan"),
        "client_us": with_["client"] / messages * 1e6 if messages else float("nan"),
        "client_share": with_["client"] / (with_["workers"] + with_["serve"] + with_["sink"] + with_["client"]),
        "sink_quiet_us": quiet["sink"] / campaign_quiet * 1e6 if campaign_quiet else float("nan"),
    }


def accept_rate(b, base_env, tmp, run, svc):
    env = dict(base_env, DATABASE_URL=f"sqlite://{tmp}/accept-{run}.db", MAILSPLIT_TUBE=f"bench-accept-{run}")
    subprocess.run([b.BIN, "migrate"], env=env, check=True, capture_output=True)
    template(b, env, tmp)
    api = Api(b, env, svc)
    api_failures, api_rate = api_spread(api, 4000, 0, f"api{run}")
    svc.stop(api.proc)
    if api_failures:
        print(f"    {api_failures} of 4000 POSTs not accepted", flush=True)
    n = 500
    cli_start = time.time()
    with concurrent.futures.ThreadPoolExecutor(IN_FLIGHT) as pool:
        codes = list(pool.map(lambda i: submit(b, env, i, f"a{run}")[0], range(n)))
    cli = (n - sum(c != 0 for c in codes)) / (time.time() - cli_start)
    _, library = library_submit(env, 2000, 0, f"l{run}") if os.path.exists(SUBMITTER) else (0, float("nan"))
    return api_rate, cli, library


def run(args, b):
    tmp = tempfile.mkdtemp(prefix="mailsplit-bench-tx-")
    svc = b.Services(tmp)
    try:
        bs = svc.beanstalkd()
        base = dict(os.environ, BEANSTALKD=f"127.0.0.1:{bs}", MAILSPLIT_LOG="warn")
        sink_port, sink = svc.smtp_sink()
        smtp = f"smtp://127.0.0.1:{sink_port}"
        print(f"==> campaign alone: {args.n:,} recipients, {args.workers} workers x {args.concurrency}", flush=True)
        env = dict(base, DATABASE_URL=f"sqlite://{tmp}/alone.db", MAILSPLIT_TUBE="bench-tx-alone")
        alone = b.campaign(env, tmp, args.n, "alone", args.workers, args.concurrency, smtp, 1800)
        print(f"==> the same campaign with {args.tx_n} messages over {args.tx_seconds} s", flush=True)
        db_path = f"{tmp}/with.db"
        env = dict(base, DATABASE_URL=f"sqlite://{db_path}", MAILSPLIT_TUBE="bench-tx-with")
        w = with_messages(b, env, tmp, args, smtp, db_path, svc, sink)
        print("==> accept rates of the API, `mailsplit send` and the library, no worker (3 runs)", flush=True)
        rates = [accept_rate(b, base, tmp, r, svc) for r in range(3)]
    finally:
        svc.stop()
    r = dict(w, campaign_rate_alone=alone["sending_msg_per_s"] or alone["msg_per_s"],
             api_median=statistics.median(a for a, _, _ in rates), api_all=[a for a, _, _ in rates],
             accept_median=statistics.median(x for _, x, _ in rates), accept_all=[x for _, x, _ in rates],
             library_median=statistics.median(y for _, _, y in rates), library_all=[y for _, _, y in rates],
             path="`mailsplit send` processes" if args.tx_cli else "POST /api/v1/messages")
    report(args, r)


def report(args, r):
    lines = [
        f"messages: {args.tx_n} over {args.tx_seconds:g} s via {r['path']}, "
        f"{r['messages_sent']} sent, {r['submit_failures']} submits failed",
        f"latency submit -> ledger sent_at: p50 {r['p50'] * 1000:.0f} ms, p99 {r['p99'] * 1000:.0f} ms, max {r['max'] * 1000:.0f} ms",
        f"campaign rate: alone {r['campaign_rate_alone']:.0f} msg/s; in the same run, {args.tx_seconds:g} s before the "
        f"messages {r['campaign_rate_before']:.0f} msg/s, during them {r['campaign_rate_with']:.0f} msg/s "
        f"({(r['campaign_rate_with'] / r['campaign_rate_before'] - 1) * 100:+.1f} %; the messages are "
        f"{args.tx_n / args.tx_seconds / r['campaign_rate_before'] * 100:.1f} % of the traffic)",
        f"CPU: a campaign message {r['cpu']['campaign_us']:.0f} us of the workers'; a transactional message "
        f"{r['cpu']['message_us']:.0f} us of mailsplit's (serve + workers, beyond the campaign's own); the client "
        f"{r['cpu']['client_us']:.0f} us per POST ({r['cpu']['client_share'] * 100:.1f} % of the window's CPU, "
        f"at nice {args.tx_client_nice})",
        f"accept rate of the API (16 keep-alive connections, no worker): median {r['api_median']:.0f} msg/s "
        f"({', '.join(f'{x:.0f}' for x in r['api_all'])})",
        f"accept rate of send (16 in flight, no worker): median {r['accept_median']:.0f} msg/s "
        f"({', '.join(f'{x:.0f}' for x in r['accept_all'])})",
    ]
    if r["library_median"] == r["library_median"]:  # not NaN: tx-submit was built
        lines.append(f"accept rate of the library (one thread, one connection): median {r['library_median']:.0f} msg/s "
                     f"({', '.join(f'{x:.0f}' for x in r['library_all'])})")
    print("\n" + "\n".join(lines))
    day = datetime.date.today().isoformat()
    row = (f"| {day} | transactional (SQLite, smtp-sink, {args.n:,} campaign, {args.workers}x{args.concurrency}) "
           f"| {args.tx_n} msgs/{args.tx_seconds:g} s via {r['path']}: p50 {r['p50'] * 1000:.0f} ms, p99 {r['p99'] * 1000:.0f} ms "
           f"(submit start to ledger sent_at); campaign {r['campaign_rate_alone']:.0f} msg/s alone, "
           f"{r['campaign_rate_before']:.0f} msg/s in the {args.tx_seconds:g} s before the messages, "
           f"{r['campaign_rate_with']:.0f} msg/s meanwhile "
           f"({(r['campaign_rate_with'] / r['campaign_rate_before'] - 1) * 100:+.1f} % against a "
           f"{args.tx_n / args.tx_seconds / r['campaign_rate_before'] * 100:.1f} % share); CPU per message: campaign "
           f"{r['cpu']['campaign_us']:.0f} us, transactional {r['cpu']['message_us']:.0f} us (serve + workers), "
           f"client {r['cpu']['client_us']:.0f} us per POST at nice {args.tx_client_nice}; accepted: API {r['api_median']:.0f} msg/s (16 connections), "
           f"`send` {r['accept_median']:.0f} msg/s (16 processes), "
           f"library {r['library_median']:.0f} msg/s (one thread), medians of 3 |\n")
    head = ("\n## Transactional messages beside a campaign (`scripts/bench.sh --transactional`)\n\n"
            "| date | setting | figures |\n|---|---|---|\n")
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "BENCHMARKS.md"), "a") as f:
        f.write(head + row)
