"""What a transactional message costs mailsplit, without a campaign
beside it: N messages posted evenly over S seconds to `POST
/api/v1/messages` of a `mailsplit serve` (SQLite, workers on smtp-sink,
each service on a free loopback port), and the CPU time `serve` and the
workers spent on them (from /proc/PID/stat, less what the same processes
spend idle over as long), per message.

  python3 scripts/profile_tx.py [--bin target/release/mailsplit] [--n 1000]
      [--seconds 10] [--workers 2] [--concurrency 100] [--perf DIR]

With --perf DIR, `perf record -g` runs on serve and on the first worker
while the messages go (DIR/serve.data, DIR/worker.data; `perf report -i`
reads them). Nothing asserts a speed; nothing is written to BENCHMARKS.md
(scripts/bench.py --transactional measures the campaign beside it).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
import bench_tx  # noqa: E402


def cpu(api, procs):
    return bench.cpu_s(api.proc.pid) or 0.0, sum(bench.cpu_s(p.pid) or 0.0 for p in procs)


def switches(pid):
    """Context switches (voluntary and not) of all of a process's threads
    so far."""
    n = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                n += sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
        except OSError:
            pass
    return n


def ctx(api, procs):
    return switches(api.proc.pid), sum(switches(p.pid) for p in procs)


def perf(pid, path, seconds):
    return subprocess.Popen(["perf", "record", "--call-graph", "dwarf,16384", "-F", "499", "-o", path, "-p", str(pid), "--",
                             "sleep", str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(args, tmp, svc):
    bs = svc.beanstalkd()
    sink_port, _ = svc.smtp_sink()
    env = dict(os.environ, BEANSTALKD=f"127.0.0.1:{bs}", MAILSPLIT_LOG="warn",
               DATABASE_URL=f"sqlite://{tmp}/tx.db", MAILSPLIT_TUBE="profile-tx")
    subprocess.run([bench.BIN, "migrate"], env=env, check=True, capture_output=True)
    bench_tx.template(bench, env, tmp)
    api = bench_tx.Api(bench, env, svc)
    procs = bench_tx.workers(bench, env, args, f"smtp://127.0.0.1:{sink_port}")
    db = f"{tmp}/tx.db"
    # Warm: connections, the template cache, the key.
    bench_tx.api_spread(api, 100, 1, "warm")
    while bench_tx.latencies(db)[1] < 100:
        time.sleep(0.2)
    idle0, sw0 = cpu(api, procs), ctx(api, procs)
    time.sleep(args.seconds)
    idle1, sw1 = cpu(api, procs), ctx(api, procs)
    recorders = []
    if args.perf:
        os.makedirs(args.perf, exist_ok=True)
        recorders = [perf(api.proc.pid, os.path.join(args.perf, "serve.data"), args.seconds),
                     perf(procs[0].pid, os.path.join(args.perf, "worker.data"), args.seconds)]
        time.sleep(0.5)
    failures, _ = bench_tx.api_spread(api, args.n, args.seconds, "tx")
    deadline = time.time() + 120
    while bench_tx.latencies(db)[1] < 100 + args.n - failures and time.time() < deadline:
        time.sleep(0.2)
    busy, sw2 = cpu(api, procs), ctx(api, procs)
    for r in recorders:
        r.wait()
    bench_tx.stop(procs)
    lat, sent = bench_tx.latencies(db)
    lat = lat[100:] if len(lat) > 100 else lat
    n = args.n - failures
    per = [((b - i1) - (i1 - i0)) / n * 1e6 for b, i0, i1 in zip(busy, idle0, idle1)]
    print(f"{args.n} messages over {args.seconds:g} s, {failures} failed, {sent - 100} sent")
    print(f"CPU per message: serve {per[0]:.0f} us, workers {per[1]:.0f} us, together {sum(per):.0f} us "
          f"(idle over {args.seconds:g} s: serve {(idle1[0] - idle0[0]) * 1e3:.0f} ms, "
          f"workers {(idle1[1] - idle0[1]) * 1e3:.0f} ms)")
    sw = [((b - i1) - (i1 - i0)) / n for b, i0, i1 in zip(sw2, sw0, sw1)]
    print(f"context switches per message: serve {sw[0]:.1f}, workers {sw[1]:.1f}")
    print(f"latency submit -> ledger sent_at: p50 {bench_tx.pct(sorted(lat), 50) * 1000:.0f} ms, "
          f"p99 {bench_tx.pct(sorted(lat), 99) * 1000:.0f} ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=bench.BIN)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--perf", metavar="DIR")
    args = ap.parse_args()
    bench.set_bin(args.bin)
    tmp = tempfile.mkdtemp(prefix="mailsplit-profile-tx-")
    svc = bench.Services(tmp)
    try:
        measure(args, tmp, svc)
    finally:
        svc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
