"""The real SGLang 0.5.23 engine venv that tests/lab/test_sglang_engine.py installs on lab-mon, handed
over to tests/lab/test_sglang_provided_env_lab.py (which sorts after it) instead of being removed and
installed again (~150-180 s of the lab's 2 cores and ~4 GB over HTTP).

The engine test hands its venv over only after every one of its own checks passed, and only when the
provided-environment tests are in the same session; the provided-environment fixture takes it (and
removes it afterwards), or installs its own exactly as before when nothing was handed over (run alone,
or in another order). One object per session: imported as `tests.lab.engine_handover` by both modules.
"""

from __future__ import annotations

VERSION = "0.5.23"
PROVIDED_MODULE = "test_sglang_provided_env_lab"

_venvs: dict[str, str] = {}  # version -> the venv's real path on lab-mon


def wanted(session) -> bool:
    """Whether the provided-environment tests run later in this session."""
    return any(getattr(item, "module", None) is not None and item.module.__name__.rsplit(".", 1)[-1] == PROVIDED_MODULE
               for item in session.items)


def keep(version: str, real_venv: str) -> None:
    _venvs[version] = real_venv


def kept(version: str) -> bool:
    return version in _venvs


def take(version: str) -> str | None:
    """The handed-over venv (once), or None."""
    return _venvs.pop(version, None)
