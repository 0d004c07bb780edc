"""Settings: every variable the package gateway_project/settings/ reads is in docs/settings.md with the code's
default, and a process given a bad value stops with a message naming the variable and what it expects."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import servers
from tests.conftest import needs
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = sorted((ROOT / "gateway_project" / "settings").glob("*.py"))
TABLE = ROOT / "docs" / "settings.md"
# Read beside the settings, by the OpenTelemetry SDK's conventions (audit/telemetry.py), and documented with them.
TELEMETRY = ROOT / "audit" / "telemetry.py"
# The helpers that read the environment, and the one function that reads a key (given, or made in var/) through them.
READERS = {"env_str", "env_bool", "env_int", "env_float", "env_choice", "env_list", "env_secret", "key_read"}
NOT_LITERAL = object()


def _default(call: ast.Call) -> object:
    """The default a reader is called with: a literal, or NOT_LITERAL where the code computes it."""
    node = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "default"), None)
    if call.func.id == "key_read":  # its second argument names the file in var/ that holds a key made once
        return NOT_LITERAL
    if node is None:
        return False if call.func.id == "env_bool" else ""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return NOT_LITERAL


def reader_calls() -> list[ast.Call]:
    """Every call of a reader in the settings package whose variable is named by a literal."""
    return [
        node
        for module in SETTINGS
        for node in ast.walk(ast.parse(module.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in READERS
        if isinstance(node.args[0], ast.Constant)
    ]


def settings_read() -> dict[str, object]:
    """Every variable the settings package reads, with its default."""
    return {call.args[0].value: _default(call) for call in reader_calls()}


def telemetry_read() -> dict[str, object]:
    """The OTEL_* variables audit/telemetry.py reads (os.environ.get), with their defaults."""
    return {
        node.args[0].value: ast.literal_eval(node.args[1]) if len(node.args) > 1 else ""
        for node in ast.walk(ast.parse(TELEMETRY.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
        if ast.unparse(node.func.value) == "os.environ"
    }


def bounds(call: ast.Call) -> tuple[object, object]:
    """A numeric reader's literal minimum and maximum (None where it has none)."""
    given = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in ("minimum", "maximum")}
    return given.get("minimum"), given.get("maximum")


def numeric_calls() -> dict[str, ast.Call]:
    return {call.args[0].value: call for call in reader_calls() if call.func.id in ("env_int", "env_float")}


def settings_documented() -> dict[str, str]:
    """Each row of docs/settings.md's tables: the variable, and its default cell."""
    rows = re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \| ([^|]*) \|", TABLE.read_text(), re.MULTILINE)
    return {name: cell.strip() for name, cell in rows}


def default_matches(code: object, cell: str) -> bool:
    """A literal default is the cell's first `quoted` value (`true`/`false` for booleans); an empty one is
    described in words, not quoted."""
    quoted = re.match(r"`([^`]*)`", cell)
    if code == "":
        return quoted is None
    if quoted is None:
        return False
    if isinstance(code, bool):
        return quoted.group(1) == str(code).lower()
    if isinstance(code, int | float):
        try:
            return float(quoted.group(1)) == code
        except ValueError:
            return False
    return quoted.group(1) == code


def test_every_variable_the_settings_read_is_documented_and_no_other():
    read, documented = settings_read() | telemetry_read(), settings_documented()
    assert sorted(set(read) - set(documented)) == [], "read by gateway_project/settings/, missing in docs/settings.md"
    assert sorted(set(documented) - set(read)) == [], "in docs/settings.md, no longer read by the settings"


def test_every_documented_default_is_the_codes():
    read, documented = settings_read() | telemetry_read(), settings_documented()
    wrong = {
        name: (code, documented.get(name))
        for name, code in read.items()
        if code is not NOT_LITERAL and not default_matches(code, documented.get(name, ""))
    }
    assert wrong == {}


def test_every_number_the_settings_read_has_bounds():
    """A number out of range stops the process rather than a gateway running with a negative timeout."""
    assert [name for name, call in numeric_calls().items() if bounds(call)[0] is None] == []


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def test_every_number_is_documented_with_its_bounds():
    """The default's cell says `(minimum to maximum)`, or `(at least minimum)`, as the code has them."""
    documented = settings_documented()
    wrong = {}
    for name, call in numeric_calls().items():
        minimum, maximum = bounds(call)
        said = f"(at least {_number(minimum)})" if maximum is None else f"({_number(minimum)} to {_number(maximum)})"
        if said not in documented.get(name, ""):
            wrong[name] = (said, documented.get(name))
    assert wrong == {}


def test_the_settings_read_the_environment_only_through_the_helpers():
    """So that every variable is checked, and found by the tests above."""
    outside = [
        (path.name, node.lineno)
        for path in SETTINGS
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
    ]
    assert len(SETTINGS) > 1 and outside == []


