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
Prints a table and appends a dated row to BENCHMARKS.md. --repeat N runs
steps 1-4 and 7 N times, interleaved (SQLite, PostgreSQL, SQLite, ...), on
fresh databases each round, and reports each figure's median and min-max
(steps 5 and 6 run once); the row holds the medians.

--network runs the campaign with real round-trip times instead, each server
behind target/release/delay-proxy (which holds every chunk for RTT/2 in each
direction; these kernels have no netem):
  a. relay 20 ms away, 10 connections in total (one worker, --concurrency
     10), with PIPELINING (smtp-sink) and without (smtp-sink -p): rates
     beside their ceilings 10 / (2 x RTT) and 10 / (4 x RTT);
  b. beanstalkd and PostgreSQL 1 ms away from the workers, relay on
     loopback: rate beside the same campaign with everything on loopback.
It prints each rate beside its ceiling and appends a section to
BENCHMARKS.md.

--import-compare times imports only (scripts/bench_import.py): N rows
from CSV and from a PostgreSQL source table, into SQLite and PostgreSQL.

--dkim-compare runs only step 4 (SQLite, smtp-sink) on fresh databases:
unsigned, with an RSA 2048 key, with an ed25519 key and with both for the
From domain (`mailsplit dkim keygen`), and prints msg/s for each beside
`openssl speed rsa2048` and the signing CPU per message (see
scripts/bench_dkim.py; --repeat N: N interleaved rounds, median and
min-max). Nothing is appended to BENCHMARKS.md. Every service it
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
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

import bench_storm
import bench_tx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "mailsplit")
PEER = os.path.join(ROOT, "..", "shared", "bench", "peer_seed003.py")
SMTP_SINK = "/usr/sbin/smtp-sink"
SMTP_SOURCE = "/usr/sbin/smtp-source"
DELAY_PROXY = os.path.join(ROOT, "target", "release", "delay-proxy")


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

    def start(self, argv, port, what, stderr=subprocess.DEVNULL):
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr)
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

    def delay_proxy(self, target_port, one_way_ms, log=None):
        """A delay-proxy in front of 127.0.0.1:target_port; its port. With
        `log`, its stderr (chunks carried per connection) goes there."""
        port = free_port()
        out = open(log, "w") if log else subprocess.DEVNULL
        self.start([DELAY_PROXY, f"127.0.0.1:{port}", f"127.0.0.1:{target_port}", str(one_way_ms)],
                   port, "delay-proxy", stderr=out)
        return port

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


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """A process's CPU time so far (user + system), in seconds, from
    /proc/PID/stat; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the command name: state is field 3, utime 14 and stime 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def backends_of(database):
    """PIDs of the PostgreSQL backends serving `database` (their process
    title is `postgres: USER DATABASE CLIENT STATE`, or with Debian's
    cluster name first: `postgres: 15/main: USER DATABASE ...`)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                title = f.read().decode(errors="replace")
        except OSError:
            continue
        words = title.replace("\0", " ").split()
        if len(words) >= 2 and words[0] == "postgres:" and words[1].endswith(":"):
            words = words[:1] + words[2:]
        if len(words) >= 3 and words[0] == "postgres:" and words[2] == database:
            pids.append(int(entry))
    return pids


def status(env, name):
    out = subprocess.run([BIN, "status", name, "--json"], env=env, capture_output=True, check=True)
    return json.loads(out.stdout)


def write_csv(path, n):
    with open(path, "w") as f:
        f.write("email,name,city,code\n")
        for i in range(1, n + 1):
            f.write(f"user{i}@example.test,User {i},City {i % 97},C{i % 1000}\n")


