#!/usr/bin/env python3
"""Flows at scale (issue 39): N members entering a join flow by one import,
release build, SQLite, smtp-sink on loopback.

For each N of --sizes (default 1000,100000,1000000):
  1. import the N-row CSV into a list with no flow (fresh database): seconds;
  2. on another fresh database, a marketing template (tracking opens and
     clicks with --track; the reference campaign tracks nothing) and a
     join flow on the list (`--step 0:welcome`), then the same
     import: seconds, and its ratio to 1 (target: at most 1.2);
  3. unless --import-only: --workers workers send the first step to a fresh
     smtp-sink; from the messages ledger:
       - scheduling cost per due step: (last - first step message's
         created_at) / (N - 1), in microseconds: how long the scheduler takes
         per entry once it runs (target: flat from 1k to 1M);
       - the first step's send rate: N / (last sent_at - first created_at);
  4. unless --import-only or --skip-campaign: a campaign to the same N
     (fresh database, built-in template, same workers) for the reference
     rate (`status`'s avg_rate, first to last outcome; target: the flow's
     rate at least 0.9 of it).
Also the workers' CPU per message sent (user + system, the flow's with its
scheduler) and the campaign's over the flow's: on a machine shared with
other work the rates move with the load, the CPU per message much less.
Prints the figures and Markdown rows for BENCHMARKS.md; appends nothing.
Every service it starts listens on a free loopback port and is stopped.

  python3 scripts/bench_flow.py [--sizes 1000,100000] [--import-only]
"""
import argparse
import datetime
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (Services, run_measured, write_csv, campaign, BIN)

STEP_HTML = """<html><body><h1>Welcome, {{ name }}</h1>
<p>Thanks for joining. Our <a href="https://shop.example.test/new?from=welcome">new arrivals</a>
and <a href="https://shop.example.test/help">help pages</a>.</p>
<p><a href="{{ preferences_url }}">Preferences</a> - <a href="{{ view_url }}">View online</a></p>
</body></html>
"""


# Whether the flow's step tracks opens and clicks (--track).
TRACK = False


