#!/usr/bin/env bash
# What `make install` and the tests need on the host besides Docker: python3 with venv/ensurepip (Debian
# ships it apart, as python3-venv: the test venv and the tests' fresh consumer venvs need it), g++ (nvcc's
# host compiler) and headless Chromium with its WebDriver (the human page's browser test, Selenium driving
# it). Installs the missing ones with apt; one clear line when that cannot be done.
set -euo pipefail

fail() {
    echo "host-tools: $*" >&2
    exit 1
}

missing=()
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
[ ${#missing[@]} -eq 0 ] && exit 0

command -v apt-get >/dev/null 2>&1 || fail "apt-get not found; install ${missing[*]} by hand"
as_root=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || fail "need root (or passwordless sudo) to install ${missing[*]}"
    as_root=(sudo -n)
fi
echo "host-tools: installing ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || fail "apt-get update failed"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
    || fail "apt-get install ${missing[*]} failed"
