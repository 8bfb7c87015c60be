#!/usr/bin/env bash
# A small mailsplit cluster on one machine: hosts are Linux network
# namespaces on a bridge of the script's own, faults are nft DROP rules.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/cluster.sh up [--workers N]   build the hosts, start the servers
       scripts/cluster.sh down                stop everything, remove the hosts (idempotent)
       scripts/cluster.sh env                 print the cluster's settings (for `source`)
       scripts/cluster.sh worker I [ARGS...]  start `mailsplit worker ARGS` on worker host I
       scripts/cluster.sh slow-worker I MS [ARGS...]  the same, its database link MS ms
                                              each way (delay-proxy in its namespace)
       scripts/cluster.sh stop-worker I       stop (SIGTERM) the worker of host I
       scripts/cluster.sh cut HOST [PEER...]  drop HOST's packets to and from PEERs (all: every host)
       scripts/cluster.sh heal HOST           remove HOST's DROP rules
       scripts/cluster.sh reset HOST PEER...  turn HOST's DROP rules for PEERs into TCP resets:
                                              whichever side sends next on a connection
                                              between them is reset (then `heal`)
       scripts/cluster.sh bs-kill I           kill beanstalkd I and delete its binlog (gone for good)
       scripts/cluster.sh bs-start I          start beanstalkd I again (empty)

Hosts (network namespaces msc-<host>, bridge msc-br0, 10.231.0.0/24 only):
  db      10.231.0.10  PostgreSQL (initdb into $CLUSTER_DIR/pg, run as user postgres)
  bs1 bs2 10.231.0.11-12  beanstalkd, binlog in $CLUSTER_DIR/bsI
  relay   10.231.0.13  scripts/relay_sink.py: accepts all (each DATA answered after
          RELAY_DELAY_MS, default 0), logs each recipient to $CLUSTER_DIR/relay.rcpts
  w1..wN  10.231.0.21+  mailsplit workers (N = --workers, default 3); with
          FAKETIME=+30s in the environment, `worker` starts one whose wall
          clock is 30 s ahead (libfaketime; its monotonic clock is left alone)

Faults are nft rules in the host's own namespace (table inet msc): packets
are dropped, never refused (no RST), as a real partition does. Where
network namespaces cannot be made (no CAP_NET_ADMIN), `up` says so and
exits 3: use the loopback blackhole proxy of the tests (tests/it/fencing.rs)
instead. Needs root; installs nftables and postgresql if missing.
CLUSTER_DIR (default /tmp/mailsplit-cluster) holds the state; MAILSPLIT
(default target/release/mailsplit, else target/debug/mailsplit) is the binary.
EOF
}

DIR=${CLUSTER_DIR:-/tmp/mailsplit-cluster}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${MAILSPLIT:-$ROOT/target/release/mailsplit}
[[ -x $BIN || -n ${MAILSPLIT:-} ]] || BIN=$ROOT/target/debug/mailsplit
NET=10.231.0
BR=msc-br0
DB_URL="postgres://root@$NET.10:5432/mailsplit"
BS="$NET.11:11300,$NET.12:11300"
SMTP="smtp://$NET.13:2525"

say() { echo "cluster: $*" >&2; }
die() { say "$*"; exit 1; }

