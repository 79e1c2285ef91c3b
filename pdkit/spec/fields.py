"""Field types and value rules the spec's models share: bounds that catch unit mistakes, names,
system accounts and directories, model locations, and the paths the engines' sandbox hides."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = [
    "HIDDEN_FROM_ENGINES", "MAX_BATCH", "MAX_CONTEXT_LENGTH", "MAX_GPU_MEMORY_GIB", "MAX_INTERVAL_S",
    "MAX_NUMA_NODES", "MAX_TIMEOUT_S", "NAME_PATTERN", "SYSTEM_ACCOUNTS", "SYSTEM_DIRS", "at_most", "BatchSize",
    "checked_model_location", "Frozen", "hidden_from_engines", "IntervalSeconds", "model_location_problem", "Port",
    "Seconds", "SglangVersion",
]

# A systemd unit name fragment and a Prometheus label value at once.
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
Port = Annotated[int, Field(ge=1, le=65535)]
SglangVersion = Literal["0.5.17", "0.5.23"]


# Bounds that catch unit mistakes (a MiB figure where GiB is asked, milliseconds for seconds):
# each is far above any real setting and is named in the error.
MAX_GPU_MEMORY_GIB = 320  # the largest GPUs shipping (B300, MI355X: 288 GB = 268 GiB)
MAX_NUMA_NODES = 64
MAX_CONTEXT_LENGTH = 16 * 1024 * 1024  # 16M tokens; the longest released contexts are 10M
MAX_BATCH = 65536
MAX_TIMEOUT_S = 86400  # a day
MAX_INTERVAL_S = 3600


def at_most(limit: int | float, what: str, too_big_hint: str = "") -> AfterValidator:
    """An AfterValidator: the value must be <= limit; the message names the bound."""

    def check(value: float | None) -> float | None:
        if value is not None and value > limit:
            hint = f" ({too_big_hint})" if too_big_hint else ""
            raise ValueError(f"{value} is above {limit}, the most a {what} can sensibly be{hint}")
        return value

    return AfterValidator(check)


Seconds = Annotated[int, Field(ge=1), at_most(MAX_TIMEOUT_S, "timeout in seconds",
                                              "does it look like milliseconds? give seconds")]
IntervalSeconds = Annotated[int, Field(ge=1), at_most(MAX_INTERVAL_S, "interval in seconds",
                                                      "does it look like milliseconds? give seconds")]
BatchSize = Annotated[int, Field(ge=1), at_most(MAX_BATCH, "batch size or request count")]

# Accounts Debian and Ubuntu create for the system itself (base-passwd's passwd.master, plus
# the daemons pdkit installs beside its services): a service must never run as one of them.
SYSTEM_ACCOUNTS = frozenset({
    "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy",
    "www-data", "backup", "list", "irc", "gnats", "nobody", "_apt", "messagebus", "sshd", "syslog",
    "systemd-network", "systemd-resolve", "systemd-timesync", "systemd-coredump", "polkitd",
    "prometheus", "grafana", "node-exp", "nvidia-persistenced", "ubuntu", "debian",
})
# Directories pdkit must not take over as its install or config dir.
SYSTEM_DIRS = frozenset({"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/opt", "/proc", "/root", "/run",
                         "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/local", "/var"})
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def model_location_problem(value: str) -> str | None:
    """Why a model/tokenizer/draft location is unusable, or None: an absolute path on the GPU
    nodes, or a Hugging Face hub id ("org/name", downloaded by nodes that may reach the hub)."""
    if value.startswith("/"):
        if "/../" in value + "/" or re.search(r"\s", value):
            return f"{value!r} is not a plain absolute path: no '..' components or spaces"
        return None
    if _HUB_ID.match(value) and ".." not in value:
        return None
    return (f"{value!r} is neither an absolute path nor a hub id: give the directory on the GPU nodes "
            "(e.g. /models/Llama-3.1-8B-Instruct) or a Hugging Face id 'org/name' "
            "(e.g. meta-llama/Llama-3.1-8B-Instruct); "
            "a relative path would resolve against the service's working directory")


def checked_model_location(value: str | None) -> str | None:
    """model_location_problem as a field validator: VALUE back, or ValueError with the problem."""
    if value is not None:
        problem = model_location_problem(value)
        if problem:
            raise ValueError(problem)
    return value


# directories the engine units' sandbox hides (templates/systemd/engine.service.j2: ProtectHome=yes
# makes /home, /root and /run/user empty and inaccessible; PrivateTmp=yes gives the unit its own
# empty /tmp and /var/tmp). The one list for every path an engine reads: engine_venv, the model,
# its tokenizer and a speculative draft (validate), and the preflight's model checks.
HIDDEN_FROM_ENGINES = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")


def hidden_from_engines(path: str) -> str | None:
    """The directory of HIDDEN_FROM_ENGINES that PATH is in (the engine units cannot see it), or None."""
    return next((d for d in HIDDEN_FROM_ENGINES if (path.rstrip("/") + "/").startswith(d + "/")), None)


# the base of every spec model: immutable once loaded, unknown keys refused, defaults validated too
class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)
