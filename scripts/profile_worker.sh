#!/bin/bash
# One worker's CPU per message against smtp-sink's, and optionally where it
# goes: a SQLite campaign of N recipients (the newsletter starter, as
# scripts/bench.py sends it) through ONE worker x 100 sessions to a fresh
# smtp-sink, each on a free loopback port.
#
#   scripts/profile_worker.sh BIN N [--perf SECONDS]
#
# Prints worker and sink CPU per message (from /proc/PID/stat, not wall
# time) and their ratio. With --perf, records the worker for SECONDS with
# `perf record --call-graph dwarf` once it is under way and prints the
# shares of the stages (scripts/perf_stages.py). Nothing asserts a speed;
# nothing is written to BENCHMARKS.md. Needs beanstalkd, smtp-sink (and
# perf for --perf): scripts/install-deps.sh.
set -euo pipefail
BIN=$(realpath "$1"); N=$2; PERF=${4:-}
[ "${3:-}" = "--perf" ] || PERF=
OUT=$(mktemp -d /tmp/mailsplit-profile-XXXXXX)
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
BP=$(free_port); SP=$(free_port)
mkdir -p "$OUT/binlog"
beanstalkd -l 127.0.0.1 -p "$BP" -b "$OUT/binlog" & BPID=$!
/usr/sbin/smtp-sink -u nobody "127.0.0.1:$SP" 1000 & SPID=$!
W=
cleanup() { kill "$BPID" "$SPID" ${W:+"$W"} 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$OUT"; }
trap cleanup EXIT
sleep 0.5
export DATABASE_URL="sqlite://$OUT/db.sqlite" BEANSTALKD="127.0.0.1:$BP" MAILSPLIT_LOG=error MAILSPLIT_TUBE=profile
python3 - "$N" "$OUT/r.csv" <<'PY'
import sys
n = int(sys.argv[1])
with open(sys.argv[2], "w") as f:
    f.write("email,name,city,code\n")
    for i in range(1, n + 1):
        f.write(f"user{i}@example.test,User {i},City {i % 97},C{i % 1000}\n")
PY
"$BIN" migrate >/dev/null
"$BIN" import "$OUT/r.csv" --list p >/dev/null
"$BIN" campaign create p --list p --template newsletter --subject "Benchmark news" --from news@example.test >/dev/null 2>&1
"$BIN" enqueue p >/dev/null
stat_cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
s0=$(stat_cpu $SPID); t0=$(date +%s.%N)
SMTP_URL="smtp://127.0.0.1:$SP" "$BIN" worker --concurrency 100 & W=$!
if [ -n "$PERF" ]; then
    sleep 3
    perf record -F 499 --call-graph dwarf,16384 -p $W -o "$OUT/perf.data" -- sleep "$PERF" >/dev/null 2>&1
    perf script -i "$OUT/perf.data" 2>/dev/null > "$OUT/perf.txt"
fi
while :; do
    p=$("$BIN" status p --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pending"])')
    [ "$p" = 0 ] && break
    sleep 0.5
done
t1=$(date +%s.%N); wc=$(stat_cpu $W); s1=$(stat_cpu $SPID)
kill -TERM $W; wait $W || true; W=
python3 -c "
n=$N; hz=$(getconf CLK_TCK); w=$wc/hz; s=($s1-$s0)/hz; t=$t1-$t0
print(f'worker {w/n*1e6:.1f} us/msg, smtp-sink {s/n*1e6:.1f} us/msg, ratio {w/s:.2f}, {n/t:.0f} msg/s')"
if [ -n "$PERF" ]; then
    echo "(perf was attached for ${PERF} s: the figures above include its cost; compare runs without --perf)"
    python3 "$(dirname "$0")/perf_stages.py" "$OUT/perf.txt"
fi
