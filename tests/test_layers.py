"""The house's imports flow one way (.importlinter, checked by `lint-imports` in .ci/run). Its one blind spot
is an import placed inside a function to dodge a cycle: allowed here only where Django or Celery need one
(AppConfig.ready, a Celery signal handler, a task body), and in a module named `optional.py`, whose one job is to
import an optional extra only where it is installed (handoff/codemode/optional.py: code mode's Deno and NumPy)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("gateway_project", "handoff", "registry", "policy", "audit")


def _allowed(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    decorators = [ast.unparse(d) for d in function.decorator_list]
    is_handler = any(d.endswith(".connect") or d.startswith("shared_task") for d in decorators)
    return function.name == "ready" or is_handler


def function_body_imports(root: Path = ROOT) -> list[str]:
    """`path:line in function: module` for each import of the project's own modules inside a function that
    may not have one."""
    found = []
    for app in APPS:
        for path in sorted((root / app).rglob("*.py")):
            if "migrations" in path.parts or path.name == "optional.py":
                continue
            for function in ast.walk(ast.parse(path.read_text())):
                if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) or _allowed(function):
                    continue
                for node in ast.walk(function):
                    if isinstance(node, ast.ImportFrom) and node.module:
                        modules = [node.module]
                    elif isinstance(node, ast.Import):
                        modules = [alias.name for alias in node.names]
                    else:
                        continue
                    found += [
                        f"{path.relative_to(root)}:{node.lineno} in {function.name}: {module}"
                        for module in modules
                        if module.split(".")[0] in APPS
                    ]
    return found


def test_no_import_of_our_own_hides_inside_a_function():
    assert function_body_imports() == []


def test_the_check_finds_an_import_inside_a_function(tmp_path):
    """The check above can fail: a cycle-dodging import is reported, one in AppConfig.ready is not."""
    app = tmp_path / "registry"
    app.mkdir()
    (app / "dodge.py").write_text("def later():\n    from handoff.mcp.list_changed import tell\n    return tell\n")
    (app / "apps.py").write_text("class Config:\n    def ready(self):\n        import handoff.mcp.list_changed\n")
    assert function_body_imports(tmp_path) == ["registry/dodge.py:2 in later: handoff.mcp.list_changed"]
