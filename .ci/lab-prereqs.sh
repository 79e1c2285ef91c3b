#!/usr/bin/env bash
# Host prerequisites for the pdkit lab (`pdkit lab up`): systemd-nspawn test hosts,
# debootstrap, an apt cache for the guests, and the tools the lab drives.
#
# Idempotent: packages already present are not touched and apt is not even asked to
# refresh its lists when nothing is missing. Run as root (CI runs it before the tests):
#
#     sudo .ci/lab-prereqs.sh
#
# Targets Debian 12 (bookworm) hosts; works on any Debian/Ubuntu that has these packages.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "lab-prereqs: needs root (apt-get install); run: sudo $0" >&2
    exit 2
fi

# package -> why
PACKAGES=(
    systemd-container      # systemd-nspawn: the lab hosts
    debootstrap            # builds the Debian bookworm rootfs once (cached afterwards)
    debian-archive-keyring # debootstrap checks the Release signatures with it
    apt-cacher-ng          # apt cache on the lab bridge: the guests' only package source
    zstd                   # compressed rootfs cache
    tar
    iproute2               # ip netns / veth / bridge
    openssh-client         # ssh-keygen (client key, guest host keys), ssh for checks
    util-linux             # nsenter, flock
    procps                 # pgrep/ps for debugging
    ca-certificates
)

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "lab-prereqs: all present (${PACKAGES[*]})"
    exit 0
fi

acng_was_installed=1
dpkg-query -W -f='${Status}' apt-cacher-ng 2>/dev/null | grep -q "install ok installed" \
    || acng_was_installed=0

echo "lab-prereqs: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Keep apt from hanging forever on a bad mirror.
APT_OPTS=(-o Acquire::Retries=3 -o Acquire::http::Timeout=30 -o Dpkg::Use-Pty=0)
timeout 600 apt-get "${APT_OPTS[@]}" update -q
timeout 1200 apt-get "${APT_OPTS[@]}" install -y -q --no-install-recommends "${missing[@]}"

# The distribution's apt-cacher-ng service listens on every address, port 3142, which
# would take the port the lab's own instance binds on its bridge address. The lab starts
# and stops its own instance (`pdkit lab up|down`), so a service that this script just
# installed is stopped and disabled. One that was there before is left alone.
if [ "$acng_was_installed" -eq 0 ]; then
    if [ -d /run/systemd/system ]; then
        timeout 60 systemctl disable --now apt-cacher-ng.service >/dev/null 2>&1 || true
    else
        timeout 60 /etc/init.d/apt-cacher-ng stop >/dev/null 2>&1 || true
        timeout 60 update-rc.d apt-cacher-ng disable >/dev/null 2>&1 || true
    fi
    echo "lab-prereqs: stopped and disabled the distribution's apt-cacher-ng service (the lab runs its own)"
fi

echo "lab-prereqs: done"
