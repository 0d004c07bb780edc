"""npm: an `npx` upstream's package, installed with its scripts off; the lock (package-lock.json) is every
package's version and integrity hash, and `npm ci` installs exactly it on another host."""

import json
import shutil
from pathlib import Path
from typing import Any

from registry.upstreams.packages.common import Asked, PackageProblem, run, split

LOCK = "package-lock.json"
FLAGS = ("-y", "--yes", "-q", "--quiet")
QUIET = ["--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]


def asked(args: list[str]) -> Asked:
    """What `npx <args>` runs: `-y pkg args`, `--package pkg bin args`."""
    spec, rest = split("npx", args, FLAGS, ("-p", "--package"), "npx -y <package>")
    if not (spec or rest):
        raise PackageProblem("npx names no package")
    if spec:
        return Asked("npm", spec, rest[0] if rest else "", rest[1:])
    return Asked("npm", rest[0], "", rest[1:])


def _error(output: str) -> str:
    """npm's error in one line: its code and the first line that says what happened (`npm error code E404`, then
    `npm error 404 Not Found - GET https://...`)."""
    lines = [line.removeprefix("npm error ").strip() for line in output.splitlines() if line.startswith("npm error ")]
    code = next((line.removeprefix("code ") for line in lines if line.startswith("code ")), "")
    said = next((line for line in lines if ":" in line and "complete log" not in line), "")
    return f"{code}: {said}" if code and said else code or said


def _npm(args: list[str], cwd: Path) -> None:
    run("npm", [*args, *QUIET], cwd, _error)


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


def lock(staging: Path, wanted: Asked) -> Path:
    """Installs into `staging` (relocatable: node_modules holds no absolute path); its lock."""
    (staging / "package.json").write_text('{"name": "upstream", "private": true}\n')  # the lock names it
    _npm(["install", "--save-exact", wanted.spec], staging)
    return staging / LOCK


def pin(folder: Path, wanted: Asked) -> dict[str, Any]:
    """What the install in `folder` is: its package, version, integrity, bin, and what installs it again."""
    [name] = json.loads((folder / "package.json").read_text())["dependencies"]
    entry = json.loads((folder / LOCK).read_text())["packages"][f"node_modules/{name}"]
    return {
        "name": name,
        "version": entry["version"],
        "integrity": entry.get("integrity", ""),
        "bin": _bin(folder, name, wanted.bin),
        "manifest": (folder / "package.json").read_text(),
        "lock": (folder / LOCK).read_text(),
    }


def place(staging: Path, folder: Path) -> None:
    staging.rename(folder)


def restore(folder: Path, pinned: dict[str, Any]) -> Path:
    """Installs exactly the pinned lock into `folder`; its lock."""
    folder.mkdir(parents=True)
    try:
        (folder / "package.json").write_text(pinned["manifest"])
        (folder / LOCK).write_text(pinned["lock"])
        _npm(["ci"], folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder / LOCK


def command(folder: Path, pinned: dict[str, Any], args: list[str]) -> tuple[str, list[str]]:
    return "node", [str(folder / pinned["bin"]), *args]
