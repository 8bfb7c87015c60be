#!/usr/bin/env python3
"""mailsplit benchmark: one run on this machine, on loopback, side by side with
smtp-source (the raw SMTP reference) and the seed articles' Python pipeline.

Called by scripts/bench.sh (which installs and builds first). Steps:
  1. generate N recipients and import them (time, peak RSS)
  2. enqueue the campaign (time, jobs/s, peak RSS)
  3. smtp-source's raw rate to a fresh smtp-sink (same message size, 20 sessions)
  4. the campaign with W workers: msg/s, wall time, peak RSS per worker,
     ratio to smtp-source
  5. the same N through ../shared/bench/peer_seed003.py; ratio
  6. latency-bound relay (smtp-sink -w 1), --concurrency 200, one worker
  7. steps 1-4 again on PostgreSQL
Prints a table and appends a dated row to BENCHMARKS.md.

--dkim-compare runs only step 4 (SQLite, smtp-sink) three times on fresh
databases: unsigned, with an RSA 2048 key and with an ed25519 key for the
From domain (`mailsplit dkim keygen`), and prints msg/s for each: the cost
of signing. Nothing is appended to BENCHMARKS.md. Every service it
starts (beanstalkd, smtp-sink) listens on a free loopback port and is stopped
at the end.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "mailsplit")
PEER = os.path.join(ROOT, "..", "shared", "bench", "peer_seed003.py")
SMTP_SINK = "/usr/sbin/smtp-sink"
SMTP_SOURCE = "/usr/sbin/smtp-source"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, what, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"bench: {what} did not start on port {port}")


class Services:
    """beanstalkd and smtp-sink processes started by this run."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []

    def start(self, argv, port, what):
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        wait_port(port, what)
        return p

    def beanstalkd(self):
        port = free_port()
        binlog = tempfile.mkdtemp(dir=self.tmp, prefix="binlog")
        self.start(["beanstalkd", "-l", "127.0.0.1", "-p", str(port), "-b", binlog], port, "beanstalkd")
        return port

    def smtp_sink(self, extra=()):
        port = free_port()
        p = self.start([SMTP_SINK, *extra, "-u", "nobody", f"127.0.0.1:{port}", "1000"], port, "smtp-sink")
        return port, p

    def stop(self, p=None):
        for q in [p] if p else list(self.procs):
            if q.poll() is None:
                q.terminate()
                try:
                    q.wait(10)
                except subprocess.TimeoutExpired:
                    q.kill()
            if q in self.procs:
                self.procs.remove(q)


