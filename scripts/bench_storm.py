"""`scripts/bench.py --open-storm`: an open and click storm on `mailsplit
serve` while workers send a tracked campaign (issue 26).

Starts beanstalkd, smtp-sink, SQLite (or PostgreSQL with --storm-db pg),
imports --storm-n recipients, creates a campaign with `--track
opens,clicks`, starts `serve` and --workers workers, and once they send,
hammers serve's public listener with `wrk` (Debian package `wrk`; the
installer puts it in) for --storm-seconds over --storm-connections
connections: GET /o/TOKEN and /c/TOKEN/N for real tokens, read from the
messages `mailsplit preview` composes for --storm-tokens recipients (3
clicks for each open). Then it stops serve with SIGTERM (which records
what is queued) and compares the ledger's opens + clicks with the
responses wrk got. Prints requests/s, latency percentiles, the campaign's
send rate during the storm and the load average. Not a test: nothing
here asserts a speed.
"""

import email
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

STORM_HTML = """<html><body><p>Hello {{ name | default("friend") }},</p>
<p><a href="https://shop.example/spring?utm=mail">Spring offers</a>
<a href="https://shop.example/stores">Our stores</a>
<a href="https://shop.example/help">Help</a></p>
<p><a href="{{ unsubscribe_url }}">Unsubscribe</a></p></body></html>
"""

WRK_LUA = """
local paths = {}
for line in io.lines("%s") do paths[#paths + 1] = line end
local i = 0
request = function()
  i = i + 1
  return wrk.format("GET", paths[(i %% #paths) + 1])
end
done = function(summary, latency, requests)
  io.write(string.format("STORM requests=%%d errors_status=%%d errors_connect=%%d errors_read=%%d errors_timeout=%%d duration_us=%%d p50_us=%%d p90_us=%%d p99_us=%%d max_us=%%d\\n",
    summary.requests, summary.errors.status, summary.errors.connect, summary.errors.read,
    summary.errors.timeout, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max))
end
"""


def add_arguments(ap):
    ap.add_argument("--open-storm", action="store_true",
                    help="only the open/click storm on serve while workers send (scripts/bench_storm.py)")
    ap.add_argument("--storm-n", type=int, default=300_000, help="--open-storm: recipients (default 300,000)")
    ap.add_argument("--storm-seconds", type=int, default=20, help="--open-storm: storm length (default 20)")
    ap.add_argument("--storm-connections", type=int, default=64, help="--open-storm: wrk connections (default 64)")
    ap.add_argument("--storm-tokens", type=int, default=200,
                    help="--open-storm: recipients whose links are hit (default 200)")
    ap.add_argument("--storm-db", choices=["sqlite", "pg"], default="sqlite", help="--open-storm: database")


def tracked_totals(bench, env, name):
    s = bench.status(env, name)
    return s, s.get("opens", 0) + s.get("machine_opens", 0) + s.get("clicks", 0)


def tokens(bench, env, n, public):
    """Paths of the open pixel and the click links of the first n members."""
    paths = []
    for i in range(n):
        out = subprocess.run([bench.BIN, "preview", "storm", "--recipient", f"user{i + 1}@example.test"],
                             env=env, check=True, capture_output=True, text=True).stdout
        message = email.message_from_string(out)
        flat = "".join(part.get_payload(decode=True).decode() for part in message.walk()
                       if part.get_content_maintype() == "text").replace("&#x2f;", "/")
        for m in re.finditer(re.escape(public) + r"(/[oc]/[A-Za-z0-9_-]+(?:/\d+)?)", flat):
            if m.group(1) not in paths:
                paths.append(m.group(1))
    return paths


