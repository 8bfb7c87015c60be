#!/usr/bin/env python3
"""What `PRAGMA secure_delete = ON` costs a worker's ledger writes on SQLite.

Replays a campaign's ledger pattern with the sqlite3 shell, no mailsplit
binary needed: N delivery rows, then per batch of 100 the claim (UPDATE ...
RETURNING over json_each) and the outcome (UPDATE with a Message-ID, so the
row grows and its old cell is freed), each in its own transaction, WAL,
synchronous=NORMAL. Runs OFF and ON alternated and prints the shell's CPU
time (user + sys, from the process itself) per message for each.

    python3 scripts/bench_secure_delete.py [--n 300000] [--rounds 3]
"""
import argparse
import os
import resource
import statistics
import subprocess
import tempfile


def setup_sql(n):
    return (
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;\n"
        "CREATE TABLE deliveries(id INTEGER PRIMARY KEY, campaign_id INT, email TEXT, status TEXT,"
        " claimed_by TEXT, sent_at INT, message_id TEXT, attempts INT);\n"
        f"WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i<{n}) INSERT INTO deliveries"
        " SELECT i,1,'person'||i||'@example.org','pending',NULL,NULL,NULL,0 FROM c;\n"
    )


def run_sql(n, mode):
    out = [f"PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA secure_delete={mode};"]
    for b in range(0, n, 100):
        ids = ",".join(str(i) for i in range(b + 1, min(b + 101, n + 1)))
        sel = f"WHERE id IN (SELECT value FROM json_each('[{ids}]'))"
        out.append("BEGIN; UPDATE deliveries SET status='claimed', claimed_by='w1-123',"
                   f" attempts=attempts+1 {sel} RETURNING id, email; COMMIT;")
        out.append("BEGIN; UPDATE deliveries SET status='sent', claimed_by=NULL, sent_at=1764349000,"
                   f" message_id='<'||id||'.abcdef0123@mail.example.org>' {sel}; COMMIT;")
    return "\n".join(out) + "\n"


def cpu_of(argv, stdin_path):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(stdin_path) as f:
        subprocess.run(argv, stdin=f, stdout=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"setup": os.path.join(tmp, "setup.sql")}
        with open(paths["setup"], "w") as f:
            f.write(setup_sql(args.n))
        for mode in ("OFF", "ON"):
            paths[mode] = os.path.join(tmp, f"run_{mode}.sql")
            with open(paths[mode], "w") as f:
                f.write(run_sql(args.n, mode))
        cpu = {"OFF": [], "ON": []}
        db = os.path.join(tmp, "db")
        for _ in range(args.rounds):
            for mode in ("OFF", "ON"):
                for suffix in ("", "-wal", "-shm"):
                    if os.path.exists(db + suffix):
                        os.remove(db + suffix)
                cpu_of(["sqlite3", db], paths["setup"])
                cpu[mode].append(cpu_of(["sqlite3", db], paths[mode]) / args.n * 1e6)
        for mode in ("OFF", "ON"):
            runs = ", ".join(f"{x:.2f}" for x in cpu[mode])
            print(f"secure_delete {mode}: {statistics.median(cpu[mode]):.2f} us/msg (runs {runs})")


if __name__ == "__main__":
    main()
