#!/usr/bin/env bash
# Start/stop a private beanstalkd and smtp-sink for mailsplit on loopback ports.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/services.sh start|stop|env [options]

  start   start beanstalkd (with a binlog) and Postfix's smtp-sink on 127.0.0.1,
          on the given ports or on free ones; wait until both accept connections;
          write DIR/env for `source`
  stop    stop what `start` started in DIR (by the pids in DIR); idempotent
  env     print DIR/env:
            export BEANSTALKD=127.0.0.1:P  export SMTP_URL=smtp://127.0.0.1:P
            export BEANSTALKD_PORT=P       export SMTP_PORT=P

Options:
  --dir DIR              state directory (pids, logs, binlog/, env);
                         default .mailsplit-run in the current directory
  --beanstalkd-port P    default: a free port
  --smtp-port P          default: a free port
  --smtp-sink-args ARGS  extra smtp-sink options, split on spaces, e.g.
                         "-w 1" (delay DATA) or "-r RCPT" (4xx) or "-f DATA" (5xx);
                         separate several commands with commas, not spaces
  -h, --help             this help

Example:
  scripts/services.sh start && source .mailsplit-run/env
  ...
  scripts/services.sh stop

Files in DIR: beanstalkd.pid, beanstalkd.log, binlog/ (kept across restarts, so
queued jobs survive), smtp-sink.pid, smtp-sink.log, env. Whatever start creates
is private to the user (directories 0700, files 0600).
EOF
}

# why: the run directory (binlog with queued jobs, logs, env) is the operator's alone (0700/0600)
umask 077

die() { echo "services.sh: $*" >&2; exit 1; }
usage_error() { echo "services.sh: $* (see --help)" >&2; exit 2; }

cmd=""
dir=".mailsplit-run"
bs_port=""
smtp_port=""
sink_args=""
while (($# > 0)); do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        start | stop | env)
            [[ -z $cmd ]] || usage_error "only one command, got '$cmd' and '$1'"
            cmd=$1 ;;
        --dir) dir=${2:?--dir needs a value}; shift ;;
        --dir=*) dir=${1#*=} ;;
        --beanstalkd-port) bs_port=${2:?--beanstalkd-port needs a value}; shift ;;
        --beanstalkd-port=*) bs_port=${1#*=} ;;
        --smtp-port) smtp_port=${2:?--smtp-port needs a value}; shift ;;
        --smtp-port=*) smtp_port=${1#*=} ;;
        --smtp-sink-args) sink_args=${2?--smtp-sink-args needs a value}; shift ;;
        --smtp-sink-args=*) sink_args=${1#*=} ;;
        *) usage_error "unknown argument: $1" ;;
    esac
    shift
done
[[ -n $cmd ]] || usage_error "missing command: start, stop or env"
for p in "$bs_port" "$smtp_port"; do
    [[ -z $p || $p =~ ^[0-9]+$ ]] || usage_error "not a port number: $p"
done

if [[ ! -d $dir ]]; then
    case "$cmd" in
        stop) exit 0 ;;
        env) die "no $dir: run 'scripts/services.sh start' first" ;;
    esac
    mkdir -p "$dir"
fi
dir=$(cd "$dir" && pwd) # why: pids/env must name the same place from any cwd

# true while pid runs; a zombie counts as gone (its reaper, pid 1, may be slow)
alive() {
    local state
    state=$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$1/status" 2>/dev/null) || return 1
    [[ -n $state && $state != Z ]]
}

# name pidfile expected-comm -> pid if that process is alive and is what we started
live_pid() {
    local pidfile=$1 comm=$2 pid
    [[ -f $pidfile ]] || return 1
    pid=$(<"$pidfile")
    [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" || return 1
    # why: a stale pidfile may name a recycled pid of some unrelated process
    # (setsid: the instant between fork and exec of a just-started one)
    case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
        "$comm" | setsid) ;;
        *) return 1 ;;
    esac
    echo "$pid"
}

