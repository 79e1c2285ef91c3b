"""The bench fingerprint's driver probe over real SSH to a lab host (strict host-key checking).

Lab hosts have no GPU: the probe must come back "unknown: <the shell's reason>", never a made-up
version; and a host whose key is not in the known_hosts file must be refused, not trusted.
"""

from __future__ import annotations

import pytest

from pdkit.bench.env import probe_driver

pytestmark = pytest.mark.lab


def test_driver_probe_reaches_the_host_and_reports_why_there_is_no_version(lab):
    name, data = lab.pyinfra_hosts()[0]
    driver = probe_driver({**data, "name": name})
    assert driver.startswith("unknown: ") and "nvidia-smi" in driver, driver


def test_driver_probe_refuses_an_unknown_host_key(lab, tmp_path):
    name, data = lab.pyinfra_hosts()[0]
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    driver = probe_driver({**data, "name": name, "ssh_known_hosts_file": str(empty)})
    assert driver == "unknown: Host key verification failed.", driver
