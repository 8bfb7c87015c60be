#!/bin/bash
# One worker's CPU per message against smtp-sink's, and optionally where it
# goes: a campaign of N recipients (the newsletter starter, as
# scripts/bench.py sends it) through ONE worker x 100 sessions to a fresh
# smtp-sink, each on a free loopback port.
#
#   scripts/profile_worker.sh BIN N [--perf SECONDS | --callgrind | --syscalls] [--pg]
#
# Prints worker and sink CPU per message (from /proc/PID/stat, not wall
# time) and their ratio. With --perf, records the worker for SECONDS with
# `perf record --call-graph dwarf` once it is under way and prints the
# shares of the stages (scripts/perf_stages.py).
#
# With --callgrind the worker runs under `valgrind --tool=callgrind` and
# the figure printed is its user-space instructions per message (all its
# threads, start-up and shutdown included, less the heartbeat's one hash
# of the binary: keep N the same when comparing two binaries, e.g. 5000): a count that the machine's load does not move,
# unlike CPU time. Callgrind is ~50x slower, so the CPU figures of that run
# mean nothing; the sink is not under callgrind. CALLGRIND_OUT=FILE keeps
# the profile for callgrind_annotate.
#
# With --syscalls, `perf stat` counts the system calls of the worker and of
# the sink over the whole send (the tracepoint raw_syscalls:sys_enter), and
# prints them per message.
#
# With --pg the campaign runs on PostgreSQL: a fresh database under
# $MAILSPLIT_TEST_PG (default postgres://root@127.0.0.1:5432), created and
# dropped here. The worker's figure is then its own CPU plus its server
# backends': the postmaster's cutime+cstime (fields 16 and 17 of its
# /proc/PID/stat: every backend that exited, i.e. the worker's once it
# has exited), read before the worker starts and after it exits. Any other
# client's backends that end meanwhile (other tests or benches on the
# machine, the `status` polls of this script) are counted too: on a shared
# machine that figure is an upper bound. Also printed: the worker's own
# backends alone, sampled from /proc just before it exits.
#
# Nothing asserts a speed; nothing is written to BENCHMARKS.md. Needs
# beanstalkd, smtp-sink (perf for --perf, valgrind for --callgrind, psql
# for --pg): scripts/install-deps.sh.
set -euo pipefail
BIN=$(realpath "$1"); N=$2; shift 2
PERF='' CALLGRIND='' PG='' SYSCALLS=''
while [ $# -gt 0 ]; do
    case $1 in
        --perf) PERF=$2; shift 2 ;;
        --callgrind) CALLGRIND=1; shift ;;
        --pg) PG=1; shift ;;
        --syscalls) SYSCALLS=1; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
