"""Service user, directories, and the Python venvs installed from the wheelhouse (no index access on nodes)."""

from __future__ import annotations

import shlex
from urllib.parse import urlsplit

from pyinfra.api import deploy
from pyinfra.operations import files, server

from pdkit.hosts import hoststate
from pdkit.hosts.deploy import current_host, current_plan, current_spec
from pdkit.hosts.hoststate import Bundled, host_state, installed, node_platform, path_matches
from pdkit.wheels import installshards, wheelhouse
from roles import transfer


@deploy("pdkit base: service user and directories")
def service_user_and_dirs() -> None:
    spec = current_spec()
    state = host_state()
    # one user per trust domain (docs/security.md): the engines', the router's
    for user in current_plan().users or (spec.cluster.service_user,):
        if not state.get("users", {}).get(user, state["user"]):
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


def _node_bundle() -> Bundled:
    return hoststate.node_venv_bundle(current_spec(), node_platform)


def _engine_bundle() -> Bundled | None:
    return hoststate.engine_venv_bundle(current_spec(), current_host(), node_platform)


def _router_bundle() -> Bundled | None:
    return hoststate.router_venv_bundle(current_spec(), current_host(), node_platform)


def _bundles() -> list[Bundled]:
    """Every venv this host gets, as (bundle, link): node, engine, router (pdkit.hosts.hoststate.collect_bundles)."""
    return hoststate.collect_bundles((_node_bundle, _engine_bundle, _router_bundle))


def changed_venv_links() -> set[str]:
    """The venv links this run points at a new venv (pdkit.hosts.hoststate.changed_venv_links)."""
    return hoststate.changed_venv_links(_bundles())


def _install_bundle(bundle: wheelhouse.Bundle, venv: str) -> None:
    """Install BUNDLE into a new venv beside the old one, then swap the VENV link atomically.

    Running services keep their old venv until they restart (no window where imports break),
    and the previous venvs stay on disk for a rollback. pip installs exactly the bundle's
    requirements file: every package pinned with its hash, no resolver, no index.
    """
    spec = current_spec()
    if installed(bundle, venv):
        return
    install = spec.cluster.install_dir
    real = f"{install}/venvs/{bundle.name}-{bundle.digest[:16]}"
    q = shlex.quote
    url = transfer.bundle_url(bundle, spec.cluster.wheelhouse_transfer)
    pip_tmp = f"{install}/wheelhouse/tmp"
    scratch = [pip_tmp]
    # pip unpacks in TMPDIR (/tmp may be a small tmpfs) and would keep a second copy in its cache
    pip = f"TMPDIR={q(pip_tmp)} {q(real)}/bin/pip install --quiet --disable-pip-version-check --no-cache-dir --no-index --no-deps --require-hashes --progress-bar off"
    size = f"{bundle.size / 1e6:.0f} MB"
    # a big bundle installs through several pip processes at once, each its own share of the wheels
    # (pdkit/wheels/installshards.py): one pip takes minutes of one core for an engine bundle
    shards = list(bundle.shard_files()) or ["requirements.txt"]
    if url:
        # the node fetches every file itself from this machine (pdkit/wheels/bundleserver.py); pip checks each hash
        # plain HTTP is trusted for transport only: pip still refuses any file whose hash differs
        fetch, links = [], f"--trusted-host {q(urlsplit(url).hostname or '')} --find-links {q(url)}"
        sources = [f"{links} -r {q(url + name)}" for name in shards]
        how = f"fetched over HTTP from this machine ({size})"
    else:
        wheels = f"{install}/wheelhouse"
        tarball, unpacked = f"{wheels}/{bundle.remote_name}", f"{wheels}/{bundle.name}"
        files.put(name=f"Upload {bundle.name} wheels over SFTP ({size})", src=str(bundle.tarball()), dest=tarball, mode="0644")
        # unpacked, then gone: an engine bundle is ~4 GB beside its ~11 GB venv
        fetch = [f"rm -rf {q(unpacked)} && mkdir -p {q(unpacked)} && tar -xf {q(tarball)} -C {q(unpacked)} && rm -f {q(tarball)}"]
        sources = [f"--find-links {q(unpacked)} -r {q(unpacked)}/{name}" for name in shards]
        how = f"from the uploaded wheels ({size})"
        scratch.append(unpacked)
    if len(sources) == 1:
        install_wheels, processes = f"{pip} {sources[0]}", ""
    else:
        # each pip sees only its share: the others' packages are not missing dependencies to warn about
        install_wheels, processes = installshards.all_at_once([f"{pip} --no-warn-conflicts {s}" for s in sources]), f", {len(sources)} pip processes"
    commands = [
        *fetch,
        f"rm -rf {q(real)} {q(pip_tmp)} && mkdir -p {q(install)}/venvs {q(pip_tmp)} && python3 -m venv {q(real)}",
        install_wheels,
        f"rm -rf {' '.join(q(p) for p in scratch)}",
        f"touch {q(real)}/.pdkit-bundle-{bundle.digest[:16]}",
        # atomic switch: rename a new link over the old one
        f"ln -sfn {q(real)} {q(venv)}.new && mv -T {q(venv)}.new {q(venv)}",
        # keep the three newest venvs of this kind (the live one among them) for rollbacks
        f"ls -1dt {q(install)}/venvs/{bundle.name}-* | tail -n +4 | xargs -r rm -rf",
    ]
    server.shell(
        name=f"Install {bundle.name} venv ({len(bundle.wheels)} wheels, offline, hash-checked{processes}) {how}; switch {venv} to it",
        commands=commands, _timeout=transfer.INSTALL_TIMEOUT_S,
    )


@deploy("pdkit base: venvs from the wheelhouse")
def venvs() -> None:
    # every host gets the node venv (pdkit: health gates everywhere, pdkit-exporter on GPU nodes);
    # a host running engine processes the engine environment, unless it provides its own; router
    # hosts the router venv
    for bundle, venv in _bundles():
        _install_bundle(bundle, venv)
