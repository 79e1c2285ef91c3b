"""pdkit: SGLang prefill/decode disaggregated serving, laid down by pyinfra from one validated spec."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"


def lazy_attr(namespace: dict[str, Any], home: dict[str, str], name: str) -> Any:
    """A package's PEP 562 `__getattr__`: NAME from the submodule HOME names for it, kept in the package's
    NAMESPACE (its globals()), so that the next lookup, and a test's monkeypatch of it, is a plain attribute."""
    package = namespace["__name__"]
    if name not in home:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{package}.{home[name]}"), name)
    namespace[name] = value
    return value
