"""Alertmanager silences for planned changes: `pdkit roll`, `rollback`, `tune` and a deploy that
restarts engines silence exactly the hosts they touch, for a window that bounds the step, and
expire the silence when the step ends (also when it failed, after the restore).

A silence is a courtesy, not a gate: an Alertmanager that does not answer gets one warning per
command and the change goes on. Where the spec has no monitoring host there is nothing to do.

The client speaks Alertmanager's v2 API (stdlib HTTP through pdkit.agent.health.http_request):
POST /api/v2/silences, GET /api/v2/silence/{id}, DELETE /api/v2/silence/{id}. Measured on
Alertmanager 0.25.0 (Debian bookworm): a startsAt in the past is replaced by the Alertmanager's
own now; DELETE of an already expired silence answers 200, of an unknown id 500 "silence not found".

Which alerts are a host's (the labels every scrape target carries: pdkit/monitoring/scrape.py):
- `node="<host>"`: every target ON the host (its engines, pdkit-exporter, node_exporter, the DCGM
  exporter, its router and that router's per-worker alerts);
- `worker_instance="<host>/<engine>"`: what routers on OTHER hosts say about the host's engines
  (router worker alerts are labelled with the router's node, and the worker by worker_instance).
Alertmanager ANDs the matchers of one silence, so those are two silences, both scoped by `cluster`.
"""

from __future__ import annotations

import atexit
import getpass
import json
import os
import socket
import sys
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pdkit.agent.health import http_request
from pdkit.hosts import routersync

if TYPE_CHECKING:
    from pyinfra.api.host import Host
    from pyinfra.api.state import State

    from pdkit.spec import ClusterSpec

CREATED_BY = "pdkit"
# a request to Alertmanager gives up after this long: a silence must not slow a change down
TIMEOUT_S = 5.0
# startsAt is sent this far in the past: Alertmanager then starts the silence at its own now
# (silences.Set), so a control machine whose clock runs ahead of the monitoring host's never
# leaves the silence pending while the change already runs
STARTS_AT_LEAD_S = 300


@dataclass(frozen=True)
class Matcher:
    """One label matcher of a silence (Alertmanager v2's `matcher`)."""

    name: str
    value: str
    is_regex: bool = False

    def api(self) -> dict:
        return {"name": self.name, "value": self.value, "isRegex": self.is_regex, "isEqual": True}

    def __str__(self) -> str:
        return f'{self.name}{"=~" if self.is_regex else "="}"{self.value}"'


def _one_of(name: str, values: list[str]) -> Matcher:
    """NAME equal to the one value, or an anchored regex matching exactly these values."""
    # lazy: importing pdkit.monitoring.common runs the package's __init__, every generator: ~70 ms
    # more than pdkit.roll (which imports this module) already loads
    from pdkit.monitoring.common import regex_literal

    if len(values) == 1:
        return Matcher(name, values[0])
    return Matcher(name, "|".join(regex_literal(v) for v in values), is_regex=True)


def host_matchers(spec: ClusterSpec, hosts: list[str]) -> list[tuple[Matcher, ...]]:
    """The matcher sets (one silence each) that cover every alert about HOSTS: the targets on them
    (node) and the routers' view of their engines (worker_instance), both within the cluster."""
    # lazy: pdkit.monitoring's __init__ loads every generator (~70 ms; see _one_of)
    from pdkit.monitoring.common import engine_instance

    cluster = Matcher("cluster", spec.cluster.name)
    sets: list[tuple[Matcher, ...]] = [(cluster, _one_of("node", list(hosts)))]
    wanted = set(hosts)
    fronted: list[str] = []
    for router in spec.router_hosts:
        for h, e in spec.router_workers(router):
            instance = engine_instance(h, e.name)
            if h.name in wanted and instance not in fronted:
                fronted.append(instance)
    if fronted:
        sets.append((cluster, _one_of("worker_instance", fronted)))
    return sets


