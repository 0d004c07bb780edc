"""An `npx` or `uvx` upstream's package, installed when the upstream is registered and run from its own folder,
offline.

`npx -y some-server@1.2` (or `uvx some-server`) would fetch whatever the registry says at each start, inside a
sandbox that has no network. Instead the package is installed once, outside the sandbox, by its manager (npm with
its scripts off, `npm.py`; uv into a virtual environment, `uv.py`), into GATEWAY_PACKAGES_DIR/<upstream>/<digest>,
where <digest> is the SHA-256 of the lock the manager wrote (every package's version and hash). The upstream keeps
that pin (name, version, integrity, digest, and the lock itself, so another executor host installs exactly it), and
its server runs from the folder. A later install that gives another digest (a new version, or the same version with
other contents) is held for an operator's approval, as a changed tool definition is; until then the pinned one
runs (registry/package_pins.py)."""

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings

from registry.upstreams.packages import npm, uv
from registry.upstreams.packages.common import Asked, PackageProblem, file_digest

__all__ = ["Asked", "PackageProblem", "asked", "command", "install", "installed"]
MANAGERS = {"npx": npm, "uvx": uv}
BY_NAME = {"npm": npm, "uv": uv}


def asked(command: str, args: list[str]) -> Asked | None:
    """The package an `npx` or `uvx` command line runs, or None for any other command."""
    manager = MANAGERS.get(os.path.basename(command))
    return manager.asked(list(args)) if manager else None


def _home(slug: str) -> Path:
    home = Path(settings.GATEWAY_PACKAGES_DIR) / slug
    home.mkdir(parents=True, exist_ok=True)
    return home


def install(slug: str, wanted: Asked) -> dict[str, Any]:
    """Installs what a command line asks for into a folder of the upstream's own; its pin."""
    manager = BY_NAME[wanted.manager]
    home = _home(slug)
    staging = Path(tempfile.mkdtemp(prefix="installing-", dir=home))
    try:
        folder = home / file_digest(manager.lock(staging, wanted))[:16]
        if not folder.exists():  # else the same lock is installed there already
            manager.place(staging, folder)
        pinned = manager.pin(folder, wanted)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"manager": wanted.manager, "spec": wanted.spec, **pinned, "digest": file_digest(folder / manager.LOCK)}


def installed(slug: str, pinned: dict[str, Any]) -> Path:
    """The pinned package's folder, installed from its lock where this host lacks it (the manager checks every
    package's hash), and refused where its lock is not the pinned one."""
    manager = BY_NAME[pinned["manager"]]
    folder = _home(slug) / pinned["digest"][:16]
    if not folder.exists():
        try:
            manager.restore(folder, pinned)
        except FileExistsError:  # made meanwhile: another process of this host is installing it
            raise PackageProblem(f"the package {pinned['name']} is being installed in {folder}: try again") from None
    if file_digest(folder / manager.LOCK) != pinned["digest"]:
        raise PackageProblem(f"the package {pinned['name']} in {folder} is not the approved one (its lock changed)")
    return folder


def command(slug: str, pinned: dict[str, Any], wanted: Asked) -> tuple[str, list[str]]:
    """The command line that runs the pinned package's server with the arguments the upstream gives it."""
    return BY_NAME[pinned["manager"]].command(installed(slug, pinned), pinned, wanted.args)