ip_of() {
    case $1 in
        db) echo $NET.10 ;; bs1) echo $NET.11 ;; bs2) echo $NET.12 ;; relay) echo $NET.13 ;;
        w[0-9]*) echo $NET.$((20 + ${1#w})) ;;
        *) die "unknown host $1 (db, bs1, bs2, relay, w1…)" ;;
    esac
}

install_deps() {
    local missing=()
    command -v nft >/dev/null || missing+=(nftables)
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
    command -v beanstalkd >/dev/null || missing+=(beanstalkd)
    command -v faketime >/dev/null || missing+=(faketime)
    if ((${#missing[@]})); then
        say "installing ${missing[*]}"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

# shellcheck disable=SC2012 # why: version directories, newest by sort -V
pg_bin() { ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1; }

# Run a command inside host $1's namespace, in the background, with its
# pid in $DIR/$2.pid and its output in $DIR/$2.log.
spawn() {
    local host=$1 name=$2
    shift 2
    ip netns exec "msc-$host" setsid "$@" >>"$DIR/$name.log" 2>&1 </dev/null &
    echo $! >"$DIR/$name.pid"
}

stop_pid() {
    local f=$DIR/$1.pid pid
    [[ -f $f ]] || return 0
    pid=$(cat "$f")
    kill -"${2:-TERM}" "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$f"
}

add_host() {
    local host=$1 addr
    addr=$(ip_of "$host")
    ip netns add "msc-$host"
    ip link add "msc-$host" type veth peer name eth0 netns "msc-$host"
    ip link set "msc-$host" master $BR up
    ip -n "msc-$host" addr add "$addr/24" dev eth0
    ip -n "msc-$host" link set eth0 up
    ip -n "msc-$host" link set lo up
    ip netns exec "msc-$host" nft add table inet msc
    ip netns exec "msc-$host" nft add chain inet msc in '{ type filter hook input priority 0; }'
    ip netns exec "msc-$host" nft add chain inet msc out '{ type filter hook output priority 0; }'
}

wait_tcp() {
    local host=$1 addr=$2 port=$3
    for _ in $(seq 200); do
        ip netns exec "msc-$host" bash -c "exec 3<>/dev/tcp/$addr/$port" 2>/dev/null && return 0
        sleep 0.1
    done
    die "nothing listens on $addr:$port (see $DIR/*.log)"
}

start_bs() {
    local i=$1
    mkdir -p "$DIR/bs$i"
    spawn "bs$i" "bs$i" beanstalkd -l "$(ip_of "bs$i")" -p 11300 -b "$DIR/bs$i"
    wait_tcp "bs$i" "$(ip_of "bs$i")" 11300
}

up() {
    local workers=$1
    [[ $(id -u) == 0 ]] || die "needs root (network namespaces)"
    if ! ip netns add msc-probe 2>/dev/null; then
        say "cannot make network namespaces here: use the loopback blackhole proxy (tests/it/fencing.rs)"
        exit 3
    fi
    ip netns del msc-probe
    down 2>/dev/null
    install_deps
    [[ -x $BIN ]] || die "no $BIN: cargo build --release first"
    mkdir -p "$DIR"
    echo "$workers" >"$DIR/workers"
    ip link add $BR type bridge
    ip addr add $NET.1/24 dev $BR
    ip link set $BR up
    local h
    for h in db bs1 bs2 relay $(seq -f 'w%g' 1 "$workers"); do add_host "$h"; done
    # PostgreSQL, as the postgres user (it refuses to run as root).
    local pg
    pg=$(pg_bin)
    mkdir -p "$DIR/pg"
    chown postgres "$DIR" "$DIR/pg"
    runuser -u postgres -- "$pg/initdb" -D "$DIR/pg" -A trust -U root >/dev/null
    cat >>"$DIR/pg/postgresql.conf" <<EOF
listen_addresses = '$NET.10'
unix_socket_directories = '$DIR/pg'
max_connections = 200
fsync = off
EOF
    echo "host all all $NET.0/24 trust" >>"$DIR/pg/pg_hba.conf"
    ip netns exec msc-db runuser -u postgres -- "$pg/pg_ctl" -D "$DIR/pg" -l "$DIR/pg.log" -w start >/dev/null
    ip netns exec msc-db "$pg/psql" -h "$DIR/pg" -U root -d postgres -qc 'CREATE DATABASE mailsplit' >/dev/null
    start_bs 1
    start_bs 2
    spawn relay relay python3 "$ROOT/scripts/relay_sink.py" $NET.13 2525 "$DIR/relay.rcpts" \
        "${RELAY_DELAY_MS:-0}"
    wait_tcp relay $NET.13 2525
    say "up: db $NET.10, beanstalkd $BS, relay $SMTP, $workers worker hosts ($DIR)"
}

down() {
    local i
    for f in "$DIR"/w*.pid; do [[ -e $f ]] && stop_pid "$(basename "$f" .pid)"; done
    stop_pid relay
    stop_pid bs1
    stop_pid bs2
    if [[ -f $DIR/pg/postmaster.pid ]]; then
        runuser -u postgres -- "$(pg_bin)/pg_ctl" -D "$DIR/pg" -m immediate stop >/dev/null 2>&1 || true
    fi
    for ns in $(ip netns list 2>/dev/null | awk '/^msc-/ {print $1}'); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
        ip netns del "$ns"
    done
    for i in $(ip -o link show 2>/dev/null | awk -F': ' '$2 ~ /^msc-/ {sub(/@.*/, "", $2); print $2}'); do
        ip link del "$i" 2>/dev/null || true
    done
    [[ $DIR == /tmp/* ]] && rm -rf "$DIR"
    return 0
}

worker() {
    local i=$1
    shift
    stop_pid "w$i"
    spawn "w$i" "w$i" env DATABASE_URL="$DB_URL" BEANSTALKD="$BS" SMTP_URL="$SMTP" \
        MAILSPLIT_LOG="${MAILSPLIT_LOG:-info}" ${FAKETIME:+FAKETIME="$FAKETIME" DONT_FAKE_MONOTONIC=1} \
        ${FAKETIME:+LD_PRELOAD=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1} \
        "$BIN" worker "$@"
}

# Worker $1 through a delay-proxy of $2 ms each way to the database (the
# kernel here has no netem qdisc).
slow_worker() {
    local i=$1 oneway=$2
    shift 2
    stop_pid "w$i-proxy"
    spawn "w$i" "w$i-proxy" "$(dirname "$BIN")/delay-proxy" 127.0.0.1:15432 $NET.10:5432 "$oneway"
    wait_tcp "w$i" 127.0.0.1 15432
    DB_URL="postgres://root@127.0.0.1:15432/mailsplit" worker "$i" "$@"
}

cut() {
    local host=$1 peer
    shift
    ip_of "$host" >/dev/null
    if (($# == 0)) || [[ $1 == all ]]; then
        ip netns exec "msc-$host" nft add rule inet msc in iifname eth0 drop
        ip netns exec "msc-$host" nft add rule inet msc out oifname eth0 drop
        return
    fi
    for peer in "$@"; do
        ip netns exec "msc-$host" nft add rule inet msc in ip saddr "$(ip_of "$peer")" drop
        ip netns exec "msc-$host" nft add rule inet msc out ip daddr "$(ip_of "$peer")" drop
    done
}

# After a `cut`: what a switch that comes back with its state lost does
# to the connections that crossed it. Each TCP segment between HOST and a
# PEER is refused with a reset: a segment HOST sends resets HOST's end, one
# a PEER sends resets the PEER's end. A connection where both ends wait for
# the other sends nothing, and nothing resets it.
reset() {
    local host=$1 peer
    shift
    ip_of "$host" >/dev/null
    heal "$host"
    for peer in "$@"; do
        ip netns exec "msc-$host" nft add rule inet msc in ip saddr "$(ip_of "$peer")" \
            meta l4proto tcp reject with tcp reset
        ip netns exec "msc-$host" nft add rule inet msc out ip daddr "$(ip_of "$peer")" \
            meta l4proto tcp reject with tcp reset
    done
}

heal() {
    ip netns exec "msc-$1" nft flush chain inet msc in
    ip netns exec "msc-$1" nft flush chain inet msc out
}

cmd=${1:-}
shift || true
case $cmd in
    up)
        workers=3
        while (($#)); do
            case $1 in
                --workers) workers=${2:?--workers needs a number}; shift 2 ;;
                *) echo "cluster.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
            esac
        done
        [[ $workers =~ ^[1-9][0-9]?$ ]] || { echo "cluster.sh: --workers must be 1 to 99" >&2; exit 2; }
        up "$workers" ;;
    down) down ;;
    env) printf 'DATABASE_URL=%s\nBEANSTALKD=%s\nSMTP_URL=%s\nCLUSTER_DIR=%s\n' "$DB_URL" "$BS" "$SMTP" "$DIR" ;;
    worker) worker "$@" ;;
    slow-worker) slow_worker "$@" ;;
    stop-worker) stop_pid "w${1:?which worker}"; stop_pid "w$1-proxy" ;;
    cut) cut "$@" ;;
    heal) heal "${1:?which host}" ;;
    reset) reset "$@" ;;
    bs-kill) stop_pid "bs${1:?which}" KILL; rm -rf "${DIR:?}/bs$1" ;;
    bs-start) start_bs "${1:?which}" ;;
    -h | --help) usage ;;
    *) usage >&2; exit 2 ;;
esac
