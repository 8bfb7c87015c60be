#!/usr/bin/env bash
# The whole test suite (what CI runs): deps, PostgreSQL, scripts, fmt, clippy, tests.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/test.sh [--help]

  1. scripts/install-deps.sh (beanstalkd, smtp-sink, supervisor, -dev libraries, dkimpy)
  2. PostgreSQL on 127.0.0.1:5432 must answer; if not, tries
     pg_ctlcluster --skip-systemctl-redirect <version> main start
     MAILSPLIT_TEST_PG (base URL, the tests create databases under it; default
     postgres://root@127.0.0.1:5432, else postgres://postgres@...) is exported;
     its database "test" is created if missing
  3. smoke test of scripts/services.sh and scripts/workers.sh (+ shellcheck if installed)
  4. cargo fmt --check, and scripts/modgraph.py (no import circle in src/)
  5. cargo build --all-targets with clippy as the workspace's compiler
     wrapper (RUSTC_WORKSPACE_WRAPPER=clippy-driver, -D warnings): the
     debug build the quickstart and the tests use is also the lint gate,
     so the dependencies are compiled once, not checked a second time for
     a separate `cargo clippy`; a probe crate with a known lint must fail
     first, so a gate that stopped gating fails the suite
  6. scripts/quickstart.sh --debug --n 2000: the README's first command, in
     the same clone (its build is the one above)
  7. cargo nextest run --all-targets --run-ignored all --no-fail-fast with
     CHAOS_N=3000: every test, and the chaos suite's crash/restart/outage
     scenarios in their short form (what `scripts/chaos.sh --short` runs;
     the full run, in release, writes RELIABILITY.md) beside them. Three
     things at once, by CPU priority (as root; as another user 0, 5 and 19):
       - the rate-measuring tests (the .config/nextest.toml override that
         takes every thread; its `alone` profile pairs the lightest), at
         nice -10: their assertions are rates at a peer or a clock, so
         they get the CPU whenever they ask;
       - scripts/partition.sh --short (network partitions between namespaced
         hosts: its own PostgreSQL, two beanstalkd, a relay, three
         workers), at nice -5; its output, in target/partition.log, is
         printed when the tests end;
       - the rest, 12 at a time, at nice 10: what the two above leave (they
         wait on paced relays and use a fraction of a core).
     The tests start their own beanstalkd and smtp-sink on free ports.
     Installs cargo-nextest if missing; MAILSPLIT_TEST_CARGO_TEST=1 runs
     `cargo test` instead (the ratelimit:: and connections:: areas last on
     one thread, then scripts/chaos.sh --short --debug --jobs 2, then the
     partition suite after them)

Prints each step's duration when it ends and a table of them at the end,
and after the nextest step the slowest ten tests (from nextest's JUnit
reports, target/nextest/{alone,default}/junit.xml).
Exits non-zero at the first failure; the last line says PASSED or FAILED.
EOF
}
case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    "") ;;
    *) echo "test.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
esac

cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p target
touch target/.test-sh-start
# why: CI builds a clean clone once: incremental compilation's caches are
# written and never read there (a developer's run keeps them)
if [[ -n ${CI:-} ]]; then export CARGO_INCREMENTAL=0; fi
# why: Postfix's pipe(8) runs target/debug/mailsplit as `nobody` in the tests:
# the build output must be open to others whatever the caller's umask
umask 022

current=""
current_start=$SECONDS
durations=()
mmss() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
step_done() {
    [[ -n $current ]] || return 0
    local took=$((SECONDS - current_start))
    durations+=("$(printf '%8s  %s' "$(mmss "$took")" "$current")")
    echo "    ($(mmss "$took"): $current)"
}
step() {
    step_done
    current=$1
    current_start=$SECONDS
    echo "==> $1"
}
finish() {
    local rc=${1:-$?}
    bg_stop
    step_done
    current=${current:-setup}
    echo "test.sh: step durations:"
    printf '  %s\n' "${durations[@]}"
    if ((rc == 0)); then
        echo "test.sh: PASSED (quickstart, fmt, clippy, tests, chaos and partition short forms) in $(mmss "$SECONDS")"
    else
        echo "test.sh: FAILED at step: $current (exit $rc) after $(mmss "$SECONDS")" >&2
    fi
}
trap finish EXIT

