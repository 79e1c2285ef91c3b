#!/usr/bin/env bash
# Host prerequisites for the monitoring unit tests (tests/test_monitoring.py, tests/test_alertmanager.py):
# `promtool`, from Debian's `prometheus` package, checks the generated prometheus.yml and alert rules
# and runs the rules' unit tests; `amtool` and `prometheus-alertmanager`, from Debian's
# `prometheus-alertmanager` (the version the monitoring host gets, pdkit/upstream/versions.py APT_PINS), check
# the rendered alertmanager.yml and run it on 127.0.0.1.
#
# Idempotent: when the package is present nothing is touched and apt is not asked to refresh
# its lists. Run as root (CI runs it before the tests):
#
#     sudo .ci/monitoring-prereqs.sh
#
# Only the tools are wanted on this machine, not the servers: the packages' daemons are kept
# from starting while they install, then disabled, and this script checks that none is left running
# (the Alertmanager tests start their own, on 127.0.0.1 with a temp --storage.path).
set -euo pipefail

# the same pin as the monitoring host (pdkit/upstream/versions.py APT_PINS; tests/test_alertmanager.py checks they agree),
# so amtool checks what the host runs
ALERTMANAGER_VERSION=0.25.0-1+b4
PACKAGES=(prometheus "prometheus-alertmanager=$ALERTMANAGER_VERSION")
# daemon (unit name, process name) of each package
DAEMONS=("prometheus.service prometheus" "prometheus-alertmanager.service prometheus-alertmanager")

installed() {
    dpkg-query -W -f='${Status}' prometheus 2>/dev/null | grep -q "install ok installed" \
        && [ "$(dpkg-query -W -f='${Version}' prometheus-alertmanager 2>/dev/null)" = "$ALERTMANAGER_VERSION" ] \
        && command -v promtool >/dev/null && command -v amtool >/dev/null && command -v prometheus-alertmanager >/dev/null
}

if installed; then
    echo "monitoring-prereqs: present ($(promtool --version 2>&1 | head -1); $(amtool --version 2>&1 | head -1))"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "monitoring-prereqs: needs root (apt-get install ${PACKAGES[*]}); run: sudo $0" >&2
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

echo "monitoring-prereqs: installing ${PACKAGES[*]} (for promtool, amtool)"
export DEBIAN_FRONTEND=noninteractive
# Keep apt from hanging forever on a bad mirror.
APT_OPTS=(-o Acquire::Retries=3 -o Acquire::http::Timeout=30 -o Dpkg::Use-Pty=0)
timeout 600 apt-get "${APT_OPTS[@]}" update -q
# no recommends: node exporter and friends are not wanted on the control machine
timeout 1200 apt-get "${APT_OPTS[@]}" install -y -q --no-install-recommends "${PACKAGES[@]}"

# A daemon of THIS machine, i.e. in our PID namespace: lab hosts (systemd-nspawn containers) run
# their own prometheus and alertmanager in their own namespaces, which are theirs to run.
own_ns=$(readlink /proc/self/ns/pid)
for daemon in "${DAEMONS[@]}"; do
    read -r unit process <<<"$daemon"
    # Installed here for the tools only: the server must not start now or at boot.
    if [ -d /run/systemd/system ]; then
        timeout 60 systemctl disable --now "$unit" >/dev/null 2>&1 || true
    else
        timeout 60 "/etc/init.d/${unit%.service}" stop >/dev/null 2>&1 || true
        timeout 60 update-rc.d "${unit%.service}" disable >/dev/null 2>&1 || true
    fi
    # by its full command line: comm is cut at 15 characters ("prometheus-aler")
    for pid in $(pgrep -f "^/usr/bin/$process( |\$)" || true); do
        if [ "$(readlink "/proc/$pid/ns/pid" 2>/dev/null)" = "$own_ns" ]; then
            echo "monitoring-prereqs: a $process daemon is still running (pid $pid) after disabling $unit" >&2
            exit 1
        fi
    done
done
installed || { echo "monitoring-prereqs: promtool, amtool or prometheus-alertmanager $ALERTMANAGER_VERSION missing after install" >&2; exit 1; }
echo "monitoring-prereqs: done ($(promtool --version 2>&1 | head -1); $(amtool --version 2>&1 | head -1); services disabled, not running)"
