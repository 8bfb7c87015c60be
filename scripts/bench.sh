#!/usr/bin/env bash
# Benchmark mailsplit on this machine: a whole campaign (default 1,000,000
# recipients) beside smtp-source's raw rate and the seed articles' Python
# pipeline, then the latency-bound and PostgreSQL runs. Appends a row to
# BENCHMARKS.md. Not a test: nothing here asserts a speed.
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: scripts/bench.sh [--n N] [--workers W] [--concurrency C] [--skip peer,latency,pg] [--repeat 3]
                                                 # --repeat: N interleaved rounds, median and min-max
       scripts/bench.sh --network [--relay-n N] [--lan-n N] [--relay-rtt-ms 20] [--lan-rtt-ms 1]
       scripts/bench.sh --dkim-compare [--n N] [--repeat 3]   # msg/s unsigned, RSA 2048, ed25519, both;
                                                 # signing CPU per message vs openssl speed rsa2048
       scripts/bench.sh --import-compare [--n N] # import: CSV vs PostgreSQL source, into SQLite and PostgreSQL
       scripts/bench.sh --template-compare [--n 100000] [--rounds R]   # compiled-in vs user template (ratio)
       scripts/bench.sh --open-storm [--storm-n N] [--storm-seconds S] [--storm-connections C] [--storm-db sqlite|pg]
                                                  # opens/clicks per second on serve while workers send
       scripts/bench.sh --transactional [--n 200000] [--tx-n 1000] [--tx-seconds 10]
                                                  # message latency and the campaign's rate meanwhile

Installs what it needs (scripts/install-deps.sh; a Python venv .peerenv with
greenstalk, aiosmtplib and jinja2 for ../shared/bench/peer_seed003.py), builds
the release binary, then runs scripts/bench.py with the same arguments.
Services are started on free loopback ports and stopped at the end.
USAGE
}
case "${1:-}" in
    -h | --help) usage; exit 0 ;;
esac

cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/install-deps.sh
if [[ ! -x .peerenv/bin/python ]]; then
    echo "==> Python venv for the seed pipeline (.peerenv)"
    python3 -m venv .peerenv
    .peerenv/bin/pip install -q greenstalk aiosmtplib jinja2
fi
echo "==> cargo build --release"
cargo build --release
exec python3 scripts/bench.py "$@"