def who() -> str:
    """The person behind the command: the sudo caller where there is one, else the login user, @ this machine."""
    try:
        user = os.environ.get("SUDO_USER") or getpass.getuser()
    except Exception:  # noqa: BLE001 - no name for this uid: still say something
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _public(url: str) -> str:
    """URL without any user:password part: what a message may show."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _matchers_text(sets: list[tuple[Matcher, ...]]) -> str:
    return " and ".join("{" + ", ".join(str(m) for m in s) + "}" for s in sets)


class AlertmanagerError(RuntimeError):
    """Alertmanager did not answer, or refused: the message names its URL (no credentials) and why."""


class Alertmanager:
    """One Alertmanager's v2 silence API."""

    def __init__(self, url: str, timeout: float = TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, payload: dict | None = None) -> tuple[int, str]:
        status, body = http_request(f"{self.url}/api/v2{path}", payload, timeout=self.timeout, method=method)
        if status == 0:
            raise AlertmanagerError(f"Alertmanager at {_public(self.url)} did not answer ({body.strip()[:200]})")
        return status, body

    def create(self, matchers: tuple[Matcher, ...], ends_at: datetime, comment: str, starts_at: datetime) -> str:
        payload = {"matchers": [m.api() for m in matchers], "startsAt": _iso(starts_at), "endsAt": _iso(ends_at),
                   "createdBy": CREATED_BY, "comment": comment}
        status, body = self._call("POST", "/silences", payload)
        if status != 200:
            raise AlertmanagerError(f"Alertmanager at {_public(self.url)} refused the silence: {status} "
                                    f"{body.strip()[:200]}")
        return json.loads(body)["silenceID"]

    def get(self, silence_id: str) -> dict | None:
        status, body = self._call("GET", f"/silence/{urllib.parse.quote(silence_id, safe='')}")
        if status == 404 or (status == 500 and "not found" in body):
            return None
        if status != 200:
            raise AlertmanagerError(f"Alertmanager at {_public(self.url)}: GET silence {silence_id} answered {status} "
                                    f"{body.strip()[:200]}")
        return json.loads(body)

    def silences(self) -> list[dict]:
        status, body = self._call("GET", "/silences")
        if status != 200:
            raise AlertmanagerError(f"Alertmanager at {_public(self.url)}: GET silences answered {status} "
                                    f"{body.strip()[:200]}")
        return json.loads(body)

    def expire(self, silence_id: str) -> None:
        """Expire the silence now (an already expired one stays expired: 200 from Alertmanager 0.25)."""
        status, body = self._call("DELETE", f"/silence/{urllib.parse.quote(silence_id, safe='')}")
        if status != 200:
            raise AlertmanagerError(f"Alertmanager at {_public(self.url)} did not expire silence {silence_id}: "
                                    f"{status} {body.strip()[:200]}")


@dataclass
class Silence:
    """The silences of one planned step (one per matcher set and Alertmanager), as the reports keep them."""

    command: str
    label: str  # the hosts, as the progress lines name them
    hosts: tuple[str, ...]
    comment: str
    matchers: list[tuple[Matcher, ...]]
    starts_at: datetime
    ends_at: datetime  # the window's upper bound: a crashed pdkit leaves it at most this long
    ids: list[tuple[str, str]] = field(default_factory=list)  # (Alertmanager URL, silence id)
    expired_at: datetime | None = None
    outcome: str = ""

    def record(self) -> dict:
        """For `pdkit roll --report` and tests: ids, matchers (Alertmanager's own form), window."""
        return {
            "command": self.command, "hosts": list(self.hosts), "comment": self.comment,
            "silences": [{"alertmanager": _public(url), "id": sid} for url, sid in self.ids],
            "matchers": [[m.api() for m in s] for s in self.matchers],
            "starts_at": _iso(self.starts_at), "ends_at": _iso(self.ends_at),
            "expired_at": _iso(self.expired_at) if self.expired_at else None, "outcome": self.outcome,
        }


