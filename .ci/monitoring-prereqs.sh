#!/usr/bin/env bash
# Host prerequisites for the monitoring unit tests (tests/test_monitoring.py): `promtool`, from
# Debian's `prometheus` package, checks the generated prometheus.yml and alert rules and runs
# the rules' unit tests.
#
# Idempotent: when the package is present nothing is touched and apt is not asked to refresh
# its lists. Run as root (CI runs it before the tests):
#
#     sudo .ci/monitoring-prereqs.sh
#
# Only promtool is wanted on this machine, not a Prometheus server: the package's daemon is kept
# from starting while it installs, then disabled, and this script checks that none is left running.
set -euo pipefail

PACKAGE=prometheus

if dpkg-query -W -f='${Status}' "$PACKAGE" 2>/dev/null | grep -q "install ok installed" \
    && command -v promtool >/dev/null; then
    echo "monitoring-prereqs: $PACKAGE present ($(promtool --version 2>&1 | head -1))"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "monitoring-prereqs: needs root (apt-get install $PACKAGE); run: sudo $0" >&2
    exit 2
fi

# Keep the package's postinst from starting the server at all: a policy-rc.d that denies every
# start, for the duration of the install only (one that already exists is left as it is).
POLICY=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# monitoring-prereqs: no service starts while packages install\nexit 101\n' > "$POLICY"
    chmod 0755 "$POLICY"
    own_policy=1
fi
cleanup() {
    if [ "$own_policy" -eq 1 ]; then rm -f "$POLICY"; fi
}
trap cleanup EXIT

echo "monitoring-prereqs: installing $PACKAGE (for promtool)"
export DEBIAN_FRONTEND=noninteractive
# Keep apt from hanging forever on a bad mirror.
APT_OPTS=(-o Acquire::Retries=3 -o Acquire::http::Timeout=30 -o Dpkg::Use-Pty=0)
timeout 600 apt-get "${APT_OPTS[@]}" update -q
# no recommends: node exporter and friends are not wanted on the control machine
timeout 1200 apt-get "${APT_OPTS[@]}" install -y -q --no-install-recommends "$PACKAGE"

# Installed here for promtool only: the server must not start now or at boot.
if [ -d /run/systemd/system ]; then
    timeout 60 systemctl disable --now prometheus.service >/dev/null 2>&1 || true
else
    timeout 60 /etc/init.d/prometheus stop >/dev/null 2>&1 || true
    timeout 60 update-rc.d prometheus disable >/dev/null 2>&1 || true
fi

# A daemon of THIS machine, i.e. in our PID namespace: lab hosts (systemd-nspawn containers) run
# their own prometheus in their own namespaces, which is theirs to run.
own_ns=$(readlink /proc/self/ns/pid)
for pid in $(pgrep -x prometheus || true); do
    if [ "$(readlink "/proc/$pid/ns/pid" 2>/dev/null)" = "$own_ns" ]; then
        echo "monitoring-prereqs: a prometheus daemon is still running (pid $pid) after disabling the service" >&2
        exit 1
    fi
done
command -v promtool >/dev/null || { echo "monitoring-prereqs: promtool missing after install" >&2; exit 1; }
echo "monitoring-prereqs: done ($(promtool --version 2>&1 | head -1); prometheus service disabled, not running)"