# The slowest ten tests of the nextest run, from its JUnit report
# (.config/nextest.toml writes it): where the suite's time goes.
slowest_tests() {
    local junits=()
    for junit in target/nextest/alone/junit.xml target/nextest/default/junit.xml; do
        [[ -f $junit && $junit -nt target/.test-sh-start ]] && junits+=("$junit")
    done
    ((${#junits[@]})) || return 0
    echo "test.sh: slowest ten tests (nextest, ${junits[*]}):"
    python3 - "${junits[@]}" <<'PY' || true
import sys
import xml.etree.ElementTree as ET
cases = [
    (float(c.get("time", 0)), c.get("classname", ""), c.get("name", ""))
    for junit in sys.argv[1:]
    for c in ET.parse(junit).iter("testcase")
]
for took, binary, name in sorted(cases, reverse=True)[:10]:
    print(f"  {took:7.1f}s  {binary} {name}")
PY
}

# nextest at niceness NICE with the suite's arguments (every target, the
# chaos scenarios too: they are the only ignored tests) and more arguments
nextest() {
    local nice=$1
    shift
    nice -n "$nice" cargo nextest run --all-targets --run-ignored all --no-fail-fast "$@"
}

# The filter of .config/nextest.toml's override that gives a test every
# thread: the rate-measuring tests, named there once.
alone_filter() {
    python3 - <<'PY'
import tomllib
with open(".config/nextest.toml", "rb") as f:
    overrides = tomllib.load(f)["profile"]["default"]["overrides"]
print(next(o["filter"] for o in overrides if o.get("threads-required") == "num-test-threads"))
PY
}

# Steps in the background: `bg_start NAME TITLE CMD...` runs CMD with its
# output in target/NAME.log and its own duration in target/NAME.took;
# `bg_wait NAME TITLE always|failure` waits for it, adds its line to the
# durations table and prints its log (always, or only when it failed);
# `bg_stop` ends whatever still runs.
declare -A bg_pid=() bg_started=()
bg_start() {
    local name=$1 title=$2
    shift 2
    bg_started[$name]=$SECONDS
    echo "==> $title, in the background: target/$name.log"
    rm -f "target/$name.took"
    (
        rc=0
        "$@" || rc=$?
        echo $((SECONDS - bg_started[$name])) >"target/$name.took"
        exit "$rc"
    ) >"target/$name.log" 2>&1 &
    bg_pid[$name]=$!
}
bg_wait() {
    local name=$1 title=$2 print=$3 rc=0 took
    [[ -n ${bg_pid[$name]:-} ]] || return 0
    wait "${bg_pid[$name]}" || rc=$?
    unset "bg_pid[$name]"
    # its own duration (it may end long before it is waited for)
    took=$(cat "target/$name.took" 2>/dev/null || echo $((SECONDS - bg_started[$name])))
    durations+=("$(printf '%8s  %s' "$(mmss "$took")" "$title")")
    echo "==> $title: exit $rc after $(mmss "$took")"
    if [[ $print == always ]] || ((rc)); then
        cat "target/$name.log"
    fi
    return "$rc"
}
# why: a suite stopped early must not leave the partition cluster up, nor
# a clippy running
bg_stop() {
    local name
    for name in "${!bg_pid[@]}"; do
        kill -TERM "${bg_pid[$name]}" 2>/dev/null || true
        wait "${bg_pid[$name]}" 2>/dev/null || true
    done
}

# The lint gate is the build: clippy-driver compiles the workspace's crates
# (cargo's RUSTC_WORKSPACE_WRAPPER; the dependencies go to rustc as in any
# build), with cargo clippy's own way of passing it arguments. Its artifacts
# sit beside a plain build's (another hash), so neither rebuilds the other.
clippy_gate() {
    local driver
    driver=$(command -v clippy-driver || true)
    [[ -n $driver ]] || { echo "test.sh: clippy-driver is not on PATH; install clippy" >&2; exit 1; }
    export RUSTC_WORKSPACE_WRAPPER=$driver CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
}
# why: a gate that stopped gating (a clippy that reads its arguments some
# other way, a wrapper cargo ignores) would pass everything: a crate with
# a lint clippy denies by default must fail to build through it first
clippy_probe() {
    local probe=target/clippy-probe
    mkdir -p "$probe/src"
    printf '[package]\nname = "clippy-probe"\nversion = "0.0.0"\nedition = "2021"\n[workspace]\n' >"$probe/Cargo.toml"
    printf 'pub fn len(v: &Vec<u8>) -> usize {\n    return v.len();\n}\n' >"$probe/src/lib.rs"
    if cargo build -q --manifest-path "$probe/Cargo.toml" >"$probe/out.log" 2>&1; then
        echo "test.sh: clippy through RUSTC_WORKSPACE_WRAPPER let a denied lint build ($probe); the lint gate is not working" >&2
        exit 1
    fi
    grep -q 'clippy::' "$probe/out.log" || {
        cat "$probe/out.log" >&2
        echo "test.sh: the clippy probe failed, but not on clippy's lints ($probe/out.log)" >&2
        exit 1
    }
}

# The partition suite (network faults between namespaced hosts: its own
# PostgreSQL, beanstalkd and relay, torn down after) on the binary the
# tests use
# why: by CPU priority, the rate-measuring tests first, the partition suite
# next, the rest last (--help, step 7): lowered where this user may (root),
# else raised from the caller's niceness by the same steps
# why: twenty steps between the rate tests and the rest: at ten (a ninth
# of the CPU to the rest when both want it) a rate test's relay saw 23 in
# a second where its limit allows 22, at nineteen none did
if (($(nice -n -1 nice 2>/dev/null || echo 0) < $(nice))); then
    nice_rate=-10 nice_partition=-5 nice_rest=10
else
    nice_rate=0 nice_partition=5 nice_rest=19
fi
partition_title="partition suite, short form (scripts/partition.sh --short, nice $nice_partition, beside the tests)"
partition_start() {
    bg_start partition "$partition_title" \
        nice -n "$nice_partition" env MAILSPLIT="$PWD/target/debug/mailsplit" scripts/partition.sh --short
}
partition_wait() { bg_wait partition "$partition_title" always; }

step "install dependencies (scripts/install-deps.sh)"
scripts/install-deps.sh
# why: the API test's schemathesis venv comes from PyPI on a fresh clone
# (minutes of downloads): made beside the build, not in the test's time
mkdir -p target
scripts/api-conformance.sh --prepare >target/api-venv.log 2>&1 &

pg_up() {
    if command -v pg_isready >/dev/null 2>&1; then
        pg_isready -q -d "$1"
    else
        # why: without the client tools, at least see that something listens
        local hostport=${1#*://}
        hostport=${hostport#*@}
        hostport=${hostport%%/*}
        [[ $hostport == *:* ]] || hostport+=":5432"
        (exec 3<>"/dev/tcp/${hostport%:*}/${hostport##*:}") 2>/dev/null
    fi
}

# psql as user U against database D on the local server
local_psql() {
    local user=$1 db=$2
    shift 2
    psql -X -q -h 127.0.0.1 -p 5432 -U "$user" -d "$db" -v ON_ERROR_STOP=1 "$@"
}

step "PostgreSQL"
if [[ -n ${MAILSPLIT_TEST_PG:-} ]]; then
    # why: the user chose a server; do not start or change anything
    pg_up "$MAILSPLIT_TEST_PG/test" || { echo "test.sh: MAILSPLIT_TEST_PG=$MAILSPLIT_TEST_PG does not answer" >&2; exit 1; }
    echo "    using MAILSPLIT_TEST_PG=$MAILSPLIT_TEST_PG"
else
    local_url="postgresql://127.0.0.1:5432/postgres"
    if ! pg_up "$local_url"; then
        if [[ -d /etc/postgresql ]] && command -v pg_ctlcluster >/dev/null 2>&1; then
            for version in /etc/postgresql/*/; do
                version=$(basename "$version")
                echo "    starting PostgreSQL $version (pg_ctlcluster --skip-systemctl-redirect $version main start)"
                pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
            done
            for ((i = 0; i < 30; i++)); do
                pg_up "$local_url" && break
                sleep 0.5
            done
        fi
        pg_up "$local_url" || {
            echo "test.sh: PostgreSQL does not answer on 127.0.0.1:5432 and could not be started;" \
                "install and start it (trust auth for local TCP), or set MAILSPLIT_TEST_PG=postgres://USER@HOST:PORT" >&2
            exit 1
        }
    fi
    pg_user=root
    if command -v psql >/dev/null 2>&1; then
        # why: the tests connect to BASE/test and CREATE DATABASE there, so the
        # role needs a "test" database and the right to create databases
        pg_user=""
        for user in root postgres; do
            if ! local_psql "$user" test -Atc 'select 1' >/dev/null 2>&1 &&
                local_psql "$user" postgres -Atc 'select 1' >/dev/null 2>&1; then
                echo "    creating database \"test\" as $user"
                local_psql "$user" postgres -c 'CREATE DATABASE test' >/dev/null 2>&1 || true
            fi
            can=$(local_psql "$user" test -Atc \
                'select rolsuper or rolcreatedb from pg_roles where rolname = current_user' 2>/dev/null || true)
            if [[ $can == t ]]; then
                pg_user=$user
                break
            fi
        done
        [[ -n $pg_user ]] || {
            echo "test.sh: neither root nor postgres can connect to 127.0.0.1:5432/test and create" \
                "databases; set MAILSPLIT_TEST_PG=postgres://USER@HOST:PORT" >&2
            exit 1
        }
    else
        echo "    psql not installed: assuming role root with database test" >&2
    fi
    export MAILSPLIT_TEST_PG="postgres://$pg_user@127.0.0.1:5432"
    echo "    MAILSPLIT_TEST_PG=$MAILSPLIT_TEST_PG"
fi

step "scripts: syntax, shellcheck, services.sh and workers.sh smoke test"
for f in scripts/*.sh .ci/run; do bash -n "$f"; done
if command -v shellcheck >/dev/null 2>&1; then
    shellcheck scripts/*.sh .ci/run
fi
smoke=$(mktemp -d)
smoke_cleanup() {
    scripts/workers.sh stop --dir "$smoke/run" >/dev/null 2>&1 || true
    scripts/services.sh stop --dir "$smoke/run" >/dev/null 2>&1 || true
    rm -rf "$smoke"
}
trap 'rc=$?; smoke_cleanup; finish "$rc"' EXIT
# why: a stand-in worker: logs, and exits 0 on TERM like the real one
printf '#!/bin/sh\necho "worker started" >&2\ntrap "exit 0" TERM\nwhile :; do sleep 1 & wait; done\n' >"$smoke/fake"
chmod +x "$smoke/fake"
scripts/services.sh start --dir "$smoke/run" >/dev/null
scripts/services.sh env --dir "$smoke/run" | grep -q '^export BEANSTALKD=127.0.0.1:'
scripts/workers.sh start --dir "$smoke/run" --workers 2 --bin "$smoke/fake" >/dev/null
[[ $(scripts/workers.sh status --dir "$smoke/run" | grep -c RUNNING) == 2 ]]
scripts/workers.sh serve --dir "$smoke/run" >/dev/null
[[ $(scripts/workers.sh status --dir "$smoke/run" | grep -c RUNNING) == 3 ]]
scripts/workers.sh stop --dir "$smoke/run" >/dev/null
scripts/services.sh stop --dir "$smoke/run" >/dev/null
smoke_cleanup
trap finish EXIT

step "cargo fmt --check"
# why: a minimal rustup profile has neither rustfmt nor clippy
for pair in fmt:rustfmt clippy:clippy; do
    if ! cargo "${pair%%:*}" --version >/dev/null 2>&1; then
        command -v rustup >/dev/null 2>&1 ||
            { echo "test.sh: cargo ${pair%%:*} is missing; install ${pair#*:}" >&2; exit 1; }
        rustup component add "${pair#*:}"
    fi
done
cargo fmt --check
# the module graph: files as nodes, imports as edges; a circle fails
python3 scripts/modgraph.py >/dev/null || python3 scripts/modgraph.py

step "cargo build --all-targets through clippy (-D warnings): the build and the lint gate"
# why: one compile of the dependencies for both: `cargo clippy` checks
# every dependency again (about 200-300 CPU-seconds on a fresh clone of
# this 2-core machine, a sixth of the suite's CPU)
clippy_gate
clippy_probe
cargo build --all-targets

step "quickstart, as a new user runs it first (scripts/quickstart.sh --debug --n 2000)"
# why: the README's two commands in order, in one clone: a quickstart that
# leaves target/ private fails tests/it/postfix.rs below. --debug shares the
# tests' build (the one above: the same wrapper, so nothing is compiled
# again); 2,000 recipients (20 jobs) still take two supervised workers
# through a whole campaign.
scripts/quickstart.sh --debug --n 2000

if [[ -z ${MAILSPLIT_TEST_CARGO_TEST:-} ]] && ! cargo nextest --version >/dev/null 2>&1; then
    step "install cargo-nextest (cargo install cargo-nextest --locked)"
    cargo install cargo-nextest --locked
fi
if [[ -z ${MAILSPLIT_TEST_CARGO_TEST:-} ]]; then
    # why: a process per test, so the rate-measuring tests can be given the
    # whole machine while the rest run 12 at a time (.config/nextest.toml)
    # why: --run-ignored all: the chaos scenarios are the only ignored
    # tests; CHAOS_N=3000 is their short form (chaos.sh --short), and their
    # result lines go where chaos.sh puts them
    # why: the rate-measuring tests (the override that takes every thread)
    # use a fraction of a core (they wait on paced relays: 140 CPU-seconds
    # in five minutes), and so does the partition suite: the rest runs
    # beside both, below them in CPU priority, so their rates and cuts keep
    # the CPU they ask for and the rest takes what they leave
    alone=$(alone_filter)
    step "cargo nextest run: the rest (nice $nice_rest) beside the rate-measuring tests (nice $nice_rate) and the partition suite"
    mkdir -p target/chaos
    CHAOS_REPORT="$PWD/target/chaos/report-test-sh-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
    export CHAOS_N=3000 CHAOS_REPORT
    # why: a failure in one does not stop the others: every failure of the
    # suite shows in one run (the suite fails at its end)
    rc=0
    rate_title="the rate-measuring tests (nextest --profile alone, nice $nice_rate)"
    bg_start rate "$rate_title" nextest "$nice_rate" --profile alone -E "$alone"
    partition_start
    nextest "$nice_rest" -E "not ($alone)" || rc=$?
    bg_wait rate "$rate_title" always || { ((rc)) || rc=$?; }
    slowest_tests
    partition_wait || { ((rc)) || rc=$?; }
    ((rc == 0)) || exit "$rc"
else
    # why: in one test binary, util::alone() keeps the rate-measuring tests
    # from each other but not from the rest: those areas go last, alone
    step "cargo test --all-targets, then ratelimit:: and connections:: on one thread"
    cargo test --all-targets -- --test-threads=2 --skip ratelimit:: --skip connections::
    cargo test --test it -- --test-threads=1 ratelimit:: connections::

    step "chaos suite, short form (scripts/chaos.sh --short --debug --jobs 2)"
    # why: --debug: the binary the tests just built, no second (release)
    # build; --jobs 2: each scenario waits mostly on its paced relay
    scripts/chaos.sh --short --debug --jobs 2
fi

if [[ -n ${MAILSPLIT_TEST_CARGO_TEST:-} ]]; then
    step "partition suite, short form (scripts/partition.sh --short)"
    MAILSPLIT="$PWD/target/debug/mailsplit" scripts/partition.sh --short
fi
