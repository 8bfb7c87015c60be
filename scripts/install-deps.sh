#!/usr/bin/env bash
# Install the system packages mailsplit's scripts and tests need (Debian).
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/install-deps.sh [--help]

Installs, if any is missing, the Debian packages mailsplit needs:
  beanstalkd      the job queue
  postfix         /usr/sbin/smtp-sink (the test SMTP server), and the binaries
                  for the private Postfix instances the bounce tests start
                  (tests/it/util/postfix.rs, `postfix -c DIR`); postfix is
                  preseeded "No configuration", so no system mail server is set up
  supervisor      runs the workers (scripts/supervisord.conf)
  chromium chromium-driver   the dashboard's browser tests (headless, driven
                  over WebDriver by chromedriver; no browser is downloaded)
  python3-prometheus-client  the metrics test parses /metrics with it
  spamassassin    the wire test runs its local rules (`spamassassin -L -t`)
                  over one message of each built-in template
  npm, axe-core   the accessibility test's checker (axe-core, pinned, from the
                  npm registry into /usr/local/share/axe-core)
  wrk             the HTTP load of `scripts/bench.sh --open-storm`
  pkg-config libsqlite3-dev libpq-dev   to build the SQLite and PostgreSQL drivers
  libssl-dev      OpenSSL, which signs DKIM's RSA signatures (the openssl crate)
  gcc libc6-dev   only if no C compiler/linker (cc) is present

and, for the DKIM tests' independent verifier, the Python packages dkimpy and
PyNaCl (ed25519) for python3: with pip when python3 has it, else Debian's
python3-dkim and python3-nacl.

No beanstalkd, postfix or supervisor system service is left running by the
install: scripts/services.sh and scripts/workers.sh start their own on free
ports. Idempotent and silent when nothing is missing. Needs root (or sudo)
when something must be installed. Checks that cargo is on PATH.
EOF
}

case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    "") ;;
    *) echo "install-deps.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
esac

say() { echo "install-deps: $*"; }

# true when a system service is running
svc_running() {
    if [[ -d /run/systemd/system ]]; then
        systemctl is-active --quiet "$1"
    elif [[ $1 == postfix ]]; then
        # why: postfix's init script reports "ok" for status when it has no main.cf
        local pid
        pid=$(tr -dc 0-9 2>/dev/null </var/spool/postfix/pid/master.pid) && [[ -n $pid && -d /proc/$pid ]]
    else
        command -v service >/dev/null 2>&1 && service "$1" status >/dev/null 2>&1
    fi
}

# true when the dpkg package is fully installed (a -dev package has no binary to look for)
have_pkg() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

