"""The webhook receiver of the lab's Alertmanager: an HTTP sink on the monitoring host itself.

inventories/lab.py routes every alert to the receiver `lab-sink`, a webhook at
http://<lab-mon>:9095/. `Sink.start` runs a small stdlib server there as a transient systemd unit
(`systemd-run`, so it dies with the lab host and is never left behind by a failed test); each POST
body Alertmanager sends is appended as one JSON line to a file on the host, and `notifications`
reads them back over SSH. Nothing here is part of pdkit: it stands in for a person's pager.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass

from pdkit.lab.lifecycle import ssh_run
from pdkit.lab.model import LabInfo
from tests.lab.test_deploy import json_from_child

UNIT = "pdkit-lab-alert-sink"
PORT = 9095
LOG = "/run/pdkit-lab-alert-sink.jsonl"

SERVER = f"""
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        note = json.loads(body)
        # whether Alertmanager sent the receiver's credential (the token itself is not kept)
        note["_bearer"] = (self.headers.get("Authorization") or "").startswith("Bearer ")
        with open({LOG!r}, "a") as fh:
            fh.write(json.dumps(note) + "\\n")
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], {PORT}), H).serve_forever()
"""


@dataclass
class Sink:
    lab: LabInfo
    host: str  # the monitoring host's lab name

    def start(self) -> None:
        """(Re)start the sink with an empty log; returns once it answers."""
        command = (f"systemctl stop {UNIT} 2>/dev/null; systemctl reset-failed {UNIT} 2>/dev/null; rm -f {LOG}; "
                   f"addr=$(hostname -I | awk '{{print $1}}'); "
                   f"systemd-run --unit {UNIT} --quiet python3 -c {shlex.quote(SERVER)} \"$addr\" && "
                   f"for i in $(seq 100); do python3 -c \"import socket; socket.create_connection(('$addr', {PORT}), 1)\" "
                   f"2>/dev/null && exit 0; sleep 0.1; done; exit 1")
        result = ssh_run(self.lab, self.host, command, timeout=60)
        assert result.returncode == 0, f"the alert sink did not start on {self.host}: {result.stderr[-2000:]}"

    def stop(self) -> None:
        ssh_run(self.lab, self.host, f"systemctl stop {UNIT} 2>/dev/null; rm -f {LOG}", timeout=30)

    def notifications(self) -> list[dict]:
        """Every webhook body received so far (Alertmanager's webhook format, version 4)."""
        result = ssh_run(self.lab, self.host, f"cat {LOG} 2>/dev/null || true", timeout=30)
        return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]

    def alerts(self, alertname: str, status: str | None = None, **labels: str) -> list[tuple[dict, dict]]:
        """(notification, alert) for each alert named ALERTNAME (with STATUS and LABELS) in what was received."""
        out = []
        for note in self.notifications():
            for alert in note.get("alerts", []):
                if alert["labels"].get("alertname") != alertname:
                    continue
                if status is not None and alert.get("status") != status:
                    continue
                if all(alert["labels"].get(k) == v for k, v in labels.items()):
                    out.append((note, alert))
        return out

    def wait_for(self, alertname: str, status: str, timeout: float, **labels: str) -> float:
        """Seconds until a notification of ALERTNAME with STATUS (and LABELS) arrived; fails after TIMEOUT."""
        start = time.monotonic()
        while not self.alerts(alertname, status, **labels):
            assert time.monotonic() - start < timeout, (
                f"no {status} notification of {alertname} {labels} within {timeout:.0f} s; received: "
                f"{[(a['labels'].get('alertname'), a['status'], a['labels'].get('instance')) for n in self.notifications() for a in n.get('alerts', [])]}")
            time.sleep(1)
        return time.monotonic() - start


def alerting_facts(inventory: str = "inventories/lab.py") -> dict:
    """The lab's Alertmanager URL, monitoring host and grouping clock, read from the spec (in a child
    process: pdkit.inventory.loader imports pyinfra's CLI, which gevent-patches its importer)."""
    return json_from_child(
        "import json; from pdkit.inventory.loader import load; from pdkit.monitoring.common import alertmanager_urls; "
        f"spec = load({inventory!r}); mon = spec.monitoring_hosts[0]; a = mon.monitoring.alerting; "
        "print(json.dumps({'am': alertmanager_urls(spec)[0], 'mon': mon.name, "
        "'group_wait_s': a.group_wait_s, 'group_interval_s': a.group_interval_s}))")
