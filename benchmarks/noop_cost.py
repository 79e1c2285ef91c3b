"""The no-op re-run's cost per host (issue 20 item 6), measured without a lab.

    python benchmarks/noop_cost.py [--sizes 4,16,32] [--repeat 5] [--before REV[,REV...]] [--profile N]
    sudo python benchmarks/noop_cost.py --ssh [--sshd PATH] [--sizes 4,16,32] [--before REV[,REV...]]

Prepare (pure Python, no host contacted): deploy/pd.py run by pyinfra's own loader
(pyinfra_cli.util.load_deploy_file: one greenlet per host in this process, as `pyinfra INV
deploy/pd.py` runs it) against inventories/lab.py for N GPU hosts (benchmarks/scale.py
`lab_inventory_text`, the planned lab: N GPU hosts and lab-mon), every fact answered as a
converged host answers it (the plan's files, directories, units, packages, release and venvs in
place) and the wheelhouse's bundles stubbed (they are built once per run, not per host). Prints
the prepare time per host, the plans computed, the facts read (one per SSH round trip) and the
operations that would run (0: a no-op). With --before REV[,REV...] the same runs against each
REV's tree (`git archive`) first: a before/after table.

--ssh (root; an OpenSSH sshd: Debian's /usr/sbin/sshd, or the binary of the openssh-server .deb
unpacked with `dpkg -x`): a throwaway sshd on 127.0.0.1 (its own host key, client key and
known_hosts, run in a private mount namespace over a copy of /etc/passwd that has sshd's
privilege-separation user and gives root a home with Debian's default dot files, as a lab guest
has), and `pyinfra -y INV DEPLOY` against the same N-host lab inventory whose SSH goes to it (an
ssh_config maps the lab's addresses to 127.0.0.1), for the deploys of --deploys: `connect` (none:
connect, disconnect), `true` (one trivial fact per host: a round trip's own cost) and `facts`
(the facts deploy/pd.py reads, through the tree's own roles). Measured:
wall, the pyinfra process's CPU, and the CPU of what sshd ran for it (its reaped children:
sessions, shells, the probes). On the lab the guests run on the deploying machine's CPU too.
Not the lab: no systemd, D-Bus or PAM session in the guests, no idle lab load beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SIZES = (4, 16, 32)
# what a converged lab guest answers to the preflight's facts (gpu: none: OS, arch, kernel, marker)
OS_RELEASE = ['PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"', 'NAME="Debian GNU/Linux"', 'VERSION_ID="12"', "VERSION=\"12 (bookworm)\"",
              "VERSION_CODENAME=bookworm", "ID=debian"]
NODE_ANSWERS = {"os": OS_RELEASE, "arch": ["x86_64"], "kernel": ["6.1.0-lab"], "reboot_required": []}
# the argv a release records (roles/releases.py applied_by): the same for every tree measured
ARGV = ["pyinfra", "inventories/lab.py", "deploy/pd.py"]
# pdkit.hosts.deploy caches the spec by id(inventory): inventories are kept so that no id is reused
_KEEP: list = []


def _scale():
    """benchmarks/scale.py of this checkout (its inventories), sys.path left as it was (a worker imports the tree it measures)."""
    import importlib.util

    if "pdkit_bench_scale" in sys.modules:
        return sys.modules["pdkit_bench_scale"]
    path = list(sys.path)
    spec = importlib.util.spec_from_file_location("pdkit_bench_scale", REPO / "benchmarks" / "scale.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
    return module


# ---------------------------------------------------------------------------
# prepare: runs inside a worker process whose sys.path starts with the tree measured


def _node_lines(names) -> list[str]:
    from roles.node_facts import NODE_FACTS_MARK

    out: list[str] = []
    for name in names:
        out += [f"{NODE_FACTS_MARK}{name}", *NODE_ANSWERS[name]]
    return out


def _converged(spec, plan, kwargs: dict, bundle_digest: dict[str, str]) -> dict:
    """The host-state probe's answer on a host where PLAN is in place (roles/facts.py)."""
    from pdkit.render.plan import services_meta

    have: dict[str, list] = {f.path: ["file", f.mode, f.owner, f.group, f.sha256] for f in plan.files}
    have.update({d[0]: ["dir", d[1], d[2], d[3], None] for d in plan.directories})
    install = spec.cluster.install_dir
    for path in (install, f"{install}/wheelhouse"):
        have[path] = ["dir", "0755", "root", "root", None]
    users = kwargs["user"] if isinstance(kwargs["user"], list) else [kwargs["user"]]
    release = {"id": "1", "hash": plan.release_hash, "venvs": {}, "files": sorted(f.path for f in plan.files), "services": services_meta(plan.services)}
    return {
        "release": release, "packages": sorted(kwargs["packages"]), "python": "3.11", "glibc": "glibc 2.36", "arch": "x86_64",
        "paths": {p: have.get(p) for p in sorted(set(kwargs["paths"]) | set(release["files"]))},
        "units": {u: ["loaded", "active", "enabled"] for u in [*kwargs["units"], *sorted(release["services"])]},
        "user": True, "users": {u: True for u in users},
        "venvs": {v: [f".pdkit-bundle-{bundle_digest[name][:16]}"] for v, name in zip(kwargs["venvs"], ("node", "engine", "router"), strict=True)},
        # the preflight's facts the probe reads itself (roles/node_facts.py PROBE_TEXTS); an absent file is None
        "texts": {name: "".join(line + "\n" for line in NODE_ANSWERS[name]) or None for name, _kind, _source in kwargs.get("texts", ())},
    }


