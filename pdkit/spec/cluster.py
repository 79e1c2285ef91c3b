"""The validated cluster: ClusterSpec, its hosts and the lookups the rest of pdkit reads it by
(engines, placements, merged tuning, router workers); and Problem / SpecError, what validation reports."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, TypeVar

from pdkit.spec.fields import Frozen
from pdkit.spec.models import Cluster, Engine, Model, Monitoring, Node, Router
from pdkit.spec.tuning import Tuning
from pdkit.upstream.versions import ROUTER_RELEASES, SGLANG_RELEASES

_T = TypeVar("_T")  # what a ClusterSpec lookup table holds

__all__ = [
    "ClusterSpec", "HostSpec", "Placement", "Problem", "SpecError",
]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the inventory, said so that the user can fix it without reading code."""

    host: str
    field: str
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        return f"{self.host}: {self.field}: {self.message}"


class SpecError(Exception):
    """The inventory has errors; `problems` lists every one of them."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class HostSpec(Frozen):
    name: str
    # the address pdkit and other hosts reach this host on
    address: str
    # pyinfra's ssh_port (None: the connector's default, 22; or not an SSH host)
    ssh_port: int | None = None
    groups: tuple[str, ...] = ()
    node: Node | None = None
    router: Router | None = None
    monitoring: Monitoring | None = None


@dataclass(frozen=True)
class Placement:
    """One engine process: ENGINE's rank RANK, running on HOST; HEAD declares it (rank 0)."""

    host: HostSpec
    engine: Engine
    rank: int
    head: HostSpec


class ClusterSpec(Frozen):
    """The whole validated cluster. Everything else in pdkit reads this."""

    cluster: Cluster
    hosts: tuple[HostSpec, ...]
    inventory: str = ""

    def _memo(self, name: str, source: object, build: Callable[[], _T]) -> _T:
        """A lookup table built once per spec from SOURCE (one of its fields), built again when
        that field is another object (model_copy(update=...) copies the instance's __dict__)."""
        hit: tuple[object, _T] | None = self.__dict__.get(name)
        if hit is None or hit[0] is not source:
            hit = (source, build())
            self.__dict__[name] = hit
        return hit[1]

    @property
    def _by_name(self) -> dict[str, HostSpec]:
        def build() -> dict[str, HostSpec]:
            # the first host of each name, as the search it replaces found it (loader names are unique)
            out: dict[str, HostSpec] = {}
            for h in self.hosts:
                out.setdefault(h.name, h)
            return out

        return self._memo("_by_name_memo", self.hosts, build)

    def host(self, name: str) -> HostSpec:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(name) from None

    def check_limit(self, names: Iterable[str]) -> None:
        """Refuse a `--limit` that names a host the inventory lacks (pdkit roll, pdkit bench)."""
        known = [h.name for h in self.hosts]
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise ValueError(f"--limit names unknown host(s) {unknown}; the inventory has {known}")

    @property
    def gpu_hosts(self) -> list[HostSpec]:
        return [h for h in self.hosts if h.node is not None]

    @property
    def router_hosts(self) -> list[HostSpec]:
        return [h for h in self.hosts if h.router is not None]

    @property
    def monitoring_hosts(self) -> list[HostSpec]:
        return [h for h in self.hosts if h.monitoring is not None]

    def engines(self) -> list[tuple[HostSpec, Engine]]:
        """Every engine with the host that declares it (rank 0 of an engine spanning nodes: the
        one router worker, health, bench and scrape target of the engine)."""
        return [(h, e) for h in self.gpu_hosts for e in h.node.engines]  # type: ignore[union-attr]

    @cached_property
    def _placements(self) -> dict[str, list[Placement]]:
        # one pass over the engines: a host's ranks are looked up, never searched for (512 nodes)
        out: dict[str, list[Placement]] = {h.name: [] for h in self.hosts}
        names = {h.name: h for h in self.hosts}
        for head, engine in self.engines():
            for rank, name in enumerate(engine.nodes or (head.name,)):
                node = names.get(name)
                if rank == 0:
                    out[head.name].append(Placement(head, engine, 0, head))
                elif node is not None and node.node is not None and name != head.name:
                    out[name].append(Placement(node, engine, rank, head))
        return out

    def placements(self, host: HostSpec) -> list[Placement]:
        """Every engine process HOST runs: its own engines (rank 0) first, then the ranks it
        serves of engines declared on other hosts."""
        return self._placements.get(host.name, [])

    def engine_hosts(self, host: HostSpec, engine: Engine) -> list[HostSpec]:
        """The hosts an engine declared on HOST runs on, in rank order ([host] if it spans none)."""
        if not engine.nodes:
            return [host]
        names = self._by_name
        return [names[n] for n in engine.nodes if n in names]

    def engine_tuning(self, engine: Engine) -> Tuning:
        """Cluster `all`, then the role's, then the engine's own settings."""
        # merged once per engine (~17 lookups per engine in validate + render; the spec and its
        # engines are frozen): keyed by identity, the engine kept so that its id cannot be reused
        merged_for: dict[int, tuple[Engine, Tuning]] = self._memo("_tuning_memo", self.cluster, dict)
        hit = merged_for.get(id(engine))
        if hit is not None and hit[0] is engine:
            return hit[1]
        tuning = self.cluster.tuning
        merged = tuning.all.merged(getattr(tuning, engine.role)).merged(engine.tuning)
        merged_for[id(engine)] = (engine, merged)
        return merged

    def engine_model(self, engine: Engine) -> Model:
        return engine.model or self.cluster.model

    def engine_version(self, engine: Engine) -> str:
        return engine.sglang_version or self.cluster.sglang_version

    def engine_address(self, host: HostSpec) -> str:
        assert host.node is not None
        return host.node.address or host.address

    def router_release(self, host: HostSpec) -> tuple[str, str]:
        router = host.router
        assert router is not None
        if router.package is not None and router.version is not None:
            return router.package, router.version
        default = SGLANG_RELEASES[self.cluster.sglang_version].default_router
        if router.package is not None and router.package != default[0]:
            # a package without a version: the one pinned release of that package
            return next(k for k in ROUTER_RELEASES if k[0] == router.package)
        return default

    def router_decode_policy(self, host: HostSpec) -> str:
        """The decode policy: explicit, else power_of_two when there are 2+ decode workers to pick from."""
        assert host.router is not None
        if host.router.decode_policy is not None:
            return host.router.decode_policy
        decodes = [e for _, e in self.router_workers(host) if e.role == "decode"]
        return "power_of_two" if len(decodes) >= 2 else "round_robin"

    def router_workers(self, host: HostSpec) -> list[tuple[HostSpec, Engine]]:
        router = host.router
        assert router is not None
        engines = self.engines()
        if router.workers is None:
            return engines
        wanted = set(router.workers)
        return [(h, e) for h, e in engines if f"{h.name}/{e.name}" in wanted]

    def is_pd(self) -> bool:
        return any(e.role != "unified" for _, e in self.engines())
