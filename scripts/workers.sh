#!/usr/bin/env bash
# Run N `mailsplit worker` processes under supervisord (scripts/supervisord.conf).
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/workers.sh start|serve|stop|status [options]

  start   start supervisord (daemonized) running N `mailsplit worker`s; waits
          until they are RUNNING
  serve   also start `mailsplit serve` (program mailsplit-serve) under the
          supervisord that `start` started; waits until it is RUNNING.
          serve reads its settings (MAILSPLIT_LISTEN, MAILSPLIT_ADMIN_LISTEN,
          MAILSPLIT_ADMIN_TOKEN, ...) from supervisord's environment, which is
          fixed when supervisord starts: export them before `start`
  stop    shut supervisord and its workers down (TERM: workers finish or hand
          back their jobs); idempotent
  status  supervisorctl status

Options:
  --workers N   number of workers (default 2)
  --dir DIR     supervisord's pid, socket and logs, the workers' cwd
                (default .mailsplit-run in the current directory)
  --bin PATH    mailsplit binary (default target/release/mailsplit of this repo)
  -h, --help    this help

The workers take DATABASE_URL, BEANSTALKD, MAILSPLIT_TUBE, SMTP_URL (and
MAILSPLIT_CONCURRENCY, MAILSPLIT_LOG) from this script's environment. If
BEANSTALKD and SMTP_URL are both unset and DIR/env exists (written by
scripts/services.sh start), it is sourced. A relative sqlite:// DATABASE_URL
(or none, i.e. sqlite://mailsplit.db) is made absolute against the current
directory, because the workers run in DIR.

Logs: DIR/mailsplit-worker-NN.log, DIR/supervisord.log. DIR and everything in
it are created private to the user (0700/0600); URLs are printed without their
passwords.
EOF
}

# why: the run directory, its logs and pids are the operator's alone (0700/0600)
umask 077

die() { echo "workers.sh: $*" >&2; exit 1; }
usage_error() { echo "workers.sh: $* (see --help)" >&2; exit 2; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
conf="$here/supervisord.conf"
# shellcheck source=scripts/redact.sh
source "$here/redact.sh"

cmd=""
workers=2
dir=".mailsplit-run"
bin="$here/../target/release/mailsplit"
while (($# > 0)); do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        start | serve | stop | status)
            [[ -z $cmd ]] || usage_error "only one command, got '$cmd' and '$1'"
            cmd=$1 ;;
        --workers) workers=${2:?--workers needs a value}; shift ;;
        --workers=*) workers=${1#*=} ;;
        --dir) dir=${2:?--dir needs a value}; shift ;;
        --dir=*) dir=${1#*=} ;;
        --bin) bin=${2:?--bin needs a value}; shift ;;
        --bin=*) bin=${1#*=} ;;
        *) usage_error "unknown argument: $1" ;;
    esac
    shift
done
[[ -n $cmd ]] || usage_error "missing command: start, serve, stop or status"
[[ $workers =~ ^[1-9][0-9]*$ ]] || usage_error "--workers must be a positive number, got '$workers'"
command -v supervisord >/dev/null 2>&1 || die "supervisord not found: run scripts/install-deps.sh"

if [[ ! -d $dir ]]; then
    case "$cmd" in
        stop) echo "workers: not running"; exit 0 ;;
        status) echo "workers: not running (no $dir)"; exit 3 ;;
    esac
    mkdir -p "$dir"
fi
# why: supervisord daemonizes (and workers chdir), so every path it sees must be absolute
dir=$(cd "$dir" && pwd)
bin_dir=$(cd "$(dirname "$bin")" 2>/dev/null && pwd) || bin_dir=$(dirname "$bin")
bin="$bin_dir/$(basename "$bin")"

# the variables supervisord.conf expands
export MAILSPLIT_BIN="$bin" MAILSPLIT_WORKERS="$workers" MAILSPLIT_DIR="$dir"
ctl=(supervisorctl -c "$conf")

# true while pid runs; a zombie counts as gone (its reaper, pid 1, may be slow)
alive() {
    local state
    state=$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$1/status" 2>/dev/null) || return 1
    [[ -n $state && $state != Z ]]
}