OUT=$(mktemp -d /tmp/mailsplit-profile-XXXXXX)
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
BP=$(free_port); SP=$(free_port)
mkdir -p "$OUT/binlog"
beanstalkd -l 127.0.0.1 -p "$BP" -b "$OUT/binlog" & BPID=$!
/usr/sbin/smtp-sink -u nobody "127.0.0.1:$SP" 1000 & SPID=$!
W=
PGBASE=${MAILSPLIT_TEST_PG:-postgres://root@127.0.0.1:5432}
DB=mailsplit_prof_$$_$RANDOM
cleanup() {
    kill "$BPID" "$SPID" ${W:+"$W"} 2>/dev/null || true
    wait 2>/dev/null || true
    if [ -n "$PG" ]; then psql "$PGBASE/postgres" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true; fi
    rm -rf "$OUT"
}
trap cleanup EXIT
sleep 0.5
if [ -n "$PG" ]; then
    psql "$PGBASE/postgres" -qc "CREATE DATABASE $DB" >/dev/null
    export DATABASE_URL="$PGBASE/$DB"
else
    export DATABASE_URL="sqlite://$OUT/db.sqlite"
fi
export BEANSTALKD="127.0.0.1:$BP" MAILSPLIT_LOG=error MAILSPLIT_TUBE=profile
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
# Kernel time alone (stime): the loopback TCP under each send and read
stat_sys() { awk '{print $15}' "/proc/$1/stat"; }
# The postmaster's reaped children (cutime + cstime), after the command name.
PGDIR=/var/lib/postgresql/15/main
pm_children() { sed 's/.*) //' "/proc/$(head -1 "$PGDIR/postmaster.pid")/stat" | awk '{print $14 + $15}'; }
# The live backends serving this run's database (process title
# `postgres: [CLUSTER: ]USER DATABASE CLIENT STATE`, Debian names the cluster).
own_backends() {
    local sum=0 pid
    for pid in $(pgrep -f "^postgres: ([^ ]+: )?[^ ]+ $DB "); do
        sum=$((sum + $(sed 's/.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}')))
    done
    echo $sum
}
if [ -n "$PG" ]; then p0=$(pm_children); fi
s0=$(stat_cpu $SPID); k0=$(stat_sys $SPID); t0=$(date +%s.%N)
if [ -n "$CALLGRIND" ]; then
    SMTP_URL="smtp://127.0.0.1:$SP" valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.out" \
        --log-file="$OUT/cg.log" "$BIN" worker --concurrency 100 & W=$!
else
    SMTP_URL="smtp://127.0.0.1:$SP" "$BIN" worker --concurrency 100 & W=$!
fi
PS=()
if [ -n "$SYSCALLS" ]; then
    perf stat -e raw_syscalls:sys_enter -x, -o "$OUT/sys.w" -p "$W" & PS+=($!)
    perf stat -e raw_syscalls:sys_enter -x, -o "$OUT/sys.s" -p "$SPID" & PS+=($!)
fi
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
wk=$(stat_sys $W); k1=$(stat_sys $SPID)
ob=0; if [ -n "$PG" ]; then ob=$(own_backends); fi
if [ ${#PS[@]} -gt 0 ]; then
    kill -INT "${PS[@]}"; wait "${PS[@]}" 2>/dev/null || true
    count() { awk -F, '/raw_syscalls/ {print $1}' "$1"; }
    python3 -c "n=$N; print(f'system calls per message: worker {$(count "$OUT/sys.w")/n:.2f}, smtp-sink {$(count "$OUT/sys.s")/n:.2f}')"
fi
kill -TERM $W; wait $W || true; W=
pb=0
if [ -n "$PG" ]; then
    sleep 1 # the postmaster reaps the worker's backends once they exit
    pb=$(($(pm_children) - p0))
fi
python3 -c "
n=$N; hz=$(getconf CLK_TCK); w=$wc/hz; s=($s1-$s0)/hz; t=$t1-$t0; pb=$pb/hz; ob=$ob/hz
if $([ -n "$PG" ] && echo True || echo False):
    print(f'worker {w/n*1e6:.1f} + backends {pb/n*1e6:.1f} us/msg (its own backends alone {ob/n*1e6:.1f}), '
          f'smtp-sink {s/n*1e6:.1f} us/msg, ratio {(w+pb)/s:.2f} (own backends only {(w+ob)/s:.2f}), {n/t:.0f} msg/s')
else:
    print(f'worker {w/n*1e6:.1f} us/msg, smtp-sink {s/n*1e6:.1f} us/msg, ratio {w/s:.2f}, {n/t:.0f} msg/s')
wk=$wk/hz; sk=($k1-$k0)/hz
print(f'of which in the kernel: worker {wk/n*1e6:.1f} us/msg ({wk/w:.0%}), smtp-sink {sk/n*1e6:.1f} us/msg ({sk/s:.0%})')"
if [ -n "$CALLGRIND" ]; then
    ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$OUT/cg.out")
    # The heartbeat hashes the worker's own binary once at start (tens of
    # MB, and callgrind's CPU has no SHA instructions): not a message's cost.
    hash=$(callgrind_annotate --inclusive=yes --threshold=100 "$OUT/cg.out" 2>/dev/null |
        awk '/:mailsplit::worker::heartbeat::binary_identity/ { gsub(",", "", $1); if ($1 + 0 > m + 0) m = $1 + 0 } END { print m + 0 }')
    echo "(under callgrind: the CPU figures above mean nothing)"
    python3 -c "print(f'worker instructions per message: {($ir - $hash) / $N:,.0f} '
                      f'({$ir:,} in all, less {$hash:,} hashing the binary at start; N=$N)')"
    if [ -n "${CALLGRIND_OUT:-}" ]; then cp "$OUT/cg.out" "$CALLGRIND_OUT"; fi
fi
if [ -n "$PERF" ]; then
    echo "(perf was attached for ${PERF} s: the figures above include its cost; compare runs without --perf)"
    python3 "$(dirname "$0")/perf_stages.py" "$OUT/perf.txt"
fi
