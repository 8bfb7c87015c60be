#!/usr/bin/env bash
# Refresh the dashboard's pictures in docs/screenshots/: the admin pages at
# 360, 1280 and 1920 px and the public pages, taken by Debian's headless
# chromium during the browser tests (real serve, workers and send).
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: scripts/screenshots.sh [--help]

Runs the browser tests that take pictures with MAILSPLIT_SCREENSHOTS set:
  accessibility::   dashboard, campaign, API keys and suppression pages as
                    NAME-360.png, NAME-1280.png, NAME-1920.png
  pages_browser::   the sign-up form, confirmation and preference centre
into docs/screenshots/. Needs scripts/install-deps.sh (chromium,
chromium-driver, axe-core) and cargo-nextest.
USAGE
}

case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    "") ;;
    *) echo "screenshots.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
esac

cd "$(dirname "$0")/.."
out="$PWD/docs/screenshots"
mkdir -p "$out"
MAILSPLIT_SCREENSHOTS="$out" cargo nextest run --test it \
    -E 'test(/^accessibility::/) | test(/^pages_browser::/)'
echo "screenshots.sh: pictures in $out"