def run_measured(argv, env):
    """Run a command to completion; return (seconds, its peak RSS in MB, stdout)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.time()
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        dt = time.time() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            sys.exit(f"bench: {' '.join(argv)} failed:\n{err.read().decode(errors='replace')}")
        return dt, usage.ru_maxrss / 1024, out.read().decode()


def vm_hwm_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def status(env, name):
    out = subprocess.run([BIN, "status", name, "--json"], env=env, capture_output=True, check=True)
    return json.loads(out.stdout)


def write_csv(path, n):
    with open(path, "w") as f:
        f.write("email,name,city,code\n")
        for i in range(1, n + 1):
            f.write(f"user{i}@example.test,User {i},City {i % 97},C{i % 1000}\n")


def campaign(env, tmp, n, name, workers, concurrency, smtp_url, timeout, dkim=None):
    """Import, enqueue and send one campaign; return the figures. With
    dkim="rsa" or "ed25519", the From domain gets a key of that algorithm
    first, so every message is signed."""
    csv = os.path.join(tmp, f"{name}.csv")
    if not os.path.exists(csv):
        write_csv(csv, n)
    subprocess.run([BIN, "migrate"], env=env, check=True, capture_output=True)
    if dkim:
        subprocess.run([BIN, "dkim", "keygen", "example.test", "--algorithm", dkim, "--selector", f"bench-{dkim}"],
                       env=env, check=True, capture_output=True)
    imp_s, imp_rss, _ = run_measured([BIN, "import", csv, "--list", name], env)
    subprocess.run([BIN, "campaign", "create", name, "--list", name, "--template", "newsletter",
                    "--subject", "Benchmark news", "--from", "news@example.test"],
                   env=env, check=True, capture_output=True)
    enq_s, enq_rss, enq_out = run_measured([BIN, "enqueue", name], env)
    jobs = int(re.search(r"in (\d+) jobs", enq_out).group(1))
    wenv = dict(env, SMTP_URL=smtp_url, MAILSPLIT_LOG="warn")
    start = time.time()
    procs = [subprocess.Popen([BIN, "worker", "--concurrency", str(concurrency)], env=wenv,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(workers)]
    deadline = start + timeout
    while True:
        s = status(env, name)
        if s["pending"] == 0:
            break
        if time.time() > deadline:
            break
        time.sleep(0.2)
    wall = time.time() - start
    rss = [vm_hwm_mb(p.pid) for p in procs]
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(60)
    s = status(env, name)
    done = s["sent"] + s["failed"]
    return {
        "import_s": imp_s, "import_rss_mb": imp_rss,
        "enqueue_s": enq_s, "enqueue_rss_mb": enq_rss, "jobs": jobs, "jobs_per_s": jobs / enq_s,
        "sent": s["sent"], "failed": s["failed"], "pending": s["pending"],
        "wall_s": wall, "msg_per_s": done / wall, "worker_rss_mb": rss,
    }


def message_size(env, name):
    out = subprocess.run([BIN, "preview", name], env=env, capture_output=True, check=True)
    return len(out.stdout)


def smtp_source_rate(port, size, count):
    t = time.time()
    subprocess.run([SMTP_SOURCE, "-d", "-s", "20", "-l", str(size), "-m", str(count),
                    "-f", "news@example.test", "-t", "user@example.test", f"127.0.0.1:{port}"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return count / (time.time() - t)


def peer_rate(python, tmp, n, smtp_port, bs_port):
    out = subprocess.run([python, PEER, os.path.join(tmp, "peer.db"), str(n), "2", "200",
                          str(smtp_port), str(bs_port)], capture_output=True, check=True, timeout=3600)
    m = re.search(r"= (\d+) msg/s", out.stdout.decode())
    return float(m.group(1)) if m else float("nan")


def pg_url(base, name):
    return f"{base}/{name}"


def psql(base, sql):
    subprocess.run(["psql", pg_url(base, "test"), "-qc", sql], check=True, capture_output=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="recipients (default 1,000,000)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--concurrency", type=int, default=100, help="SMTP sessions per worker (default 100)")
    ap.add_argument("--peer-python", default=os.path.join(ROOT, ".peerenv", "bin", "python"),
                    help="python with greenstalk, aiosmtplib, jinja2 (scripts/bench.sh makes it)")
    ap.add_argument("--pg", default=os.environ.get("MAILSPLIT_TEST_PG", "postgres://root@127.0.0.1:5432"),
                    help="PostgreSQL base URL (a database is created and dropped)")
    ap.add_argument("--skip", default="", help="comma-separated steps to skip: peer,latency,pg")
    ap.add_argument("--latency-n", type=int, default=4000, help="recipients for the latency-bound run")
    ap.add_argument("--dkim-compare", action="store_true",
                    help="only the SQLite campaign, unsigned vs RSA 2048 vs ed25519 DKIM (see above)")
    ap.add_argument("--bin", default=BIN, help=f"mailsplit binary (default {BIN})")
    args = ap.parse_args()
    set_bin(args.bin)
    if args.dkim_compare:
        return dkim_compare(args)
    skip = set(filter(None, args.skip.split(",")))
    tmp = tempfile.mkdtemp(prefix="mailsplit-bench-")
    svc = Services(tmp)
    results = {}
    try:
        bs = svc.beanstalkd()
        base_env = dict(os.environ, BEANSTALKD=f"127.0.0.1:{bs}", MAILSPLIT_LOG="warn")
        env = dict(base_env, DATABASE_URL=f"sqlite://{tmp}/bench.db", MAILSPLIT_TUBE="bench-sqlite")
        sink_port, sink = svc.smtp_sink()

        print(f"==> SQLite: import, enqueue and send {args.n:,} recipients with {args.workers} workers", flush=True)
        # smtp-source first, on the same sink, with our message size.
        subprocess.run([BIN, "migrate"], env=env, check=True, capture_output=True)
        results["sqlite"] = None
        sq = campaign_with_reference(env, tmp, args, sink_port, results)
        results["sqlite"] = sq

        if "peer" not in skip:
            print(f"==> seed pipeline (peer_seed003.py), {args.n:,} recipients, 2 workers x 200 senders", flush=True)
            results["peer_msg_per_s"] = peer_rate(args.peer_python, tmp, args.n, sink_port, bs)

        if "latency" not in skip:
            print("==> latency-bound relay: smtp-sink -w 1, one worker, --concurrency 200", flush=True)
            slow_port, _ = svc.smtp_sink(["-w", "1"])
            lenv = dict(base_env, DATABASE_URL=f"sqlite://{tmp}/latency.db", MAILSPLIT_TUBE="bench-latency")
            r = campaign(lenv, tmp, args.latency_n, "latency", 1, 200, f"smtp://127.0.0.1:{slow_port}", 600)
            results["latency_msg_per_s"] = r["msg_per_s"]

        if "pg" not in skip:
            db = f"mailsplit_bench_{os.getpid()}"
            psql(args.pg, f"DROP DATABASE IF EXISTS {db}")
            psql(args.pg, f"CREATE DATABASE {db}")
            try:
                print(f"==> PostgreSQL: the same campaign", flush=True)
                penv = dict(base_env, DATABASE_URL=pg_url(args.pg, db), MAILSPLIT_TUBE="bench-pg")
                results["pg"] = campaign(penv, tmp, args.n, "bench", args.workers, args.concurrency,
                                         f"smtp://127.0.0.1:{sink_port}", 1800)
            finally:
                psql(args.pg, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    finally:
        svc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    report(args, results)


def set_bin(path):
    global BIN
    BIN = os.path.abspath(path)
    if not os.access(BIN, os.X_OK):
        sys.exit(f"bench: {BIN} is not an executable; build it with cargo build --release")


def dkim_compare(args):
    """The same SQLite campaign unsigned, RSA-signed and ed25519-signed."""
    tmp = tempfile.mkdtemp(prefix="mailsplit-bench-dkim-")
    svc = Services(tmp)
    rates = {}
    try:
        bs = svc.beanstalkd()
        sink_port, _ = svc.smtp_sink()
        csv = os.path.join(tmp, "bench.csv")
        write_csv(csv, args.n)
        for mode in ("none", "rsa", "ed25519"):
            print(f"==> {args.n:,} recipients, {args.workers} workers, DKIM: {mode}", flush=True)
            env = dict(os.environ, BEANSTALKD=f"127.0.0.1:{bs}", MAILSPLIT_LOG="warn",
                       DATABASE_URL=f"sqlite://{tmp}/bench-{mode}.db", MAILSPLIT_TUBE=f"bench-{mode}")
            r = campaign(env, tmp, args.n, "bench", args.workers, args.concurrency,
                         f"smtp://127.0.0.1:{sink_port}", 1800, dkim=None if mode == "none" else mode)
            rates[mode] = r
            print(f"    {r['msg_per_s']:,.0f} msg/s ({r['wall_s']:.1f} s wall, sent {r['sent']:,}, "
                  f"pending {r['pending']:,}, {message_size(env, 'bench')} B messages)", flush=True)
    finally:
        svc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    base = rates["none"]["msg_per_s"]
    print(f"\nDKIM signing cost, {args.n:,} recipients, {args.workers} workers x {args.concurrency} sessions, "
          f"{os.cpu_count()} cores:")
    for mode, r in rates.items():
        print(f"  {mode:<8} {r['msg_per_s']:>10,.0f} msg/s  {r['msg_per_s'] / base * 100:5.1f} % of unsigned")


def campaign_with_reference(env, tmp, args, sink_port, results):
    csv = os.path.join(tmp, "bench.csv")
    write_csv(csv, args.n)
    r = campaign(env, tmp, args.n, "bench", args.workers, args.concurrency,
                 f"smtp://127.0.0.1:{sink_port}", 1800)
    size = message_size(env, "bench")
    print(f"==> smtp-source reference: 20 sessions, {size}-byte messages, same smtp-sink", flush=True)
    results["message_bytes"] = size
    results["smtp_source_msg_per_s"] = smtp_source_rate(sink_port, size, min(args.n, 200_000))
    return r


def fmt(x, digits=0):
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return f"{x:,.{digits}f}"


def report(args, r):
    sq, pg = r.get("sqlite") or {}, r.get("pg") or {}
    src = r.get("smtp_source_msg_per_s")
    peer = r.get("peer_msg_per_s")
    rows = [
        ("recipients", fmt(args.n)),
        ("import", f"{fmt(sq.get('import_s'), 1)} s, peak RSS {fmt(sq.get('import_rss_mb'))} MB"),
        ("enqueue", f"{fmt(sq.get('enqueue_s'), 2)} s, {fmt(sq.get('jobs_per_s'))} jobs/s, peak RSS {fmt(sq.get('enqueue_rss_mb'))} MB"),
        ("smtp-source raw rate", f"{fmt(src)} msg/s ({r.get('message_bytes')} B messages, 20 sessions)"),
        (f"mailsplit SQLite, {args.workers} workers", f"{fmt(sq.get('msg_per_s'))} msg/s, {fmt(sq.get('wall_s'), 1)} s wall, sent {fmt(sq.get('sent'))}, pending {fmt(sq.get('pending'))}"),
        ("  ratio to smtp-source", fmt(sq.get('msg_per_s', 0) / src * 100, 1) + " %" if src else "-"),
        ("  worker peak RSS", ", ".join(f"{x:.1f} MB" for x in sq.get("worker_rss_mb", []))),
        ("seed pipeline (Python)", f"{fmt(peer)} msg/s"),
        ("  mailsplit / seed", f"{sq.get('msg_per_s', 0) / peer:.1f}x" if peer else "-"),
        ("latency-bound (1 s/msg, 200 sessions)", f"{fmt(r.get('latency_msg_per_s'), 1)} msg/s"),
        (f"mailsplit PostgreSQL, {args.workers} workers", f"{fmt(pg.get('msg_per_s'))} msg/s, {fmt(pg.get('wall_s'), 1)} s wall; enqueue {fmt(pg.get('enqueue_s'), 2)} s; import {fmt(pg.get('import_s'), 1)} s"),
        ("  PostgreSQL / SQLite", f"{pg['msg_per_s'] / sq['msg_per_s'] * 100:.0f} %" if pg and sq else "-"),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True).stdout.decode().strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True).stdout.strip()
    if dirty:
        commit += " (uncommitted changes)"
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    machine = f"{os.cpu_count()} cores {cpu}".strip()
    path = os.path.join(ROOT, "BENCHMARKS.md")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write("# Benchmarks\n\nRows appended by `scripts/bench.sh` (one run each, loopback, one machine).\n"
                    "Rates in msg/s; RSS is peak resident memory.\n\n"
                    "| date | machine | commit | N | import s | enqueue s (jobs/s) | smtp-source | SQLite msg/s (% of smtp-source) | wall s | worker RSS MB | seed peer msg/s (x) | latency-bound msg/s | PostgreSQL msg/s (% of SQLite) |\n"
                    "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    with open(path, "a") as f:
        f.write("| {date} | {machine} | {commit} | {n} | {imp} | {enq} ({jps}) | {src} | {sq} ({ratio}) | {wall} | {rss} | {peer} ({px}) | {lat} | {pg} ({pgr}) |\n".format(
            date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            machine=machine, commit=commit, n=fmt(args.n),
            imp=fmt(sq.get("import_s"), 1), enq=fmt(sq.get("enqueue_s"), 2), jps=fmt(sq.get("jobs_per_s")),
            src=fmt(src), sq=fmt(sq.get("msg_per_s")),
            ratio=f"{sq['msg_per_s'] / src * 100:.0f} %" if src and sq else "-",
            wall=fmt(sq.get("wall_s"), 1), rss=" / ".join(f"{x:.0f}" for x in sq.get("worker_rss_mb", [])),
            peer=fmt(peer), px=f"{sq['msg_per_s'] / peer:.1f}x" if peer and sq else "-",
            lat=fmt(r.get("latency_msg_per_s"), 1),
            pg=fmt(pg.get("msg_per_s")), pgr=f"{pg['msg_per_s'] / sq['msg_per_s'] * 100:.0f} %" if pg and sq else "-"))
    print(f"\nappended a row to {path}")


if __name__ == "__main__":
    main()
