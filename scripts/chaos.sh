#!/usr/bin/env bash
# The chaos suite: whole campaigns against a real beanstalkd, a scripted SMTP
# relay, SQLite and PostgreSQL, with workers killed, beanstalkd restarted, the
# database unavailable, a misbehaving relay, deploys and an interrupted
# enqueue (tests/chaos.rs). Writes the results table to RELIABILITY.md.
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: scripts/chaos.sh [--n N] [--short] [--debug] [--jobs J] [--out FILE]

  --n N       recipients per campaign (default 20000; CHAOS_N for the tests)
  --short     the short form: N = 3000, 5 s outages, 5 kills; writes
              target/chaos/RELIABILITY-short.md unless --out is given
  --debug     the debug build the other tests use, not a release build
              (scripts/test.sh: the short form's relay is paced, so the
              build's speed hardly shows, and CI builds no second profile)
  --jobs J    scenarios at a time (default 1; each has its own servers,
              database and workers)
  --out FILE  where the report goes (default RELIABILITY.md)

Builds the release binary and runs
  cargo test --release --test chaos -- --include-ignored --test-threads=1
with CHAOS_N and CHAOS_REPORT set: every scenario (and the fast bad-input
checks) appends one JSON line, which this script turns into the markdown
table. The tests start their own beanstalkd, SMTP peer and supervisord on
free ports; PostgreSQL must answer at MAILSPLIT_TEST_PG (default
postgres://root@127.0.0.1:5432, with a database "test"; scripts/test.sh
sets that up). Exits non-zero if any scenario failed.
USAGE
}

n=20000
short=0
out=""
profile=(--release)
jobs=1
while (($#)); do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --n)
            [[ ${2:-} =~ ^[0-9]+$ ]] || { echo "chaos.sh: --n needs a number" >&2; exit 2; }
            n=$2
            shift 2
            ;;
        --short) short=1; shift ;;
        --debug) profile=(); shift ;;
        --jobs)
            [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "chaos.sh: --jobs needs a number" >&2; exit 2; }
            jobs=$2
            shift 2
            ;;
        --out)
            [[ -n ${2:-} ]] || { echo "chaos.sh: --out needs a file name" >&2; exit 2; }
            out=$2
            shift 2
            ;;
        *) echo "chaos.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
if ((short)); then
    n=3000
    out=${out:-target/chaos/RELIABILITY-short.md}
    mode="short (--short)"
else
    out=${out:-RELIABILITY.md}
    mode="full"
fi

for tool in beanstalkd supervisord python3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "==> $tool is missing: scripts/install-deps.sh"
        scripts/install-deps.sh
        break
    fi
