"""What every package manager's install shares: the problem it raises, what a command line asks for, and how a
manager's tool is run (bounded, its error in one line)."""

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TIMEOUT = 300.0  # for one install


class PackageProblem(Exception):
    """A package that cannot be installed or run as pinned, in the operator's words."""


@dataclass(frozen=True)
class Asked:
    """What an `npx` or `uvx` command line asks for: its manager (npm, uv), a package (a name with an optional
    version or range, a tarball or a wheel), the command to run when it names one, and the server's arguments."""

    manager: str
    spec: str
    bin: str
    args: list[str]


def split(
    launcher: str, args: list[str], quiet: tuple[str, ...], option: tuple[str, ...], usage: str
) -> tuple[str, list[str]]:
    """A launcher's arguments as the package its `option` names ("" when none) and the rest, past the `quiet`
    flags it may carry (and `--`); a flag it does not know is refused."""
    rest, spec = list(args), ""
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0)
        name, _, value = flag.partition("=")
        if flag == "--":
            break
        if name in option and (value or rest):
            spec = value or rest.pop(0)
        elif flag not in quiet:
            raise PackageProblem(f"{launcher} option {flag!r} is not understood: give the package first ({usage})")
    return spec, rest


def run(tool: str, args: list[str], cwd: Path, error: Callable[[str], str]) -> str:
    """Runs a package manager's `tool`; its output, or a PackageProblem saying in one line (`error` picks it from
    the tool's output) why it failed."""
    found = shutil.which(tool) or shutil.which(tool, path=os.path.dirname(sys.executable))  # or the gateway's own
    if found is None:
        raise PackageProblem(f"{tool} is not installed where upstreams are registered")
    try:
        done = subprocess.run([found, *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=TIMEOUT)
    except subprocess.CalledProcessError as exc:
        said = error(exc.stderr or exc.stdout) or f"status {exc.returncode}"
        raise PackageProblem(f"{tool} {args[0]} failed: {said}") from None
    except subprocess.TimeoutExpired:
        raise PackageProblem(f"{tool} {args[0]} did not finish within {TIMEOUT:g} s") from None
    return done.stdout


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