def campaign(env, tmp, n, name, workers, concurrency, smtp_url, timeout, dkim=None, worker_env=None,
             sink=None, database=None):
    """Import, enqueue and send one campaign; return the figures. With
    dkim="rsa" or "ed25519", the From domain gets a key of that algorithm
    first, so every message is signed. With `sink` (the smtp-sink process)
    the figures hold the CPU time per message of the workers and of the
    sink, from their own /proc counters: their ratio does not move with the
    machine's speed as the rates do. With `database` (a PostgreSQL
    database's name) the workers' CPU includes their server backends'."""
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
    wenv = dict(env, SMTP_URL=smtp_url, MAILSPLIT_LOG="warn", **(worker_env or {}))
    sink_before = cpu_s(sink.pid) if sink else None
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
        time.sleep(poll_interval(s))
    wall = time.time() - start
    rss = [vm_hwm_mb(p.pid) for p in procs]
    worker_cpu = sum(cpu_s(p.pid) or 0.0 for p in procs)
    if database:
        worker_cpu += sum(cpu_s(pid) or 0.0 for pid in backends_of(database))
    sink_cpu = cpu_s(sink.pid) - sink_before if sink else None
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
        "worker_cpu_us": worker_cpu / done * 1e6 if done else float("nan"),
        "sink_cpu_us": sink_cpu / done * 1e6 if sink_cpu and done else float("nan"),
        "cpu_ratio": worker_cpu / sink_cpu if sink_cpu else float("nan"),
        # First to last recorded outcome: without the workers' start-up.
        "sending_msg_per_s": s.get("avg_rate", 0.0),
    }


