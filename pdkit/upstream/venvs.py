"""Where the contract virtualenvs of the pinned releases live (one per SGLang release and router
package, built by .ci/contract-env.sh) and their Pythons. Standard library only."""

from __future__ import annotations

import os
from pathlib import Path

ENV_SCRIPT = "bash .ci/contract-env.sh"
# Written last by .ci/contract-env.sh into each virtualenv it finished.
ENV_MARKER = ".contract-env-ok"
ROUTER_PACKAGES = ("smg", "sglang-router")

def contract_home() -> Path:
    """Where the contract virtualenvs live: $PDKIT_CONTRACT_HOME or ~/.cache/pdkit/contract."""
    configured = os.environ.get("PDKIT_CONTRACT_HOME")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "pdkit" / "contract"


class ContractEnvMissing(RuntimeError):
    """The virtualenv holding a pinned parser is not there (or was never finished)."""

    def __init__(self, name: str, path: Path):
        self.name = name
        self.path = path
        super().__init__(
            f"contract virtualenv {name!r} is missing or incomplete at {path}: "
            f"run `{ENV_SCRIPT}` from the pdkit repository root to create it"
        )


def env_python(name: str) -> Path:
    """The Python of contract virtualenv `name` (e.g. "sglang-0.5.23"), if it is complete."""
    venv = contract_home() / name
    python = venv / "bin" / "python"
    if not python.exists() or not (venv / ENV_MARKER).exists():
        raise ContractEnvMissing(name, venv)
    return python


def sglang_python(version: str) -> Path | None:
    """The Python of the sglang `version` contract env, or None when it is not built."""
    try:
        return env_python(f"sglang-{version}")
    except ContractEnvMissing:
        return None


def router_python(package: str, version: str) -> Path | None:
    """The Python of the `package` ("smg" | "sglang-router") `version` env, or None."""
    try:
        return env_python(f"{package}-{version}")
    except ContractEnvMissing:
        return None