stop_one() {
    local name=$1 comm=$2 pidfile="$dir/$1.pid" pid i
    if pid=$(live_pid "$pidfile" "$comm"); then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do
            alive "$pid" || break
            sleep 0.1
        done
        if alive "$pid"; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
        echo "stopped $name (pid $pid)"
    fi
    rm -f "$pidfile"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port() {
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
    else
        # why: fresh machines may lack python3; probe random high ports instead
        local p i
        for ((i = 0; i < 100; i++)); do
            p=$((20000 + RANDOM % 30000))
            port_open "$p" || { echo "$p"; return 0; }
        done
        die "no free port found"
    fi
}

# wait until pid listens on port, else exit naming the port and the log
wait_listening() {
    local name=$1 pid=$2 port=$3 log=$4 i
    for ((i = 0; i < 100; i++)); do
        if ! alive "$pid"; then
            tail -n 5 "$log" >&2 || true
            die "$name exited instead of listening on 127.0.0.1:$port; see $log"
        fi
        port_open "$port" && return 0
        sleep 0.1
    done
    tail -n 5 "$log" >&2 || true
    die "$name did not accept connections on 127.0.0.1:$port within 10 s; see $log"
}

case "$cmd" in
    env)
        [[ -f $dir/env ]] || die "no $dir/env: run 'scripts/services.sh start' first"
        cat "$dir/env"
        ;;

    stop)
        stop_one smtp-sink smtp-sink
        stop_one beanstalkd beanstalkd
        rm -f "$dir/env"
        ;;

    start)
        # why: a second start must not leak a second pair of daemons
        if live_pid "$dir/beanstalkd.pid" beanstalkd >/dev/null ||
            live_pid "$dir/smtp-sink.pid" smtp-sink >/dev/null; then
            die "already running in $dir; run 'scripts/services.sh stop --dir $dir' first"
        fi
        command -v beanstalkd >/dev/null 2>&1 || die "beanstalkd not found: run scripts/install-deps.sh"
        [[ -x /usr/sbin/smtp-sink ]] || die "/usr/sbin/smtp-sink not found: run scripts/install-deps.sh"
        rm -f "$dir/beanstalkd.pid" "$dir/smtp-sink.pid" "$dir/env"

        [[ -n $bs_port ]] || bs_port=$(free_port)
        [[ -n $smtp_port ]] || smtp_port=$(free_port)
        [[ $bs_port != "$smtp_port" ]] || smtp_port=$(free_port)
        # why: otherwise the readiness check would see the other program and report success
        for p in "$bs_port" "$smtp_port"; do
            ! port_open "$p" || die "port 127.0.0.1:$p is already in use"
        done

        # why: if anything below fails, stop whatever we did start
        ok=0
        undo_start() {
            ((ok)) && return
            stop_one smtp-sink smtp-sink >/dev/null
            stop_one beanstalkd beanstalkd >/dev/null
        }
        trap undo_start EXIT

        mkdir -p "$dir/binlog"
        # why: setsid detaches from the terminal's process group, so Ctrl-C or a
        # closed terminal does not kill the services; it keeps the pid (no fork)
        setsid beanstalkd -l 127.0.0.1 -p "$bs_port" -b "$dir/binlog" \
            </dev/null >"$dir/beanstalkd.log" 2>&1 &
        echo $! >"$dir/beanstalkd.pid"

        read -r -a extra <<<"$sink_args"
        sink_user=()
        # why: smtp-sink refuses to run as root without -u (it drops privileges after bind)
        ((EUID != 0)) || sink_user=(-u nobody)
        # why: -c prints running counters to its log; options must precede host:port backlog
        setsid /usr/sbin/smtp-sink -c "${extra[@]}" "${sink_user[@]}" "127.0.0.1:$smtp_port" 1000 \
            </dev/null >"$dir/smtp-sink.log" 2>&1 &
        echo $! >"$dir/smtp-sink.pid"

        wait_listening beanstalkd "$(<"$dir/beanstalkd.pid")" "$bs_port" "$dir/beanstalkd.log"
        wait_listening smtp-sink "$(<"$dir/smtp-sink.pid")" "$smtp_port" "$dir/smtp-sink.log"

        cat >"$dir/env.tmp" <<EOF
export BEANSTALKD=127.0.0.1:$bs_port
export SMTP_URL=smtp://127.0.0.1:$smtp_port
export BEANSTALKD_PORT=$bs_port
export SMTP_PORT=$smtp_port
EOF
        mv "$dir/env.tmp" "$dir/env"
        ok=1
        echo "beanstalkd on 127.0.0.1:$bs_port (pid $(<"$dir/beanstalkd.pid"), binlog $dir/binlog)"
        echo "smtp-sink  on 127.0.0.1:$smtp_port (pid $(<"$dir/smtp-sink.pid"))"
        echo "environment: source $dir/env"
        ;;
esac