# supervisord's pid if the one for this DIR is alive
supervisord_pid() {
    local pid
    [[ -f $dir/supervisord.pid ]] || return 1
    pid=$(<"$dir/supervisord.pid")
    [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" || return 1
    # why: a stale pidfile may name a recycled pid of an unrelated process
    grep -q supervisord "/proc/$pid/cmdline" 2>/dev/null || return 1
    echo "$pid"
}

# ask supervisord to stop its workers and exit; wait for it
shutdown_and_wait() {
    local pid=$1 i
    "${ctl[@]}" shutdown >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
    # why: shutdown returns at once; workers get stopwaitsecs=30 to finish their jobs
    for ((i = 0; i < 400; i++)); do
        alive "$pid" || return 0
        sleep 0.1
    done
    die "supervisord (pid $pid) still running after 40 s; see $dir/supervisord.log"
}

case "$cmd" in
    status)
        supervisord_pid >/dev/null || { echo "workers: not running (no supervisord for $dir)"; exit 3; }
        exec "${ctl[@]}" status
        ;;

    serve)
        supervisord_pid >/dev/null ||
            die "no supervisord for $dir: run 'scripts/workers.sh start --dir $dir' first (with serve's settings exported)"
        "${ctl[@]}" start mailsplit-serve >/dev/null 2>&1 || true
        state=""
        for ((i = 0; i < 50; i++)); do
            state=$("${ctl[@]}" status mailsplit-serve 2>/dev/null || true)
            [[ $state == *' RUNNING '* || $state == *' FATAL '* ]] && break
            sleep 0.2
        done
        if [[ $state != *' RUNNING '* ]]; then
            echo "$state" >&2
            tail -n 20 "$dir/mailsplit-serve.log" >&2 2>/dev/null || true
            die "mailsplit serve did not start (see $dir/mailsplit-serve.log); its settings come from the environment 'scripts/workers.sh start' had"
        fi
        echo "serve: running under supervisord; log in $dir/mailsplit-serve.log"
        ;;

    stop)
        pid=$(supervisord_pid) || { echo "workers: not running"; exit 0; }
        shutdown_and_wait "$pid"
        echo "workers: stopped (supervisord pid $pid)"
        ;;

    start)
        if pid=$(supervisord_pid); then
            die "already running in $dir (supervisord pid $pid); run 'scripts/workers.sh stop --dir $dir' first"
        fi
        [[ -x $bin ]] || die "$bin is not an executable file (build it: cargo build --release, or pass --bin)"

        if [[ -z ${BEANSTALKD:-} && -z ${SMTP_URL:-} && -f $dir/env ]]; then
            echo "workers: using $dir/env from scripts/services.sh"
            # shellcheck source=/dev/null
            source "$dir/env"
        fi
        # why: workers run with cwd DIR; a relative sqlite path must keep meaning "here"
        db=${DATABASE_URL:-sqlite://mailsplit.db}
        if [[ $db == sqlite:* ]]; then
            path=${db#sqlite:}
            path=${path#//}
            [[ $path == /* ]] || db="sqlite://$PWD/$path"
        fi
        export DATABASE_URL="$db"
        for v in BEANSTALKD SMTP_URL; do
            [[ -n ${!v:-} ]] || echo "workers: warning: $v is not set; the workers use their default" >&2
        done

        rm -f "$dir/supervisord.pid"
        supervisord -c "$conf" || die "supervisord failed to start; see $dir/supervisord.log"

        # why: supervisord forks into the background before its workers are up;
        # report a worker that cannot start now rather than leave it FATAL silently
        state="" running=0 deadline=$((SECONDS + 15))
        while ((SECONDS < deadline)); do
            state=$("${ctl[@]}" status 2>/dev/null || true)
            running=$(grep -c ' RUNNING ' <<<"$state" || true)
            ((running == workers)) && break
            grep -q ' FATAL ' <<<"$state" && break
            sleep 0.2
        done
        if ((running != workers)); then
            echo "$state" >&2
            tail -n 20 "$dir"/mailsplit-worker-*.log >&2 2>/dev/null || true
            if pid=$(supervisord_pid); then shutdown_and_wait "$pid"; fi
            die "workers did not start (see $dir/mailsplit-worker-NN.log and $dir/supervisord.log)"
        fi
        # why: both URLs may carry a password; a banner ends up in terminals and CI logs
        echo "workers: $workers x $bin worker (DATABASE_URL=$(redact_url "$DATABASE_URL") BEANSTALKD=${BEANSTALKD:-default} SMTP_URL=$(redact_url "${SMTP_URL:-default}")); logs in $dir"
        ;;
esac
