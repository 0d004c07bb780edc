"""uv: a `uvx` upstream's package, in a virtual environment of its own; the lock (requirements.txt, compiled by
`uv pip compile --generate-hashes`) is every distribution's version and hashes, and `uv pip sync --require-hashes`
installs exactly it. A virtual environment holds its own path, so it is made where it stays."""

import re
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

from registry.upstreams.packages.common import Asked, PackageProblem, run, split

LOCK = "requirements.txt"
FLAGS = ("-q", "--quiet")
WANTED = "requirements.in"


def asked(args: list[str]) -> Asked:
    """What `uvx <args>` runs: `pkg[==version] args`, `pkg@version args`, `--from spec command args`."""
    spec, rest = split("uvx", args, FLAGS, ("--from",), "uvx <package>")
    if not rest:
        raise PackageProblem("uvx names no package")
    if spec:
        return Asked("uv", spec, rest[0], rest[1:])
    name, _, version = rest[0].partition("@")
    return Asked("uv", f"{name}=={version}" if version and "/" not in name else rest[0], "", rest[1:])


def _error(output: str) -> str:
    """uv's error in one line: its first two lines, without their drawing."""
    lines = [line.strip(" ×╰─▶│") for line in output.splitlines()]
    return ": ".join([line for line in lines if line][:2])


def _uv(args: list[str], cwd: Path) -> None:
    run("uv", [*args, "--quiet"], cwd, _error)


def lock(staging: Path, wanted: Asked) -> Path:
    """Resolves what is asked into `staging`'s lock (nothing installed yet)."""
    (staging / WANTED).write_text(f"{wanted.spec}\n")
    _uv(["pip", "compile", WANTED, "--generate-hashes", "--no-header", "--output-file", LOCK], staging)
    return staging / LOCK


def restore(folder: Path, pinned: dict[str, Any]) -> Path:
    """Installs exactly the lock into a virtual environment in `folder`, made where it stays; its lock."""
    folder.mkdir(parents=True)
    try:
        (folder / LOCK).write_text(pinned["lock"])
        _uv(["venv", "venv"], folder)
        _uv(["pip", "sync", "--require-hashes", "--python", "venv/bin/python", LOCK], folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder / LOCK


def place(staging: Path, folder: Path) -> None:
    restore(folder, {"lock": (staging / LOCK).read_text()})


def _direct(lock_text: str) -> tuple[str, list[str]]:
    """The asked requirement's line in the lock (`name==1.2`, or a path) and its hashes."""
    blocks = re.split(r"\n(?=\S)", lock_text)
    block = next(b for b in blocks if f"# via -r {WANTED}" in b or f"# via\n    #   -r {WANTED}" in b)
    return block.split()[0], re.findall(r"--hash=(\S+)", block)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pin(folder: Path, wanted: Asked) -> dict[str, Any]:
    """What the install in `folder` is: its distribution, version, hashes, the command, and the lock."""
    text = (folder / LOCK).read_text()
    line, hashes = _direct(text)
    asked_name = _canonical(Path(line).name.split("-")[0] if "/" in line else re.split(r"[=<>!~\[;@ ]", line)[0])
    [site] = folder.glob("venv/lib/python*/site-packages")
    found = {_canonical(d.metadata["Name"]): d for d in metadata.distributions(path=[str(site)])}
    if asked_name not in found:
        raise PackageProblem(f"the lock's {line} is not installed in {folder}")
    dist = found[asked_name]
    scripts = sorted(e.name for e in dist.entry_points if e.group == "console_scripts")
    choice = wanted.bin or (scripts[0] if len(scripts) == 1 else asked_name)
    if choice not in scripts:
        having = ", ".join(scripts) or "none"
        raise PackageProblem(f"package {dist.metadata['Name']} has no command {choice!r} (it has {having})")
    return {
        "name": dist.metadata["Name"],
        "version": dist.version,
        "integrity": ",".join(hashes),
        "bin": f"venv/bin/{choice}",
        "lock": text,
    }


def command(folder: Path, pinned: dict[str, Any], args: list[str]) -> tuple[str, list[str]]:
    return str(folder / pinned["bin"]), args