class Silencer:
    """Creates and expires one command's silences; warns once per Alertmanager that cannot be reached.

    SAY(who, text) prints one line (the roll's progress printer, the deploy's stderr line)."""

    def __init__(self, urls: list[str], command: str, say: Callable[[str, str], None], *, user: str | None = None,
                 timeout: float = TIMEOUT_S) -> None:
        self.managers = [Alertmanager(u, timeout) for u in urls]
        self.command = command
        self.say = say
        self.user = user or who()
        self.warned: set[str] = set()
        self.made: list[Silence] = []

    @classmethod
    def for_spec(cls, spec: ClusterSpec, command: str, say: Callable[[str, str], None], **kw) -> Silencer:
        """The spec's Alertmanagers (pdkit.monitoring.common.alertmanager_urls): none without a monitoring host."""
        # lazy: pdkit.monitoring's __init__ loads every generator (~70 ms; see _one_of)
        from pdkit.monitoring.common import alertmanager_urls

        return cls(alertmanager_urls(spec), command, say, **kw)

    @property
    def records(self) -> list[dict]:
        return [s.record() for s in self.made]

    def _warn(self, am: Alertmanager, exc: Exception) -> None:
        if am.url in self.warned:
            return
        self.warned.add(am.url)
        self.say("-", f"warning: {exc}: going on without a silence there (a silence is a courtesy, not a gate); "
                      f"alerts from the hosts this {self.command} touches may page")

    def start(self, label: str, hosts: list[str], matchers: list[tuple[Matcher, ...]], window_s: float,
              what: str) -> Silence | None:
        """Silence MATCHERS for at most WINDOW_S from now; one line saying what and until when.
        None when there is no Alertmanager, or none took it (warned)."""
        if not self.managers or not matchers:
            return None
        now = datetime.now(UTC)
        comment = f"{self.command} by {self.user}: {what}"
        silence = Silence(self.command, label, tuple(hosts), comment, matchers, now, now + timedelta(seconds=window_s))
        for am in self.managers:
            for m in matchers:
                try:
                    silence.ids.append((am.url, am.create(m, silence.ends_at, comment,
                                                          now - timedelta(seconds=STARTS_AT_LEAD_S))))
                except (AlertmanagerError, ValueError, KeyError) as exc:
                    self._warn(am, exc)
                    break
        if not silence.ids:
            return None
        self.made.append(silence)
        ids = ", ".join(sid for _, sid in silence.ids)
        self.say(label, f"silenced {_matchers_text(matchers)} until {silence.ends_at:%H:%M:%S} UTC at the latest "
                        f"({window_s:.0f} s, the step's bound): {comment} (silence {ids})")
        return silence

    def end(self, silence: Silence | None, outcome: str) -> None:
        """Expire SILENCE now; one line saying so and why (OUTCOME)."""
        if silence is None or silence.expired_at is not None:
            return
        failed = []
        for url, sid in silence.ids:
            am = next(a for a in self.managers if a.url == url)
            try:
                am.expire(sid)
            except AlertmanagerError as exc:
                failed.append(f"{sid} ({exc})")
        silence.expired_at = datetime.now(UTC)
        silence.outcome = outcome
        held = (silence.expired_at - silence.starts_at).total_seconds()
        if failed:
            self.say(silence.label, f"warning: could not expire silence {', '.join(failed)}: it ends by itself at "
                                    f"{silence.ends_at:%H:%M:%S} UTC; expire it in Alertmanager's UI or with amtool")
        else:
            self.say(silence.label, f"silence expired after {held:.1f} s ({outcome}): alerts of "
                     f"{', '.join(silence.hosts)} page again")

    @contextmanager
    def silenced(self, label: str, hosts: list[str], matchers: list[tuple[Matcher, ...]], window_s: float, what: str,
                 done: str = "done", failed: str = "the step failed; expired after its restore") -> Iterator[Step]:
        """start(), then end() whatever happens inside: with FAILED's words when an exception leaves
        the block (re-raised) or the block set `step.failed`, else DONE's."""
        step = Step(self.start(label, hosts, matchers, window_s, what))
        try:
            yield step
        except BaseException:
            step.failed = True
            raise
        finally:
            self.end(step.silence, failed if step.failed else done)


@dataclass
class Step:
    """What `Silencer.silenced` yields: the silence (None: none was made) and whether the step failed."""

    silence: Silence | None
    failed: bool = False


def wait_state(am: Alertmanager, silence_id: str, state: str, timeout: float = 5.0) -> dict:
    """The silence once Alertmanager reports STATE (tests and lab checks)."""
    deadline = time.monotonic() + timeout
    while True:
        got = am.get(silence_id)
        if got is not None and got["status"]["state"] == state:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"silence {silence_id} is {got and got['status']['state']}, not {state}, after "
                                 f"{timeout} s")
        time.sleep(0.1)


# ---------------------------------------------------------------- a plain deploy (roles/services.py)
#
# The deploy runs on the control machine, host by host in pyinfra's operation order: a python.call
# operation silences the host right before its engines or router restart, another expires it after
# their gates. A host whose operation fails runs none of its later operations, so a pyinfra
# callback expires its silence at that failure (a host the deploy left broken pages), and an exit
# handler expires whatever is still open when the process ends.

