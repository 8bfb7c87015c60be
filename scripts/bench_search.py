"""The dashboard's subscriber search through `serve`: `GET
/subscribers?q=PREFIX` (Bearer token, as a script would), timed at the
client on the same machine, for each database and size. Seeds N
recipients `userI@example.test` on list `customers` (one through
`mailsplit import`, the rest by one SQL statement with the same columns,
as tests/it/util/env.rs `import_bulk` does: the figure is about the
search, and a 1M CSV import takes minutes), ANALYZEs, starts `serve`,
warms up, then times `--searches` requests per prefix. Prints Markdown
rows for BENCHMARKS.md; appends nothing.

    python3 scripts/bench_search.py --n 100000,1000000 [--bin target/debug/mailsplit]
"""
import argparse
import datetime
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

TOKEN = "bench-search-token"
PREFIXES = ("user4242", "user9", "zzz")

SQLITE_FILL = (
    "WITH RECURSIVE s(i) AS (SELECT 2 UNION ALL SELECT i + 1 FROM s WHERE i < {n}) "
    "INSERT INTO recipients (email, name, attributes, status, updated_at, email_key) "
    "SELECT 'user' || i || '@example.test', 'User ' || i, '{{}}', 'active', "
    "(SELECT MAX(updated_at) FROM recipients), 'user' || i || '@example.test' FROM s"
)
PG_FILL = (
    "INSERT INTO recipients (email, name, attributes, status, updated_at, email_key) "
    "SELECT 'user' || i || '@example.test', 'User ' || i, '{{}}', 'active', "
    "(SELECT MAX(updated_at) FROM recipients), 'user' || i || '@example.test' "
    "FROM generate_series(2, {n}) AS i"
)
MEMBERS = (
    "INSERT INTO list_members (list_id, recipient_id) "
    "SELECT (SELECT id FROM lists WHERE name = 'customers'), r.id FROM recipients r "
    "WHERE NOT EXISTS (SELECT 1 FROM list_members m WHERE m.recipient_id = r.id)"
)


def seed(binary, env, tmp, kind, url, n):
    """One recipient through `import`, the rest by SQL; seconds taken."""
    t = time.time()
    one = os.path.join(tmp, "one.csv")
    bench.write_csv(one, 1)
    subprocess.run([binary, "migrate"], env=env, check=True, capture_output=True)
    subprocess.run([binary, "import", one, "--list", "customers"], env=env, check=True,
                   capture_output=True)
    if kind == "sqlite":
        db = sqlite3.connect(url.removeprefix("sqlite://"))
        db.execute(SQLITE_FILL.format(n=n))
        db.execute(MEMBERS)
        db.commit()
        db.execute("ANALYZE")
        db.close()
    else:
        for sql in (PG_FILL.format(n=n), MEMBERS, "ANALYZE"):
            subprocess.run(["psql", url, "-qc", sql], check=True, capture_output=True)
    return time.time() - t


def timed(port, prefix, count):
    """Milliseconds of `count` searches (after five to warm up)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/subscribers?q={prefix}",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    took = []
    for i in range(count + 5):
        t = time.perf_counter()
        with urllib.request.urlopen(req, timeout=20) as r:
            r.read()
            if r.status != 200:
                sys.exit(f"bench: search answered {r.status}")
        if i >= 5:
            took.append((time.perf_counter() - t) * 1000)
    took.sort()
    return statistics.median(took), took[int(len(took) * 0.95) - 1]


def one_run(args, kind, n):
    tmp = tempfile.mkdtemp(prefix="mailsplit-bench-search-")
    name = f"mailsplit_bsearch_{os.getpid()}"
    if kind == "sqlite":
        url = f"sqlite://{tmp}/bench.db"
    else:
        bench.psql(args.pg, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        bench.psql(args.pg, f"CREATE DATABASE {name}")
        url = bench.pg_url(args.pg, name)
    env = dict(os.environ, DATABASE_URL=url, MAILSPLIT_LOG="warn", MAILSPLIT_ADMIN_TOKEN=TOKEN,
               BEANSTALKD="127.0.0.1:1")
    served = None
    try:
        seeded = seed(args.bin, env, tmp, kind, url, n)
        public, admin = bench.free_port(), bench.free_port()
        served = subprocess.Popen([args.bin, "serve", "--listen", f"127.0.0.1:{public}",
                                   "--admin-listen", f"127.0.0.1:{admin}"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        bench.wait_port(admin, "serve", timeout=60)
        for prefix in PREFIXES:
            median, p95 = timed(admin, prefix, args.searches)
            print(f"| {kind} | {n:,} | `{prefix}` | {median:.1f} ms | {p95:.1f} ms | "
                  f"{args.searches} | seeded in {seeded:.0f} s |", flush=True)
    finally:
        if served:
            served.terminate()
            served.wait(10)
        if kind == "postgres":
            bench.psql(args.pg, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        subprocess.run(["rm", "-rf", tmp], check=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="100000", help="sizes, comma-separated (default 100000)")
    ap.add_argument("--db", default="sqlite,postgres", help="sqlite, postgres or both (default)")
    ap.add_argument("--searches", type=int, default=200, help="timed requests per prefix (default 200)")
    ap.add_argument("--bin", default=bench.BIN, help=f"mailsplit binary (default {bench.BIN})")
    ap.add_argument("--pg", default=os.environ.get("MAILSPLIT_TEST_PG", "postgres://root@127.0.0.1:5432"))
    args = ap.parse_args()
    load = os.getloadavg()
    print(f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, "
          f"load {load[0]:.1f}, binary {args.bin}")
    print("| database | recipients | prefix | median | p95 | requests | note |")
    print("|---|---:|---|---:|---:|---:|---|")
    for kind in args.db.split(","):
        for n in (int(x) for x in args.n.split(",")):
            one_run(args, kind, n)
    print(f"load after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