missing=()
command -v beanstalkd >/dev/null 2>&1 || missing+=(beanstalkd)
[[ -x /usr/sbin/smtp-sink ]] || missing+=(postfix)
command -v supervisord >/dev/null 2>&1 || missing+=(supervisor)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
# why: the tests run Debian's /usr/bin/python3 (a pyenv python3 on PATH lacks the module)
[[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import prometheus_client' 2>/dev/null ||
    missing+=(python3-prometheus-client)
command -v spamassassin >/dev/null 2>&1 || missing+=(spamassassin)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
have_pkg libsqlite3-dev || missing+=(libsqlite3-dev)
have_pkg libpq-dev || missing+=(libpq-dev)
have_pkg libssl-dev || missing+=(libssl-dev)
# why: rustup's cargo needs a system linker; Debian's cargo package brings one, rustup does not
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)

if ((${#missing[@]} > 0)); then
    # why: the brief's fixed package set; install all (cheap when present) so
    # one run leaves a complete machine
    pkgs=(beanstalkd postfix supervisor pkg-config libsqlite3-dev libpq-dev libssl-dev
        chromium chromium-driver python3-prometheus-client spamassassin wrk)
    command -v cc >/dev/null 2>&1 || pkgs+=(gcc libc6-dev)
    say "missing: ${missing[*]}; installing: ${pkgs[*]}"

    SUDO=()
    if ((EUID != 0)); then
        command -v sudo >/dev/null 2>&1 || { say "must run as root (or have sudo) to install packages" >&2; exit 1; }
        SUDO=(sudo)
    fi

    services=(beanstalkd postfix supervisor)
    # why: a service already running before we started is the user's; leave it alone
    declare -A was_running=()
    for s in "${services[@]}"; do
        if svc_running "$s"; then was_running[$s]=1; fi
    done

    # why: Debian's convention to stop maintainer scripts from starting daemons;
    # only add our own if none exists, and remove it again afterwards
    policy=/usr/sbin/policy-rc.d
    own_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\n# temporary, from mailsplit scripts/install-deps.sh\nexit 101\n' |
            "${SUDO[@]}" tee "$policy" >/dev/null
        "${SUDO[@]}" chmod 755 "$policy"
        own_policy=1
    fi
    cleanup() { if ((own_policy)); then "${SUDO[@]}" rm -f "$policy"; fi; }
    trap cleanup EXIT

    # why: "No configuration" = postfix installs its tools but no main.cf and no running MTA
    echo 'postfix postfix/main_mailer_type select No configuration' | "${SUDO[@]}" debconf-set-selections

    "${SUDO[@]}" apt-get update
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "${pkgs[@]}"

    # why: belt and braces for init systems that ignore policy-rc.d
    for s in "${services[@]}"; do
        [[ -n ${was_running[$s]:-} ]] && continue
        if svc_running "$s"; then
            say "stopping the $s system service the install started"
            "${SUDO[@]}" service "$s" stop || say "warning: could not stop $s" >&2
        fi
    done

    cleanup
    own_policy=0
    say "done"
fi

# why: tests/it/dkim.rs checks signatures with dkimpy, an implementation independent of ours
if ! python3 -c 'import dkim, nacl.signing' >/dev/null 2>&1; then
    say "installing dkimpy and PyNaCl for python3 (the DKIM tests' verifier)"
    if ! python3 -m pip install --quiet dkimpy pynacl 2>/dev/null &&
        ! python3 -m pip install --quiet --break-system-packages dkimpy pynacl 2>/dev/null; then
        SUDO=()
        ((EUID == 0)) || SUDO=(sudo)
        "${SUDO[@]}" apt-get update
        "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-dkim python3-nacl
    fi
    python3 -c 'import dkim, nacl.signing' || { say "dkimpy is still missing for $(command -v python3)" >&2; exit 1; }
fi

# why: tests/it/doctor.rs answers `mailsplit doctor`'s DNS questions with a dnslib server
if ! python3 -c 'import dnslib' >/dev/null 2>&1; then
    say "installing dnslib for python3 (the doctor tests' DNS server)"
    if ! python3 -m pip install --quiet dnslib 2>/dev/null &&
        ! python3 -m pip install --quiet --break-system-packages dnslib 2>/dev/null; then
        SUDO=()
        ((EUID == 0)) || SUDO=(sudo)
        "${SUDO[@]}" apt-get update
        "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-dnslib
    fi
    python3 -c 'import dnslib' || { say "dnslib is still missing for $(command -v python3)" >&2; exit 1; }
fi

# why: tests/it/accessibility.rs runs axe-core in chromium over every admin and
# public page; the package comes from the npm registry, pinned, its one script kept
AXE_VERSION=4.14.1
AXE_DIR=${MAILSPLIT_AXE_DIR:-/usr/local/share/axe-core}
if [[ ! -s $AXE_DIR/$AXE_VERSION/axe.min.js ]]; then
    say "installing axe-core $AXE_VERSION into $AXE_DIR (the accessibility test)"
    SUDO=()
    ((EUID == 0)) || SUDO=(sudo)
    if ! command -v npm >/dev/null 2>&1; then
        "${SUDO[@]}" apt-get update
        "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends npm
    fi
    axe_tmp=$(mktemp -d)
    (cd "$axe_tmp" && npm pack --silent "axe-core@$AXE_VERSION" >/dev/null &&
        tar -xzf "axe-core-$AXE_VERSION.tgz" package/axe.min.js)
    "${SUDO[@]}" mkdir -p "$AXE_DIR/$AXE_VERSION"
    "${SUDO[@]}" cp "$axe_tmp/package/axe.min.js" "$AXE_DIR/$AXE_VERSION/axe.min.js"
    "${SUDO[@]}" ln -sfn "$AXE_VERSION" "$AXE_DIR/current"
    rm -rf "$axe_tmp"
fi

if ! command -v cargo >/dev/null 2>&1; then
    cat >&2 <<'EOF'
install-deps: cargo (Rust) is not on PATH. Install a current Rust toolchain with rustup
(Debian 12's own cargo package is too old for mailsplit's crates):
    apt-get install -y curl ca-certificates
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y
    . "$HOME/.cargo/env"
then run this script again.
EOF
    exit 1
fi