# a router sync (roles/services.py _sync_router: its client's timeout) per router on other hosts
ROUTER_SYNC_S = 120
_deploy_open: dict[str, tuple[Silencer, Silence]] = {}
_deploy_watched: weakref.WeakSet = weakref.WeakSet()
_deploy_exit_registered: list[bool] = []
_deploy_silencers: dict[tuple[str, ...], Silencer] = {}


def deploy_window_s(gate_timeouts: list[float], router_gate_timeouts: list[float], router_syncs: int) -> float:
    """Pure: the bound of a deploy's restarts on one host: the engines' and daemons' restart and
    gates, the router syncs, the router's restart and gate (each gate command's timeout + 60)."""
    first = max(gate_timeouts, default=0) + 60 if gate_timeouts else 0
    router = max(router_gate_timeouts, default=0) + 60 if router_gate_timeouts else 0
    return first + router_syncs * ROUTER_SYNC_S + router + 60


def deploy_silence(spec: ClusterSpec, host_name: str, moving: list,
                   node_drained: bool) -> tuple[float, list[str]] | None:
    """Pure: whether a deploy silences HOST_NAME around its restarts, as (window, units), else None:
    when an engine or router (re)starts (MOVING: pdkit.render.plan.Service), the spec has a monitoring
    host, and the deploy is not a roll's (node_drained: the roll silences its batch itself)."""
    units = [s for s in moving if s.kind in ("engine", "router")]
    if not units or not spec.monitoring_hosts or node_drained:
        return None
    window = deploy_window_s([s.ready_timeout_s for s in moving if s.kind != "router"],
                             [s.ready_timeout_s for s in moving if s.kind == "router"],
                             len(routersync.routers_for_host(spec, host_name)))
    return window, [s.unit for s in units]


def _deploy_say(who: str, text: str) -> None:
    print(f"pdkit: {who}: {text}", file=sys.stderr, flush=True)


def deploy_start(state, host, spec: ClusterSpec, window_s: float, units: list[str]) -> None:
    """python.call (pyinfra passes STATE and HOST): silence HOST for its restarts of UNITS."""
    # lazy: pdkit.monitoring's __init__ loads every generator (~70 ms; see _one_of)
    from pdkit.monitoring.common import alertmanager_urls

    # one Silencer for the whole deploy: an Alertmanager that does not answer is one warning, not one per host
    urls = tuple(alertmanager_urls(spec))
    if urls not in _deploy_silencers:
        _deploy_silencers[urls] = Silencer(list(urls), "pyinfra deploy", _deploy_say)
    silencer = _deploy_silencers[urls]
    silence = silencer.start(host.name, [host.name], host_matchers(spec, [host.name]), window_s,
                             f"restarting {', '.join(units)} on {host.name}")
    if silence is None:
        return
    _deploy_open[host.name] = (silencer, silence)
    if state not in _deploy_watched:
        _deploy_watched.add(state)
        state.add_callback_handler(_failure_watch())
    if not _deploy_exit_registered:
        _deploy_exit_registered.append(True)
        atexit.register(deploy_end_all, "the deploy ended before its gates passed: expired, so whatever is still wrong "
                        "pages")


def deploy_end(state, host) -> None:
    """python.call: HOST's restarts passed their gates: expire its silence."""
    opened = _deploy_open.pop(host.name, None)
    if opened is not None:
        opened[0].end(opened[1], "its restarts passed their gates")


def deploy_end_all(outcome: str) -> None:
    for name in list(_deploy_open):
        silencer, silence = _deploy_open.pop(name)
        silencer.end(silence, outcome)


def _failure_watch():
    # lazy: pyinfra's API loads gevent (~200 ms measured); only a deploy, already inside pyinfra, calls this
    from pyinfra.api.state import BaseStateCallback

    class FailureWatch(BaseStateCallback):
        """Expires a host's deploy silence at its first failed operation: pyinfra runs none of its
        later ones (the expiring one included)."""

        @staticmethod  # as pyinfra's BaseStateCallback declares it
        def operation_host_error(state: State, host: Host, op_hash: Any, retry_count: int = 0,
                                 max_retries: int = 0) -> None:
            opened = _deploy_open.pop(host.name, None)
            if opened is not None:
                opened[0].end(opened[1], "the deploy failed on it: expired, so whatever is still wrong pages")

    return FailureWatch()
