"""Service user, directories, and the Python venvs installed from the wheelhouse (no index access on nodes)."""

from __future__ import annotations

import shlex

from pyinfra.api import deploy
from pyinfra.operations import files, server

from pdkit import flags, wheelhouse
from pdkit.deploy import current_host, current_plan, current_spec
from roles.facts import host_state, path_matches


def node_python() -> str:
    """The host's python3 as MAJOR.MINOR (the wheelhouse is built for it)."""
    return host_state()["python"]


@deploy("pdkit base: service user and directories")
def service_user_and_dirs() -> None:
    spec = current_spec()
    state = host_state()
    user = spec.cluster.service_user
    if not state["user"]:
        server.group(name=f"Group {user}", group=user, system=True)
        server.user(
            name=f"User {user} (unprivileged, no login)",
            user=user, group=user, system=True, home=f"/var/lib/{user}", shell="/usr/sbin/nologin",
            ensure_home=False,
        )
    install = spec.cluster.install_dir
    wanted = [*current_plan().directories, (install, "0755", "root", "root"), (f"{install}/wheelhouse", "0755", "root", "root")]
    for path, mode, owner, group in wanted:
        if not path_matches(state, path, "dir", mode, owner, group):
            files.directory(name=f"Directory {path}", path=path, mode=mode, user=owner, group=group)


def _node_bundle() -> tuple[wheelhouse.Bundle, str]:
    spec = current_spec()
    return wheelhouse.node_bundle(node_python(), spec.cluster.engine, spec.cluster.sglang_version), flags.venv_dir(spec)


def _installed(bundle: wheelhouse.Bundle, venv: str) -> bool:
    # the marker sits inside the real venv, seen through the VENV link: present only when the
    # link points at a complete venv of exactly this bundle (it is written last)
    return f".pdkit-bundle-{bundle.digest[:16]}" in host_state()["venvs"].get(venv, [])


def node_venv_will_change() -> bool:
    """True when this run installs a new node venv: the engines must then restart onto it."""
    return not _installed(*_node_bundle())


def _install_bundle(bundle: wheelhouse.Bundle, venv: str, *, with_pdkit: bool) -> None:
    """Install BUNDLE into a new venv beside the old one, then swap the VENV link atomically.

    Running services keep their old venv until they restart (no window where imports break),
    and the previous venvs stay on disk for a rollback.
    """
    spec = current_spec()
    if _installed(bundle, venv):
        return
    wheels = f"{spec.cluster.install_dir}/wheelhouse"
    real = f"{spec.cluster.install_dir}/venvs/{bundle.name}-{bundle.digest[:16]}"
    tarball = f"{wheels}/{bundle.remote_name}"
    unpacked = f"{wheels}/{bundle.name}"
    files.put(name=f"Upload {bundle.name} wheels ({bundle.tarball.stat().st_size // 1_000_000} MB)", src=str(bundle.tarball), dest=tarball, mode="0644")
    q = shlex.quote
    pip = f"{q(real)}/bin/pip install --quiet --disable-pip-version-check --no-index"
    commands = [
        f"rm -rf {q(unpacked)} && mkdir -p {q(unpacked)} && tar -xf {q(tarball)} -C {q(unpacked)}",
        f"rm -rf {q(real)} && mkdir -p {q(spec.cluster.install_dir)}/venvs && python3 -m venv {q(real)}",
        f"{pip} --find-links {q(unpacked)} -r {q(unpacked)}/requirements.txt",
    ]
    if with_pdkit:
        commands.append(f"{pip} --no-deps {q(unpacked)}/pdkit-*.whl")
    commands += [
        f"touch {q(real)}/.pdkit-bundle-{bundle.digest[:16]}",
        # atomic switch: rename a new link over the old one
        f"ln -sfn {q(real)} {q(venv)}.new && mv -T {q(venv)}.new {q(venv)}",
        # keep the three newest venvs of this kind (the live one among them) for rollbacks
        f"ls -1dt {q(spec.cluster.install_dir)}/venvs/{bundle.name}-* | tail -n +4 | xargs -r rm -rf",
    ]
    server.shell(name=f"Install {bundle.name} venv from the wheelhouse (offline) and switch {venv} to it", commands=commands)


@deploy("pdkit base: venvs from the wheelhouse")
def venvs() -> None:
    spec = current_spec()
    this = current_host()
    # every host gets the node venv: the engine (sim or sglang) on GPU nodes, the health gates everywhere
    _install_bundle(*_node_bundle(), with_pdkit=True)
    if this.router is not None:
        package, version = spec.router_release(this)
        _install_bundle(wheelhouse.router_bundle(node_python(), package, version), flags.router_venv_dir(spec), with_pdkit=False)