def open_storm(bench, args):
    if not shutil.which("wrk"):
        sys.exit("bench: --open-storm needs wrk (apt-get install wrk)")
    tmp = tempfile.mkdtemp(prefix="mailsplit-storm-")
    svc = bench.Services(tmp)
    procs = []
    try:
        bs = svc.beanstalkd()
        sink_port, _ = svc.smtp_sink()
        if args.storm_db == "pg":
            db = "storm"
            subprocess.run(["psql", bench.pg_url(args.pg, "postgres"), "-qc", f"DROP DATABASE IF EXISTS {db}"], check=True)
            subprocess.run(["psql", bench.pg_url(args.pg, "postgres"), "-qc", f"CREATE DATABASE {db}"], check=True)
            url = bench.pg_url(args.pg, db)
        else:
            url = f"sqlite://{tmp}/storm.db"
        public_port, admin_port = bench.free_port(), bench.free_port()
        public = f"http://127.0.0.1:{public_port}"
        env = dict(os.environ, BEANSTALKD=f"127.0.0.1:{bs}", MAILSPLIT_LOG="warn", DATABASE_URL=url,
                   MAILSPLIT_TUBE="storm", SMTP_URL=f"smtp://127.0.0.1:{sink_port}")
        env.pop("MAILSPLIT_ADMIN_TOKEN", None)
        run = lambda *a: subprocess.run([bench.BIN, *a], env=env, check=True, capture_output=True, text=True)
        run("migrate")
        csv = os.path.join(tmp, "storm.csv")
        bench.write_csv(csv, args.storm_n)
        print(f"==> open storm: import {args.storm_n:,} recipients ({args.storm_db})", flush=True)
        run("import", csv, "--list", "storm")
        html = os.path.join(tmp, "storm.html")
        with open(html, "w") as f:
            f.write(STORM_HTML)
        run("campaign", "create", "storm", "--list", "storm", "--html", html, "--subject", "Storm",
            "--from", "news@example.com", "--public-url", public, "--track", "opens,clicks")
        paths = tokens(bench, env, args.storm_tokens, public)
        paths_file = os.path.join(tmp, "paths.txt")
        with open(paths_file, "w") as f:
            f.write("\n".join(paths) + "\n")
        lua = os.path.join(tmp, "storm.lua")
        with open(lua, "w") as f:
            f.write(WRK_LUA % paths_file)
        serve = subprocess.Popen([bench.BIN, "serve", "--listen", f"127.0.0.1:{public_port}",
                                  "--admin-listen", f"127.0.0.1:{admin_port}", "--max-connections", "1024"],
                                 env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "serve.log"), "w"))
        procs.append(serve)
        bench.wait_port(public_port, "serve")
        run("enqueue", "storm")
        for i in range(args.workers):
            procs.append(subprocess.Popen([bench.BIN, "worker", "--concurrency", str(args.concurrency)], env=env,
                                          stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, f"w{i}.log"), "w")))
        # why: tokens exist for sent recipients only; a small --storm-n
        # must not wait for more than it has
        while bench.status(env, "storm").get("sent", 0) < min(2000, args.storm_n):
            time.sleep(0.2)
        sent_before = bench.status(env, "storm")["sent"]
        load_before = os.getloadavg()
        print(f"==> open storm: wrk {args.storm_seconds} s, {args.storm_connections} connections, "
              f"{len(paths)} paths, while {args.workers} workers send", flush=True)
        t = time.time()
        out = subprocess.run(["wrk", "-t", "2", "-c", str(args.storm_connections), "-d", f"{args.storm_seconds}s",
                              "-s", lua, "--timeout", "10s", public], capture_output=True, text=True, check=True).stdout
        wall = time.time() - t
        load_after = os.getloadavg()
        sent_after = bench.status(env, "storm")["sent"]
        m = re.search(r"STORM (.*)", out)
        if not m:
            sys.exit(f"bench: no wrk summary:\n{out}")
        w = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
        serve.send_signal(signal.SIGTERM)
        serve.wait(30)
        procs.remove(serve)
        s, recorded = tracked_totals(bench, env, "storm")
        answered = w["requests"] - w["errors_status"]
        rps = w["requests"] / (w["duration_us"] / 1e6)
        send_rate = (sent_after - sent_before) / wall
        print(f"requests {w['requests']:,} in {w['duration_us'] / 1e6:.1f} s: {rps:,.0f} req/s; latency p50 "
              f"{w['p50_us'] / 1000:.1f} ms, p90 {w['p90_us'] / 1000:.1f} ms, p99 {w['p99_us'] / 1000:.1f} ms, "
              f"max {w['max_us'] / 1000:.1f} ms; non-2xx/3xx {w['errors_status']}, socket errors "
              f"{w['errors_connect'] + w['errors_read'] + w['errors_timeout']}")
        print(f"recorded {recorded:,} hits (opens {s.get('opens')}, machine opens {s.get('machine_opens')}, "
              f"clicks {s.get('clicks')}) for {answered:,} answered requests: "
              f"{'every hit recorded' if recorded >= answered else f'{answered - recorded} MISSING'}"
              f"{f' (+{recorded - answered} sent as wrk stopped, unanswered)' if recorded > answered else ''}")
        print(f"meanwhile the workers sent {send_rate:,.0f} msg/s; load average {load_before[0]:.2f} -> "
              f"{load_after[0]:.2f} on {os.cpu_count()} cores")
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        svc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
