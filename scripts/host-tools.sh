#!/usr/bin/env bash
# What `make install` and the tests need on the host besides Docker: python3 with venv/ensurepip (Debian
# ships it apart, as python3-venv: the test venv and the tests' fresh consumer venvs need it), g++ (nvcc's
# host compiler), headless Chromium with its WebDriver (the human page's browser test, Selenium driving
# it), debootstrap (the factory's base images) and QEMU's user-mode emulators with binfmt-support (the other
# platform's images and containers: Debian registers qemu-<arch> with binfmt_misc's fix-binary flag, which a
# container needs; QEMU 10 or later, because bookworm's 7.2 crashes in `import torch`: on bookworm it comes
# from bookworm-backports). Installs the missing ones with apt; one clear line when that cannot be done.
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
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
# the emulator of the other platform: aarch64 on an x86_64 host, x86_64 on an aarch64 one
case "$(uname -m)" in
    aarch64 | arm64) emulator=qemu-x86_64 ;;
    *) emulator=qemu-aarch64 ;;
esac
command -v update-binfmts >/dev/null 2>&1 || missing+=(binfmt-support)
# the emulator's major version (0 when absent): factory/build/emulation.py's MIN_QEMU
qemu_major() {
    "${emulator}-static" --version 2>/dev/null | sed -n 's/^qemu-[^ ]* version \([0-9]*\)\..*/\1/p' | head -1
}
old_qemu=false
major="$(qemu_major)"
[ "${major:-0}" -ge 10 ] || old_qemu=true

# binfmt_misc registered, enabled and with the fix-binary flag (F), else emulated containers cannot start
register_emulator() {
    local dir=/proc/sys/fs/binfmt_misc
    [ -e "$dir/status" ] || "${as_root[@]}" mount -t binfmt_misc binfmt_misc "$dir" 2>/dev/null \
        || fail "binfmt_misc is not mounted and cannot be: run \`mount -t binfmt_misc binfmt_misc $dir\` as root"
    if [ "${1:-}" = again ]; then
        # the kernel holds the interpreter it opened at registration (F): a new QEMU needs a new entry
        "${as_root[@]}" update-binfmts --disable "$emulator" >/dev/null 2>&1 || true
    elif [ -e "$dir/$emulator" ] && grep -q '^enabled' "$dir/$emulator" && grep -q '^flags:.*F' "$dir/$emulator"; then
        return 0
    fi
    "${as_root[@]}" update-binfmts --enable "$emulator" >/dev/null 2>&1 || true
    grep -q '^flags:.*F' "$dir/$emulator" 2>/dev/null \
        || fail "$emulator is not registered with binfmt_misc's fix-binary flag (see $dir/$emulator)"
}

# QEMU 10: trixie's own; bookworm's from bookworm-backports (its qemu-user, qemu-user-binfmt and the
# qemu-user-static that names the static binaries)
install_qemu() {
    local codename backports=()
    codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
    if [ "$codename" = bookworm ]; then
        local list=/etc/apt/sources.list.d/bookworm-backports.list
        if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
            echo "deb http://deb.debian.org/debian bookworm-backports main" | "${as_root[@]}" tee "$list" >/dev/null \
                || fail "cannot add bookworm-backports (for QEMU 10) to $list"
        fi
        backports=(-t bookworm-backports)
    fi
    echo "host-tools: installing QEMU 10 (qemu-user-static${backports[*]:+ from bookworm-backports})"
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || fail "apt-get update failed"
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${backports[@]}" \
        qemu-user-static qemu-user qemu-user-binfmt >/dev/null \
        || fail "apt-get install of QEMU 10 (qemu-user-static qemu-user qemu-user-binfmt) failed"
    major="$(qemu_major)"
    [ "${major:-0}" -ge 10 ] || fail "QEMU is ${major:-missing} after installing it, not 10 or later"
}

# Emulation serves only the other platform's builds (`make aarch64-demo`; no test of `make test` needs it), so
# a host where it cannot be set up still gets everything else: one warning line, and the factory's own check
# (factory/build/emulation.py) says what to run when such a build is asked for.
emulation() {
    (
        if $old_qemu; then
            install_qemu
            register_emulator again
        fi
        register_emulator
    ) || echo "host-tools: warning: no emulation of the other platform here (above); only its builds need it" >&2
}

as_root=()
[ "$(id -u)" -eq 0 ] || as_root=(sudo -n)
if [ ${#missing[@]} -eq 0 ]; then
    emulation
    exit 0
fi

command -v apt-get >/dev/null 2>&1 || fail "apt-get not found; install ${missing[*]} by hand"
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || fail "need root (or passwordless sudo) to install ${missing[*]}"
fi
echo "host-tools: installing ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || fail "apt-get update failed"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
    || fail "apt-get install ${missing[*]} failed"
emulation
