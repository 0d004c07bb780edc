"""The embedded default's SQLite database under concurrent writers: an upstream that announces a change while
`import_mcp_config` still writes has its catalog synced again by the change handler, in another thread, at
the same time. Each import runs as its own process on a fresh copy of one migrated database."""

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests import servers
from tests.conftest import BIN, needs

pytestmark = pytest.mark.e2e  # it runs import_mcp_config processes against one SQLite file

TRIES = 8


def _env(var: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SQLITE_PATH")}
    return env | {
        "DJANGO_SETTINGS_MODULE": "gateway_project.settings",
        "GATEWAY_EXECUTOR": "inline",
        "SWITCHBOARD_VAR_DIR": str(var),
    }


def _named(database: Path, i: int) -> dict[str, str]:
    """Both ways of naming the file: SQLITE_PATH, or a DATABASE_URL of sqlite:///."""
    return {"SQLITE_PATH": str(database)} if i % 2 else {"DATABASE_URL": f"sqlite:///{database}"}


def _catalog(database: Path) -> dict[str, set[str]]:
    with sqlite3.connect(database) as db:
        rows = db.execute(
            "SELECT u.slug, t.name FROM registry_upstream u JOIN registry_tool t ON t.upstream_id = u.id"
            " WHERE u.last_synced_at IS NOT NULL"
        ).fetchall()
    catalog: dict[str, set[str]] = {}
    for slug, name in rows:
        catalog.setdefault(slug, set()).add(name)
    return catalog


def test_importing_two_upstreams_while_one_announces_a_change_never_finds_the_database_locked(tmp_path):
    needs(servers.EVERYTHING_JS.exists(), "npm packages are not installed (run: npm ci)")
    env, migrated = _env(tmp_path / "var"), tmp_path / "migrated.sqlite3"
    manage = [sys.executable, str(servers.ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env | _named(migrated, 1), cwd=servers.ROOT, check=True)
    config = tmp_path / "mcp.json"
    # server-everything registers a tool once initialized, and so says its tool list changed at once.
    everything = {"command": "node", "args": [str(servers.EVERYTHING_JS), "stdio"]}
    clock = {"command": str(BIN / "mcp-server-time"), "args": ["--local-timezone", "UTC"]}
    # every first: the import syncs in the file's order, so its change is handled while time is still written.
    config.write_text(json.dumps({"mcpServers": {"every": everything, "time": clock}}))
    databases = [tmp_path / f"try{i}.sqlite3" for i in range(TRIES)]
    for database in databases:
        shutil.copy(migrated, database)
    imports = [
        subprocess.Popen(
            [*manage, "import_mcp_config", str(config)],
            env=env | _named(database, i),
            cwd=servers.ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i, database in enumerate(databases)
    ]
    outputs = [(process.communicate(timeout=120)[0], process.returncode) for process in imports]
    for (output, code), database in zip(outputs, databases, strict=True):
        assert code == 0 and "database is locked" not in output, output
        assert "handling a tools change failed" not in output, output  # the change handler's sync
        catalog = _catalog(database)
        assert "get_current_time" in catalog.get("time", set()) and "echo" in catalog.get("every", set()), output