def _prepare_once(tree: Path, n: int, tmp: Path, profile: bool = False) -> dict:
    from pyinfra.api import Config, State
    from pyinfra.api.host import Host
    from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state
    from pyinfra_cli.inventory import make_inventory
    from pyinfra_cli.util import load_deploy_file

    import pdkit.hosts.deploy
    from pdkit.inventory.loader import load
    from pdkit.render.plan import plan_cluster
    from pdkit.wheels import wheelhouse
    from roles.node_facts import NodeFacts

    inv = tmp / f"lab{n}-{time.monotonic_ns()}.py"  # a new name each time: pyinfra caches files by path
    inv.write_text(_scale().lab_inventory_text(n, repo=tree))
    spec = load(str(inv))
    plans = plan_cluster(spec)
    digest = {name: name.ljust(64, "0") for name in ("node", "engine", "router")}
    bundle = {name: wheelhouse.Bundle(name=name, wheels=(), requirements="", digest=digest[name]) for name in digest}

    facts: dict[str, int] = {}

    def get_fact(self, cls, *args, **kwargs):
        facts[cls.__name__] = facts.get(cls.__name__, 0) + 1
        if cls.__name__ == "NodeFacts":
            return NodeFacts().process(_node_lines(kwargs["names"]))
        if cls.__name__ == "PdkitHostState":
            return _converged(spec, plans[self.name], kwargs, digest)
        if cls.__name__ == "WithHostState":
            assert kwargs["fact"] is NodeFacts, kwargs["fact"]
            return _node_lines(kwargs["kwargs"]["names"]), _converged(spec, plans[self.name], kwargs["state"], digest)
        raise AssertionError(f"a converged no-op run does not read {cls.__name__}")

    planned = [0]
    real_plan_host = pdkit.hosts.deploy.plan_host

    def counting_plan_host(*a, **k):
        planned[0] += 1
        return real_plan_host(*a, **k)

    patched = [(Host, "get_fact", get_fact), (pdkit.hosts.deploy, "plan_host", counting_plan_host),
               (wheelhouse, "node_bundle", lambda *a, **k: bundle["node"]), (wheelhouse, "engine_bundle", lambda *a, **k: bundle["engine"]),
               (wheelhouse, "router_bundle", lambda *a, **k: bundle["router"])]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patched]
    state = State()
    config = Config()
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
    try:
        for obj, name, value in patched:
            setattr(obj, name, value)
        with ctx_state.use(state), ctx_config.use(config):
            inventory = make_inventory(str(inv), cwd=str(tree))
            _KEEP.append(inventory)
            with ctx_inventory.use(inventory):
                state.init(inventory, config)
                hosts = list(inventory)
                for h in hosts:
                    h.connected = True  # what connect_all leaves; no command is run
                    state.activate_host(h)
                with contextlib.redirect_stderr(io.StringIO()):  # the preflight's reports
                    t0 = time.perf_counter()
                    if prof:
                        prof.enable()
                    load_deploy_file(state, "deploy/pd.py")
                    if prof:
                        prof.disable()
                    seconds = time.perf_counter() - t0
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
    would_run = 0
    ops = 0
    for h in hosts:
        for op_hash in state.get_op_order():
            if op_hash not in state.ops[h]:
                continue
            ops += 1
            conditions = state.get_op_data_for_host(h, op_hash).global_arguments.get("_if") or []
            with ctx_state.use(state), ctx_host.use(h):
                if all(c() for c in (conditions if isinstance(conditions, list) else [conditions])):
                    would_run += 1
    out = {"gpu_hosts": n, "hosts": len(hosts), "seconds": seconds, "plans": planned[0], "facts": facts, "ops": ops, "would_run": would_run}
    if prof:
        import pstats

        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
        out["profile"] = text.getvalue()
    return out