def python(tmp_path: Path, arguments: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """The gateway's Python with these arguments, in an environment of its own (no services) plus `env`."""
    # As a deployment's, after collectstatic: WhiteNoise warns of a web process with no static files to serve.
    (tmp_path / "static").mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "DATABASE_", "REDIS_", "SQLITE_"))}
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=ROOT,
        env=base | {"DJANGO_SETTINGS_MODULE": "gateway_project.settings", "SWITCHBOARD_VAR_DIR": str(tmp_path)} | env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def start(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """A process that loads the gateway's settings, as Daphne, Celery and manage.py do."""
    return python(tmp_path, ["-c", "import django; django.setup(); print('configured')"], env)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("GATEWAY_MAX_BODY_BYTES", "abc", "GATEWAY_MAX_BODY_BYTES must be an integer, not 'abc'"),
        ("GATEWAY_SSE_REPLAY_EVENTS", "1e3", "GATEWAY_SSE_REPLAY_EVENTS must be an integer, not '1e3'"),
        ("GATEWAY_INPUT_WAIT_SECONDS", "5m", "GATEWAY_INPUT_WAIT_SECONDS must be a number, not '5m'"),
        ("GATEWAY_DEFAULT_TIMEOUT", "nan", "GATEWAY_DEFAULT_TIMEOUT must be a number, not 'nan'"),
        ("GATEWAY_MAX_JSON_DEPTH", "500", "GATEWAY_MAX_JSON_DEPTH must be between 8 and 128, not '500'"),
        ("GATEWAY_DEFAULT_TIMEOUT", "-5", "GATEWAY_DEFAULT_TIMEOUT must be between 0.1 and 3600, not '-5'"),
        ("GATEWAY_SANDBOX_MAX_RUNNING", "0", "GATEWAY_SANDBOX_MAX_RUNNING must be between 1 and 1024, not '0'"),
        ("GATEWAY_BREAKER_FAILURES", "0", "GATEWAY_BREAKER_FAILURES must be between 1 and 1000, not '0'"),
        (
            "GATEWAY_AUDIT_OUTCOME_LOOKBACK_HOURS",
            "0.5",
            "GATEWAY_AUDIT_OUTCOME_LOOKBACK_HOURS must be between 1 and 8760, not '0.5'",
        ),
        (
            "GATEWAY_SNAPSHOT_CHECK_SECONDS",
            "3600.5",
            "GATEWAY_SNAPSHOT_CHECK_SECONDS must be between 0 and 3600, not '3600.5'",
        ),
        ("GATEWAY_HANDOFF_TOKEN_TTL", "-120", "GATEWAY_HANDOFF_TOKEN_TTL must be between 1 and 3600, not '-120'"),
        (
            "GATEWAY_AUDIT_PAYLOADS",
            "ture",
            "GATEWAY_AUDIT_PAYLOADS must be 1, true, yes or on, or 0, false, no or off, not 'ture'",
        ),
        ("GATEWAY_CODE_MODE", "maybe", "GATEWAY_CODE_MODE must be 'on', 'only' or 'off', not 'maybe'"),
        ("GATEWAY_EXECUTOR", "threads", "GATEWAY_EXECUTOR must be 'inline' or 'celery', not 'threads'"),
        ("LOG_LEVEL", "verbose", "LOG_LEVEL must be 'DEBUG', 'INFO', 'WARNING', 'ERROR' or 'CRITICAL', not 'verbose'"),
        (
            "SECRET_KEY_FILE",
            "/nonexistent/key",
            "SECRET_KEY_FILE must be a readable file (No such file or directory), not '/nonexistent/key'",
        ),
    ],
)
def test_a_bad_value_stops_the_process_naming_the_variable_and_what_it_expects(tmp_path, variable, value, message):
    started = start(tmp_path, **{variable: value})
    assert started.returncode == 1
    assert started.stderr.strip().splitlines()[-1] == f"django.core.exceptions.ImproperlyConfigured: {message}"
    assert "configured" not in started.stdout


@pytest.mark.parametrize(
    ("broker", "transport"), [("redis://127.0.0.1:6379/15", "direct"), ("amqp://127.0.0.1//", "task")]
)
def test_calls_go_straight_to_the_workers_where_the_broker_is_redis_and_as_tasks_elsewhere(tmp_path, broker, transport):
    code = "import django; django.setup(); from django.conf import settings; print(settings.GATEWAY_CALL_TRANSPORT)"
    started = python(tmp_path, ["-c", code], {"CELERY_BROKER_URL": broker})
    assert (started.returncode, started.stdout.split()[-1]) == (0, transport)


def test_the_direct_call_transport_on_a_broker_other_than_redis_stops_the_process(tmp_path):
    started = start(tmp_path, CELERY_BROKER_URL="amqp://127.0.0.1//", GATEWAY_CALL_TRANSPORT="direct")
    assert started.returncode == 1
    assert started.stderr.strip().splitlines()[-1] == (
        "django.core.exceptions.ImproperlyConfigured: GATEWAY_CALL_TRANSPORT=direct needs a Redis broker "
        "(CELERY_BROKER_URL)"
    )


