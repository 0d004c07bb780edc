"""An `npx` upstream's package, installed when the upstream is registered and run from its own folder, offline.

`npx -y some-server@1.2 --flag` would fetch whatever the registry says at each start, inside a sandbox that has no
network. Instead the package is installed once, outside the sandbox, with npm (its scripts not run), into
GATEWAY_PACKAGES_DIR/<upstream>/<digest>, where <digest> is the SHA-256 of the package-lock.json npm wrote (every
package's version and integrity hash). The upstream keeps that pin (name, version, integrity, digest, and the lock
itself, so another executor host installs exactly it with `npm ci`), and its server runs as `node <its bin>` from
the folder. A later install that gives another digest (a new version, or the same version with other contents) is
held for an operator's approval, as a changed tool definition is; until then the pinned one runs."""

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

TIMEOUT = 300.0  # for one npm install
NPX_FLAGS = ("-y", "--yes", "-q", "--quiet")
LOCK = "package-lock.json"


class PackageProblem(Exception):
    """A package that cannot be installed or run as pinned, in the operator's words."""


@dataclass(frozen=True)
class Asked:
    """What an `npx` command line asks for: a package (a name with an optional version or range, or a tarball),
    the bin to run when it names one, and the server's own arguments."""

    spec: str
    bin: str
    args: list[str]


def asked(command: str, args: list[str]) -> Asked | None:
    """The package an `npx` command line runs, or None for any other command."""
    if os.path.basename(command) != "npx":
        return None
    rest, spec, bin_name = list(args), "", ""
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0)
        if flag in NPX_FLAGS:
            continue
        if flag in ("-p", "--package") and rest:
            spec = rest.pop(0)
        elif flag.startswith("--package="):
            spec = flag.removeprefix("--package=")
        elif flag == "--":
            break
        else:
            raise PackageProblem(f"npx option {flag!r} is not understood: give the package first (npx -y <package>)")
    if not rest and not spec:
        raise PackageProblem("npx names no package")
    if spec:
        bin_name = rest.pop(0) if rest else ""
    else:
        spec = rest.pop(0)
    return Asked(spec, bin_name, rest)


def _npm(*args: str, cwd: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise PackageProblem("npm is not installed where upstreams are registered (Debian package `npm`)")
    common = ["--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]
    try:
        subprocess.run([npm, *args, *common], cwd=cwd, capture_output=True, text=True, check=True, timeout=TIMEOUT)
    except subprocess.CalledProcessError as exc:
        raise PackageProblem(f"npm {args[0]} failed: {_npm_error(exc.stderr or exc.stdout, exc.returncode)}") from None
    except subprocess.TimeoutExpired:
        raise PackageProblem(f"npm {args[0]} did not finish within {TIMEOUT:g} s") from None


def _npm_error(output: str, status: int) -> str:
    """npm's error in one line: its code and the first line that says what happened (`npm error code E404`, then
    `npm error 404 Not Found - GET https://...`)."""
    lines = [line.removeprefix("npm error ").strip() for line in output.splitlines() if line.startswith("npm error ")]
    code = next((line.removeprefix("code ") for line in lines if line.startswith("code ")), f"status {status}")
    said = next((line for line in lines if ":" in line and "complete log" not in line), "")
    return f"{code}: {said}" if said else code


def _digest(folder: Path) -> str:
    return hashlib.sha256((folder / LOCK).read_bytes()).hexdigest()


def _bin(folder: Path, name: str, wanted: str) -> str:
    """The path, inside the folder, of the script the package's bin names (as npx picks it: the one bin, or the
    one named like the package)."""
    manifest = json.loads((folder / "node_modules" / name / "package.json").read_text())
    bins = manifest.get("bin") or {}
    if isinstance(bins, str):
        bins = {name.rsplit("/", 1)[-1]: bins}
    choice = wanted or (next(iter(bins)) if len(bins) == 1 else name.rsplit("/", 1)[-1])
    if choice not in bins:
        raise PackageProblem(f"package {name} has no bin {choice!r} (it has {', '.join(sorted(bins)) or 'none'})")
    return str(Path("node_modules") / name / bins[choice])


def _settled(slug: str, staging: Path) -> Path:
    """The staging folder moved to its digest's place (kept as it is if one is there already)."""
    final = Path(settings.GATEWAY_PACKAGES_DIR) / slug / _digest(staging)[:16]
    if final.exists():
        shutil.rmtree(staging)
    else:
        staging.rename(final)
    return final


def install(slug: str, wanted: Asked) -> dict[str, Any]:
    """Installs what an `npx` command line asks for into a folder of the upstream's own; its pin."""
    home = Path(settings.GATEWAY_PACKAGES_DIR) / slug
    home.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="installing-", dir=home))
    try:
        (staging / "package.json").write_text('{"name": "upstream", "private": true}\n')  # the lock names it
        _npm("install", "--save-exact", wanted.spec, cwd=staging)
        [name] = json.loads((staging / "package.json").read_text())["dependencies"]
        entry = json.loads((staging / LOCK).read_text())["packages"][f"node_modules/{name}"]
        bin_path = _bin(staging, name, wanted.bin)
        folder = _settled(slug, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {
        "spec": wanted.spec,
        "name": name,
        "version": entry["version"],
        "integrity": entry.get("integrity", ""),
        "digest": _digest(folder),
        "bin": bin_path,
        "manifest": (folder / "package.json").read_text(),
        "lock": (folder / LOCK).read_text(),
    }


def folder(slug: str, pin: dict[str, Any]) -> Path:
    return Path(settings.GATEWAY_PACKAGES_DIR) / slug / pin["digest"][:16]


def installed(slug: str, pin: dict[str, Any]) -> Path:
    """The pinned package's folder, installed from its lock where this host lacks it (`npm ci` checks every
    package's integrity hash), and refused where its lock is not the pinned one."""
    where = folder(slug, pin)
    if not where.exists():
        where.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="installing-", dir=where.parent))
        try:
            (staging / "package.json").write_text(pin["manifest"])
            (staging / LOCK).write_text(pin["lock"])
            _npm("ci", cwd=staging)
            _settled(slug, staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    if _digest(where) != pin["digest"]:
        raise PackageProblem(f"the package {pin['name']} in {where} is not the approved one (its lock changed)")
    return where
