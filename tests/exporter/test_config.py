"""The exporter config: defaults, and errors that name the key."""

from __future__ import annotations

import json

import pytest

from pdkit.agent.exporter.config import ConfigError, load_config, parse_config

MINIMAL = {"node": "gpu01", "engines": [
    {"name": "decode", "role": "decode", "url": "http://10.0.0.1:30001/", "argv": ["--port", "30001"]}]}


def test_defaults():
    cfg = parse_config(MINIMAL)
    assert (cfg.listen_address, cfg.listen_port, cfg.timeout_s, cfg.cluster, cfg.release) == \
        ("127.0.0.1", 9400, 2.0, "", None)
    assert cfg.journal.enabled and cfg.journal.max_entries == 2000
    (engine,) = cfg.engines
    assert engine.url == "http://10.0.0.1:30001" and engine.unit is None and engine.env == ()


def test_full_config_round_trip(tmp_path):
    data = {**MINIMAL, "cluster": "prod", "listen_address": "10.0.0.1", "listen_port": 9401, "release": None,
            "release_file": "/etc/pdkit/release.json", "timeout_s": 1.5,
            "journal": {"enabled": False, "max_entries": 500, "timeout_s": 3},
            "engines": [{**MINIMAL["engines"][0], "unit": "pdkit-engine-decode.service", "sglang_version": "0.5.23",
                         "env": {"UCX_TLS": "tcp", "HF_TOKEN": None}, "drift_ignore": ["--page-size"]}]}
    path = tmp_path / "exporter.json"
    path.write_text(json.dumps(data))
    cfg = load_config(path)
    assert cfg.listen_port == 9401 and not cfg.journal.enabled and cfg.journal.max_entries == 500
    assert cfg.engines[0].env_dict == {"HF_TOKEN": None, "UCX_TLS": "tcp"}


@pytest.mark.parametrize("change, message", [
    ({"nodes": "x"}, "unknown key(s) nodes"),
    ({"node": ""}, "node: expected a non-empty string"),
    ({"listen_port": 70000}, "listen_port: expected an integer"),
    ({"listen_port": True}, "listen_port: expected an integer"),
    ({"timeout_s": 0}, "timeout_s: expected a number"),
    ({"journal": {"max_lines": 5}}, "journal: unknown key(s) max_lines"),
    ({"engines": [{"name": "a", "role": "router", "url": "http://h:1", "argv": []}]}, "engines[0].role"),
    ({"engines": [{"name": "a", "role": "decode", "url": "h:1", "argv": []}]}, "not an http(s) URL"),
    ({"engines": [{"name": "a", "role": "decode", "url": "http://h:1"}]}, "engines[0]: missing required key(s) argv"),
    ({"engines": [{"name": "a", "role": "decode", "url": "http://h:1", "argv": [1]}]}, "argv: expected a list"),
    ({"engines": [{"name": "a", "role": "decode", "url": "http://h:1", "argv": [], "env": {"X": 1}}]},
     "engines[0].env"),
    ({"engines": [{"name": "a", "role": "decode", "url": "http://h:1", "argv": []}] * 2}, "duplicate name(s) a"),
])
def test_errors_name_the_key(change, message):
    with pytest.raises(ConfigError) as err:
        parse_config({**MINIMAL, **change})
    assert message in str(err.value)


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(bad)
