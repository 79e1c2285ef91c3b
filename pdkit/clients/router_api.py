"""Client for the router's worker API (smg 1.13.0), stdlib only.

What smg 1.13.0 really does (checked against the binary on loopback, see docs/rolling.md):

- GET /workers -> {"workers": [{"id", "url", "worker_type": "prefill"|"decode"|"regular",
  "bootstrap_port", "is_healthy", "status": "ready"|"draining"|...}], "total", "stats"}.
  sglang-router 0.3.2 (the router pdkit pairs with SGLang 0.5.17) answers the same without
  "status", and DELETE takes the worker off the list at once (no draining entry).
- DELETE /workers/{id} -> 202 "removal queued": the worker turns `draining` at once
  (is_healthy false, no new requests are routed to it; requests already on it finish), and
  disappears from the list after the router's drain settle time (~5 s by default).
- POST /workers {"url", "worker_type", "bootstrap_port"} -> 202 "addition queued"; while the
  old entry is still draining it answers 409 WORKER_ALREADY_EXISTS, so a re-add waits until
  the removal finished. A re-added worker is healthy and routable within about a second.
- The settle time is per worker: PUT /workers/{id} (and POST /workers) take
  {"health": {"drain_settle_secs": N}}, queued like every change; GET /workers/{id} shows
  `"health": {"drain_settle_secs": N}` once it applies. A DELETE sent before that still settles
  for the old time, so `remove` waits for the update to show first.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from dataclasses import dataclass

from pdkit.agent.health import bearer_headers, http_request, worker_key

# what smg and sglang-router call an engine that is neither a prefill nor a decode (a unified
# engine): their worker API answers 400 to "unified" (smg 1.13.0)
REGULAR = "regular"


def worker_type(role: str) -> str:
    """The router's worker type for an engine of ROLE: the one rule for the deploy, routersync and roll.

    >>> worker_type("prefill"), worker_type("unified")
    ('prefill', 'regular')
    """
    return role if role in ("prefill", "decode") else REGULAR


class RouterError(RuntimeError):
    """The router answered something unexpected (or nothing)."""


class RouterKeyError(RouterError):
    """The router refused every API key this client has (401): missing or wrong. The message
    names the router, which keys were tried (by where they came from, never their value) and
    what to run."""


@dataclass(frozen=True)
class Key:
    """One API key a client may try: its value (None: no key) and where it came from, for
    messages (the value is never printed)."""

    value: str | None
    source: str

    @property
    def label(self) -> str:
        return self.source if self.value is not None or self.source.startswith("no key") else f"no key ({self.source})"


def key_order(*candidates: Key) -> list[Key]:
    """Pure: CANDIDATES in order, each value once (the first source that named it wins).

    >>> [k.source for k in key_order(Key("a", "running"), Key("a", "inventory"), Key(None, "none"))]
    ['running', 'none']
    """
    seen: set[str | None] = set()
    out = []
    for key in candidates:
        if key.value in seen:
            continue
        seen.add(key.value)
        out.append(key)
    return out


def key_refused_message(base_url: str, body: str, tried: list[Key], fix: str = "") -> str:
    """Pure: what a router that refused every key (401) means, in one message: a key missing or
    wrong, the router's own words (smg 1.13.0: "Missing API key: ..." to a request without one,
    "Invalid API key" to a wrong one), which keys were tried (where they came from, never their
    value) and FIX, what to run."""
    said = body.strip()
    try:
        said = json.loads(said).get("error", {}).get("message", said)
    except (ValueError, AttributeError):
        pass
    what = ("requires an API key and pdkit has none for it" if not any(k.value for k in tried)
            else "refuses every API key pdkit has for it: it runs with another key")
    tried_s = ", ".join(k.label for k in tried) or "none"
    return f"router {base_url} {what} (it answered 401: {said[:120]}; tried: {tried_s})" + (f". {fix}" if fix else "")


@dataclass(frozen=True)
class Worker:
    id: str
    url: str
    worker_type: str
    bootstrap_port: int | None
    healthy: bool
    # smg 1.13.0: "ready", "draining", ...; sglang-router 0.3.2 lists no status ("") and drops a
    # removed worker from the list at once
    status: str

    @property
    def routable(self) -> bool:
        """The router may send this worker new requests: healthy and not draining."""
        return self.healthy and self.status in ("ready", "")


def parse_workers(body: str) -> list[Worker]:
    """Workers from GET /workers (smg: {"workers": [...]}; a bare list is accepted too)."""
    data = json.loads(body)
    items = data.get("workers", []) if isinstance(data, dict) else data
    out = []
    for w in items or []:
        if not isinstance(w, dict) or "url" not in w:
            continue
        out.append(
            Worker(
                id=str(w.get("id", "")),
                url=worker_key(str(w["url"])),
                worker_type=str(w.get("worker_type", REGULAR)),
                bootstrap_port=w.get("bootstrap_port"),
                healthy=bool(w.get("is_healthy", False)),
                status=str(w.get("status", "")),
            )
        )
    return out


class RouterClient:
    """The worker API of one router: list, remove (drain), add, wait.

    DRAIN_SETTLE_S: the settle time to give each worker it removes or adds, for routers that
    take one per worker (pdkit.upstream.versions.RouterRelease.per_worker_drain_settle); None leaves the
    router's own (smg: 5 s, during which the worker cannot be added back).
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 10.0,
                 drain_settle_s: int | None = None,
                 keys: list[Key] | None = None, key_fix: str = "") -> None:
        self.base_url = base_url.rstrip("/")
        # the keys to try, in order (a roll across a key change: the key the running router was
        # started with, then the inventory's, then none); the one the router last accepted is used
        # until it answers 401, then the others are tried (the router restarted on another key)
        self.keys = key_order(*keys) if keys else [Key(api_key, "the given key")]
        self.key = self.keys[0]
        # what to run when every key is refused (RouterKeyError's message)
        self.key_fix = key_fix
        self.timeout = timeout
        self.drain_settle_s = drain_settle_s

    @property
    def headers(self) -> dict[str, str]:
        return bearer_headers(self.key.value)

    def _call(self, method: str, path: str, payload: dict | None = None,
              timeout: float | None = None) -> tuple[int, str]:
        """One request with the key the router last accepted; on a 401 the other keys, in order,
        and the first one it accepts is kept. Every key refused: RouterKeyError."""
        url = f"{self.base_url}{path}"
        timeout = self.timeout if timeout is None else timeout
        status, body = http_request(url, payload, timeout=timeout, headers=self.headers, method=method)
        if status != 401:
            return status, body
        for key in [k for k in self.keys if k is not self.key]:
            headers = bearer_headers(key.value)
            status2, body2 = http_request(url, payload, timeout=timeout, headers=headers, method=method)
            if status2 != 401:
                self.key = key
                return status2, body2
        raise RouterKeyError(key_refused_message(self.base_url, body, self.keys, self.key_fix))

    def workers(self) -> list[Worker]:
        status, body = self._call("GET", "/workers")
        if status != 200:
            raise RouterError(f"GET {self.base_url}/workers answered {status or 'nothing'}: {body.strip()[:200]}")
        try:
            return parse_workers(body)
        except ValueError as exc:
            raise RouterError(f"GET {self.base_url}/workers answered something unreadable: {exc}") from exc

    def find(self, url: str) -> Worker | None:
        url = worker_key(url)
        return next((w for w in self.workers() if w.url == url), None)

    def detail(self, worker_id: str) -> dict:
        """GET /workers/{id}: the worker's whole record ({} when it is gone)."""
        status, body = self._call("GET", f"/workers/{urllib.parse.quote(worker_id, safe='')}")
        if status == 404:
            return {}
        if status != 200:
            raise RouterError(f"GET {self.base_url}/workers/{worker_id} answered {status or 'nothing'}: "
                              f"{body.strip()[:200]}")
        try:
            return json.loads(body)
        except ValueError as exc:
            raise RouterError(f"GET {self.base_url}/workers/{worker_id} answered something unreadable: {exc}") from exc

    def set_drain_settle(self, worker: Worker, *, timeout: float = 10.0, settle_s: int | None = None) -> bool:
        """Give WORKER this client's settle time (or SETTLE_S) and wait until the router shows it; False
        when it did not take (the removal then settles for the router's own time: slower, not wrong)."""
        if self.drain_settle_s is None:
            return False
        settle = self.drain_settle_s if settle_s is None else settle_s

        def shown() -> bool:
            return self.detail(worker.id).get("health", {}).get("drain_settle_secs") == settle

        if shown():
            return True
        payload: dict = {"url": worker.url, "worker_type": worker.worker_type, "health": {"drain_settle_secs": settle}}
        if worker.bootstrap_port is not None:
            payload["bootstrap_port"] = worker.bootstrap_port
        status, _ = self._call("PUT", f"/workers/{urllib.parse.quote(worker.id, safe='')}", payload)
        if status not in (200, 202):
            return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if shown():
                return True
            time.sleep(0.05)
        return False

    def remove(self, url: str, *, timeout: float = 30.0, settle_s: int | None = None) -> Worker | None:
        """Take the worker at URL out of routing (no new requests; those on it finish) and wait
        until the router lists it draining or gone; None when it was not registered. SETTLE_S: how
        long the router keeps it listed `draining` (routers that take it per worker; default this
        client's)."""
        worker = self.find(url)
        if worker is None:
            return None
        if worker.status == "ready":
            self.set_drain_settle(worker, settle_s=settle_s)
        status, body = self._call("DELETE", f"/workers/{urllib.parse.quote(worker.id, safe='')}")
        if status not in (200, 202, 204, 404):
            raise RouterError(f"DELETE {self.base_url}/workers/{worker.id} ({url}) answered {status or 'nothing'}: "
                              f"{body.strip()[:200]}")
        # the removal is queued: until it shows, the router may still pick this worker
        deadline = time.monotonic() + timeout
        while (listed := self.find(url)) is not None and listed.routable:
            if time.monotonic() > deadline:
                raise RouterError(f"{url} is still listed ready by {self.base_url} {timeout:.0f} s after its removal "
                                  "was accepted")
            time.sleep(0.05)
        return worker

    def add(self, url: str, worker_type: str, bootstrap_port: int | None = None, *, timeout: float = 60.0) -> None:
        """Register URL again, waiting out a removal that is still draining (smg answers 409 then)."""
        payload: dict = {"url": worker_key(url), "worker_type": worker_type}
        if bootstrap_port is not None:
            payload["bootstrap_port"] = bootstrap_port
        if self.drain_settle_s is not None:
            payload["health"] = {"drain_settle_secs": self.drain_settle_s}
        deadline = time.monotonic() + timeout
        while True:
            existing = self.find(url)
            if existing is not None and existing.status != "draining":
                return  # already registered (e.g. a restarted router read it from its argv)
            if existing is None:
                status, body = self._call("POST", "/workers", payload)
                if status in (200, 201, 202):
                    return
                if status != 409:
                    raise RouterError(f"POST {self.base_url}/workers ({url}) answered {status or 'nothing'}: "
                                      f"{body.strip()[:200]}")
            if time.monotonic() > deadline:
                raise RouterError(f"{url} is still being removed from {self.base_url} after {timeout:.0f} s; cannot "
                                  "add it back")
            # short: a downtime roll's held worker (pdkit.roll) is added back the moment it is gone
            time.sleep(0.05)

    def wait_gone(self, urls: list[str], *, timeout: float = 60.0) -> None:
        """Until no URL is listed any more (a removed worker stays listed, draining, for the
        router's settle time: a caller that reports the list as final waits that out)."""
        unwanted = {worker_key(u) for u in urls}
        deadline = time.monotonic() + timeout
        while unwanted:
            still = sorted(unwanted & {w.url for w in self.workers()})
            if not still:
                return
            if time.monotonic() > deadline:
                raise RouterError(f"router {self.base_url}: {still} still listed {timeout:.0f} s after their removal "
                                  "was accepted")
            time.sleep(0.1)

    def wait_healthy(self, urls: list[str], *, timeout: float = 60.0) -> None:
        """Until every URL is listed ready and healthy."""
        wanted = {worker_key(u) for u in urls}
        deadline = time.monotonic() + timeout
        while True:
            listed = {w.url: w for w in self.workers()}
            missing = sorted(u for u in wanted if u not in listed)
            unhealthy = sorted(u for u in wanted if u in listed and not listed[u].routable)
            if not missing and not unhealthy:
                return
            if time.monotonic() > deadline:
                raise RouterError(f"router {self.base_url}: after {timeout:.0f} s workers missing {missing}, unhealthy "
                                  f"{unhealthy}")
            time.sleep(0.05)

    def completion(self, model: str, prompt: str, max_tokens: int = 4, timeout: float = 60.0) -> tuple[int, str]:
        """One non-streaming completion through the router: (status, body)."""
        return self._call("POST", "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens},
                          timeout=timeout)
