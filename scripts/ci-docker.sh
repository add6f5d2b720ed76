#!/usr/bin/env bash
# Make sure a Docker daemon answers and debootstrap is installed, for the integration tests.
# Installs docker.io and debootstrap with apt when missing, starts dockerd when it does not answer,
# and waits up to 60 s for it. Exits non-zero with one clear line when that cannot be done.
set -euo pipefail

log=${DOCKERD_LOG:-/tmp/ci-dockerd.log}
wait_s=${DOCKERD_WAIT:-60}

fail() {
    echo "ci-docker: $*" >&2
    exit 1
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        fail "need root (or passwordless sudo) to run: $*"
    fi
}

missing=()
command -v docker >/dev/null 2>&1 || missing+=(docker.io)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || fail "apt-get not found; install ${missing[*]} by hand"
    # De-duplicate: docker.io may be listed twice.
    mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
    echo "ci-docker: installing ${pkgs[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
        || fail "apt-get update failed"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null \
        || fail "apt-get install ${pkgs[*]} failed"
fi

if docker info >/dev/null 2>&1; then
    echo "ci-docker: dockerd is answering"
    exit 0
fi

echo "ci-docker: starting dockerd (log: $log)"
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    as_root systemctl start docker || true
fi
if ! docker info >/dev/null 2>&1; then
    # A dockerd killed without cleanup (the end of a session, a crash) leaves its pid file behind,
    # and a new dockerd refuses to start while it exists.
    if ! pgrep -x dockerd >/dev/null 2>&1; then
        as_root rm -f /var/run/docker.pid
    fi
    as_root sh -c "nohup dockerd >'$log' 2>&1 &" || fail "could not launch dockerd"
fi

for _ in $(seq "$wait_s"); do
    if docker info >/dev/null 2>&1; then
        echo "ci-docker: dockerd is answering"
        exit 0
    fi
    sleep 1
done
tail -n 5 "$log" >&2 2>/dev/null || true
fail "dockerd did not answer within ${wait_s} s (see $log)"