def fresh_sqlite(tmp, name):
    path = os.path.join(tmp, f"{name}.db")
    for suffix in ("", "-wal", "-shm", "-import-lock"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    return path


def run(argv, env):
    out = subprocess.run([bench.BIN] + argv, env=env, capture_output=True)
    if out.returncode != 0:
        sys.exit(f"bench: {' '.join(argv)} failed:\n{out.stderr.decode(errors='replace')}")
    return out.stdout.decode()


def import_plain(tmp, csv, env):
    path = fresh_sqlite(tmp, "plain")
    e = dict(env, DATABASE_URL=f"sqlite://{path}")
    run(["migrate"], e)
    dt, rss, _ = bench.run_measured([bench.BIN, "import", csv, "--list", "bench"], e)
    return dt, rss


def import_with_flow(tmp, csv, env):
    path = fresh_sqlite(tmp, "flow")
    e = dict(env, DATABASE_URL=f"sqlite://{path}")
    run(["migrate"], e)
    html = os.path.join(tmp, "welcome.html")
    with open(html, "w") as f:
        f.write(STEP_HTML)
    # Untracked unless --track: the reference campaign (the built-in
    # newsletter, no public URL) tracks nothing either, and a tracked
    # message costs more to compose (a signed URL per link and the pixel).
    track = ["--track", "opens,clicks", "--public-url", "https://mail.example.test"] if TRACK else []
    run(["template", "create", "welcome", "--html", html, "--subject", "Welcome",
         "--from", "news@example.test", "--stream", "marketing"] + track, e)
    run(["flow", "create", "welcome", "--list", "bench", "--trigger", "join", "--step", "0:welcome"], e)
    dt, rss, _ = bench.run_measured([bench.BIN, "import", csv, "--list", "bench"], e)
    return dt, rss, path, e


def send_first_step(svc, path, env, n, args):
    """Workers until every entry's first step is sent (or --timeout)."""
    bs = svc.beanstalkd()
    sink_port, _ = svc.smtp_sink()
    wenv = dict(env, BEANSTALKD=f"127.0.0.1:{bs}", SMTP_URL=f"smtp://127.0.0.1:{sink_port}",
                MAILSPLIT_LOG="warn")
    start = time.time()
    procs = [subprocess.Popen([bench.BIN, "worker", "--concurrency", str(args.concurrency)], env=wenv,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(args.workers)]
    db = sqlite3.connect(path, timeout=30)
    try:
        while time.time() - start < args.timeout:
            done = db.execute("SELECT COUNT(*) FROM messages WHERE status IN ('sent', 'failed')").fetchone()[0]
            if done >= n:
                break
            time.sleep(0.5 if n > 10_000 else 0.1)
        wall = time.time() - start
        # Before they stop: the workers' CPU (the scheduler's with it), a
        # figure a loaded machine moves less than the rates.
        worker_cpu = sum(bench.cpu_s(p.pid) or 0.0 for p in procs)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(60)
        svc.stop()
    first_c, last_c, queued = db.execute(
        "SELECT MIN(created_at), MAX(created_at), COUNT(*) FROM messages").fetchone()
    first_s, last_s, sent = db.execute(
        "SELECT MIN(sent_at), MAX(sent_at), COUNT(*) FROM messages WHERE status = 'sent'").fetchone()
    # Per second from the first step stored: steps stored and sent (where
    # the time goes: the scheduler, or the workers after it).
    hist = {}
    for col in ("created_at", "sent_at"):
        rows = db.execute(
            f"SELECT ({col} - ?) / 1000, COUNT(*) FROM messages WHERE {col} IS NOT NULL GROUP BY 1 ORDER BY 1",
            (first_c,)).fetchall() if queued else []
        hist[col] = [c for _, c in rows]
    db.close()
    print(f"stored per second: {hist['created_at']}\nsent per second:   {hist['sent_at']}", flush=True)
    per_step_us = (last_c - first_c) * 1000 / max(queued - 1, 1) if queued else float("nan")
    span_s = (last_s - first_c) / 1000 if sent else float("nan")
    return {
        "queued": queued, "sent": sent, "wall_s": wall,
        "schedule_us_per_step": per_step_us,
        "schedule_s": (last_c - first_c) / 1000 if queued else float("nan"),
        "flow_msg_per_s": sent / span_s if sent and span_s > 0 else float("nan"),
        "worker_cpu_us": worker_cpu / sent * 1e6 if sent else float("nan"),
    }


def campaign_rate(svc, tmp, csv_dir, n, env, args):
    path = fresh_sqlite(tmp, "campaign")
    bs = svc.beanstalkd()
    sink_port, sink = svc.smtp_sink()
    e = dict(env, DATABASE_URL=f"sqlite://{path}", BEANSTALKD=f"127.0.0.1:{bs}")
    try:
        r = bench.campaign(e, csv_dir, n, f"bench{n}", args.workers, args.concurrency,
                           f"smtp://127.0.0.1:{sink_port}", args.timeout, sink=sink)
    finally:
        svc.stop()
    return r["sending_msg_per_s"], r["worker_cpu_us"]


def one_size(n, args, tmp):
    csv = os.path.join(tmp, f"bench{n}.csv")
    bench.write_csv(csv, n)
    env = dict(os.environ, MAILSPLIT_LOG="warn")
    r = {"n": n, "load_before": os.getloadavg()[0]}
    print(f"==> N = {n:,}: import without a flow", flush=True)
    r["import_plain_s"], r["import_plain_rss"] = import_plain(tmp, csv, env)
    print(f"==> N = {n:,}: import into a list with a join flow", flush=True)
    r["import_flow_s"], r["import_flow_rss"], path, fenv = import_with_flow(tmp, csv, env)
    r["import_ratio"] = r["import_flow_s"] / r["import_plain_s"]
    report = json.loads(run(["flow", "report", "welcome", "--json"], fenv))
    r["entered"] = report["entered"]
    if not args.import_only:
        print(f"==> N = {n:,}: first step sent by {args.workers} workers", flush=True)
        svc = bench.Services(tmp)
        try:
            r.update(send_first_step(svc, path, fenv, n, args))
            if not args.skip_campaign:
                print(f"==> N = {n:,}: the same N as a campaign", flush=True)
                r["campaign_msg_per_s"], r["campaign_worker_cpu_us"] = campaign_rate(
                    svc, tmp, tmp, n, env, args)
                r["rate_ratio"] = r["flow_msg_per_s"] / r["campaign_msg_per_s"]
                r["cpu_ratio"] = r["campaign_worker_cpu_us"] / r["worker_cpu_us"]
        finally:
            svc.stop()
    r["load_after"] = os.getloadavg()[0]
    print(json.dumps(r), flush=True)
    return r


def fmt(v, digits=1):
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


def rows(results):
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            cwd=bench.ROOT).stdout.decode().strip()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    print(f"\n{when} UTC, commit {commit}, {os.cpu_count()} cores, SQLite, release build")
    print("| N | import s (no flow) | import s (join flow) | ratio | entered | scheduling µs / due step "
          "| step 1 sent msg/s | campaign msg/s | flow / campaign | worker CPU µs / msg (flow / campaign) "
          "| CPU campaign / flow | load before / after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['n']:,} | {fmt(r['import_plain_s'], 2)} | {fmt(r['import_flow_s'], 2)} "
              f"| {fmt(r['import_ratio'], 2)} | {fmt(r['entered'])} | {fmt(r.get('schedule_us_per_step'))} "
              f"| {fmt(r.get('flow_msg_per_s'), 0)} | {fmt(r.get('campaign_msg_per_s'), 0)} "
              f"| {fmt(r.get('rate_ratio'), 2)} "
              f"| {fmt(r.get('worker_cpu_us'), 0)} / {fmt(r.get('campaign_worker_cpu_us'), 0)} "
              f"| {fmt(r.get('cpu_ratio'), 2)} | {r['load_before']:.1f} / {r['load_after']:.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,100000,1000000", help="comma-separated N (members)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per send at most")
    ap.add_argument("--import-only", action="store_true", help="steps 1-2 only")
    ap.add_argument("--skip-campaign", action="store_true", help="no reference campaign")
    ap.add_argument("--bin", default=bench.BIN)
    ap.add_argument("--track", action="store_true",
                    help="the step tracks opens and clicks (the reference campaign does not)")
    args = ap.parse_args()
    bench.BIN = args.bin
    global TRACK
    TRACK = args.track
    tmp = tempfile.mkdtemp(prefix="mailsplit-bench-flow-")
    results = []
    try:
        for n in [int(x) for x in args.sizes.split(",") if x.strip()]:
            results.append(one_size(n, args, tmp))
    finally:
        subprocess.run(["rm", "-rf", tmp])
        if results:
            rows(results)


if __name__ == "__main__":
    main()
