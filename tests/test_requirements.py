"""What the code imports is installed by its requirements file: the gateway's code (what scripts/demo and a
deployment run) by requirements.txt alone, the tests and benchmarks by requirements-dev.txt. The npm packages are
the tests' alone: scripts/demo installs none, and the console's Chart.js is a file of the repository."""

import ast
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ["audit", "registry", "policy", "handoff", "gateway_project", "examples", "manage.py"]
DEVELOPMENT = ["tests", "bench", "scripts"]
# What scripts/bootstrap reads, and an installer that only writes down how it was called (as `name arguments`).
BOOTSTRAP_FILES = [
    "scripts/bootstrap",
    "scripts/demo",
    "requirements.txt",
    "requirements-dev.txt",
    "package.json",
    "package-lock.json",
]
LOGGED = '#!/bin/sh\necho "$(basename "$0") $*" >> "$CALLS"\n'


def requirements(file: Path) -> list[Requirement]:
    """The requirements a pip requirements file names, following `-r`."""
    found = []
    for line in file.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            found += requirements(file.parent / line[3:].strip())
        elif line:
            found.append(Requirement(line))
    return found


def installed_by(file: Path) -> set[str]:
    """The distributions pip installs for the file: those it names, with their dependencies and extras."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(r.name, frozenset(r.extras)) for r in requirements(file)]
    while todo:
        name, extras = todo.pop()
        if (canonicalize_name(name), extras) in seen:
            continue
        seen.add((canonicalize_name(name), extras))
        try:
            depends = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue  # an optional dependency whose marker holds here but that nothing installed
        for spec in map(Requirement, depends):
            if spec.marker is None or any(spec.marker.evaluate({"extra": e}) for e in extras | {""}):
                todo.append((spec.name, frozenset(spec.extras)))
    return {name for name, _ in seen}


# Modules a host program gives the scripts it runs, never installed by pip: gdb's (bench/interned_gdb.py runs
# inside `gdb -x`).
HOST_MODULES = frozenset({"gdb"})


def python_files(paths: list[str]) -> list[Path]:
    """The Python files of the repository's top-level folders and files named."""
    return [
        file for top in paths for file in ([ROOT / top] if top.endswith(".py") else sorted((ROOT / top).rglob("*.py")))
    ]


def third_party_imports(paths: list[str]) -> dict[str, str]:
    """Each module outside the standard library and this repository that the files import, with one importer."""
    local = {p.stem for p in ROOT.iterdir()}
    found = {}
    for file in python_files(paths):
        siblings = {p.stem for p in file.parent.iterdir()}
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for module in (name.split(".")[0] for name in names):
                if module not in sys.stdlib_module_names | HOST_MODULES and module not in local | siblings:
                    found.setdefault(module, str(file.relative_to(ROOT)))
    return found


@pytest.mark.parametrize(("paths", "file"), [(RUNTIME, "requirements.txt"), (DEVELOPMENT, "requirements-dev.txt")])
def test_every_package_the_code_imports_is_installed_by_its_requirements_file(paths, file):
    installed = installed_by(ROOT / file)
    providers = metadata.packages_distributions()
    missing = {
        module: importer
        for module, importer in third_party_imports(paths).items()
        if not {canonicalize_name(d) for d in providers.get(module, [])} & installed
    }
    assert missing == {}, f"imported, but not installed by {file}"


def test_the_runtime_requirements_leave_out_test_and_benchmark_packages():
    runtime = installed_by(ROOT / "requirements.txt")
    assert {"pytest", "pytest-django", "ruff", "hypothesis", "playwright", "bpe-openai"} & runtime == set()


def _installed_by_script(repo: Path, *script: str) -> list[str]:
    """How the script, run in a copy of what it reads, called Python (pip, manage.py) and npm, each replaced by
    a stand-in that writes the call down: the real ones would install from the registries."""
    for name in BOOTSTRAP_FILES:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, repo / name)
    for stand_in in (repo / ".venv/bin/python", repo / "bin/npm"):
        stand_in.parent.mkdir(parents=True)
        stand_in.write_text(LOGGED)
        stand_in.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PORT"} | {
        "PATH": f"{repo / 'bin'}:{os.environ['PATH']}",
        "CALLS": str(repo / "calls"),
    }
    subprocess.run(script, cwd=repo, env=env, check=True, timeout=60, capture_output=True)
    return (repo / "calls").read_text().splitlines()


def test_scripts_demo_installs_the_runtime_requirements_and_nothing_from_npm(tmp_path):
    calls = _installed_by_script(tmp_path, "scripts/demo")
    assert [call for call in calls if call.startswith("npm")] == []
    assert any(call.endswith("pip install --quiet --disable-pip-version-check -r requirements.txt") for call in calls)
    assert calls[-1] == "python manage.py serve_demo --port 8000"


def test_bootstrap_for_the_tests_installs_their_npm_packages(tmp_path):
    calls = _installed_by_script(tmp_path, "scripts/bootstrap", "--dev")
    assert "npm ci --no-audit --no-fund --loglevel=error" in calls
    assert any(call.endswith("-r requirements-dev.txt") for call in calls)


def test_the_gateway_reads_nothing_from_node_modules_and_serves_chart_js_from_the_repository():
    read = python_files(RUNTIME) + sorted((ROOT / "templates").rglob("*.html"))
    # The sandbox and npm's installs name node_modules as a kind of folder an upstream's command runs from, not the
    # project's.
    upstreams = {ROOT / "registry/upstreams/sandbox.py", ROOT / "registry/upstreams/packages/npm.py"}
    read = [file for file in read if file not in upstreams]
    assert [str(file) for file in read if "node_modules" in file.read_text()] == []
    chart = Path(finders.find("vendor/chart.js/chart.umd.min.js"))
    assert chart.is_relative_to(ROOT / "audit/static") and chart.read_text().startswith("/*!\n * Chart.js v4")
