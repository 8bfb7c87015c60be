"""--import-compare: the same N rows imported from a CSV file and from a
PostgreSQL source table (`import --from-sql … --source postgres://…`),
into a SQLite and into a PostgreSQL target, each into a fresh database.
Prints seconds, rows/s, peak RSS (the import process's own, from wait4)
and the ratio SQL-source / CSV per target, plus the load average before
and after (other work on the machine slows every figure alike). Prints
Markdown rows for BENCHMARKS.md; appends nothing.
"""
import datetime
import os
import shutil
import subprocess
import tempfile

QUERY = "SELECT email, name, city, code FROM customers"


def _fresh_pg(bench, base, name):
    bench.psql(base, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    bench.psql(base, f"CREATE DATABASE {name}")
    return bench.pg_url(base, name)


def _drop_pg(bench, base, name):
    bench.psql(base, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _one(bench, env, argv):
    """Migrate the target, run one import; (seconds, peak RSS MB)."""
    subprocess.run([bench.BIN, "migrate"], env=env, check=True, capture_output=True)
    dt, rss, out = bench.run_measured([bench.BIN] + argv, env)
    if "rows read" not in out:
        raise SystemExit(f"bench: unexpected import output: {out}")
    return dt, rss


def import_compare(bench, args):
    n = args.n
    tmp = tempfile.mkdtemp(prefix="mailsplit-bench-import-")
    pid = os.getpid()
    source_db = f"mailsplit_bsrc_{pid}"
    load_before = os.getloadavg()
    rows = []
    try:
        csv = os.path.join(tmp, "people.csv")
        bench.write_csv(csv, n)
        source = _fresh_pg(bench, args.pg, source_db)
        print(f"==> PostgreSQL source table: {n:,} rows", flush=True)
        subprocess.run(["psql", source, "-qc",
                        "CREATE TABLE customers (email text, name text, city text, code text)"],
                       check=True, capture_output=True)
        subprocess.run(["psql", source, "-qc",
                        f"\\copy customers FROM '{csv}' WITH (FORMAT csv, HEADER true)"],
                       check=True, capture_output=True)
        subprocess.run(["psql", source, "-qc", "VACUUM ANALYZE customers"], check=True, capture_output=True)
        base_env = dict(os.environ, MAILSPLIT_LOG="warn")
        for target in ("sqlite", "postgres"):
            for kind in ("csv", "pg-source"):
                name = f"mailsplit_btgt_{pid}"
                if target == "sqlite":
                    path = os.path.join(tmp, "target.db")
                    for suffix in ("", "-wal", "-shm", "-import-lock"):
                        if os.path.exists(path + suffix):
                            os.remove(path + suffix)
                    url = f"sqlite://{path}"
                else:
                    url = _fresh_pg(bench, args.pg, name)
                env = dict(base_env, DATABASE_URL=url)
                if kind == "csv":
                    argv = ["import", csv, "--list", "bench"]
                else:
                    # The bench's source user is the server's superuser.
                    argv = ["import", "--list", "bench", "--from-sql", QUERY, "--source", source,
                            "--allow-privileged-source"]
                print(f"==> {kind} -> {target}", flush=True)
                try:
                    dt, rss = _one(bench, env, argv)
                finally:
                    if target == "postgres":
                        _drop_pg(bench, args.pg, name)
                rows.append((target, kind, dt, rss))
                print(f"    {dt:.1f} s, {n / dt:,.0f} rows/s, peak RSS {rss:.1f} MB", flush=True)
    finally:
        _drop_pg(bench, args.pg, source_db)
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()
    _report(n, rows, load_before, load_after)


def _report(n, rows, load_before, load_after):
    by = {(t, k): (dt, rss) for t, k, dt, rss in rows}
    today = datetime.date.today().isoformat()
    cpus = os.cpu_count()
    load = f"load {load_before[0]:.1f} before, {load_after[0]:.1f} after ({cpus} cores)"
    print()
    print("| date | target | source | rows | seconds | rows/s | peak RSS | SQL source / CSV | machine |")
    print("|---|---|---|---|---|---|---|---|---|")
    for target in ("sqlite", "postgres"):
        csv_dt = by[(target, "csv")][0]
        for kind in ("csv", "pg-source"):
            dt, rss = by[(target, kind)]
            ratio = f"{dt / csv_dt:.2f}x" if kind == "pg-source" else ""
            print(f"| {today} | {target} | {kind} | {n:,} | {dt:.1f} | {n / dt:,.0f} | "
                  f"{rss:.1f} MB | {ratio} | {load} |")
