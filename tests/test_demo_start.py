"""scripts/demo's start (handoff/management/commands/serve_demo.py): a new SQLite file is a copy of the schema
template of its migration set, made by that set's first migrate, and migrated again when the set changes; the
template holds no key, agent or user; setup_demo run again changes nothing and prints the same key; the one
process answers a call at once, from the stdio servers it started before Django, and, restarted, with the same key;
the README's client (examples/client.py), run as the README says, calls the demo's time tool with the demo's key."""

import asyncio
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
from django.contrib.auth.hashers import check_password

from tests import servers
from tests.clients import call, tool_names

pytestmark = pytest.mark.e2e  # it runs manage.py processes, and serve_demo serves with its upstreams
MANAGE = [sys.executable, str(servers.ROOT / "manage.py")]
KEY = re.compile(r"\b(sb_[A-Za-z0-9_-]+)")
CLIENT_SECTION = re.compile(r"^## Connecting a client\n(.*?)^## ", re.MULTILINE | re.DOTALL)
COLD_APP = """from django.db import models


class Note(models.Model):
    text = models.CharField(max_length=40)
"""
COLD_MIGRATION = """from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = {dependencies}
    operations = [{operation}]
"""


def _env(var: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SQLITE_PATH")}
    return (
        env
        | more
        | {
            "DJANGO_SETTINGS_MODULE": "gateway_project.settings",
            "GATEWAY_EXECUTOR": "inline",
            "SWITCHBOARD_VAR_DIR": str(var),
        }
    )


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([*MANAGE, *args], env=env, cwd=servers.ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _schema_ready(var: Path, templates: Path, **env: str) -> str:
    return _manage(_env(var, **env), "schema_ready", "--template-dir", str(templates))


def _rows(database: Path, table: str) -> int:
    with sqlite3.connect(database) as db:
        return db.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]  # noqa: S608 (names from this file)


def test_a_new_database_is_a_copy_of_the_template_its_migration_set_first_made(tmp_path):
    templates = tmp_path / "templates"
    assert "copied" not in _schema_ready(tmp_path / "first", templates)
    [template] = templates.glob("schema-*.sqlite3")
    assert f"copied from {template}" in _schema_ready(tmp_path / "second", templates)
    # The copy is as migrated as the file that was migrated: migrate finds nothing to do.
    _manage(_env(tmp_path / "second"), "migrate", "--check")
    assert _rows(tmp_path / "second/switchboard.sqlite3", "auth_group") == 1  # the Auditor group migrate made


def test_a_changed_migration_set_is_migrated_again_and_makes_a_template_of_its_own(tmp_path):
    templates, app = tmp_path / "templates", tmp_path / "apps/coldapp"
    (app / "migrations").mkdir(parents=True)
    for name, text in [("__init__.py", ""), ("models.py", COLD_APP), ("migrations/__init__.py", "")]:
        (app / name).write_text(text)
    fields = "[('id', models.BigAutoField(primary_key=True)), ('text', models.CharField(max_length=40))]"
    create = f"migrations.CreateModel('Note', {fields})"
    (app / "migrations/0001_initial.py").write_text(COLD_MIGRATION.format(dependencies=[], operation=create))
    with_app = {"GATEWAY_EXTRA_APPS": "coldapp", "PYTHONPATH": str(tmp_path / "apps")}
    _schema_ready(tmp_path / "one", templates, **with_app)
    assert "copied" in _schema_ready(tmp_path / "two", templates, **with_app)

    add = "migrations.AddField('Note', 'author', models.CharField(max_length=40, default=''))"
    (app / "migrations/0002_author.py").write_text(
        COLD_MIGRATION.format(dependencies=[("coldapp", "0001_initial")], operation=add)
    )
    assert "copied" not in _schema_ready(tmp_path / "three", templates, **with_app)
    assert len(list(templates.glob("schema-*.sqlite3"))) == 2
    with sqlite3.connect(tmp_path / "three/switchboard.sqlite3") as db:
        assert "author" in {row[1] for row in db.execute("PRAGMA table_info(coldapp_note)")}
    # The database of the older set is brought up to the new one by migrate, not replaced.
    _schema_ready(tmp_path / "one", templates, **with_app)
    _manage(_env(tmp_path / "one", **with_app), "migrate", "--check")


def test_setup_demo_again_keeps_its_key_syncs_nothing_and_the_template_holds_no_secret(tmp_path):
    templates, var = tmp_path / "templates", tmp_path / "var"
    _schema_ready(var, templates)
    first = _manage(_env(var), "setup_demo")
    again = _manage(_env(var), "setup_demo")
    assert "demo: " in first and "time: " in first and "Admin console login" in first
    assert "demo: " not in again and "time: " not in again and "Admin console login" not in again
    assert KEY.search(first).group(1) == KEY.search(again).group(1) == (var / "demo_key").read_text()
    assert (var / "demo_key").stat().st_mode & 0o777 == 0o600
    with sqlite3.connect(var / "switchboard.sqlite3") as db:
        demo_keys = (
            "SELECT count(*) FROM policy_agentkey k JOIN policy_agent a ON a.id = k.agent_id WHERE a.name = 'demo'"
        )
        assert db.execute(demo_keys).fetchone()[0] == 1
    # The passwords shown once, hashed beside the rest of the setup, open their accounts.
    shown = [("admin", r"Admin console login \(shown once\): admin / (\S+)")]
    shown += [(login, rf"console admin {login} / (\S+)") for login in ("platform-admin", "payments-admin")]
    with sqlite3.connect(var / "switchboard.sqlite3") as db:
        for login, pattern in shown:
            [encoded] = db.execute("SELECT password FROM auth_user WHERE username = ?", [login]).fetchone()
            assert check_password(re.search(pattern, first).group(1), encoded), login
    [template] = templates.glob("schema-*.sqlite3")
    for table in ("policy_agent", "policy_agentkey", "auth_user", "registry_upstream", "audit_auditevent"):
        assert _rows(template, table) == 0, table


def _serve(var: Path, port: int, log: Path) -> tuple[servers.Running, str]:
    process = servers.start([*MANAGE, "serve_demo", "--port", str(port)], _env(var), log)
    running = servers.Running(process, log, f"http://127.0.0.1:{port}")
    # A first start migrates, syncs both upstreams and starts the specialist before it listens: 30-40 s were seen
    # on a loaded machine.
    servers.wait_for_port(port, process, log, timeout=120)
    # The key is printed (and flushed) before Daphne starts, so it is in the log once the port accepts.
    return running, KEY.search(log.read_text()).group(1)


def test_the_embedded_defaults_start_loads_no_store_client_it_does_not_use_and_daphne_only_to_serve(tmp_path):
    """redis-py and hvac cost a start 0.2 s, Daphne and Twisted 0.16 (bench/cold_start.py): the embedded default,
    which has neither Redis nor Vault, loads none of them setting Django up, with the ASGI app or with serve_demo's
    command; serve_demo imports Daphne once its upstreams are starting. Nor what its first call does not need: the
    console's pages (registry/admin.py, the console it imports), psycopg on SQLite, the OpenAPI validator, requests
    (the IdP sign-in's), and code mode's module (NumPy) for a call that only asks whether its tool is one of code
    mode's."""
    probe = (
        "import django, sys; django.setup(); "
        "import gateway_project.asgi, handoff.management.commands.serve_demo; "
        "from handoff.codemode.optional import own_tools; assert 'execute' in own_tools(); "
        "print(sorted(m for m in ('daphne', 'hvac', 'redis', 'twisted', 'registry.admin', 'handoff.console', "
        "'psycopg', 'openapi_spec_validator', 'requests', 'handoff.codemode.run', 'numpy') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=_env(tmp_path), cwd=servers.ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


def _demo_teams(var: Path) -> dict[str, tuple]:
    """What the demo's database says of its teams: their upstreams, those shared with them, agents and admins."""
    query = {
        "owns": "SELECT t.slug, u.slug FROM registry_upstream u JOIN policy_team t ON t.id = u.team_id",
        "borrows": "SELECT t.slug, u.slug FROM registry_upstream_shared_with s JOIN policy_team t ON t.id = s.team_id "
        "JOIN registry_upstream u ON u.id = s.upstream_id",
        "agents": "SELECT t.slug, a.name FROM policy_agent a JOIN policy_team t ON t.id = a.team_id",
        "admins": "SELECT t.slug, u.username FROM policy_teammember m JOIN policy_team t ON t.id = m.team_id "
        "JOIN auth_user u ON u.id = m.user_id WHERE m.role = 'admin' AND NOT u.is_superuser",
    }
    with sqlite3.connect(var / "switchboard.sqlite3") as db:
        return {what: tuple(sorted(db.execute(sql).fetchall())) for what, sql in query.items()}


def test_serve_demo_answers_in_one_process_and_a_restart_prints_the_same_key(tmp_path):
    var, port = tmp_path / "var", servers.free_port()
    for log, text in [(tmp_path / "start.log", "cold"), (tmp_path / "restart.log", "warm")]:
        running, key = _serve(var, port, log)
        try:
            echoed = asyncio.run(call(running.url, key, "demo__echo", {"text": text}))
            login = httpx2.get(f"{running.url}/admin/login/", timeout=10)  # its static files compressed or not yet
            payments = (var / "payments_key").read_text()
            borrowed = asyncio.run(call(running.url, payments, "demo__echo", {"text": text}))  # shared with it
            offered = asyncio.run(tool_names(running.url, payments))
            desk = asyncio.run(tool_names(running.url, key, path="/mcp/s/desk"))  # the demo's virtual server
        finally:
            running.stop()
        assert [c.text for c in echoed.content] == [[c.text for c in borrowed.content][0]] == [text]
        assert "demo__echo" in offered and not any(name.startswith("time__") for name in offered)  # platform's own
        assert desk == {"demo__echo", "demo__add", "time__get_current_time"}
        assert login.status_code == 200 and re.search(r"/static/admin/css/base\.[0-9a-f]{12}\.css", login.text)
        assert key == (var / "demo_key").read_text()
    assert _demo_teams(var) == {
        "owns": (("default", "demo"), ("default", "time"), ("payments", "finance")),
        "borrows": (("default", "finance"), ("payments", "demo")),
        "agents": (("default", "demo"), ("default", "people"), ("payments", "payments-bot")),
        "admins": (("default", "platform-admin"), ("payments", "payments-admin")),
    }
    started, restarted = (tmp_path / "start.log").read_text(), (tmp_path / "restart.log").read_text()
    # A first start prints the key, then syncs the catalogs while Daphne is imported, and serves once they are in.
    assert started.index(key) < started.index("\ndemo: ") < started.index("Serving ")
    assert started.index(key) < started.index("\ntime: ") < started.index("Serving ")
    for log in (started, restarted):  # the servers manage.py started before Django, which the pool took
        assert "upstream demo: taking its server started early" in log
        assert "upstream time: taking its server started early" in log
    assert "Virtual server 'desk': /mcp/s/desk offers demo__echo, demo__add, time__get_current_time" in started
    assert len(re.findall("Admin console login", started)) == 1 and "Admin console login" not in restarted
    assert re.search(r"console admin payments-admin / \S+", started)  # its password shown once
    assert "console admin payments-admin\n" in restarted
    assert f"Agent 'payments-bot' API key (team payments, kept in {var / 'payments_key'}):\n  {payments}" in restarted


def _readme_client_commands() -> list[list[str]]:
    """The commands the README's "Connecting a client" gives to run its client, as a newcomer pastes them."""
    section = CLIENT_SECTION.search((servers.ROOT / "README.md").read_text()).group(1)
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines()]


def _client(command: list[str], var: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "SWITCHBOARD_KEY"} | {"SWITCHBOARD_VAR_DIR": str(var)}
    return subprocess.run(command, env=environment | env, cwd=servers.ROOT, capture_output=True, text=True, timeout=60)


def test_the_readmes_client_calls_the_demos_time_tool_with_the_demos_key_and_says_why_when_it_cannot(tmp_path):
    [command, elsewhere] = _readme_client_commands()
    assert command == [".venv/bin/python", "examples/client.py"] and elsewhere[:2] == command
    var, port = tmp_path / "var", servers.free_port()
    # The demo's own port is 8000, which the tests may not take: the README's other line names a gateway's URL.
    url = f"http://127.0.0.1:{port}/mcp"
    assert _client([*command, url], var).stderr == (
        f"No API key: set SWITCHBOARD_KEY, or run scripts/demo once (it writes {var / 'demo_key'}).\n"
    )
    assert _client([*command, url], var, SWITCHBOARD_KEY="sb_x").stderr == (
        f"Nothing answers at {url}: start the gateway first (scripts/demo).\n"
    )
    running, _ = _serve(var, port, tmp_path / "demo.log")
    try:
        told = _client([*command, url], var)
        wrong = _client([*command, url], var, SWITCHBOARD_KEY="sb_not-a-key")
    finally:
        running.stop()
    assert (told.returncode, told.stderr) == (0, "")
    assert json.loads(told.stdout)["timezone"] == "Europe/Paris"
    assert (wrong.returncode, wrong.stdout, wrong.stderr) == (
        1,
        "",
        "The gateway refused: Missing or invalid credentials: sign in with OAuth, or send "
        "'Authorization: Bearer <agent key>'\n",
    )