done
export MAILSPLIT_TEST_PG=${MAILSPLIT_TEST_PG:-postgres://root@127.0.0.1:5432}
if command -v pg_isready >/dev/null 2>&1 && ! pg_isready -q -d "$MAILSPLIT_TEST_PG/test"; then
    echo "chaos.sh: PostgreSQL does not answer at $MAILSPLIT_TEST_PG/test;" \
        "start it (scripts/test.sh does) or set MAILSPLIT_TEST_PG" >&2
    exit 1
fi

mkdir -p target/chaos
stamp=$(date -u +%Y%m%dT%H%M%SZ)
jsonl=$root/target/chaos/report-$stamp.jsonl
log=$root/target/chaos/run-$stamp.log
: >"$jsonl"

echo "==> cargo build ${profile[*]} (binary and the chaos test)"
cargo build "${profile[@]}"
cargo test "${profile[@]}" --test chaos --no-run
((${#profile[@]})) || mode+=", debug build"
((jobs == 1)) || mode+=", $jobs scenarios at a time"

echo "==> chaos suite: $n recipients per campaign ($mode); log: $log"
started=$SECONDS
set +e
CHAOS_N=$n CHAOS_REPORT=$jsonl \
    cargo test "${profile[@]}" --test chaos -- --include-ignored --test-threads="$jobs" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
elapsed=$((SECONDS - started))

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n $(git status --porcelain 2>/dev/null) ]]; then
    commit+=" (with uncommitted changes)"
fi
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
mem=$(awk '/^MemTotal/ {printf "%.0f GiB RAM", $2 / 1048576}' /proc/meminfo 2>/dev/null || true)
machine="$(uname -sr), $(nproc) cores${cpu:+ ($cpu)}${mem:+, $mem}"
if ((short)); then
    again="scripts/chaos.sh --short"
else
    again="scripts/chaos.sh$([[ $n == 20000 ]] || echo " --n $n")"
fi

mkdir -p "$(dirname "$out")"
python3 - "$jsonl" "$log" "$out" "$n" "$mode" "$commit" "$machine" "$elapsed" "$again" "$rc" <<'PY'
import datetime
import json
import re
import sys

jsonl, log, out, n, mode, commit, machine, elapsed, again, rc = sys.argv[1:]
rows = [json.loads(line) for line in open(jsonl, encoding="utf-8") if line.strip()]
# The fault scenarios in the order of the issue, then the bad-input checks;
# SQLite before PostgreSQL.
ORDER = ["worker kill -9 x", "worker kill", "beanstalkd", "database", "relay faults", "relay stops",
         "binary replaced", "enqueue", "bad input"]


def rank(r):
    s = r["scenario"]
    first = next((i for i, p in enumerate(ORDER) if s.startswith(p)), len(ORDER))
    return (first, s, r["backend"] != "sqlite")


rows.sort(key=rank)
text = open(log, encoding="utf-8", errors="replace").read()
failed_tests = re.findall(r"^test (\S+) \.\.\. FAILED$", text, re.M)
passed_tests = re.findall(r"^test (\S+) \.\.\. ok$", text, re.M)


def cell(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


lines = [
    "# Reliability",
    "",
    "Produced by `scripts/chaos.sh` (tests/chaos.rs), not by hand. Each scenario runs a",
    "whole campaign against a real beanstalkd (with a binlog), a scripted SMTP relay and",
    "SQLite or PostgreSQL, injects its fault mid-campaign, waits for the campaign to",
    "finish, and checks: every recipient ends sent, failed or skipped; the relay",
    "received every recipient recorded sent; the counters equal `COUNT(*)` over the",
    "ledger; no job is left buried or stuck; recipients received twice stay within",
    "what the scenario allows (messages in flight at a kill, or accepted by a relay",
    "that never answered). *lost* = recipients without an outcome + recipients",
    "recorded sent that the relay never received; it must be 0.",
    "",
    f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
    f"- commit: {commit}",
    f"- machine: {machine}",
    f"- run: {mode}, {n} recipients per campaign, 2 workers x 20 SMTP sessions"
    " (1 worker for the bad-input checks), relay paced to ~25 s of sending"
    f" (8 s in the short form); whole suite {int(elapsed) // 60} min {int(elapsed) % 60} s",
    f"- regenerate: `{again}`" + ("" if "--short" in again else " (`scripts/chaos.sh --short` for the quick form)"),
    "",
    "| scenario | backend | recipients | sent | failed | skipped | duplicates | allowed | lost | time s | result |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
]
for r in rows:
    lines.append(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            cell(r["scenario"]),
            r["backend"],
            r["recipients"],
            r["sent"],
            r["failed"],
            r["skipped"],
            r["duplicates"],
            r.get("allowed_duplicates", 0),
            r["lost"],
            r["seconds"],
            "pass" if r["ok"] else "**FAIL**",
        )
    )
reported = len(rows)
# A test that failed before writing its line (setup, timeout, crash).
with_rows = {r.get("test", "").split("::")[-1] for r in rows}
unreported = [t for t in failed_tests if t.split("::")[-1] not in with_rows]
for t in unreported:
    lines.append(f"| test `{t}` failed | | | | | | | | | | **FAIL** (see below) |")
lines += ["", "## Notes and problems", ""]
for r in rows:
    lines.append(f"- **{cell(r['scenario'])}** ({r['backend']}):")
    for note in r.get("notes", []):
        lines.append(f"  - {cell(note)}")
    for p in r.get("problems", []):
        lines.append(f"  - PROBLEM: {cell(p)}")
if failed_tests:
    lines += ["", "## Failed tests", ""]
    lines += [f"- `{t}`" for t in failed_tests]
    lines += ["", f"The full output is in `{log}` on the machine that ran it."]
summary = (
    f"{len(passed_tests)} tests passed, {len(failed_tests)} failed;"
    f" {sum(1 for r in rows if r['ok'])} of {reported} scenarios passed"
)
if rc != "0" and not failed_tests:
    summary += f"; cargo test exited {rc} (build failure or crash: see the log)"
lines += ["", summary + ".", ""]
# scripts/partition.sh's section (between its markers) is kept.
try:
    old = open(out, encoding="utf-8").read()
except OSError:
    old = ""
begin, end = "<!-- partition.sh: begin -->", "<!-- partition.sh: end -->"
if begin in old and end in old:
    lines += [old[old.index(begin):old.index(end) + len(end)], ""]
open(out, "w", encoding="utf-8").write("\n".join(lines))
print(f"chaos.sh: {summary}; report written to {out}")
PY

if ((rc != 0)); then
    echo "chaos.sh: FAILED (cargo test exited $rc); see $out and $log" >&2
    exit 1
fi
echo "chaos.sh: PASSED in $((elapsed / 60))m$((elapsed % 60))s; report: $out"