def poll_interval(s):
    """How long to wait before the next `status`: each poll is a process and
    a database connection (on PostgreSQL a backend and a TLS handshake),
    taken from the CPU the campaign is measured on. Once a second while the
    end is far, and down to 0.1 s as it nears (half the ETA), so the end is
    still seen within a tenth of a second."""
    eta = s.get("eta_seconds")
    if eta is None:
        return 0.2
    return min(1.0, max(0.1, eta / 2))


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
    ap.add_argument("--network", action="store_true",
                    help="only the campaigns with real round-trip times (see above)")
    ap.add_argument("--relay-rtt-ms", type=float, default=20, help="--network: relay round trip (default 20)")
    ap.add_argument("--lan-rtt-ms", type=float, default=1,
                    help="--network: beanstalkd and PostgreSQL round trip (default 1)")
    ap.add_argument("--relay-n", type=int, default=10_000, help="--network: recipients for the relay runs (default 10,000)")
    ap.add_argument("--lan-n", type=int, default=100_000, help="--network: recipients for the LAN runs")
    ap.add_argument("--import-compare", action="store_true",
                    help="only imports: N rows from CSV vs a PostgreSQL source, into SQLite and PostgreSQL")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each measure this many times, interleaved, and give the median and min-max "
                         "(the default run and --dkim-compare)")
    ap.add_argument("--bin", default=BIN, help=f"mailsplit binary (default {BIN})")
    ap.add_argument("--compare-bin", metavar="PATH",
                    help="another mailsplit binary (e.g. the previous release) that sends the same SQLite "
                         "campaign in every round, beside --bin: a change's own effect against the machine's swing")
    ap.add_argument("--template-compare", action="store_true",
                    help="compiled-in template vs a realistic user template (scripts/bench_template.py)")
    ap.add_argument("--rounds", type=int, default=1, help="--template-compare: alternating rounds (default 1)")
    bench_storm.add_arguments(ap)
    bench_tx.add_arguments(ap)
    args = ap.parse_args()
    set_bin(args.bin)
    if args.template_compare:
        import bench_template
        return bench_template.run(args, sys.modules[__name__])
    if args.transactional:
        return bench_tx.run(args, sys.modules[__name__])
    if args.open_storm:
        return bench_storm.open_storm(sys.modules[__name__], args)
    if args.dkim_compare:
        return dkim_compare(args)
    if args.network:
        return network(args)
    if args.import_compare:
        import bench_import
        return bench_import.import_compare(sys.modules[__name__], args)
    skip = set(filter(None, args.skip.split(",")))
    tmp = tempfile.mkdtemp(prefix="mailsplit-bench-")
    svc = Services(tmp)
    rounds = []
    results = {}
    try:
        bs = svc.beanstalkd()
        base_env = dict(os.environ, BEANSTALKD=f"127.0.0.1:{bs}", MAILSPLIT_LOG="warn")
        sink_port, sink = svc.smtp_sink()
        write_csv(os.path.join(tmp, "bench.csv"), args.n)
        # Each round runs every measure once, on fresh databases, so a
        # busy moment of the machine lands on one round, not on one measure.
        for run in range(1, args.repeat + 1):
            tag = f" (round {run}/{args.repeat})" if args.repeat > 1 else ""
            r = {}
            print(f"==> SQLite: import, enqueue and send {args.n:,} recipients with {args.workers} workers{tag}",
                  flush=True)
            env = dict(base_env, DATABASE_URL=f"sqlite://{tmp}/bench-{run}.db", MAILSPLIT_TUBE=f"bench-sqlite-{run}")
            r["sqlite"] = campaign_with_reference(env, tmp, args, sink_port, r, sink)
            if args.compare_bin:
                print(f"==> SQLite, the same campaign with {args.compare_bin}{tag}", flush=True)
                ours = BIN
                set_bin(args.compare_bin)
                try:
                    cenv = dict(env, DATABASE_URL=f"sqlite://{tmp}/compare-{run}.db",
                                MAILSPLIT_TUBE=f"bench-compare-{run}")
                    r["compare"] = campaign(cenv, tmp, args.n, "bench", args.workers, args.concurrency,
                                            f"smtp://127.0.0.1:{sink_port}", 1800, sink=sink)
                finally:
                    set_bin(ours)
                os.remove(os.path.join(tmp, f"compare-{run}.db"))
            if "pg" not in skip:
                db = f"mailsplit_bench_{os.getpid()}_{run}"
                psql(args.pg, f"DROP DATABASE IF EXISTS {db}")
                psql(args.pg, f"CREATE DATABASE {db}")
                try:
                    print(f"==> PostgreSQL: the same campaign{tag}", flush=True)
                    penv = dict(base_env, DATABASE_URL=pg_url(args.pg, db), MAILSPLIT_TUBE=f"bench-pg-{run}")
                    r["pg"] = campaign(penv, tmp, args.n, "bench", args.workers, args.concurrency,
                                       f"smtp://127.0.0.1:{sink_port}", 1800, sink=sink, database=db)
                finally:
                    psql(args.pg, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            os.remove(os.path.join(tmp, f"bench-{run}.db"))
            rounds.append(r)
            print_round(r)
        results = combine(rounds)

        # The seed pipeline and the latency-bound run are measured once:
        # neither is among the figures that swing (and the seed pipeline
        # takes ten minutes at 1M).
        if "peer" not in skip:
            print(f"==> seed pipeline (peer_seed003.py), {args.n:,} recipients, 2 workers x 200 senders", flush=True)
            results["peer_msg_per_s"] = peer_rate(args.peer_python, tmp, args.n, sink_port, bs)

        if "latency" not in skip:
            print("==> latency-bound relay: smtp-sink -w 1, one worker, --concurrency 200", flush=True)
            slow_port, _ = svc.smtp_sink(["-w", "1"])
            lenv = dict(base_env, DATABASE_URL=f"sqlite://{tmp}/latency.db", MAILSPLIT_TUBE="bench-latency")
            r = campaign(lenv, tmp, args.latency_n, "latency", 1, 200, f"smtp://127.0.0.1:{slow_port}", 600)
            results["latency_msg_per_s"] = r["msg_per_s"]
    finally:
        svc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    report(args, results)


def whole_s(c):
    """Import, enqueue and send: the whole campaign's seconds."""
    return c["import_s"] + c["enqueue_s"] + c["wall_s"]


def print_round(r):
    sq, pg, src = r["sqlite"], r.get("pg"), r["smtp_source_msg_per_s"]
    line = (f"    SQLite {sq['msg_per_s']:,.0f} msg/s = {sq['msg_per_s'] / src * 100:.0f} % of smtp-source "
            f"{src:,.0f}; whole campaign {whole_s(sq):.1f} s; CPU per message: {cpu_text(sq)}")
    if r.get("compare"):
        c = r["compare"]
        line += f"\n    --compare-bin: SQLite {c['msg_per_s']:,.0f} msg/s; CPU per message: {cpu_text(c)}"
    if pg:
        line += (f"\n    PostgreSQL {pg['msg_per_s']:,.0f} msg/s = {pg['msg_per_s'] / sq['msg_per_s'] * 100:.0f} % "
                 f"of SQLite, whole campaign {whole_s(pg):.1f} s; CPU per message: {cpu_text(pg, ' (with their backends)')}")
    print(line, flush=True)


def cpu_text(c, who=""):
    """CPU per message of the workers and of the sink, and their ratio."""
    return (f"workers{who} {fmt(c.get('worker_cpu_us'), 1)} us, smtp-sink "
            f"{fmt(c.get('sink_cpu_us'), 1)} us, ratio {fmt(c.get('cpu_ratio'), 2)}")


def combine(rounds):
    """The rounds' figures as one set: each number the median over the
    rounds (each figure's own median: they need not come from one round),
    a worker's peak RSS the highest; and `spread`, each headline figure's
    values over the rounds, for the min-max beside its median."""
    def merged(runs):
        if not runs:
            return None
        out = {}
        for k, v in runs[0].items():
            if k == "worker_rss_mb":
                out[k] = [max(r[k][i] for r in runs) for i in range(len(v))]
            elif isinstance(v, (int, float)):
                out[k] = statistics.median(r[k] for r in runs)
        out["whole_s"] = statistics.median(whole_s(r) for r in runs)
        return out
    sq = [r["sqlite"] for r in rounds]
    pg = [r["pg"] for r in rounds if r.get("pg")]
    compare = [r["compare"] for r in rounds if r.get("compare")]
    src = [r["smtp_source_msg_per_s"] for r in rounds]
    spread = {
        "smtp-source msg/s": src,
        "SQLite msg/s": [c["msg_per_s"] for c in sq],
        "SQLite % of smtp-source": [c["msg_per_s"] / s * 100 for c, s in zip(sq, src)],
        "SQLite import s": [c["import_s"] for c in sq],
        "SQLite enqueue s": [c["enqueue_s"] for c in sq],
        "SQLite whole campaign s": [whole_s(c) for c in sq],
        "SQLite worker CPU / sink CPU": [c["cpu_ratio"] for c in sq],
    }
    if compare:
        spread.update({
            "--compare-bin SQLite msg/s": [c["msg_per_s"] for c in compare],
            "--compare-bin worker CPU / sink CPU": [c["cpu_ratio"] for c in compare],
        })
    if pg:
        spread.update({
            "PostgreSQL msg/s": [c["msg_per_s"] for c in pg],
            "PostgreSQL % of SQLite": [p["msg_per_s"] / s["msg_per_s"] * 100 for p, s in zip(pg, sq)],
            "PostgreSQL import s": [c["import_s"] for c in pg],
            "PostgreSQL import / SQLite's": [p["import_s"] / s["import_s"] for p, s in zip(pg, sq)],
            "PostgreSQL whole campaign s": [whole_s(c) for c in pg],
            "PostgreSQL (workers + backends) CPU / sink CPU": [c["cpu_ratio"] for c in pg],
        })
    return {
        "rounds": len(rounds), "sqlite": merged(sq), "pg": merged(pg), "compare": merged(compare),
        "smtp_source_msg_per_s": statistics.median(src),
        "message_bytes": rounds[0].get("message_bytes"), "spread": spread,
    }


def set_bin(path):
    global BIN
    BIN = os.path.abspath(path)
    if not os.access(BIN, os.X_OK):
        sys.exit(f"bench: {BIN} is not an executable; build it with cargo build --release")


def dkim_compare(args):
    """The same SQLite campaign unsigned, RSA-signed, ed25519-signed and
    with both, beside openssl speed (scripts/bench_dkim.py)."""
    import bench_dkim
    return bench_dkim.dkim_compare(args, sys.modules[__name__])


def network(args):
    """The campaign with the relay, then beanstalkd and PostgreSQL, behind
    delay proxies (see the module's documentation)."""
    if not os.access(DELAY_PROXY, os.X_OK):
        sys.exit(f"bench: {DELAY_PROXY} is missing; build it with cargo build --release")
    tmp = tempfile.mkdtemp(prefix="mailsplit-bench-net-")
    svc = Services(tmp)
    rows = []
    try:
        bs = svc.beanstalkd()
        base_env = dict(os.environ, BEANSTALKD=f"127.0.0.1:{bs}", MAILSPLIT_LOG="warn")
        rtt = args.relay_rtt_ms / 1000
        for label, extra, trips in (("with PIPELINING", [], 2), ("without PIPELINING (smtp-sink -p)", ["-p"], 4)):
            sink_port, _ = svc.smtp_sink(extra)
            relay = svc.delay_proxy(sink_port, args.relay_rtt_ms / 2)
            tag = "pipelining" if trips == 2 else "nopipelining"
            print(f"==> relay {args.relay_rtt_ms:g} ms away, {label}: {args.relay_n:,} recipients, "
                  f"1 worker x 10 sessions", flush=True)
            env = dict(base_env, DATABASE_URL=f"sqlite://{tmp}/relay-{tag}.db", MAILSPLIT_TUBE=f"bench-{tag}")
            r = campaign(env, tmp, args.relay_n, "relay", 1, 10, f"smtp://127.0.0.1:{relay}", 1800)
            ceiling = 10 / (trips * rtt)
            rows.append((f"relay {args.relay_rtt_ms:g} ms RTT, 10 connections, {label}", r["msg_per_s"],
                         f"ceiling 10 / ({trips} x {args.relay_rtt_ms:g} ms) = {ceiling:,.0f}; first to last "
                         f"outcome {r['sending_msg_per_s']:,.1f} msg/s = {r['sending_msg_per_s'] / ceiling * 100:.0f} %",
                         r["msg_per_s"] / ceiling))
            print(f"    {r['msg_per_s']:,.1f} msg/s = {r['msg_per_s'] / ceiling * 100:.0f} % of {ceiling:,.0f} "
                  f"from the workers' start ({r['sending_msg_per_s']:,.1f} msg/s = "
                  f"{r['sending_msg_per_s'] / ceiling * 100:.0f} % from first to last outcome; "
                  f"sent {r['sent']:,}, pending {r['pending']:,})", flush=True)

        sink_port, _ = svc.smtp_sink()
        smtp = f"smtp://127.0.0.1:{sink_port}"
        pg = urllib.parse.urlsplit(args.pg)
        pg_port = pg.port or 5432
        logs = {k: os.path.join(tmp, f"{k}-proxy.log") for k in ("pg", "bs")}
        bs_proxy = svc.delay_proxy(bs, args.lan_rtt_ms / 2, logs["bs"])
        pg_proxy = svc.delay_proxy(pg_port, args.lan_rtt_ms / 2, logs["pg"])
        lan = {}
        for where in ("loopback", "lan"):
            db = f"mailsplit_bench_{where}_{os.getpid()}"
            psql(args.pg, f"DROP DATABASE IF EXISTS {db}")
            psql(args.pg, f"CREATE DATABASE {db}")
            try:
                env = dict(base_env, DATABASE_URL=pg_url(args.pg, db), MAILSPLIT_TUBE=f"bench-{where}")
                wenv = None
                if where == "lan":
                    user = f"{pg.username}@" if pg.username else ""
                    proxied = urllib.parse.urlunsplit(pg._replace(netloc=f"{user}127.0.0.1:{pg_proxy}"))
                    wenv = {"DATABASE_URL": pg_url(proxied, db), "BEANSTALKD": f"127.0.0.1:{bs_proxy}"}
                print(f"==> PostgreSQL, {args.workers} workers x {args.concurrency} sessions, relay on loopback, "
                      f"beanstalkd and PostgreSQL {'on loopback' if where == 'loopback' else f'{args.lan_rtt_ms:g} ms away'}: "
                      f"{args.lan_n:,} recipients", flush=True)
                lan[where] = campaign(env, tmp, args.lan_n, "lan", args.workers, args.concurrency, smtp, 1800,
                                      worker_env=wenv)
                print(f"    {lan[where]['msg_per_s']:,.0f} msg/s (sent {lan[where]['sent']:,}, "
                      f"pending {lan[where]['pending']:,})", flush=True)
            finally:
                psql(args.pg, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        time.sleep(0.5)
        trips = {}
        for k, path in logs.items():
            with open(path) as f:
                trips[k] = sum(int(m.group(1)) for m in re.finditer(r": (\d+) chunks up", f.read()))
        jobs = lan["lan"]["jobs"]
        print(f"    round trips per job of {args.lan_n // max(jobs, 1)} recipients (the workers' requests through "
              f"the proxies): PostgreSQL {trips['pg'] / jobs:.1f}, beanstalkd {trips['bs'] / jobs:.1f}", flush=True)
        base = lan["loopback"]["msg_per_s"]
        rows.append((f"PostgreSQL + beanstalkd on loopback, {args.workers} x {args.concurrency} sessions", base,
                     "reference", 1.0))
        rows.append((f"PostgreSQL + beanstalkd {args.lan_rtt_ms:g} ms RTT, same relay", lan["lan"]["msg_per_s"],
                     f"of the loopback rate; per job: {trips['pg'] / jobs:.1f} PostgreSQL and "
                     f"{trips['bs'] / jobs:.1f} beanstalkd round trips", lan["lan"]["msg_per_s"] / base))
    finally:
        svc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print()
    for name, rate, ceiling, ratio in rows:
        print(f"{name:<{width}}  {rate:>9,.1f} msg/s  {ratio * 100:5.1f} %  {ceiling}")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True).stdout.decode().strip()
    path = os.path.join(ROOT, "BENCHMARKS.md")
    with open(path, "a") as f:
        f.write(f"\n## Network run {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M')} "
                f"(commit {commit}, {os.cpu_count()} cores, `scripts/bench.sh --network`)\n\n"
                "| scenario | msg/s | % | of |\n|---|---|---|---|\n")
        for name, rate, ceiling, ratio in rows:
            f.write(f"| {name} | {rate:,.1f} | {ratio * 100:.0f} % | {ceiling} |\n")
    print(f"\nappended to {path}")


def campaign_with_reference(env, tmp, args, sink_port, results, sink):
    r = campaign(env, tmp, args.n, "bench", args.workers, args.concurrency,
                 f"smtp://127.0.0.1:{sink_port}", 1800, sink=sink)
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
    sq, pg, cmp_ = r.get("sqlite") or {}, r.get("pg") or {}, r.get("compare") or {}
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
        ("  CPU per message", cpu_text(sq)),
        ("--compare-bin, SQLite",
         f"{fmt(cmp_.get('msg_per_s'))} msg/s; CPU per message: {cpu_text(cmp_)}" if cmp_ else "-"),
        ("seed pipeline (Python)", f"{fmt(peer)} msg/s"),
        ("  mailsplit / seed", f"{sq.get('msg_per_s', 0) / peer:.1f}x" if peer else "-"),
        ("latency-bound (1 s/msg, 200 sessions)", f"{fmt(r.get('latency_msg_per_s'), 1)} msg/s"),
        (f"mailsplit PostgreSQL, {args.workers} workers", f"{fmt(pg.get('msg_per_s'))} msg/s, {fmt(pg.get('wall_s'), 1)} s wall; enqueue {fmt(pg.get('enqueue_s'), 2)} s; import {fmt(pg.get('import_s'), 1)} s"),
        ("  PostgreSQL / SQLite", f"{pg['msg_per_s'] / sq['msg_per_s'] * 100:.0f} %" if pg and sq else "-"),
        ("  CPU per message", cpu_text(pg, " (with their backends)") if pg else "-"),
        ("whole campaign (import + enqueue + send)",
         f"SQLite {fmt(sq.get('whole_s'), 1)} s, PostgreSQL {fmt(pg.get('whole_s'), 1)} s"),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    if r.get("rounds", 1) > 1:
        print(f"each figure the median of {r['rounds']} interleaved rounds; worker RSS the highest")
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    spread = r.get("spread") if r.get("rounds", 1) > 1 else None
    if spread:
        print(f"\nmedian (min-max) over {r['rounds']} rounds:")
        width = max(len(k) for k in spread)
        for k, values in spread.items():
            digits = 2 if k.endswith("CPU") else (2 if max(values) < 10 else 1) if k.endswith((" s", "'s")) else 0
            print(f"  {k:<{width}}  {median_spread(values, digits)}")
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
                    "| date | machine | commit | N | import s | enqueue s (jobs/s) | smtp-source | SQLite msg/s (% of smtp-source) | wall s | worker RSS MB | seed peer msg/s (x) | latency-bound msg/s | PostgreSQL msg/s (% of SQLite) | worker CPU / sink CPU (SQLite; PostgreSQL) |\n"
                    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    n = fmt(args.n)
    if spread:
        n += f" (median of {r['rounds']}: SQLite msg/s {median_spread(spread['SQLite msg/s'])}" + (
            f", PostgreSQL msg/s {median_spread(spread['PostgreSQL msg/s'])}" if "PostgreSQL msg/s" in spread else "") + ")"
    row = ("| {date} | {machine} | {commit} | {n} | {imp} | {enq} ({jps}) | {src} | {sq} ({ratio}) | {wall} | {rss} | {peer} ({px}) | {lat} | {pg} ({pgr}) | {cpu} |\n".format(
            date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            machine=machine, commit=commit, n=n,
            imp=fmt(sq.get("import_s"), 1), enq=fmt(sq.get("enqueue_s"), 2), jps=fmt(sq.get("jobs_per_s")),
            src=fmt(src), sq=fmt(sq.get("msg_per_s")),
            ratio=f"{sq['msg_per_s'] / src * 100:.0f} %" if src and sq else "-",
            wall=fmt(sq.get("wall_s"), 1), rss=" / ".join(f"{x:.0f}" for x in sq.get("worker_rss_mb", [])),
            peer=fmt(peer), px=f"{sq['msg_per_s'] / peer:.1f}x" if peer and sq else "-",
            lat=fmt(r.get("latency_msg_per_s"), 1),
            cpu=f"{fmt(sq.get('cpu_ratio'), 2)}; {fmt(pg.get('cpu_ratio'), 2)}"
                + (f" (--compare-bin {fmt(cmp_.get('cpu_ratio'), 2)})" if cmp_ else ""),
            pg=fmt(pg.get("msg_per_s")), pgr=f"{pg['msg_per_s'] / sq['msg_per_s'] * 100:.0f} %" if pg and sq else "-"))
    insert_run_row(path, row)
    print(f"\nadded a row to the runs table of {path}")


def median_spread(values, digits=0):
    """median (min-max)"""
    return f"{fmt(statistics.median(values), digits)} ({fmt(min(values), digits)}-{fmt(max(values), digits)})"


def insert_run_row(path, row):
    """Put `row` after the last row of the file's first table (the runs
    table), not at the end, where the network sections go."""
    with open(path) as f:
        lines = f.readlines()
    at = next((i for i, l in enumerate(lines) if l.startswith("| date |")), None)
    if at is None:
        lines.append(row)
    else:
        while at < len(lines) and lines[at].startswith("|"):
            at += 1
        lines.insert(at, row)
    with open(path, "w") as f:
        f.writelines(lines)


if __name__ == "__main__":
    main()
