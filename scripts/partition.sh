#!/usr/bin/env bash
# The partition suite (issue 28): real network faults between hosts of
# scripts/cluster.sh, each mid-campaign and healed, and what they cost.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/partition.sh [--short] [--only FAULT[,FAULT...]] [--cut SECONDS]

Builds the cluster (scripts/cluster.sh up --workers 3: PostgreSQL, two
beanstalkd, a counting relay, three worker hosts), then for each fault:
a fresh campaign, three workers with --concurrency C, the fault injected
mid-campaign and healed after the cut, and the campaign followed to its
end. Prints one table row per fault:

  fault, cut (s), recipients, lost (recorded sent but never at the relay,
  or never finished), duplicates (recipients the relay got twice or more),
  the bound the design claims for it, and the time from the heal until
  nothing is pending.

Exits 1 when any fault loses a recipient, exceeds its bound, does not
finish, or leaves `status` inexact (pending 0, counters = COUNT(*) of the
ledger). Tears the cluster down at the end.

Faults: worker-all (w1 cut from every host), worker-db (w1 cut from the
database only), worker-bs (w1 cut from beanstalkd 1), db (the database
host cut from everyone), relay (the relay cut), bs-lost (beanstalkd 1
killed, binlog deleted, started empty, then `mailsplit requeue`), slow-db
(w1 restarted behind a 50 ms round trip to the database), clock (w1
restarted with its wall clock 30 s ahead), worker-db-60 (worker-db cut
for 60 s, to show the bound does not grow with the cut), and
worker-db-reset (w1's database link silent both ways for the cut, then
its connections reset: each end that sends next gets an RST, for
RESET_FOR seconds, as a switch that comes back without its state does; a
connection where both ends wait for the other is never reset).

Full: 20,000 recipients, C = 100, cuts of 40 s (worker-db: 20 s and 60 s).
--short: 2,000 recipients, C = 20, a claim lease of 10 s
(MAILSPLIT_LEASE_MS=10000, production 30 s), worker-db and worker-db-reset
cut 15 s (past the lease), relay and db cut 10 s, bs-lost; about 4
minutes.
Needs root (network namespaces) and target/release/mailsplit (or debug).
EOF
}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CLUSTER=$ROOT/scripts/cluster.sh
SHORT=0
ONLY=""
CUT=""
while (($#)); do
    case $1 in
        --short) SHORT=1; shift ;;
        --only) ONLY=${2:?--only needs fault names}; shift 2 ;;
        --cut) CUT=${2:?--cut needs seconds}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "partition.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

if ((SHORT)); then
    # why: the long cuts must outlast a claim's lease; the short form runs
    # every process with a 10 s lease (the hidden MAILSPLIT_LEASE_MS,
    # production 30 s), so a 15 s cut proves the same bound sooner
    export MAILSPLIT_LEASE_MS=${MAILSPLIT_LEASE_MS:-10000}
    N=2000 C=20 DELAY_MS=400 LONG=${CUT:-15} BRIEF=${CUT:-10}
    FAULTS=${ONLY:-worker-db,worker-db-reset,relay,db,bs-lost}
else
    N=20000 C=100 DELAY_MS=1000 LONG=${CUT:-40} BRIEF=${CUT:-40}
    FAULTS=${ONLY:-worker-db,worker-db-60,worker-db-reset,worker-all,worker-bs,db,relay,bs-lost,slow-db,clock}
fi
# How long the resets of worker-db-reset last before the link is healed.
RESET_FOR=5
# Seconds into the campaign a fault starts.
START_AFTER=8
# Longest wait after the heal for the campaign to finish.
FINISH_WITHIN=300

eval "$("$CLUSTER" env)"
export DATABASE_URL BEANSTALKD SMTP_URL CLUSTER_DIR
BIN=${MAILSPLIT:-$ROOT/target/release/mailsplit}
[[ -x $BIN ]] || BIN=$ROOT/target/debug/mailsplit
export MAILSPLIT=$BIN
export MAILSPLIT_TUBE=partition MAILSPLIT_LOG=${MAILSPLIT_LOG:-info}
# shellcheck disable=SC2012 # why: version directories, newest by sort -V
PSQL="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)/psql"

say() { echo "partition: $*" >&2; }
ms() { "$BIN" "$@"; }

# The relay answers each message after DELAY_MS, so a campaign lasts long
# enough for a fault to land in its middle.
RELAY_DELAY_MS=$DELAY_MS "$CLUSTER" up --workers 3 || exit $?
trap '"$CLUSTER" down' EXIT

