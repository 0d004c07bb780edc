"""What the code imports is installed by its requirements file: the gateway's code (what scripts/demo and a
deployment run) by requirements.txt alone, the tests and benchmarks by requirements-dev.txt."""

import ast
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ["audit", "registry", "policy", "handoff", "gateway_project", "examples", "manage.py"]
DEVELOPMENT = ["tests", "bench", "scripts"]


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


def third_party_imports(paths: list[str]) -> dict[str, str]:
    """Each module outside the standard library and this repository that the files import, with one importer."""
    local = {p.stem for p in ROOT.iterdir()}
    found = {}
    for top in paths:
        for file in [ROOT / top] if top.endswith(".py") else sorted((ROOT / top).rglob("*.py")):
            siblings = {p.stem for p in file.parent.iterdir()}
            for node in ast.walk(ast.parse(file.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module]
                else:
                    continue
                for module in (name.split(".")[0] for name in names):
                    if module not in sys.stdlib_module_names and module not in local | siblings:
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
