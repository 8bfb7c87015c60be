#!/usr/bin/env bash
# /api/v1 against its own OpenAPI document: validate the document with
# openapi-spec-validator, then let schemathesis fuzz every route from it
# (no 5xx; every status, content type and body as documented).
#
# Usage: scripts/api-conformance.sh [MAILSPLIT_BINARY]
#        scripts/api-conformance.sh --prepare   (only make the venv)
# Tools come from PyPI into a venv under target/ (once; later runs reuse
# it). serve runs on free ports with a fresh SQLite database, a list, a
# campaign and a key holding every scope; beanstalkd is started when
# BEANSTALKD is not set (enqueue needs one).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/target/api-venv
examples=${API_CONFORMANCE_EXAMPLES:-15}

# why: a lock, so scripts/test.sh can prepare the venv in the background
# while the build runs and the test, if it comes first, waits for it
# instead of installing into the same directory at once
mkdir -p "$root/target"
exec 9>"$root/target/api-venv.lock"
flock 9
if [[ ! -x $venv/bin/st || ! -x $venv/bin/openapi-spec-validator ]]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        'openapi-spec-validator>=0.7' 'schemathesis>=4,<5'
fi
flock -u 9
[[ ${1:-} != --prepare ]] || exit 0
bin=${1:-$root/target/debug/mailsplit}

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_port() {
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on port $1" >&2
    return 1
}

if [[ -z ${BEANSTALKD:-} ]]; then
    bport=$(free_port)
    beanstalkd -l 127.0.0.1 -p "$bport" &
    pids+=($!)
    wait_port "$bport"
    export BEANSTALKD=127.0.0.1:$bport
fi
export DATABASE_URL=sqlite://$work/db.sqlite
export MAILSPLIT_TUBE=conformance
export MAILSPLIT_ADMIN_TOKEN=conformance-admin-token-not-used-by-the-fuzzer

"$bin" migrate >/dev/null
printf 'email,name\nada@example.test,Ada\n' >"$work/news.csv"
"$bin" import "$work/news.csv" --list news >/dev/null
"$bin" campaign create weekly --list news --template newsletter \
    --subject Hi --from shop@example.test >/dev/null
key=$("$bin" apikey create fuzz --scopes send,subscribers,campaigns,read | tail -1)

public=$(free_port)
admin=$(free_port)
# A rate high enough that the fuzzer's own pace never meets it.
MAILSPLIT_API_RATE=10000 MAILSPLIT_API_BURST=10000 \
    "$bin" serve --listen "127.0.0.1:$public" --admin-listen "127.0.0.1:$admin" \
    2>"$work/serve.log" &
pids+=($!)
wait_port "$admin"
base=http://127.0.0.1:$admin

curl -fsS "$base/api/v1/openapi.json" -o "$work/openapi.json"
"$venv/bin/openapi-spec-validator" "$work/openapi.json"

# From the scratch directory: schemathesis keeps its cache where it runs.
cd "$work"
"$venv/bin/st" run "$work/openapi.json" --url "$base" \
    --header "Authorization: Bearer $key" \
    --checks not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance \
    --max-examples "$examples" --seed 37 --workers 1 \
    --generation-database none --no-color
echo "api-conformance: the document validates and schemathesis found nothing"