sql() { "$PSQL" "$DATABASE_URL" -Atq -c "$1"; }

ms migrate >/dev/null
python3 - "$CLUSTER_DIR/list.csv" "$N" <<'EOF'
import sys
with open(sys.argv[1], "w") as f:
    f.write("email,name\n")
    for i in range(1, int(sys.argv[2]) + 1):
        f.write(f"user{i}@example.test,User {i}\n")
EOF
ms import "$CLUSTER_DIR/list.csv" --list people >/dev/null

RESULTS=$CLUSTER_DIR/results.jsonl
: >"$RESULTS"

start_workers() {
    local i
    for i in 1 2 3; do "$CLUSTER" worker "$i" --concurrency "$C"; done
}

stop_workers() {
    local i
    for i in 1 2 3; do "$CLUSTER" stop-worker "$i"; done
}

pending() { ms status "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pending"])'; }

# The fault itself: inject, wait the cut, heal. Sets BOUND.
inject() {
    local fault=$1 cut=$2
    case $fault in
        worker-all) BOUND=$C; "$CLUSTER" cut w1 all ;;
        worker-db | worker-db-*) BOUND=$C; "$CLUSTER" cut w1 db ;;
        worker-bs) BOUND=0; "$CLUSTER" cut w1 bs1 ;;
        db) BOUND=$((3 * C)); "$CLUSTER" cut db all ;;
        relay) BOUND=$((3 * C)); "$CLUSTER" cut relay all ;;
        bs-lost) BOUND=0; "$CLUSTER" bs-kill 1 ;;
        slow-db)
            BOUND=0
            "$CLUSTER" stop-worker 1
            "$CLUSTER" slow-worker 1 25 --concurrency "$C" ;;
        clock)
            BOUND=0
            "$CLUSTER" stop-worker 1
            FAKETIME=+30s "$CLUSTER" worker 1 --concurrency "$C" ;;
        *) say "unknown fault $fault"; exit 2 ;;
    esac
    sleep "$cut"
    case $fault in
        worker-db-reset)
            "$CLUSTER" reset w1 db
            sleep "$RESET_FOR"
            "$CLUSTER" heal w1 ;;
        worker-all | worker-db | worker-db-* | worker-bs) "$CLUSTER" heal w1 ;;
        db) "$CLUSTER" heal db ;;
        relay) "$CLUSTER" heal relay ;;
        bs-lost)
            "$CLUSTER" bs-start 1
            # The jobs of the lost server: put again what is not finished
            # (the ledger keeps anything finished from being sent twice).
            ms requeue "$CAMPAIGN" >/dev/null ;;
        *) ;;
    esac
}

run_fault() {
    local fault=$1 cut=$2
    CAMPAIGN="p-$fault"
    : >"$CLUSTER_DIR/relay.rcpts"
    ms campaign create "$CAMPAIGN" --list people --template newsletter --subject Hello \
        --from news@example.test >/dev/null 2>&1
    ms enqueue "$CAMPAIGN" >/dev/null
    start_workers
    sleep "$START_AFTER"
    local before
    before=$(pending "$CAMPAIGN")
    say "$fault: injecting with $before of $N pending, for $cut s"
    inject "$fault" "$cut"
    local healed=$SECONDS finished=-1
    while ((SECONDS - healed < FINISH_WITHIN)); do
        if [[ $(pending "$CAMPAIGN") == 0 ]]; then finished=$((SECONDS - healed)); break; fi
        sleep 1
    done
    # Anything still on its way to the relay lands now.
    sleep 3
    stop_workers
    local id
    id=$(ms status "$CAMPAIGN" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
    sql "SELECT r.email FROM deliveries d JOIN recipients r ON r.id = d.recipient_id
         WHERE d.campaign_id = $id AND d.state = 'sent'" >"$CLUSTER_DIR/sent.txt"
    sql "SELECT state, COUNT(*) FROM deliveries WHERE campaign_id = $id GROUP BY state" \
        >"$CLUSTER_DIR/ledger.txt"
    ms status "$CAMPAIGN" --json >"$CLUSTER_DIR/status.json"
    python3 - "$fault" "$cut" "$N" "$BOUND" "$finished" "$CLUSTER_DIR" >>"$RESULTS" <<'EOF'
import collections, json, sys
fault, cut, n, bound, finished, d = sys.argv[1:]
got = collections.Counter(l.strip() for l in open(f"{d}/relay.rcpts") if l.strip())
sent = {l.strip() for l in open(f"{d}/sent.txt") if l.strip()}
ledger = {}
for line in open(f"{d}/ledger.txt"):
    if line.strip():
        state, count = line.strip().split("|")
        ledger[state] = int(count)
status = json.load(open(f"{d}/status.json"))
exact = (status["pending"] == 0
         and all(status[k] == ledger.get(k, 0) for k in ("sent", "failed", "skipped"))
         and sum(ledger.values()) == int(n))
finished_ms = sum(ledger.get(k, 0) for k in ("sent", "failed", "skipped"))
lost = len(sent - set(got)) + (int(n) - finished_ms)
dups = sum(1 for c in got.values() if c > 1)
print(json.dumps({"fault": fault, "cut": int(cut), "recipients": int(n), "lost": lost,
                  "duplicates": dups, "bound": int(bound), "finished_after_heal": int(finished),
                  "exact": exact, "failed": ledger.get("failed", 0)}))
EOF
    tail -1 "$RESULTS" >&2
}

IFS=, read -ra list <<<"$FAULTS"
for fault in "${list[@]}"; do
    case $fault in
        worker-db-60) cut=60 ;;
        worker-db | worker-db-reset | worker-all) cut=$LONG ;;
        *) cut=$BRIEF ;;
    esac
    ((SHORT)) || [[ $fault != worker-db ]] || cut=${CUT:-20}
    run_fault "$fault" "$cut"
