#!/usr/bin/env bash
# Install, build, and send a demo campaign through local beanstalkd + smtp-sink.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/quickstart.sh [--n N] [--debug] [--help]

On a fresh Debian machine (as root): installs beanstalkd, smtp-sink and
supervisor (scripts/install-deps.sh), builds mailsplit (cargo build --release;
with --debug the debug build of every target, the one the tests share, as
scripts/test.sh runs it),
starts beanstalkd and smtp-sink on free ports under .mailsplit-run/, imports N
generated recipients (default 20000) into SQLite (.mailsplit-run/demo.db),
creates and enqueues the campaign "demo-news", runs 2 workers under
supervisord until every recipient is sent (at most 300 s), prints
`mailsplit status demo-news`, and stops everything again (also on failure).
Safe to re-run: each run starts from an empty demo database and queue.
The build output (target/, the binary) is made readable and executable by
everyone (0755), so Postfix's pipe(8) (another user) can run the binary;
only what the demo writes under .mailsplit-run/ is private (umask 077).
EOF
}

n=20000
profile=release
while (($# > 0)); do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --n) n=${2:?--n needs a value}; shift ;;
        --n=*) n=${1#*=} ;;
        --debug) profile=debug ;;
        *) echo "quickstart.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "quickstart.sh: --n must be a positive number" >&2; exit 2; }

# why: every path below is relative to the repository, wherever we are called from
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/redact.sh
source scripts/redact.sh
run=.mailsplit-run
BIN=target/$profile/mailsplit
timeout_s=300

step() { echo "==> $*"; }
ms() {
    local a shown=""
    for a in "$@"; do
        [[ $a == *[[:space:]]* ]] && a="\"$a\"" # why: show the command as one would type it
        shown+=" $a"
    done
    echo "==> mailsplit$shown"
    "$BIN" "$@"
}

step "install system packages if missing (scripts/install-deps.sh)"
scripts/install-deps.sh

build=(cargo build)
# why: --debug is the build the tests share: with every target, as they
# build it. A binary-only build resolves the dependencies' features without
# the dev-dependencies (time's macros, bitflags' std, ...), so the tests'
# build that follows compiled most dependencies and the crate a second time.
if [[ $profile == release ]]; then build+=(--release); else build+=(--all-targets); fi
step "${build[*]} (umask 022: target/ and the binary 0755)"
# why: Postfix's pipe(8) runs the binary as another user (nobody): a build
# under the private umask below would make target/ 0700 and every bounce
# "Permission denied"; chmod too, for a target/ an earlier run made private
(umask 022 && "${build[@]}")
chmod go+rx target "target/$profile" "$BIN"

# why: the demo database, CSV, logs and run directory are the user's alone (0700/0600)
umask 077

# why: a previous run interrupted hard (kill -9) may have left these behind
scripts/workers.sh stop --dir "$run" >/dev/null
scripts/services.sh stop --dir "$run" >/dev/null

stop_all() {
    step "stop workers and services"
    scripts/workers.sh stop --dir "$run" || true
    scripts/services.sh stop --dir "$run" || true
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_all
    echo "quickstart: FAILED (exit $rc); logs are in $run/" >&2
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM # why: run the EXIT cleanup on Ctrl-C too

step "reset the demo: remove $run/demo.db and the old beanstalkd binlog"
rm -f "$run/demo.db" "$run/demo.db-wal" "$run/demo.db-shm"
rm -rf "$run/binlog"

step "start beanstalkd and smtp-sink (scripts/services.sh start --dir $run)"
scripts/services.sh start --dir "$run"
# shellcheck source=/dev/null
source "$run/env"
# why: absolute, because the workers run with $run as their working directory
export DATABASE_URL="sqlite://$PWD/$run/demo.db"
echo "    DATABASE_URL=$(redact_url "$DATABASE_URL") BEANSTALKD=$BEANSTALKD SMTP_URL=$(redact_url "$SMTP_URL")"

step "generate $run/demo.csv with $n recipients (email,name,city)"
awk -v n="$n" 'BEGIN {
    split("Berlin Paris Lisbon Oslo Vienna Rome Madrid Prague", city, " ")
    print "email,name,city"
    for (i = 1; i <= n; i++) printf "user%d@example.test,User %d,%s\n", i, i, city[i % 8 + 1]
}' >"$run/demo.csv"

ms migrate
ms import "$run/demo.csv" --list demo
ms templates
ms campaign create demo-news --list demo --template newsletter \
    --subject "Hello from mailsplit" --from news@example.test
ms enqueue demo-news

start=$SECONDS
step "start 2 workers under supervisord (scripts/workers.sh start --workers 2)"
scripts/workers.sh start --workers 2 --dir "$run" --bin "$BIN"

pending() {
    "$BIN" status demo-news --json | python3 -c '
import json, sys
rows = [json.loads(line) for line in sys.stdin if line.strip()]
row = next(r for r in rows if r.get("name") == "demo-news")
print(row["pending"], row["sent"], row["failed"])'
}

step "wait until every recipient is sent (mailsplit status demo-news --json shows pending 0)"
while :; do
    counts=$(pending) # why: a failing status must stop us, not read as "0 pending"
    read -r left sent failed <<<"$counts"
    ((left == 0)) && break
    if ((SECONDS - start >= timeout_s)); then
        echo "quickstart: still $left pending after ${timeout_s}s; see $run/mailsplit-worker-*.log" >&2
        exit 1
    fi
    echo "    sent $sent, failed $failed, pending $left"
    sleep 1
done
elapsed=$((SECONDS - start))

ms status demo-news

trap - EXIT INT TERM
stop_all
echo "quickstart: done: $sent sent, $failed failed in ~${elapsed}s by 2 workers; logs in $run/"