def test_a_bad_database_url_is_named_without_its_password(tmp_path):
    started = start(tmp_path, DATABASE_URL="mysqlx://switchboard:hunter2@db.internal/switchboard")
    assert started.returncode == 1
    last = started.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: DATABASE_URL must be a URL such as ")
    assert "'mysqlx://' is unknown" in last
    assert "hunter2" not in started.stderr


def test_good_values_start_the_process(tmp_path):
    started = start(
        tmp_path, GATEWAY_MAX_BODY_BYTES="2048", GATEWAY_AUDIT_PAYLOADS="Yes", GATEWAY_INPUT_WAIT_SECONDS="2.5"
    )
    assert (started.returncode, started.stdout.strip()) == (0, "configured"), started.stderr


HINT = "docs/settings.md lists every setting."


def unknown(name: str, meant: str) -> str:
    return f"{name} is set but is not a setting Switchboard reads, so it is ignored: did you mean {meant}?"


# A web process imports the ASGI application, as Daphne and uvicorn do: they run no system checks of their own.
WEB = ["-c", "import gateway_project.asgi"]


@pytest.mark.parametrize(
    ("variable", "value", "meant"),
    [
        ("GATEWAY_EXECUTER", "celery", "GATEWAY_EXECUTOR"),
        ("GATEWAY_VAULT_TOKN", "hvs.a-secret-value", "GATEWAY_VAULT_TOKEN"),  # named, never its value
        ("GATEWAY_SANDBOX_HEAP", "64", "GATEWAY_SANDBOX_HEAP_MB"),
    ],
)
def test_manage_py_check_names_a_misspelled_variable_and_the_setting_it_meant(tmp_path, variable, value, meant):
    checked = python(tmp_path, ["manage.py", "check"], {variable: value})
    assert (checked.returncode, checked.stdout) == (0, "")  # a warning: the process goes on
    assert checked.stderr == (
        "System check identified some issues:\n\nWARNINGS:\n"
        f"?: (switchboard.W001) {unknown(variable, meant)}\n\tHINT: {HINT}\n\n"
        "System check identified 1 issue (0 silenced).\n"
    )


def test_the_web_process_logs_a_misspelled_variable_as_it_starts(tmp_path):
    started = python(tmp_path, WEB, {"GATEWAY_EXECUTER": "celery", "GATEWAY_LOG_FORMAT": "json"})
    assert started.returncode == 0, started.stderr
    logged = [json.loads(line) for line in started.stderr.splitlines()]
    assert [(line["level"], line["logger"], line["message"]) for line in logged] == [
        (
            "WARNING",
            "gateway_project.checks",
            f"{unknown('GATEWAY_EXECUTER', 'GATEWAY_EXECUTOR')} (switchboard.W001; {HINT})",
        )
    ]


def test_a_variable_like_no_setting_is_named_without_a_guess(tmp_path):
    checked = python(tmp_path, ["manage.py", "check"], {"GATEWAY_ZZZ": "1"})
    assert "(switchboard.W001) GATEWAY_ZZZ is set but is not a setting Switchboard reads, so it is ignored.\n" in (
        checked.stderr
    )


def test_a_correct_environment_gives_no_warning(tmp_path):
    token = tmp_path / "vault_token"
    token.write_text("hvs.token")
    env = {
        "GATEWAY_EXECUTOR": "inline",
        "GATEWAY_VAULT_TOKEN_FILE": str(token),  # a text setting read from a file
        "GATEWAY_MAX_BODY_BYTES": "2048",
        "GATEWAY_AUDIT_PAYLOADS": "1",
        "GATEWAY_AUTH_SERVER": "0",
        "GATEWAY_AUTH_SIGNING_KEY": "read even with the server off",
    }
    checked = python(tmp_path, ["manage.py", "check"], env)
    assert (checked.returncode, checked.stdout, checked.stderr) == (
        0,
        "System check identified no issues (0 silenced).\n",
        "",
    )
    started = python(tmp_path, WEB, env)
    assert (started.returncode, started.stderr) == (0, "")


def test_a_celery_worker_logs_a_misspelled_variable_as_it_starts(server_env, logs):
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set: no Redis, so no Celery worker")
    env = server_env | {"GATEWAY_EXECUTOR": "celery", "GATEWAY_SANDBOX_HEAP": "64"}
    worker = servers.start_worker(env, logs / "worker-misspelled-setting.log")
    try:
        eventually(lambda: unknown("GATEWAY_SANDBOX_HEAP", "GATEWAY_SANDBOX_HEAP_MB") in worker.log.read_text())
    finally:
        worker.stop()