def prepare_worker(tree: Path, sizes: list[int], repeat: int, profile: int | None) -> None:
    import logging

    # the tree measured first; not this directory (its deploy.py, roll.py... are benchmarks)
    sys.path[:] = [str(tree), *(p for p in sys.path if Path(p or ".").resolve() not in (Path(__file__).resolve().parent, tree.resolve()))]

    logging.disable(logging.CRITICAL)
    sys.argv = list(ARGV)
    os.chdir(tree)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PDKIT_LAB_DIR"] = str(Path(tmp) / "no-lab")  # the planned lab, whatever runs here
        _prepare_once(tree, min(sizes), Path(tmp))  # imports and first-call caches, not timed
        for n in sizes:
            runs = [_prepare_once(tree, n, Path(tmp)) for _ in range(repeat)]
            row = dict(runs[0], seconds=statistics.median(r["seconds"] for r in runs))
            if profile == n:
                row["profile"] = _prepare_once(tree, n, Path(tmp), profile=True)["profile"]
            print(json.dumps(row), flush=True)


# ---------------------------------------------------------------------------
# the parent: trees, workers, tables


@contextlib.contextmanager
def tree_at(rev: str | None):
    """This checkout (None), or REV's tree unpacked into a temporary directory."""
    if rev is None:
        yield REPO
        return
    with tempfile.TemporaryDirectory(prefix="noop-cost-") as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp)


def _tree_env(tree: Path, lab_dir: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "PDKIT_LAB_DIR": str(lab_dir)}