done

# The table; a full run also writes it into RELIABILITY.md (between its
# markers, which scripts/chaos.sh keeps).
REPORT=""
((SHORT)) || [[ -n $ONLY || -n $CUT ]] || REPORT=$ROOT/RELIABILITY.md
python3 - "$RESULTS" "$REPORT" "$((SECONDS / 60))m$((SECONDS % 60))s" "$N" "$C" "$DELAY_MS" <<'EOF'
import datetime, json, subprocess, sys
results, report, took, n, c, delay = sys.argv[1:]
rows = [json.loads(l) for l in open(results) if l.strip()]
table = ["| fault | cut s | recipients | lost | duplicates | bound | finished after heal s | status exact | result |",
         "|---|---:|---:|---:|---:|---:|---:|---|---|"]
bad = 0
for r in rows:
    ok = (r["lost"] == 0 and r["duplicates"] <= r["bound"]
          and r["finished_after_heal"] >= 0 and r["exact"])
    bad += not ok
    fin = r["finished_after_heal"] if r["finished_after_heal"] >= 0 else "never"
    table.append(f"| {r['fault']} | {r['cut']} | {r['recipients']} | {r['lost']} | {r['duplicates']} "
                 f"| {r['bound']} | {fin} | {'yes' if r['exact'] else 'NO'} | {'ok' if ok else 'FAIL'} |")
print("\n".join(table))
if report:
    commit = subprocess.run(["git", "log", "-1", "--format=%h"], capture_output=True, text=True).stdout.strip()
    begin, end = "<!-- partition.sh: begin -->", "<!-- partition.sh: end -->"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = "\n".join([
        begin, "## Network partitions (scripts/partition.sh)", "",
        "Produced by `scripts/partition.sh` (hosts of `scripts/cluster.sh`: network namespaces,",
        "faults are nft DROP rules, healed after the cut), not by hand. PostgreSQL, two",
        f"beanstalkd hosts, 3 worker hosts x --concurrency {c}, a relay answering each",
        f"message after {delay} ms; each fault starts 8 s into a campaign of {n} recipients.",
        "*lost* = recipients recorded sent that the relay never received + recipients",
        "without an outcome; *duplicates* = recipients the relay received twice or more;",
        "*bound* = what the design allows (README, \"Several machines\"); *finished after",
        "heal* = seconds from the heal until nothing was pending (0: finished during the cut).",
        "", f"- date: {when}; commit: {commit}; whole run {took}",
        "- regenerate: `scripts/partition.sh` (`--short` for the quick form)", "",
        *table, "", end])
    try:
        old = open(report, encoding="utf-8").read()
    except OSError:
        old = ""
    if begin in old and end in old:
        new = old[:old.index(begin)] + section + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + section + "\n"
    open(report, "w", encoding="utf-8").write(new)
sys.exit(1 if bad else 0)
EOF
