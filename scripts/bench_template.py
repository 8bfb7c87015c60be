"""scripts/bench.sh --template-compare: the compiled-in starter template
against a realistic user template, same run, same machine, same services.

The user template is scripts/bench/newsletter.html (about 5 KB of HTML, a
<style> block, a {% for %} loop over three items, five variables), given
with `campaign create --html`: its CSS is inlined once when the campaign is
created, and each worker compiles it once per content version, so per
message only the render is left. Each mode gets a fresh SQLite database
and tube on the same beanstalkd and smtp-sink; with --rounds R the two
modes alternate (A B, B A, ...) and the median rate of each is compared.
Prints both rates and the ratio (issue 24 asks for >= 0.9). Nothing is
appended to BENCHMARKS.md: the row goes there by hand, with the machine's
load.

Two controls beside them, because the user template's messages are four
times the starter's (8 KB against 1.8 KB) and bytes cost the relay and the
kernel whatever composed them:
  - "starter": the compiled-in starter's own text (`templates show
    newsletter`) given with --html/--text, so the run-time engine and the
    compiled one send the same bytes: their ratio is the engine's cost;
  - smtp-source's raw rate at each of the two message sizes on the same
    smtp-sink: the ratio the wire alone allows.
"""
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench", "newsletter.html")
MODES = {
    "compiled": ["--template", "newsletter"],
    "user": ["--html", TEMPLATE],
}


def send(b, env, tmp, n, content, workers, concurrency, smtp_url, timeout=1800):
    """Import, create (with `content`), enqueue and send one campaign;
    return msg/s over the wall time and over the first to last outcome."""
    csv = os.path.join(tmp, "bench.csv")
    if not os.path.exists(csv):
        b.write_csv(csv, n)
    subprocess.run([b.BIN, "migrate"], env=env, check=True, capture_output=True)
    b.run_measured([b.BIN, "import", csv, "--list", "bench"], env)
    subprocess.run([b.BIN, "campaign", "create", "bench", "--list", "bench", *content,
                    "--subject", "News for {{ name | default('you') }}", "--from", "news@example.test"],
                   env=env, check=True, capture_output=True)
    b.run_measured([b.BIN, "enqueue", "bench"], env)
    wenv = dict(env, SMTP_URL=smtp_url, MAILSPLIT_LOG="warn")
    start = time.time()
    procs = [subprocess.Popen([b.BIN, "worker", "--concurrency", str(concurrency)], env=wenv,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(workers)]
    while True:
        s = b.status(env, "bench")
        if s["pending"] == 0 or time.time() > start + timeout:
            break
        time.sleep(b.poll_interval(s))
    wall = time.time() - start
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(60)
    s = b.status(env, "bench")
    size = len(subprocess.run([b.BIN, "preview", "bench"], env=env, capture_output=True, check=True).stdout)
    return {"msg_per_s": (s["sent"] + s["failed"]) / wall, "sending_msg_per_s": s.get("avg_rate", 0.0),
            "sent": s["sent"], "pending": s["pending"], "wall_s": wall, "bytes": size}


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def run(args, b):
    """`b` is the bench module (its services and helpers)."""
    tmp = tempfile.mkdtemp(prefix="mailsplit-bench-template-")
    for part in ("html", "text"):
        out = subprocess.run([b.BIN, "templates", "show", "newsletter", f"--{part}"], check=True,
                             capture_output=True, env=dict(os.environ, DATABASE_URL=f"sqlite://{tmp}/show.db"))
        with open(os.path.join(tmp, f"starter.{part}"), "wb") as f:
            f.write(out.stdout)
    MODES["starter"] = ["--html", os.path.join(tmp, "starter.html"), "--text", os.path.join(tmp, "starter.text")]
    svc = b.Services(tmp)
    rates = {mode: [] for mode in MODES}
    print(f"==> template compare: {args.n:,} recipients, {args.workers} workers x {args.concurrency} sessions, "
          f"{args.rounds} round(s); load average before: {loadavg()}", flush=True)
    try:
        bs = svc.beanstalkd()
        sink_port, _ = svc.smtp_sink()
        for r in range(args.rounds):
            order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
            for mode in order:
                tag = f"{mode}-{r}"
                env = dict(os.environ, BEANSTALKD=f"127.0.0.1:{bs}", MAILSPLIT_LOG="warn",
                           DATABASE_URL=f"sqlite://{tmp}/bench-{tag}.db", MAILSPLIT_TUBE=f"bench-{tag}")
                res = send(b, env, tmp, args.n, MODES[mode], args.workers, args.concurrency,
                           f"smtp://127.0.0.1:{sink_port}")
                rates[mode].append(res)
                print(f"    {mode:<9} {res['msg_per_s']:>9,.0f} msg/s wall ({res['sending_msg_per_s']:,.0f} first to "
                      f"last outcome), {res['wall_s']:.1f} s, sent {res['sent']:,}, pending {res['pending']:,}, "
                      f"{res['bytes']:,} B messages; load {loadavg()}", flush=True)
                for f in os.listdir(tmp):
                    if f.startswith(f"bench-{tag}.db"):
                        os.remove(os.path.join(tmp, f))
        sizes = {mode: rates[mode][0]["bytes"] for mode in ("compiled", "user")}
        wire = {mode: b.smtp_source_rate(sink_port, size, min(args.n, 100_000)) for mode, size in sizes.items()}
    finally:
        svc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    med = {mode: statistics.median(r["msg_per_s"] for r in rates[mode]) for mode in MODES}
    compiled, user, starter = med["compiled"], med["user"], med["starter"]
    print(f"\ntemplate compare, {args.n:,} recipients, {os.cpu_count()} cores, load average after: {loadavg()}")
    print(f"  compiled-in (newsletter)         {compiled:>10,.0f} msg/s  ({sizes['compiled']:,} B)")
    print(f"  user template (--html)           {user:>10,.0f} msg/s  ({sizes['user']:,} B)")
    print(f"  the starter as user content      {starter:>10,.0f} msg/s  (same bytes as compiled-in)")
    print(f"  ratio user / compiled            {user / compiled:10.3f}   (issue 24 asks >= 0.9)")
    print(f"  ratio starter / compiled         {starter / compiled:10.3f}   (the run-time engine's cost alone)")
    print(f"  smtp-source at {sizes['user']:,} B / at {sizes['compiled']:,} B: {wire['user']:,.0f} / "
          f"{wire['compiled']:,.0f} msg/s = {wire['user'] / wire['compiled']:.3f}   (what the wire alone allows)")