def run_prepare(tree: Path, sizes: list[int], repeat: int, profile: int | None) -> list[dict]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", str(tree), "--sizes", ",".join(map(str, sizes)), "--repeat", str(repeat)]
    if profile:
        argv += ["--profile", str(profile)]
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(argv, cwd=tree, env=_tree_env(tree, Path(tmp) / "no-lab"), capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"prepare worker for {tree} failed:\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def prepare_table(results: dict[str, list[dict]]) -> str:
    lines = ["| tree | GPU hosts (hosts) | prepare | per host | plans computed | facts read per host | operations that would run |", "|---|---|---|---|---|---|---|"]
    for label, rows in results.items():
        for r in rows:
            per_host = sum(r["facts"].values()) / r["hosts"]
            lines.append(f"| {label} | {r['gpu_hosts']} ({r['hosts']}) | {r['seconds'] * 1000:.0f} ms | {r['seconds'] * 1000 / r['hosts']:.1f} ms | "
                         f"{r['plans']} | {per_host:.2f} ({', '.join(f'{k} {v}' for k, v in sorted(r['facts'].items()))}) | {r['would_run']} of {r['ops']} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# --ssh

FACTS_DEPLOY = '''"""The facts deploy/pd.py reads on a no-op run, in its order, through the tree's own roles (benchmarks/noop_cost.py)."""
from pdkit.hosts.deploy import current_host, current_spec, tune_connection
from roles import preflight
from roles.facts import host_state

current_spec()
tune_connection()
# where the tree has it: the preflight's facts and the host state in one round trip
getattr(preflight, "read_facts_and_host_state", lambda: None)()
if current_host().node is not None:
    preflight.node_facts()
host_state()
'''

ONE_COMMAND_DEPLOY = '''"""One trivial fact per host: what an SSH round trip itself costs (a session, the login shell, sh)."""
from pyinfra import host
from pyinfra.facts.server import Command

from pdkit.hosts.deploy import tune_connection

tune_connection()
host.get_fact(Command, command="true")
'''

DEPLOYS = {"connect": '"""Nothing: pyinfra connects to every host and disconnects."""\n', "true": ONE_COMMAND_DEPLOY, "facts": FACTS_DEPLOY}


class Sshd:
    """A throwaway sshd on 127.0.0.1:PORT, with its own keys, in a private mount namespace."""

    def __init__(self, binary: str, work: Path, port: int):
        self.binary, self.work, self.port = binary, work, port
        self.pid: int | None = None
        self.made_privsep_dir = False

    def start(self) -> None:
        w = self.work
        for key in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"noop-cost-{key}", "-f", str(w / key)], check=True)
        (w / "authorized_keys").write_text((w / "client_key.pub").read_text())
        (w / "known_hosts").write_text(f"[127.0.0.1]:{self.port} " + " ".join((w / "host_key.pub").read_text().split()[:2]) + "\n")
        home = w / "home"
        home.mkdir()
        for name in ("dot.bashrc", "dot.profile"):  # Debian's defaults: no pyenv shims or the like from this machine's root
            src = Path("/usr/share/base-files") / name
            if src.exists():
                shutil.copy(src, home / name.replace("dot", ""))
        passwd = []
        for line in Path("/etc/passwd").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == "root":
                fields[5] = str(home)
            passwd.append(":".join(fields))
        if not any(line.startswith("sshd:") for line in passwd):
            passwd.append("sshd:x:65533:65534:sshd privilege separation:/run/sshd:/usr/sbin/nologin")
        (w / "passwd").write_text("\n".join(passwd) + "\n")
        sftp = next((p for p in ("/usr/lib/openssh/sftp-server", str(Path(self.binary).parent.parent / "lib/openssh/sftp-server")) if Path(p).exists()), "internal-sftp")
        (w / "sshd_config").write_text("\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {w / 'host_key'}", f"PidFile {w / 'sshd.pid'}",
            f"AuthorizedKeysFile {w / 'authorized_keys'}", "PermitRootLogin prohibit-password", "PubkeyAuthentication yes",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "UseDNS no", "StrictModes no",
            "MaxStartups 200", "MaxSessions 50", f"Subsystem sftp {sftp}", "",
        ]))
        if not Path("/run/sshd").exists():
            Path("/run/sshd").mkdir(mode=0o755)
            self.made_privsep_dir = True
        script = f"mount --bind {w / 'passwd'} /etc/passwd && exec {self.binary} -f {w / 'sshd_config'} -E {w / 'sshd.log'}"
        subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], check=True)
        for _ in range(50):
            if (w / "sshd.pid").exists():
                self.pid = int((w / "sshd.pid").read_text())
                return
            time.sleep(0.1)
        raise SystemExit(f"sshd did not start: {(w / 'sshd.log').read_text() if (w / 'sshd.log').exists() else 'no log'}")

    def cpu(self) -> float:
        """CPU seconds of sshd and every child it has reaped (sessions, shells, the commands they ran)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.pid:
            os.kill(self.pid, signal.SIGTERM)
        if self.made_privsep_dir:
            with contextlib.suppress(OSError):
                Path("/run/sshd").rmdir()


def ssh_inventory_text(lab_inventory: Path, sshd: Sshd) -> str:
    w = sshd.work
    return "\n".join([
        '"""The lab inventory with every host\'s SSH going to the local sshd (benchmarks/noop_cost.py)."""',
        "import runpy",
        f"_base = runpy.run_path({str(lab_inventory)!r})",
        f"_ssh = {{'ssh_port': {sshd.port}, 'ssh_config_file': {str(w / 'ssh_config')!r}, 'ssh_key': {str(w / 'client_key')!r},",
        f"        'ssh_known_hosts_file': {str(w / 'known_hosts')!r}, 'ssh_strict_host_key_checking': 'yes'}}",
        "gpu_nodes = [(h, {**d, **_ssh}) for h, d in _base['gpu_nodes']]",
        "monitoring = [(h, {**d, **_ssh}) for h, d in _base['monitoring']]",
        "all = _base['all']  # noqa: A001 - pyinfra's group name",
        "",
    ])


def _pyinfra() -> str:
    local = Path(sys.executable).parent / "pyinfra"
    return str(local) if local.exists() else "pyinfra"


def run_ssh(label: str, tree: Path, sizes: list[int], repeat: int, sshd: Sshd, tmp: Path, names: list[str]) -> list[dict]:
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))
    from pdkit.lab import planned_lab

    rows = []
    deploys = {}
    for name in names:
        deploys[name] = tmp / f"{name}_deploy.py"
        deploys[name].write_text(DEPLOYS[name])
    for n in sizes:
        addresses = sorted({h.address for h in planned_lab(n).hosts})
        (sshd.work / "ssh_config").write_text(f"Host {' '.join(addresses)}\n  HostName 127.0.0.1\n  Port {sshd.port}\n")
        lab_inv = tmp / f"lab{n}.py"
        lab_inv.write_text(_scale().lab_inventory_text(n, repo=tree))
        inv = tmp / f"ssh{n}.py"
        inv.write_text(ssh_inventory_text(lab_inv, sshd))
        for name, deploy in deploys.items():
            runs = []
            for _ in range(repeat):
                s0, r0, t0 = sshd.cpu(), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
                done = subprocess.run([_pyinfra(), "-y", str(inv), str(deploy)], cwd=tree, env=_tree_env(tree, tmp / "no-lab"),
                                      capture_output=True, text=True, timeout=600)
                wall = time.perf_counter() - t0
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                time.sleep(0.3)  # sshd reaps its last sessions
                if done.returncode != 0:
                    raise SystemExit(f"pyinfra failed at {n} hosts ({name}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
                runs.append({"wall": wall, "client_cpu": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), "sshd_cpu": sshd.cpu() - s0})
            row = {"gpu_hosts": n, "hosts": len(addresses), "deploy": name, **{k: statistics.median(r[k] for r in runs) for k in runs[0]}}
            rows.append(row)
            print(f"  {label}: {n} GPU hosts, {name}: {row['wall']:.2f} s", file=sys.stderr, flush=True)
    return rows


def ssh_table(results: dict[str, list[dict]]) -> str:
    """One row per tree, size and deploy; the CPU each host beyond the smallest size adds (pyinfra's start-up is paid once)."""
    lines = ["| tree | GPU hosts (hosts) | deploy | wall | pyinfra CPU | sshd side CPU | CPU per added host: pyinfra + sshd side |", "|---|---|---|---|---|---|---|"]
    for label, rows in results.items():
        first: dict[str, dict] = {}
        for r in rows:
            base = first.setdefault(r["deploy"], r)
            added = r["hosts"] - base["hosts"]
            per = (f"{(r['client_cpu'] - base['client_cpu']) * 1000 / added:.1f} + {(r['sshd_cpu'] - base['sshd_cpu']) * 1000 / added:.1f} ms"
                   if added else "-")
            lines.append(f"| {label} | {r['gpu_hosts']} ({r['hosts']}) | {r['deploy']} | {r['wall']:.2f} s | {r['client_cpu']:.2f} s | {r['sshd_cpu']:.2f} s | {per} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="GPU host counts (default 4,16,32)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per size; the median is shown (default 5; --ssh: 3)")
    parser.add_argument("--before", metavar="REV[,REV...]", help="also measure these revisions' trees (git archive), first")
    parser.add_argument("--profile", type=int, metavar="N", help="print cProfile's top functions of the prepare at N GPU hosts (this tree)")
    parser.add_argument("--ssh", action="store_true", help="also the connection and fact cost against a local sshd (root)")
    parser.add_argument("--sshd", default="/usr/sbin/sshd", help="the sshd binary (default /usr/sbin/sshd)")
    parser.add_argument("--port", type=int, default=2222)
    parser.add_argument("--deploys", default="connect,facts", help=f"--ssh: which of {', '.join(DEPLOYS)} (default connect,facts)")
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.worker:
        prepare_worker(args.worker, sizes, args.repeat, args.profile)
        return 0
    revs = args.before.split(",") if args.before else []
    trees = [*((rev, rev) for rev in revs), ("this tree", None)]
    prepared: dict[str, list[dict]] = {}
    for label, rev in trees:
        with tree_at(rev) as tree:
            prepared[label] = run_prepare(tree, sizes, args.repeat, args.profile if rev is None else None)
    print("Prepare of deploy/pd.py, every fact answered as a converged host (no host contacted); median of", args.repeat)
    print(prepare_table(prepared))
    for label, rows in prepared.items():
        for r in rows:
            if "profile" in r:
                print(f"\n{label}, {r['gpu_hosts']} GPU hosts:\n{r['profile']}")
    out: dict[str, object] = {"prepare": prepared}
    if args.ssh:
        if os.geteuid() != 0:
            raise SystemExit("--ssh runs sshd in a private mount namespace: run as root")
        if not Path(args.sshd).exists():
            raise SystemExit(f"no sshd at {args.sshd}: install openssh-server, or unpack its .deb (dpkg -x) and give --sshd")
        repeat = min(args.repeat, 3)
        ssh_rows: dict[str, list[dict]] = {}
        with tempfile.TemporaryDirectory(prefix="noop-cost-ssh-") as tmp:
            sshd = Sshd(args.sshd, Path(tmp), args.port)
            sshd.start()
            try:
                for label, rev in trees:
                    with tree_at(rev) as tree:
                        ssh_rows[label] = run_ssh(label, tree, sizes, repeat, sshd, Path(tmp), args.deploys.split(","))
            finally:
                sshd.stop()
        print(f"\npyinfra -y against the lab inventory, every host's SSH to one local sshd; median of {repeat}")
        print(ssh_table(ssh_rows))
        out["ssh"] = ssh_rows
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
